//! `Node`: the six lanes to one Redis server (standalone, the Sentinel group's master, or one master
//! of a cluster) built from the config, and their lifecycle (open, drain, close exactly once).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tollgate_model::{Exclusive, Lane, Multiplexed, Protocol, Tenant};

use crate::ceilings::{Ceilings, Outer};
use crate::config::{LaneSettings, LanesConfig};
use crate::connector::{Connector, Credentials};
use crate::error::{CallError, LaneError, OpenError};
use crate::exclusive::{Borrowed, ExclusiveLane};
use crate::kill;
use crate::life::Life;
use crate::locator::{Locator, Server};
use crate::metrics::{Families, LaneMetrics, Rejection};
use crate::multiplex::{MultiplexedLane, NodeChannel, Scripts};
use crate::pubsub::{PubSubLane, Rehome};
use crate::scope_pools::{ScopeLogin, ScopePools};
use crate::script_limit::Watch;
use crate::status::{LaneFacts, LaneStatus, LanesStatus, Sharing};
use crate::stopper;

/// One server's lanes. Cheap to clone; all clones share the same lanes.
#[derive(Clone)]
pub(crate) struct Node(Arc<Inner>);

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
    /// The scopes' pools (`scope_pools`); `None` for the lease service's lanes.
    scopes: Option<Arc<ScopePools>>,
}

impl Drop for Inner {
    /// The last handle is gone without `close`: stop the drivers rather than leak them.
    fn drop(&mut self) {
        self.life.start_draining();
        self.life.kill();
    }
}

/// How a call to [`crate::Lanes::close`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseOutcome {
    /// Every borrowed connection came back and every in-flight command was answered in time.
    Drained,
    /// The drain deadline passed; what was still running was cut off and its connections closed.
    Forced,
    /// An earlier call already closed the lanes; nothing was done.
    AlreadyClosed,
}

