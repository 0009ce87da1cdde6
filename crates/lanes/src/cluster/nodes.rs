//! A cluster's lanes: one [`Node`] (six lanes, their own ceilings) per master the slot map names,
//! opened when a command is first routed there, and the slot map they are routed by. Also where
//! shard subscriptions follow their slot: when a slot leaves a master (resharding, a failover),
//! Redis drops the daemon's shard subscriptions in it with an `sunsubscribe` nobody asked for
//! (`removeChannelsInSlot` in Redis's cluster.c), and answers an `SSUBSCRIBE` sent there on a
//! stale map with `-MOVED`. The node's PUBSUB lane hands such a name's subscribers here
//! ([`Moved`]); they are subscribed again on the master the refreshed slot map names for the slot,
//! and their clients never see the `sunsubscribe`.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::refresh::{ClusterMap, View};
use super::settle::Unsettled;
use super::Slot;
use crate::ceilings::Ceilings;
use crate::config::LanesConfig;
use crate::error::{LaneError, OpenError};
use crate::life::Life;
use crate::locator::Server;
use crate::metrics::{Families, Redirected};
use crate::node::{credentials, InCluster, Node, Owner};
use crate::pubsub::{Moved, Rehome};
use crate::route::Route;
use crate::{Endpoint, LanesStatus};

pub(crate) struct ClusterLanes {
    map: ClusterMap,
    nodes: RwLock<HashMap<Endpoint, Node>>,
    config: LanesConfig,
    owner: Owner,
    families: Families,
    /// What every node's lanes sit under, so that the lanes' ceilings hold over the whole cluster.
    ceilings: Ceilings,
    /// The slot map's refresher; it stops when the lanes close.
    life: Arc<Life>,
    drivers: parking_lot::Mutex<JoinSet<()>>,
    /// How long a command waits for a first slot map before it is refused (not sent).
    patience: Duration,
    /// How long a command may wait, in all, for a busy cluster (`redis.cluster.retry_for`).
    retry_for: Duration,
    /// Where every node's PUBSUB lane sends the shard channels whose slot moved away from it.
    moved: mpsc::UnboundedSender<Moved>,
    /// The slots that met a redirect lately: sessions send their commands for them one at a time.
    unsettled: Unsettled,
}

impl ClusterLanes {
    pub(crate) fn open(
        seeds: &[Endpoint],
        retry_for: Duration,
        config: &LanesConfig,
        owner: Owner,
        families: Families,
    ) -> Result<Arc<ClusterLanes>, OpenError> {
        if seeds.is_empty() {
            return Err(OpenError::NoSeeds);
        }
        if let Owner::Leases {
            database: Some(database),
        } = owner
        {
            return Err(OpenError::DatabaseInCluster { database });
        }
        // The REGULAR lane's user reads the slot map: its plumbing grants CLUSTER SHARDS and INFO.
        let asker = credentials(&config.settings(tollgate_model::Lane::Regular))?;
        let life = Arc::new(Life::new());
        let mut drivers = JoinSet::new();
        let map = ClusterMap::start(seeds.to_vec(), asker, &life, &mut drivers);
        let patience = config
            .settings(tollgate_model::Lane::Regular)
            .acquire_timeout;
        // A moved subscription waits for the new owner as long as a subscription waits for Redis.
        let resubscribe_patience = config
            .settings(tollgate_model::Lane::Pubsub)
            .acquire_timeout;
        let (moved, moves) = mpsc::unbounded_channel();
        let changes = map.changes();
        Ok(Arc::new_cyclic(|lanes| {
            life.spawn_until_draining(&mut drivers, prune_departed(lanes.clone(), changes));
            life.spawn_until_draining(
                &mut drivers,
                follow_moved(lanes.clone(), moves, resubscribe_patience),
            );
            ClusterLanes {
                map,
                nodes: RwLock::new(HashMap::new()),
                config: config.clone(),
                owner,
                ceilings: Ceilings::new(config, &families),
                families,
                life,
                drivers: parking_lot::Mutex::new(drivers),
                patience,
                retry_for,
                moved,
                unsettled: Unsettled::default(),
            }
        }))
    }

    pub(crate) fn retry_for(&self) -> Duration {
        self.retry_for
    }

