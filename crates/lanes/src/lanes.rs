//! `Lanes`: the six lanes built from the config, the one handle the rest of the daemon holds, and
//! their shared lifecycle (open, drain, close exactly once).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tollgate_model::{Exclusive, Lane, Multiplexed, Protocol};

use crate::budget::Budget;
use crate::config::{LaneSettings, LanesConfig};
use crate::connector::{Connector, Credentials};
use crate::error::{CallError, LaneError, OpenError};
use crate::exclusive::{Borrowed, ExclusiveLane};
use crate::kill;
use crate::life::Life;
use crate::locator::Locator;
use crate::metrics::{Families, LaneMetrics, Rejection};
use crate::multiplex::{Channel, MultiplexedLane};
use crate::pubsub::{PubSubLane, Subscription, SubscriptionKind};
use crate::status::{LaneFacts, LaneStatus, LanesStatus, Sharing};
use crate::Topology;

/// The daemon's only way to Redis. Cheap to clone; all clones share the same lanes.
#[derive(Clone)]
pub struct Lanes(Arc<Inner>);

struct Inner {
    regular: Arc<MultiplexedLane>,
    script: Arc<MultiplexedLane>,
    /// SCRIPT's connection for kills (see `kill`); `None` for the lease service's lanes.
    kills: Option<Arc<MultiplexedLane>>,
    blocking: Arc<ExclusiveLane>,
    transaction: Arc<ExclusiveLane>,
    admin: Arc<ExclusiveLane>,
    pubsub: Arc<PubSubLane>,
    pubsub_metrics: LaneMetrics,
    settings: Vec<LaneSettings>,
    connectors: Vec<Arc<Connector>>,
    life: Arc<Life>,
    drivers: Mutex<JoinSet<()>>,
    closed: tokio::sync::Mutex<bool>,
}

impl Drop for Inner {
    /// The last handle is gone without `close`: stop the drivers rather than leak them.
    fn drop(&mut self) {
        self.life.start_draining();
        self.life.kill();
    }
}

/// How a call to [`Lanes::close`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseOutcome {
    /// Every borrowed connection came back and every in-flight command was answered in time.
    Drained,
    /// The drain deadline passed; what was still running was cut off and its connections closed.
    Forced,
    /// An earlier call already closed the lanes; nothing was done.
    AlreadyClosed,
}

/// The subscriber side of the PUBSUB lane.
#[derive(Clone)]
pub struct PubSub(Arc<PubSubLane>);

impl PubSub {
    /// Subscribes to `name`, buffering at most `capacity` undelivered messages; resolves once Redis
    /// has confirmed the subscription.
    pub async fn subscribe(
        &self,
        kind: SubscriptionKind,
        name: Bytes,
        capacity: usize,
    ) -> Result<Subscription, LaneError> {
        self.0.subscribe(kind, name, capacity, None).await
    }

    /// [`PubSub::subscribe`], with every message counted against `budget` from its fan-out until
    /// the subscriber takes it ([`Subscription::recv_held`]); a message the budget refuses ends
    /// the subscription ([`SubscriptionEnded::OverBudget`](crate::SubscriptionEnded::OverBudget)).
    pub async fn subscribe_charged(
        &self,
        kind: SubscriptionKind,
        name: Bytes,
        capacity: usize,
        budget: Arc<dyn Budget>,
    ) -> Result<Subscription, LaneError> {
        self.0.subscribe(kind, name, capacity, Some(budget)).await
    }

    /// How many local subscribers `name` has, when the daemon's subscription to it is active in
    /// Redis: Redis counts the daemon's one connection for all of them.
    pub fn local_subscribers(&self, kind: SubscriptionKind, name: Bytes) -> Option<usize> {
        self.0.local_subscribers(kind, name)
    }

    /// Resolves once Redis no longer counts the daemon as subscribed to `name`, after the
    /// subscription dropped was its last local one (at once otherwise); bounded by the lane's
    /// confirmation timeout. An unsubscribing client is answered after this, as Redis answers it
    /// after it stopped counting the client.
    pub async fn unsubscribed(&self, kind: SubscriptionKind, name: Bytes) {
        self.0.unsubscribed(kind, name).await
    }

