//! `Lanes`: the one handle the rest of the daemon holds on Redis, whatever the topology. One server
//! (standalone, or a Sentinel group's master) has one [`Node`] of six lanes; a cluster has one per
//! master, and every call names the [`Route`] that picks it (keyless callers may say `Any`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::registry::Registry;
use tollgate_model::{Exclusive, Lane, Multiplexed, Protocol, Tenant};

use crate::budget::Budget;
use crate::channel::Channel;
use crate::cluster::{self, ClusterChannel, ClusterLanes};
use crate::config::LanesConfig;
use crate::error::{CallError, LaneError, OpenError};
use crate::exclusive::Borrowed;
use crate::locator::Server;
use crate::metrics::Families;
use crate::node::{CloseOutcome, Node, Owner};
use crate::pubsub::{PubSubLane, Subscription, SubscriptionKind};
use crate::reply::Reply;
use crate::route::Route;
use crate::scope_pools::ScopeLogin;
use crate::status::LanesStatus;
use crate::{Slot, Splitting, Topology};

/// The daemon's only way to Redis. Cheap to clone; all clones share the same lanes.
#[derive(Clone)]
pub struct Lanes(Arc<Inner>);

struct Inner {
    nodes: Nodes,
    /// The command timeout of the multiplexed lanes, for channels' sends without their own.
    regular_timeout: Option<Duration>,
    script_timeout: Option<Duration>,
    closed: tokio::sync::Mutex<bool>,
}

enum Nodes {
    One(Node),
    Cluster {
        lanes: Arc<ClusterLanes>,
        split: Splitting,
    },
}

