//! Per-lane Prometheus metrics, registered once into the daemon's registry; each lane keeps cheap
//! handles (the families share the underlying atomics), and `status` reads the same values back.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;
use tollgate_model::Lane;

use crate::error::Saturation;
use crate::wait_histogram::WaitHistogram;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaneLabel {
    lane: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabel {
    lane: &'static str,
    cause: &'static str,
}

/// Why a borrow or send was refused, as counted in `lane_rejections_total{cause}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    Saturated(Saturation),
    Unavailable,
    Closed,
    /// A script of a caller in its cooldown after a stop (`script_limit::Cooldown`).
    ScriptCooldown,
}

impl Rejection {
    fn label(self) -> &'static str {
        match self {
            Rejection::Saturated(Saturation::WaitExpired) => "wait_expired",
            Rejection::Saturated(Saturation::QueueFull) => "queue_full",
            Rejection::Saturated(Saturation::PrincipalShare) => "principal_share",
            Rejection::Unavailable => "unavailable",
            Rejection::Closed => "closed",
            Rejection::ScriptCooldown => "script_cooldown",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RedirectLabel {
    lane: &'static str,
    node: String,
    kind: &'static str,
}

/// What a cluster node answered instead of running a command, or what the daemon did about it, as
/// counted in `cluster_redirects_total{lane, node, kind}` (`node`: the node that answered, or for
/// `resent` the node the command was sent to again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Redirected {
    Moved,
    Ask,
    TryAgain,
    ClusterDown,
    /// The node could not be reached (the command was not sent).
    Unavailable,
    /// The command was sent again (after any of the above).
    Resent,
}

impl Redirected {
    fn label(self) -> &'static str {
        match self {
            Redirected::Moved => "moved",
            Redirected::Ask => "ask",
            Redirected::TryAgain => "tryagain",
            Redirected::ClusterDown => "clusterdown",
            Redirected::Unavailable => "unavailable",
            Redirected::Resent => "resent",
        }
    }
}

type HistogramFamily = Family<LaneLabel, WaitHistogram, fn() -> WaitHistogram>;

/// The metric families of all lanes.
pub(crate) struct Families {
    open: Family<LaneLabel, Gauge>,
    in_use: Family<LaneLabel, Gauge>,
    idle: Family<LaneLabel, Gauge>,
    waiting: Family<LaneLabel, Gauge>,
    wait: HistogramFamily,
    rejections: Family<RejectionLabel, Counter>,
    reconnects: Family<LaneLabel, Counter>,
    opened: Family<LaneLabel, Counter>,
    closed: Family<LaneLabel, Counter>,
    writes: Family<LaneLabel, Counter>,
    overlapping_writes: Family<LaneLabel, Counter>,
    redirects: Family<RedirectLabel, Counter>,
}

fn wait_histogram() -> WaitHistogram {
    // 10 µs … ~40 s: from an uncontended borrow to the longest acquire timeout anyone should set.
    WaitHistogram::new(exponential_buckets(0.00001, 4.0, 12))
}