    /// Every active pattern subscription, with its number of local subscribers.
    pub fn patterns(&self) -> Vec<(Bytes, usize)> {
        self.0.patterns()
    }
}

impl Lanes {
    /// Builds the lanes and registers their metrics. Needs a Tokio runtime (drivers are spawned) but
    /// not Redis: connections open on first use and reopen with backoff.
    pub fn open(
        topology: &Topology,
        config: &LanesConfig,
        registry: &mut Registry,
    ) -> Result<Lanes, OpenError> {
        Self::open_in(topology, config, Owner::Clients, registry)
    }

    /// The lease service's own lanes (`lanes.leases`): authenticated as the lease user, every
    /// connection in the lease database, metrics under `tollgate_leases_…`.
    pub fn open_leases(
        topology: &Topology,
        config: &LanesConfig,
        registry: &mut Registry,
    ) -> Result<Lanes, OpenError> {
        let database = Some(config.leases.database).filter(|&database| database != 0);
        Self::open_in(
            topology,
            &config.for_leases(),
            Owner::Leases { database },
            registry.sub_registry_with_prefix("leases"),
        )
    }

    fn open_in(
        topology: &Topology,
        config: &LanesConfig,
        owner: Owner,
        registry: &mut Registry,
    ) -> Result<Lanes, OpenError> {
        let database = match owner {
            Owner::Clients => None,
            Owner::Leases { database } => database,
        };
        if let Topology::Sentinel { sentinels, .. } = topology {
            if sentinels.is_empty() {
                return Err(OpenError::NoSentinels);
            }
        }
        let families = Families::register(registry);
        let life = Arc::new(Life::new());
        let mut drivers = JoinSet::new();
        let locator = Arc::new(Locator::start(topology, &life, &mut drivers));
        let mut settings = Vec::new();
        let mut connectors = Vec::new();
        let mut parts = Vec::new();
        let mut kills = None;
        for lane in Lane::ALL {
            let lane_settings = config.settings(lane);
            let credentials = credentials(&lane_settings)?;
            let metrics = families.lane(lane);
            let connector = |credentials, name: &str| {
                Connector::new(
                    name,
                    locator.clone(),
                    credentials,
                    database,
                    config.server_uid,
                    metrics.clone(),
                )
            };
            // The kill connection has a connector of its own: its warming pings, failing while
            // Redis is away, must not hold SCRIPT's other connections in backoff.
            if lane == Lane::Script && owner == Owner::Clients {
                let name = format!("tollgate-{}-kill", lane.as_str());
                let connector = Arc::new(connector(credentials.clone(), &name));
                kills = Some(kill::start(
                    &lane_settings,
                    connector,
                    metrics.clone(),
                    &life,
                    &mut drivers,
                ));
            }
            let name = format!("tollgate-{}", lane.as_str());
            parts.push((
                lane_settings.clone(),
                connector(credentials, &name),
                metrics,
            ));
            settings.push(lane_settings);
        }
        let mut parts = parts.into_iter();
        let mut next = || parts.next().expect("one part per lane, in Lane::ALL order");
        let regular = multiplexed(next(), &life, None, &mut drivers);
        let blocking = exclusive(next(), &life);
        let transaction = exclusive(next(), &life);
        let script = multiplexed(next(), &life, kills.clone(), &mut drivers);
        let (pubsub_settings, pubsub_connector, pubsub_metrics) = next();
        let admin = exclusive(next(), &life);
        connectors.extend([
            regular.connector.clone(),
            blocking.connector.clone(),
            transaction.connector.clone(),
            script.connector.clone(),
        ]);
        let pubsub_connector = Arc::new(pubsub_connector);
        connectors.push(pubsub_connector.clone());
        connectors.push(admin.connector.clone());
        let pubsub = PubSubLane::start(
            pubsub_settings.connections,
            pubsub_settings.acquire_timeout,
            pubsub_connector,
            pubsub_metrics.clone(),
            life.clone(),
            &mut drivers,
        );
        Ok(Lanes(Arc::new(Inner {
            regular,
            script,
            kills,
            blocking,
            transaction,
            admin,
            pubsub,
            pubsub_metrics,
            settings,
            connectors,
            life,
            drivers: Mutex::new(drivers),
            closed: tokio::sync::Mutex::new(false),
        })))
    }