/// What the lanes know of the cluster behind them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One server: every route leads to it.
    Single,
    /// A Redis Cluster: commands go to their slot's master.
    Cluster(Splitting),
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
        let families = Families::register(registry);
        let nodes = match topology {
            Topology::Standalone(endpoint) => Nodes::One(Node::open(
                &Server::Fixed(endpoint.clone()),
                config,
                owner,
                &families,
                None,
            )?),
            Topology::Sentinel { sentinels, .. } if sentinels.is_empty() => {
                return Err(OpenError::NoSentinels)
            }
            Topology::Sentinel {
                master,
                sentinels,
                auth,
            } => {
                let server = Server::Sentinel {
                    master: master.clone(),
                    sentinels: sentinels.clone(),
                    credentials: crate::locator::sentinel_credentials(auth)?,
                };
                Nodes::One(Node::open(&server, config, owner, &families, None)?)
            }
            Topology::Cluster {
                seeds,
                split,
                retry_for,
            } => Nodes::Cluster {
                lanes: ClusterLanes::open(seeds, *retry_for, config, owner, families)?,
                split: *split,
            },
        };
        Ok(Lanes(Arc::new(Inner {
            nodes,
            regular_timeout: config.settings(Lane::Regular).command_timeout,
            script_timeout: config.settings(Lane::Script).command_timeout,
            closed: tokio::sync::Mutex::new(false),
        })))
    }

    /// How long REGULAR waits for a reply before its connection is replaced (`None`: for ever).
    pub(crate) fn regular_timeout(&self) -> Option<Duration> {
        self.0.regular_timeout
    }

    /// The connector of the one server's REGULAR lane; `None` on a cluster (no near cache there
    /// yet: it would need a tracking connection per master).
    pub(crate) fn regular_connector(&self) -> Option<Arc<crate::connector::Connector>> {
        match &self.0.nodes {
            Nodes::One(node) => Some(node.regular_connector()),
            Nodes::Cluster { .. } => None,
        }
    }

    /// What the Redis behind these lanes says of itself (`HELLO`'s `server` and `version`), once a
    /// lane connected; on a cluster, any master's.
    pub fn server_identity(&self) -> Option<crate::connector::ServerIdentity> {
        match &self.0.nodes {
            Nodes::One(node) => node.regular_connector().identity(),
            Nodes::Cluster { lanes, .. } => lanes
                .opened()
                .iter()
                .find_map(|node| node.regular_connector().identity()),
        }
    }

    /// Whether these lanes lead to one server or to a cluster.
    pub fn shape(&self) -> Shape {
        match &self.0.nodes {
            Nodes::One(_) => Shape::Single,
            Nodes::Cluster { split, .. } => Shape::Cluster(*split),
        }
    }

    /// A channel on a multiplexed lane (REGULAR or SCRIPT): on one server, the connection the lane
    /// picks (the first with room, so work is packed on few connections and batched); on a
    /// cluster, such a connection on each node the channel's commands are routed to. RESP2.
    pub fn multiplexed(&self, lane: Multiplexed) -> Result<Channel, LaneError> {
        self.multiplexed_speaking(lane, Protocol::Resp2)
    }

    /// [`Lanes::multiplexed`] on connections speaking `protocol`, for a client that speaks it.
    pub fn multiplexed_speaking(
        &self,
        lane: Multiplexed,
        protocol: Protocol,
    ) -> Result<Channel, LaneError> {
        let timeout = match lane {
            Multiplexed::Regular => self.0.regular_timeout,
            Multiplexed::Script => self.0.script_timeout,
        };
        Ok(match &self.0.nodes {
            Nodes::One(node) => Channel::node(node.multiplexed_speaking(lane, protocol)?, timeout),
            Nodes::Cluster { lanes, .. } => {
                Channel::cluster(ClusterChannel::new(lanes.clone(), lane, protocol), timeout)
            }
        })
    }

    /// A channel like SCRIPT's on the pool of the scope `login` logs in to (`scope_pools`), for a
    /// key-constrained principal's script commands. On a cluster, on that scope's pool of the
    /// node of each command's slot (each node keeps its own pools, and `lanes.scopes.max` is per
    /// node).
    pub fn scoped_speaking(
        &self,
        login: &ScopeLogin,
        protocol: Protocol,
    ) -> Result<Channel, LaneError> {
        let timeout = self.0.script_timeout;
        Ok(match &self.0.nodes {
            Nodes::One(node) => Channel::node(node.scoped_speaking(login, protocol)?, timeout),
            Nodes::Cluster { lanes, .. } => Channel::cluster(
                ClusterChannel::new(lanes.clone(), Multiplexed::Script, protocol)
                    .scoped(login.clone()),
                timeout,
            ),
        })
    }

    /// How many scope pools are open (on a cluster, over every node).
    pub fn scope_pools(&self) -> usize {
        match &self.0.nodes {
            Nodes::One(node) => node.scope_pools(),
            Nodes::Cluster { lanes, .. } => lanes.scope_pools(),
        }
    }

    /// Borrows one connection of an exclusive lane (BLOCKING, TRANSACTION or ADMIN) of any master,
    /// waiting in line up to the lane's acquire timeout. RESP2.
    pub async fn borrow(&self, lane: Exclusive) -> Result<Borrowed, LaneError> {
        self.borrow_at(Route::Any, lane, Protocol::Resp2, None)
            .await
    }

    /// [`Lanes::borrow`] on `route`'s node, speaking `protocol`; for a client of `tenant` (a
    /// principal and one OS user of it), which may hold at most its share of the lane's
    /// connections at once (`lanes.<lane>.per_principal`, counted per user of the principal;
    /// past it the borrower waits for one of its own to come back, up to the acquire timeout).
    pub async fn borrow_at(
        &self,
        route: Route,
        lane: Exclusive,
        protocol: Protocol,
        tenant: Option<&Tenant>,
    ) -> Result<Borrowed, LaneError> {
        match &self.0.nodes {
            Nodes::One(node) => node.borrow(lane, protocol, tenant).await,
            Nodes::Cluster { lanes, .. } => {
                let target = lanes.target(&route).await?;
                lanes.node(&target)?.borrow(lane, protocol, tenant).await
            }
        }
    }

    /// Runs `command` alone on a borrowed connection of `lane` on `route`'s node (given back clean
    /// afterwards), following a cluster's redirects.
    pub async fn run_lent(
        &self,
        route: Route,
        lane: Exclusive,
        protocol: Protocol,
        tenant: &Tenant,
        command: Bytes,
        deadline: Option<Duration>,
    ) -> Result<Reply, CallError> {
        match &self.0.nodes {
            Nodes::One(node) => {
                let mut conn = node.borrow(lane, protocol, Some(tenant)).await?;
                let reply = conn.send_within(command, deadline).await;
                conn.release().await;
                reply
            }
            Nodes::Cluster { lanes, .. } => {
                let tenant = Some(tenant);
                cluster::run_lent(lanes, route, lane, protocol, tenant, command, deadline).await
            }
        }
    }

    /// The master of every shard, in a stable order, for a command every master must run (one
    /// server: that server alone).
    pub async fn masters(&self) -> Result<Vec<Route>, LaneError> {
        match &self.0.nodes {
            Nodes::One(_) => Ok(vec![Route::Any]),
            Nodes::Cluster { lanes, .. } => Ok(lanes
                .masters()
                .await?
                .into_iter()
                .map(Route::Node)
                .collect()),
        }
    }

    /// [`Lanes::masters`] by the slot map in hand, without waiting: `None` before the first map.
    pub fn masters_now(&self) -> Option<Vec<Route>> {
        match &self.0.nodes {
            Nodes::One(_) => Some(vec![Route::Any]),
            Nodes::Cluster { lanes, .. } => {
                Some(lanes.masters_now()?.into_iter().map(Route::Node).collect())
            }
        }
    }

    /// A cluster's lanes (`None` on one server).
    pub(crate) fn cluster(&self) -> Option<&Arc<ClusterLanes>> {
        match &self.0.nodes {
            Nodes::One(_) => None,
            Nodes::Cluster { lanes, .. } => Some(lanes),
        }
    }

    pub fn pubsub(&self) -> PubSub {
        PubSub(self.clone())
    }

    /// One PING over the REGULAR lane of any master within `timeout`: can the daemon reach Redis
    /// as its users?
    pub async fn ping(&self, timeout: Duration) -> Result<(), CallError> {
        let node = match &self.0.nodes {
            Nodes::One(node) => node.clone(),
            Nodes::Cluster { lanes, .. } => {
                let target = tokio::time::timeout(timeout, lanes.target(&Route::Any))
                    .await
                    .map_err(|_| CallError::Indeterminate {
                        reason: format!("no slot map from the cluster within {timeout:?}"),
                    })??;
                lanes.node(&target)?
            }
        };
        node.ping(timeout).await
    }

    pub fn status(&self) -> LanesStatus {
        match &self.0.nodes {
            Nodes::One(node) => node.status(),
            Nodes::Cluster { lanes, .. } => lanes.status().unwrap_or_else(LanesStatus::unopened),
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
        match &self.0.nodes {
            Nodes::One(node) => node.close(drain).await,
            Nodes::Cluster { lanes, .. } => lanes.close(drain).await,
        }
    }

    /// The lane of `kind`'s subscriptions to `name`: the shard's master for a sharded one, the
    /// first master for the others (a cluster delivers them on every node).
    async fn pubsub_lane(
        &self,
        kind: SubscriptionKind,
        name: &[u8],
    ) -> Result<Arc<PubSubLane>, LaneError> {
        match &self.0.nodes {
            Nodes::One(node) => Ok(node.pubsub().clone()),
            Nodes::Cluster { lanes, .. } => {
                let target = lanes.target(&pubsub_route(kind, name)).await?;
                Ok(lanes.node(&target)?.pubsub().clone())
            }
        }
    }

    /// [`Lanes::pubsub_lane`] without waiting: `None` before a slot map, or when the node was never
    /// subscribed to.
    fn pubsub_lane_now(&self, kind: SubscriptionKind, name: &[u8]) -> Option<Arc<PubSubLane>> {
        match &self.0.nodes {
            Nodes::One(node) => Some(node.pubsub().clone()),
            Nodes::Cluster { lanes, .. } => {
                let target = lanes.target_now(&pubsub_route(kind, name))?;
                lanes.opened_node(&target).map(|node| node.pubsub().clone())
            }
        }
    }
}

