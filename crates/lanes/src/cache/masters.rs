//! The near cache on a Redis Cluster: one tracking connection per master of the slot map in use
//! (`tracking::drive` each), their fill queues where `Fills::send` finds them by a key's slot, and
//! hits served only while every one of them is up. When the set of masters changes (a failover, a
//! node added or removed), the connections are replaced and the cache emptied: a promoted replica
//! may lag what its old master acknowledged, and a new master's keys were tracked by no one.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{tracking, Cache, Cause, Fills, FILL_QUEUE};
use crate::cluster::ClusterLanes;
use crate::Endpoint;

/// How long to wait before asking again for a slot map that is not there yet.
const NO_MAP_PAUSE: Duration = Duration::from_millis(200);

/// Keeps a tracking connection on every master until `stop`, replacing them when the masters
/// change.
pub(super) async fn drive(
    cache: Cache,
    cluster: Arc<ClusterLanes>,
    timeout: Option<Duration>,
    stop: CancellationToken,
) {
    let Fills::Cluster {
        masters: queues, ..
    } = &cache.0.fills
    else {
        unreachable!("a cluster's cache routes fills per master");
    };
    let mut changes = cluster.map_changes();
    loop {
        let masters = tokio::select! {
            () = stop.cancelled() => return,
            masters = cluster.masters() => masters,
        };
        let masters = match masters {
            Ok(masters) if !masters.is_empty() => masters,
            _ => {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(NO_MAP_PAUSE) => continue,
                }
            }
        };
        let round = stop.child_token();
        let up = Arc::new(AtomicUsize::new(0));
        {
            let mut queues = queues.write();
            queues.clear();
            for endpoint in &masters {
                let Ok(node) = cluster.node(endpoint) else {
                    continue;
                };
                let (fills, queue) = mpsc::channel(FILL_QUEUE);
                queues.insert(endpoint.clone(), fills);
                let told = {
                    let (cache, up, round) = (cache.clone(), up.clone(), round.clone());
                    let needed = masters.len();
                    Arc::new(move |opened: bool| {
                        // A replaced round's connections no longer count.
                        if round.is_cancelled() {
                            return;
                        }
                        let now = match opened {
                            true => up.fetch_add(1, Ordering::AcqRel) + 1,
                            false => up.fetch_sub(1, Ordering::AcqRel) - 1,
                        };
                        cache.set_tracking(now == needed);
                    }) as Arc<dyn Fn(bool) + Send + Sync>
                };
                let connector = node.regular_connector();
                let drive = tracking::drive(
                    cache.clone(),
                    connector,
                    timeout,
                    queue,
                    told,
                    round.clone(),
                );
                let span = tracing::info_span!("master", node = %endpoint);
                tokio::spawn(tracing::Instrument::instrument(drive, span));
            }
        }
        let known: HashSet<Endpoint> = masters.into_iter().collect();
        // Until the daemon stops or the masters change.
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let now = cluster.masters_now();
                    let now = now.map(|now| now.into_iter().collect::<HashSet<Endpoint>>());
                    if now.is_some_and(|now| now != known) {
                        break;
                    }
                }
            }
        }
        round.cancel();
        cache.set_tracking(false);
        queues.write().clear();
        cache.flush(Cause::Connection);
    }
}