    /// A channel on a multiplexed lane (REGULAR or SCRIPT), on the connection the lane picks: the
    /// first with room, so work is packed on few connections and batched. RESP2.
    pub fn multiplexed(&self, lane: Multiplexed) -> Result<Channel, LaneError> {
        self.multiplexed_speaking(lane, Protocol::Resp2)
    }

    /// [`Lanes::multiplexed`] on a connection speaking `protocol`, for a client that speaks it.
    pub fn multiplexed_speaking(
        &self,
        lane: Multiplexed,
        protocol: Protocol,
    ) -> Result<Channel, LaneError> {
        let pool = match lane {
            Multiplexed::Regular => &self.0.regular,
            Multiplexed::Script => &self.0.script,
        };
        if !self.0.life.is_open() {
            pool.metrics.reject(Rejection::Closed);
            return Err(LaneError::Closed);
        }
        Ok(pool.channel(protocol))
    }

    /// Borrows one connection of an exclusive lane (BLOCKING, TRANSACTION or ADMIN), waiting in line
    /// up to the lane's acquire timeout. RESP2.
    pub async fn borrow(&self, lane: Exclusive) -> Result<Borrowed, LaneError> {
        self.borrow_speaking(lane, Protocol::Resp2).await
    }

    /// [`Lanes::borrow`], the connection speaking `protocol`, for a client that speaks it.
    pub async fn borrow_speaking(
        &self,
        lane: Exclusive,
        protocol: Protocol,
    ) -> Result<Borrowed, LaneError> {
        self.borrow_within_share(lane, protocol, None).await
    }

    /// [`Lanes::borrow_speaking`] for a client of `principal`, which may hold at most its share of
    /// the lane's connections at once (`lanes.<lane>.per_principal`); past it the borrower waits
    /// for one of its own to come back, up to the acquire timeout.
    pub async fn borrow_for(
        &self,
        lane: Exclusive,
        protocol: Protocol,
        principal: &str,
    ) -> Result<Borrowed, LaneError> {
        self.borrow_within_share(lane, protocol, Some(principal))
            .await
    }

    async fn borrow_within_share(
        &self,
        lane: Exclusive,
        protocol: Protocol,
        principal: Option<&str>,
    ) -> Result<Borrowed, LaneError> {
        let pool = match lane {
            Exclusive::Blocking => &self.0.blocking,
            Exclusive::Transaction => &self.0.transaction,
            Exclusive::Admin => &self.0.admin,
        };
        pool.borrow(protocol, principal).await
    }

    pub fn pubsub(&self) -> PubSub {
        PubSub(self.0.pubsub.clone())
    }

    /// One PING over the REGULAR lane within `timeout`: can the daemon reach Redis as its users?
    pub async fn ping(&self, timeout: Duration) -> Result<(), CallError> {
        let channel = self.multiplexed(Multiplexed::Regular)?;
        let reply = tokio::time::timeout(
            timeout,
            channel.send(Bytes::from_static(b"*1\r\n$4\r\nPING\r\n")),
        )
        .await
        .map_err(|_| CallError::Indeterminate {
            reason: format!("no reply to PING within {timeout:?}"),
        })??;
        if reply.is_error() {
            return Err(CallError::NotSent(LaneError::Unavailable {
                reason: String::from_utf8_lossy(reply.bytes().trim_ascii_end()).into_owned(),
            }));
        }
        Ok(())
    }