impl Families {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let families = Families {
            open: Family::default(),
            in_use: Family::default(),
            idle: Family::default(),
            waiting: Family::default(),
            wait: Family::new_with_constructor(wait_histogram),
            rejections: Family::default(),
            reconnects: Family::default(),
            opened: Family::default(),
            closed: Family::default(),
            writes: Family::default(),
            overlapping_writes: Family::default(),
            redirects: Family::default(),
        };
        let r = registry;
        r.register(
            "lane_connections_open",
            "Connections to Redis open per lane",
            families.open.clone(),
        );
        r.register(
            "lane_in_use",
            "Connections lent to borrowers (exclusive lanes) or commands in flight (multiplexed lanes)",
            families.in_use.clone(),
        );
        r.register(
            "lane_connections_idle",
            "Idle pooled connections (exclusive lanes)",
            families.idle.clone(),
        );
        r.register(
            "lane_waiting",
            "Borrowers or commands waiting for the lane's ceiling",
            families.waiting.clone(),
        );
        r.register(
            "lane_wait_seconds",
            "Time from asking for a connection or an in-flight slot until it was granted",
            families.wait.clone(),
        );
        r.register(
            "lane_rejections",
            "Borrows and sends refused, by cause",
            families.rejections.clone(),
        );
        r.register(
            "lane_reconnects",
            "Connections established after a failed attempt or a lost connection",
            families.reconnects.clone(),
        );
        r.register(
            "lane_connections_opened",
            "Connections to Redis opened",
            families.opened.clone(),
        );
        r.register(
            "lane_connections_closed",
            "Connections to Redis closed",
            families.closed.clone(),
        );
        r.register(
            "lane_writes",
            "Writes to Redis on multiplexed lanes; each carries every command queued for it",
            families.writes.clone(),
        );
        r.register(
            "lane_overlapping_writes",
            "Writes made while an earlier write on the same connection was still unanswered: its \
             Redis is far enough (a network round trip) that holding commands for the next write \
             would cost more than writing them at once",
            families.overlapping_writes.clone(),
        );
        r.register(
            "cluster_redirects",
            "Cluster redirects met and commands sent again, per lane, node and kind \
             (moved, ask, tryagain, clusterdown, unavailable, resent)",
            families.redirects.clone(),
        );
        families
    }

    /// Counts one redirect of `kind` on `lane` at `node`; rare, so the label is built each time.
    pub(crate) fn redirected(&self, lane: Lane, node: &crate::Endpoint, kind: Redirected) {
        let label = RedirectLabel {
            lane: lane.as_str(),
            node: node.to_string(),
            kind: kind.label(),
        };
        self.redirects.get_or_create(&label).inc();
    }

    pub(crate) fn lane(&self, lane: Lane) -> LaneMetrics {
        let label = LaneLabel {
            lane: lane.as_str(),
        };
        let rejection = |cause: Rejection| {
            self.rejections
                .get_or_create(&RejectionLabel {
                    lane: lane.as_str(),
                    cause: cause.label(),
                })
                .clone()
        };
        LaneMetrics {
            open: self.open.get_or_create(&label).clone(),
            in_use: self.in_use.get_or_create(&label).clone(),
            idle: self.idle.get_or_create(&label).clone(),
            waiting: self.waiting.get_or_create(&label).clone(),
            wait: self.wait.get_or_create(&label).clone(),
            wait_expired: rejection(Rejection::Saturated(Saturation::WaitExpired)),
            queue_full: rejection(Rejection::Saturated(Saturation::QueueFull)),
            principal_share: rejection(Rejection::Saturated(Saturation::PrincipalShare)),
            script_cooldown: rejection(Rejection::ScriptCooldown),
            unavailable: rejection(Rejection::Unavailable),
            closed_rejections: rejection(Rejection::Closed),
            reconnects: self.reconnects.get_or_create(&label).clone(),
            opened: self.opened.get_or_create(&label).clone(),
            closed: self.closed.get_or_create(&label).clone(),
            writes: self.writes.get_or_create(&label).clone(),
            overlapping_writes: self.overlapping_writes.get_or_create(&label).clone(),
        }
    }
}

/// One lane's handles into the families.
#[derive(Clone)]
pub(crate) struct LaneMetrics {
    pub(crate) open: Gauge,
    pub(crate) in_use: Gauge,
    pub(crate) idle: Gauge,
    pub(crate) waiting: Gauge,
    pub(crate) wait: WaitHistogram,
    wait_expired: Counter,
    queue_full: Counter,
    principal_share: Counter,
    script_cooldown: Counter,
    unavailable: Counter,
    closed_rejections: Counter,
    pub(crate) reconnects: Counter,
    pub(crate) opened: Counter,
    pub(crate) closed: Counter,
    pub(crate) writes: Counter,
    pub(crate) overlapping_writes: Counter,
}

impl LaneMetrics {
    pub(crate) fn reject(&self, cause: Rejection) {
        self.rejection(cause).inc();
    }

    pub(crate) fn rejections(&self, cause: Rejection) -> u64 {
        self.rejection(cause).get()
    }

    fn rejection(&self, cause: Rejection) -> &Counter {
        match cause {
            Rejection::Saturated(Saturation::WaitExpired) => &self.wait_expired,
            Rejection::Saturated(Saturation::QueueFull) => &self.queue_full,
            Rejection::Saturated(Saturation::PrincipalShare) => &self.principal_share,
            Rejection::Unavailable => &self.unavailable,
            Rejection::Closed => &self.closed_rejections,
            Rejection::ScriptCooldown => &self.script_cooldown,
        }
    }
}