    /// The lanes of the node at `endpoint`, opened now if no command went there before.
    pub(crate) fn node(&self, endpoint: &Endpoint) -> Result<Node, LaneError> {
        if let Some(node) = self.nodes.read().get(endpoint) {
            return Ok(node.clone());
        }
        if !self.life.is_open() {
            return Err(LaneError::Closed);
        }
        let mut nodes = self.nodes.write();
        if let Some(node) = nodes.get(endpoint) {
            return Ok(node.clone());
        }
        let server = Server::Fixed(endpoint.clone());
        let rehome = Rehome {
            from: endpoint.clone(),
            sender: self.moved.clone(),
        };
        let node = Node::open(
            &server,
            &self.config,
            self.owner,
            &self.families,
            Some(InCluster {
                rehome,
                ceilings: &self.ceilings,
            }),
        )
        .map_err(|error| LaneError::Unavailable {
            reason: format!("cannot open lanes to {endpoint}: {error}"),
        })?;
        nodes.insert(endpoint.clone(), node.clone());
        Ok(node)
    }

    /// The master `route` leads to by the slot map in hand; `None` before the first map.
    pub(crate) fn target_now(&self, route: &Route) -> Option<Endpoint> {
        if let Route::Node(endpoint) = route {
            return Some(endpoint.clone());
        }
        let view = self.map.current()?;
        match route {
            Route::Slot(slot) => view.map.master_of(*slot).cloned(),
            Route::Any | Route::Node(_) => view.map.masters().next().cloned(),
        }
    }

    /// [`ClusterLanes::target_now`], waiting up to the lanes' acquire timeout for a first map.
    pub(crate) async fn target(&self, route: &Route) -> Result<Endpoint, LaneError> {
        if let Some(target) = self.target_now(route) {
            return Ok(target);
        }
        self.map.refresh_soon();
        let _ = self.map.ready(self.patience).await;
        self.target_now(route)
            .ok_or_else(|| LaneError::Unavailable {
                reason: match route {
                    Route::Slot(slot) => format!("no master serves slot {slot} in the slot map"),
                    Route::Any | Route::Node(_) => "no slot map from the cluster yet".to_owned(),
                },
            })
    }

    /// The masters of the slot map in hand, in a stable order (waiting for a first map as
    /// [`ClusterLanes::target`] does).
    pub(crate) async fn masters(&self) -> Result<Vec<Endpoint>, LaneError> {
        self.target(&Route::Any).await?;
        Ok(self.masters_now().unwrap_or_default())
    }

    /// The slot map in use and its replacements as they come (`None` before the first).
    pub(crate) fn map_changes(&self) -> watch::Receiver<Option<Arc<super::refresh::View>>> {
        self.map.changes()
    }

    /// The masters of the slot map in hand; `None` before the first map.
    pub(crate) fn masters_now(&self) -> Option<Vec<Endpoint>> {
        Some(self.map.current()?.map.masters().cloned().collect())
    }

    /// Counts a redirect (or a re-send) of a command on `lane` at `node`; for a command of a slot,
    /// the slot is unsettled a while (`settle`).
    pub(crate) fn redirected(
        &self,
        lane: tollgate_model::Lane,
        node: &Endpoint,
        kind: Redirected,
        slot: Option<Slot>,
    ) {
        self.families.redirected(lane, node, kind);
        if let (Some(slot), false) = (slot, kind == Redirected::Resent) {
            self.unsettled.mark(slot);
        }
    }

    /// Whether `slot` met a redirect lately.
    pub(crate) fn is_unsettled(&self, slot: Slot) -> bool {
        self.unsettled.is_unsettled(slot)
    }

    /// Whether the lanes still take work (not closing).
    pub(crate) fn is_open(&self) -> bool {
        self.life.is_open()
    }

    /// A redirect or a lost connection says the map in hand may be stale.
    pub(crate) fn refresh_soon(&self) {
        self.map.refresh_soon();
    }

    /// The lanes of the node at `endpoint` if a command went there before.
    pub(crate) fn opened_node(&self, endpoint: &Endpoint) -> Option<Node> {
        self.nodes.read().get(endpoint).cloned()
    }

    /// Every node opened so far.
    pub(crate) fn opened(&self) -> Vec<Node> {
        self.nodes.read().values().cloned().collect()
    }

    /// How many scope pools are open, over every node.
    pub(crate) fn scope_pools(&self) -> usize {
        self.opened().iter().map(Node::scope_pools).sum()
    }