    pub fn status(&self) -> LanesStatus {
        let inner = &self.0;
        let lanes = inner
            .settings
            .iter()
            .zip(&inner.connectors)
            .map(|(settings, connector)| {
                let (sharing, metrics, max_in_flight) = match settings.lane {
                    Lane::Regular => (
                        Sharing::Multiplexed,
                        &inner.regular.metrics,
                        Some(settings.in_flight),
                    ),
                    Lane::Script => (
                        Sharing::Multiplexed,
                        &inner.script.metrics,
                        Some(settings.in_flight),
                    ),
                    Lane::Blocking => (Sharing::Exclusive, &inner.blocking.metrics, None),
                    Lane::Transaction => (Sharing::Exclusive, &inner.transaction.metrics, None),
                    Lane::Admin => (Sharing::Exclusive, &inner.admin.metrics, None),
                    Lane::Pubsub => (Sharing::Shared, &inner.pubsub_metrics, None),
                };
                // A multiplexed lane has its `connections` per protocol (see `multiplex`), and
                // SCRIPT one more per protocol for kills.
                let kills = Protocol::ALL.len()
                    * usize::from(settings.lane == Lane::Script && inner.kills.is_some());
                let max_connections = match sharing {
                    Sharing::Multiplexed => settings.connections * Protocol::ALL.len() + kills,
                    Sharing::Exclusive | Sharing::Shared => settings.connections,
                };
                LaneStatus::new(LaneFacts {
                    lane: settings.lane,
                    sharing,
                    user: settings.user.as_deref(),
                    max_connections,
                    max_in_flight,
                    metrics,
                    unavailable: connector.outage(),
                })
            })
            .collect();
        LanesStatus {
            state: inner.life.state(),
            lanes,
        }
    }

    /// OPEN → DRAINING → CLOSED: refuse new work, let lent connections come back and in-flight
    /// commands finish until `drain` has passed, then cut off the rest and close every connection.
    /// A second call does nothing and says so.
    pub async fn close(&self, drain: Duration) -> CloseOutcome {
        let mut closed = self.0.closed.lock().await;
        if *closed {
            return CloseOutcome::AlreadyClosed;
        }
        *closed = true;
        let inner = &self.0;
        let deadline = Instant::now() + drain;
        inner.life.start_draining();
        for pool in [&inner.regular, &inner.script]
            .into_iter()
            .chain(inner.kills.as_ref())
        {
            pool.close_gate();
        }
        for pool in [&inner.blocking, &inner.transaction, &inner.admin] {
            pool.close_gate();
        }
        let mut drivers = std::mem::take(&mut *inner.drivers.lock());
        let drained = tokio::time::timeout_at(deadline, async {
            inner.life.all_returned().await;
            while drivers.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        if !drained {
            tracing::warn!(
                ?drain,
                "lanes did not drain in time; closing what is still in use"
            );
            inner.life.kill();
            while drivers.join_next().await.is_some() {}
        }
        for pool in [&inner.blocking, &inner.transaction, &inner.admin] {
            pool.close_idle();
        }
        inner.life.mark_closed();
        if drained {
            CloseOutcome::Drained
        } else {
            CloseOutcome::Forced
        }
    }
}

fn credentials(settings: &LaneSettings) -> Result<Option<Credentials>, OpenError> {
    let lane = settings.lane;
    let password = match &settings.password_file {
        None => String::new(),
        Some(path) => std::fs::read_to_string(path)
            .map_err(|source| OpenError::PasswordFile {
                lane,
                path: path.clone(),
                source,
            })?
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned(),
    };
    match (&settings.user, &settings.password_file) {
        (Some(user), _) => Ok(Some(Credentials {
            user: user.clone(),
            password,
        })),
        (None, Some(_)) => Err(OpenError::PasswordWithoutUser { lane }),
        (None, None) => Ok(None),
    }
}

type Part = (LaneSettings, Connector, LaneMetrics);

fn multiplexed(
    part: Part,
    life: &Arc<Life>,
    kills: Option<Arc<MultiplexedLane>>,
    drivers: &mut JoinSet<()>,
) -> Arc<MultiplexedLane> {
    let (settings, connector, metrics) = part;
    MultiplexedLane::start(
        &settings,
        Arc::new(connector),
        metrics,
        life.clone(),
        kills,
        drivers,
    )
}

/// Whose lanes these are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// The clients': SCRIPT keeps a connection for kills.
    Clients,
    /// The lease service's, in its database (`None`: database 0).
    Leases { database: Option<u32> },
}

fn exclusive(part: Part, life: &Arc<Life>) -> Arc<ExclusiveLane> {
    let (settings, connector, metrics) = part;
    Arc::new(ExclusiveLane::new(
        &settings,
        Arc::new(connector),
        metrics,
        life.clone(),
    ))
}