impl Node {
    /// Builds the lanes to `server`, their metrics in `families`; a cluster's node is opened
    /// [`InCluster`]. Needs a Tokio runtime (drivers are spawned) but
    /// not Redis: connections open on first use and reopen with backoff.
    pub(crate) fn open(
        server: &Server,
        config: &LanesConfig,
        owner: Owner,
        families: &Families,
        cluster: Option<InCluster<'_>>,
    ) -> Result<Node, OpenError> {
        let (rehome, ceilings) = match cluster {
            Some(InCluster { rehome, ceilings }) => (Some(rehome), Some(ceilings)),
            None => (None, None),
        };
        let database = match owner {
            Owner::Clients => None,
            Owner::Leases { database } => database,
        };
        let life = Arc::new(Life::new());
        let mut drivers = JoinSet::new();
        let locator = Arc::new(Locator::start(server, &life, &mut drivers));
        let mut settings = Vec::new();
        let mut connectors = Vec::new();
        let mut parts = Vec::new();
        let mut kills = None;
        let mut watch = None;
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
                let kill_lane = kill::start(
                    &lane_settings,
                    connector,
                    metrics.clone(),
                    &life,
                    &mut drivers,
                );
                // The clients' scripts past their time limit are stopped on it (`script_limit`).
                let watching = Watch::new();
                let span = tracing::info_span!("script_limit");
                drivers.spawn(tracing::Instrument::instrument(
                    stopper::watch_over(watching.clone(), kill_lane.clone(), life.clone()),
                    span,
                ));
                kills = Some(kill_lane);
                watch = Some(watching);
            }
            let name = format!("tollgate-{}", lane.as_str());
            let outer = ceilings.map_or_else(Outer::default, |ceilings| ceilings.of(lane));
            parts.push((
                lane_settings.clone(),
                connector(credentials, &name),
                metrics,
                outer,
            ));
            settings.push(lane_settings);
        }
        let mut parts = parts.into_iter();
        let mut next = || parts.next().expect("one part per lane, in Lane::ALL order");
        let regular = Scripts {
            kills: None,
            watch: watch.clone(),
        };
        let regular = multiplexed(next(), &life, regular, &mut drivers);
        let blocking = exclusive(next(), &life);
        let transaction = exclusive(next(), &life);
        let script = Scripts {
            kills: kills.clone(),
            watch,
        };
        let scopes = (owner == Owner::Clients).then(|| {
            let pools = Arc::new(ScopePools::new(
                config.scopes.clone(),
                &config.settings(Lane::Script),
                locator.clone(),
                config.server_uid,
                families.lane(Lane::Script),
                script.clone(),
                life.clone(),
            ));
            life.spawn_until_draining(&mut drivers, pools.clone().keep_swept());
            pools
        });
        let script = multiplexed(next(), &life, script, &mut drivers);
        let (pubsub_settings, pubsub_connector, pubsub_metrics, _per_node) = next();
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
            rehome,
            &mut drivers,
        );
        Ok(Node(Arc::new(Inner {
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
            scopes,
        })))
    }

    /// A channel on a multiplexed lane (REGULAR or SCRIPT) speaking `protocol`, on the connection
    /// the lane picks: the first with room, so work is packed on few connections and batched.
    /// The REGULAR lane's connector, for the near cache's tracking connection (`cache`): its
    /// user reads what REGULAR reads, and may turn `CLIENT TRACKING` on (`acl::plumbing`).
    pub(crate) fn regular_connector(&self) -> Arc<Connector> {
        self.0.regular.connector.clone()
    }

    pub(crate) fn multiplexed_speaking(
        &self,
        lane: Multiplexed,
        protocol: Protocol,
    ) -> Result<NodeChannel, LaneError> {
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

    /// A channel on the pool of the scope `login` logs in to, speaking `protocol`.
    pub(crate) fn scoped_speaking(
        &self,
        login: &ScopeLogin,
        protocol: Protocol,
    ) -> Result<NodeChannel, LaneError> {
        match &self.0.scopes {
            Some(scopes) => scopes.channel(login, protocol),
            None => Err(LaneError::Scope {
                user: login.user.clone(),
                reason: "the lease service's lanes have no scopes".into(),
            }),
        }
    }

    /// How many scope pools are open.
    pub(crate) fn scope_pools(&self) -> usize {
        self.0
            .scopes
            .as_ref()
            .map_or(0, |scopes| scopes.open_pools())
    }

    /// One connection of an exclusive lane (BLOCKING, TRANSACTION or ADMIN) speaking `protocol`,
    /// waiting in line up to the lane's acquire timeout; for a client of `principal`, within its
    /// share of the lane's connections (`lanes.<lane>.per_principal`).
    pub(crate) async fn borrow(
        &self,
        lane: Exclusive,
        protocol: Protocol,
        tenant: Option<&Tenant>,
    ) -> Result<Borrowed, LaneError> {
        let pool = match lane {
            Exclusive::Blocking => &self.0.blocking,
            Exclusive::Transaction => &self.0.transaction,
            Exclusive::Admin => &self.0.admin,
        };
        pool.borrow(protocol, tenant).await
    }

    pub(crate) fn pubsub(&self) -> &Arc<PubSubLane> {
        &self.0.pubsub
    }

    /// One PING over the REGULAR lane within `timeout`: can the daemon reach Redis as its users?
    pub(crate) async fn ping(&self, timeout: Duration) -> Result<(), CallError> {
        let channel = self.multiplexed_speaking(Multiplexed::Regular, Protocol::Resp2)?;
        let reply = tokio::time::timeout(timeout, channel.send(Bytes::from_static(kill::PING)))
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

    pub(crate) fn status(&self) -> LanesStatus {
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
    pub(crate) async fn close(&self, drain: Duration) -> CloseOutcome {
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
        if let Some(scopes) = &inner.scopes {
            scopes.close_all();
        }
        inner.life.mark_closed();
        if drained {
            CloseOutcome::Drained
        } else {
            CloseOutcome::Forced
        }
    }
}

pub(crate) fn credentials(settings: &LaneSettings) -> Result<Option<Credentials>, OpenError> {
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

type Part = (LaneSettings, Connector, LaneMetrics, Outer);

/// What a cluster's node is opened with: where its PUBSUB lane hands the shard channels whose slot
/// moved away, and the cluster's daemon-wide ceilings its lanes sit under.
pub(crate) struct InCluster<'a> {
    pub(crate) rehome: Rehome,
    pub(crate) ceilings: &'a Ceilings,
}

fn multiplexed(
    part: Part,
    life: &Arc<Life>,
    scripts: Scripts,
    drivers: &mut JoinSet<()>,
) -> Arc<MultiplexedLane> {
    let (settings, connector, metrics, outer) = part;
    MultiplexedLane::start(
        &settings,
        Arc::new(connector),
        metrics,
        life.clone(),
        scripts,
        outer,
        drivers,
    )
}

/// Whose lanes these are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The clients': SCRIPT keeps a connection for kills.
    Clients,
    /// The lease service's, in its database (`None`: database 0).
    Leases { database: Option<u32> },
}

fn exclusive(part: Part, life: &Arc<Life>) -> Arc<ExclusiveLane> {
    let (settings, connector, metrics, outer) = part;
    Arc::new(ExclusiveLane::new(
        &settings,
        Arc::new(connector),
        metrics,
        life.clone(),
        outer,
    ))
}