    /// The nodes' lanes side by side: each lane's ceilings count every node's connections; the
    /// live figures already do (the nodes share their metric families).
    pub(crate) fn status(&self) -> Option<LanesStatus> {
        let nodes = self.opened();
        let mut status = nodes.first()?.status();
        for other in &nodes[1..] {
            for (lane, theirs) in status.lanes.iter_mut().zip(other.status().lanes) {
                // Every node has its own multiplexed and subscriber connections; an exclusive
                // lane's ceiling is the cluster's (`ceilings.rs`), the same whatever the nodes.
                if lane.sharing != crate::Sharing::Exclusive {
                    lane.max_connections += theirs.max_connections;
                }
                lane.unavailable = lane.unavailable.take().or(theirs.unavailable);
            }
        }
        Some(status)
    }

    /// Closes every node's lanes within `drain`, and stops the map's refresher.
    pub(crate) async fn close(&self, drain: Duration) -> crate::CloseOutcome {
        self.life.start_draining();
        let nodes = self.opened();
        let outcomes = futures::future::join_all(nodes.iter().map(|node| node.close(drain))).await;
        self.life.kill();
        let mut drivers = std::mem::take(&mut *self.drivers.lock());
        while drivers.join_next().await.is_some() {}
        self.life.mark_closed();
        match outcomes.contains(&crate::CloseOutcome::Forced) {
            true => crate::CloseOutcome::Forced,
            false => crate::CloseOutcome::Drained,
        }
    }
}

/// How long the lanes of a node the slot map no longer names may finish what they carry.
const DEPARTED_DRAIN: Duration = Duration::from_secs(10);

/// Closes the lanes of every node a new slot map no longer names (removed from the cluster, or
/// failed), once what they carry is done or [`DEPARTED_DRAIN`] has passed. A command later routed
/// to that node opens them again.
async fn prune_departed(
    lanes: Weak<ClusterLanes>,
    mut changes: watch::Receiver<Option<Arc<View>>>,
) {
    while changes.changed().await.is_ok() {
        let Some(view) = changes.borrow_and_update().clone() else {
            continue;
        };
        let Some(lanes) = lanes.upgrade() else {
            return;
        };
        let departed: Vec<(Endpoint, Node)> = {
            let mut nodes = lanes.nodes.write();
            let gone: Vec<Endpoint> = (nodes.keys())
                .filter(|endpoint| !view.map.nodes().contains(endpoint))
                .cloned()
                .collect();
            (gone.into_iter())
                .filter_map(|endpoint| nodes.remove(&endpoint).map(|node| (endpoint, node)))
                .collect()
        };
        for (endpoint, node) in departed {
            tracing::info!(%endpoint, "the slot map no longer names this node: its lanes drain");
            lanes.drivers.lock().spawn(async move {
                node.close(DEPARTED_DRAIN).await;
            });
        }
    }
}

/// How often the slot map is looked at while it still names the node that let go.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// Takes the moved subscriptions of every node of `lanes` to their slot's new master until the
/// lanes close; one that finds none within `patience` ends.
async fn follow_moved(
    lanes: Weak<ClusterLanes>,
    mut moved: mpsc::UnboundedReceiver<Moved>,
    patience: Duration,
) {
    while let Some(moved) = moved.recv().await {
        let Some(lanes) = lanes.upgrade() else {
            moved.end("the lanes are closed".to_owned());
            continue;
        };
        match new_owner(&lanes, &moved, patience).await {
            Ok(node) => node.pubsub().adopt(moved),
            Err(reason) => moved.end(reason),
        }
    }
}

/// The lanes of the master that serves `moved`'s slot now, by a slot map refreshed after the move.
async fn new_owner(
    lanes: &ClusterLanes,
    moved: &Moved,
    patience: Duration,
) -> Result<Node, String> {
    let slot = moved.slot();
    let route = Route::Slot(slot);
    let deadline = Instant::now() + patience;
    loop {
        // Asked each time: a refresh that heard only nodes not yet told of the move changes
        // nothing, and the next one may hear the new owner.
        lanes.refresh_soon();
        if let Some(owner) = lanes
            .target_now(&route)
            .filter(|owner| *owner != moved.from)
        {
            return lanes.node(&owner).map_err(|error| error.to_string());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "slot {slot} moved away from {} and no other master serves it within {patience:?}",
                moved.from
            ));
        }
        tokio::time::sleep(LOOK_AGAIN).await;
    }
}