fn pubsub_route(kind: SubscriptionKind, name: &[u8]) -> Route {
    match kind {
        SubscriptionKind::Shard => Route::Slot(Slot::of(name)),
        SubscriptionKind::Channel | SubscriptionKind::Pattern => Route::Any,
    }
}

/// The subscriber side of the PUBSUB lane. On a cluster a shard subscription lives on its slot's
/// master and follows the slot when it moves (`cluster::resubscribe`).
#[derive(Clone)]
pub struct PubSub(Lanes);

impl PubSub {
    /// Subscribes to `name`, buffering at most `capacity` undelivered messages; resolves once Redis
    /// has confirmed the subscription.
    pub async fn subscribe(
        &self,
        kind: SubscriptionKind,
        name: Bytes,
        capacity: usize,
    ) -> Result<Subscription, LaneError> {
        let lane = self.0.pubsub_lane(kind, &name).await?;
        lane.subscribe(kind, name, capacity, None).await
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
        let lane = self.0.pubsub_lane(kind, &name).await?;
        lane.subscribe(kind, name, capacity, Some(budget)).await
    }

    /// How many local subscribers `name` has, when the daemon's subscription to it is active in
    /// Redis: Redis counts the daemon's one connection for all of them.
    pub fn local_subscribers(&self, kind: SubscriptionKind, name: Bytes) -> Option<usize> {
        self.0
            .pubsub_lane_now(kind, &name)?
            .local_subscribers(kind, name)
    }

    /// Resolves once Redis no longer counts the daemon as subscribed to `name`, after the
    /// subscription dropped was its last local one (at once otherwise); bounded by the lane's
    /// confirmation timeout. An unsubscribing client is answered after this, as Redis answers it
    /// after it stopped counting the client.
    pub async fn unsubscribed(&self, kind: SubscriptionKind, name: Bytes) {
        if let Some(lane) = self.0.pubsub_lane_now(kind, &name) {
            lane.unsubscribed(kind, name).await
        }
    }

    /// Every active pattern subscription, with its number of local subscribers.
    pub fn patterns(&self) -> Vec<(Bytes, usize)> {
        self.0
            .pubsub_lane_now(SubscriptionKind::Pattern, b"")
            .map(|lane| lane.patterns())
            .unwrap_or_default()
    }
}
