//! Shard subscriptions that follow their slot. When a slot leaves a master (resharding, a
//! failover), Redis drops the daemon's shard subscriptions in it with an `sunsubscribe` nobody
//! asked for (`removeChannelsInSlot` in Redis's cluster.c), and answers an `SSUBSCRIBE` sent there
//! on a stale map with `-MOVED`. The node's PUBSUB lane hands such a name's subscribers here
//! ([`Moved`]); they are subscribed again on the master the refreshed slot map names for the slot,
//! and their clients never see the `sunsubscribe`.

use std::sync::Weak;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::ClusterLanes;
use crate::channel::Route;
use crate::node::Node;
use crate::pubsub::Moved;

/// How often the slot map is looked at while it still names the node that let go.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// Takes the moved subscriptions of every node of `lanes` to their slot's new master until the
/// lanes close; one that finds none within `patience` ends.
pub(crate) async fn follow(
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
