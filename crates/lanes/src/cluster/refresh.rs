//! Learning the slot map and keeping it current. [`fetch_view`] asks one node, on a fresh
//! connection, for its config epoch (`CLUSTER INFO`) and its map (`CLUSTER SHARDS`, or `CLUSTER
//! SLOTS` where that is unknown). [`ClusterMap`] runs the refresher, which stops with the lanes: it
//! refreshes every few seconds and on demand ([`ClusterMap::refresh_soon`], debounced), asks a few
//! nodes at once, and adopts the answer with the highest epoch, never one older than the view it
//! holds, so that a minority partition's stale view is not adopted.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use rand::seq::SliceRandom;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tollgate_model::Protocol;
use tollgate_resp::Frame;

use super::map::{MapError, SlotMap};
use crate::conn::hello;
use crate::connector::Credentials;
use crate::life::Life;
use crate::stream::{ExchangeError, Stream};
use crate::Endpoint;

/// How often the map is refreshed when nothing asks for it sooner.
const PERIOD: Duration = Duration::from_secs(5);
/// How often it is retried while no node has answered yet.
const RETRY: Duration = Duration::from_millis(200);
/// The least time between two refreshes asked for with `refresh_soon`.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// How long one node may take to answer (dial, handshake, both questions).
const FETCH_TIMEOUT: Duration = Duration::from_secs(1);
/// How many nodes one refresh asks at once.
const ASKED: usize = 3;
/// The name the refresher's connections carry in `CLIENT LIST`.
const CLIENT_NAME: &str = "tollgate-cluster-map";

/// The slot map in use, with the config epoch of the node it came from.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) map: SlotMap,
    /// The answering node's `cluster_current_epoch`, read before its map, so the map is at least
    /// as new as the epoch.
    pub(crate) epoch: u64,
    /// Counts the distinct maps adopted (from 1), so that a holder can tell the map changed.
    pub(crate) generation: u64,
    /// The node that described it.
    pub(crate) from: Endpoint,
}

/// What one node said.
#[derive(Debug)]
pub(crate) struct NodeView {
    pub(crate) node: Endpoint,
    pub(crate) map: SlotMap,
    pub(crate) epoch: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("cluster node {node}: {failure}")]
pub(crate) struct FetchError {
    pub(crate) node: Endpoint,
    pub(crate) failure: FetchFailure,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchFailure {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Exchange(#[from] ExchangeError),
    #[error("HELLO refused: {0}")]
    HelloRefused(String),
    #[error("CLUSTER INFO: {0}")]
    Info(String),
    #[error("{0}")]
    Map(#[from] MapError),
}

/// No node described the cluster in time.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no cluster node described the cluster within {waited:?} (last failure: {last})")]
pub(crate) struct NotReady {
    waited: Duration,
    last: String,
}

/// Asks `node` for its view, within `timeout`.
pub(crate) async fn fetch_view(
    node: &Endpoint,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<NodeView, FetchError> {
    let asked = async {
        let mut stream = Stream::connect(node).await?;
        let mut read = BytesMut::new();
        let auth = credentials.map(|c| (c.user.as_str(), c.password.as_str()));
        stream
            .write_all(&hello(auth, Some(CLIENT_NAME), Protocol::Resp3))
            .await?;
        let greeting = stream.next_frame(&mut read).await?;
        if greeting.is_error() {
            return Err(FetchFailure::HelloRefused(text(&greeting)));
        }
        let info = stream.exchange(&mut read, &["CLUSTER", "INFO"]).await?;
        let epoch = current_epoch(&info)?;
        let shards = stream.exchange(&mut read, &["CLUSTER", "SHARDS"]).await?;
        let map = match SlotMap::from_shards(&shards, node) {
            Err(MapError::Refused(_)) => {
                let slots = stream.exchange(&mut read, &["CLUSTER", "SLOTS"]).await?;
                SlotMap::from_slots(&slots, node)?
            }
            read => read?,
        };
        Ok(NodeView {
            node: node.clone(),
            map,
            epoch,
        })
    };
    let failed = |failure| FetchError {
        node: node.clone(),
        failure,
    };
    match tokio::time::timeout(timeout, asked).await {
        Ok(answer) => answer.map_err(failed),
        Err(_) => Err(failed(FetchFailure::Timeout(timeout))),
    }
}

/// `cluster_current_epoch:<n>` from a `CLUSTER INFO` reply.
fn current_epoch(info: &Frame) -> Result<u64, FetchFailure> {
    if info.is_error() {
        return Err(FetchFailure::Info(text(info)));
    }
    let body = info
        .as_bytes()
        .ok_or_else(|| FetchFailure::Info("the reply is not text".into()))?;
    body.split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"cluster_current_epoch:"))
        .and_then(|n| std::str::from_utf8(n.trim_ascii()).ok()?.parse().ok())
        .ok_or_else(|| FetchFailure::Info("no cluster_current_epoch".into()))
}

fn text(frame: &Frame) -> String {
    match frame.as_bytes() {
        Some(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        None => format!("{frame:?}"),
    }
}

/// The view to hold after a refresh that heard `answers`, or `None` to keep `current`: the answer
/// with the highest epoch (ties: the most slots covered), unless it is older than `current` or
/// tells nothing new.
pub(crate) fn adopt(current: Option<&View>, answers: Vec<NodeView>) -> Option<View> {
    let best = answers
        .into_iter()
        .max_by_key(|answer| (answer.epoch, answer.map.covered()))?;
    let generation = match current {
        None => 1,
        Some(current) if best.epoch < current.epoch => return None,
        Some(current) if best.map == current.map => {
            if best.epoch == current.epoch {
                return None;
            }
            current.generation
        }
        Some(current) => current.generation + 1,
    };
    Some(View {
        map: best.map,
        epoch: best.epoch,
        generation,
        from: best.node,
    })
}

/// The cluster's slot map as the refresher last learned it.
pub(crate) struct ClusterMap {
    current: watch::Receiver<Option<Arc<View>>>,
    /// Holds at most one request: requests made while one waits (or while a refresh runs) merge.
    wake: mpsc::Sender<()>,
    last_failure: Arc<Mutex<Option<String>>>,
}

impl ClusterMap {
    /// Starts the refresher for the cluster that `seeds` belong to; it stops when the lanes drain
    /// (or this map is dropped).
    pub(crate) fn start(
        seeds: Vec<Endpoint>,
        credentials: Option<Credentials>,
        life: &Arc<Life>,
        drivers: &mut JoinSet<()>,
    ) -> ClusterMap {
        let (sender, current) = watch::channel(None);
        let (wake, woken) = mpsc::channel(1);
        let last_failure = Arc::new(Mutex::new(None));
        let refresher = Refresher {
            seeds,
            credentials,
            sender,
            last_failure: last_failure.clone(),
        };
        life.spawn_until_draining(drivers, async move { refresher.run(woken).await });
        ClusterMap {
            current,
            wake,
            last_failure,
        }
    }

    /// The view in use, once a node has answered.
    pub(crate) fn current(&self) -> Option<Arc<View>> {
        self.current.borrow().clone()
    }

    /// The view in use and its replacements as they come.
    pub(crate) fn changes(&self) -> watch::Receiver<Option<Arc<View>>> {
        self.current.clone()
    }

    /// Asks for a refresh (after a MOVED, or a connection error) without waiting for it: at most
    /// one runs at a time, and one more follows it for everything asked meanwhile.
    pub(crate) fn refresh_soon(&self) {
        // Full means a refresh is asked for already, which covers this request too.
        let _ = self.wake.try_send(());
    }

    /// The first view, waiting up to `timeout` for it.
    pub(crate) async fn ready(&self, timeout: Duration) -> Result<Arc<View>, NotReady> {
        let mut current = self.current.clone();
        if let Ok(Ok(view)) = tokio::time::timeout(timeout, current.wait_for(Option::is_some)).await
        {
            if let Some(view) = view.as_ref() {
                return Ok(view.clone());
            }
        }
        Err(NotReady {
            waited: timeout,
            last: self
                .last_failure
                .lock()
                .clone()
                .unwrap_or_else(|| "no node answered yet".into()),
        })
    }
}

struct Refresher {
    seeds: Vec<Endpoint>,
    credentials: Option<Credentials>,
    sender: watch::Sender<Option<Arc<View>>>,
    last_failure: Arc<Mutex<Option<String>>>,
}

impl Refresher {
    async fn run(self, mut woken: mpsc::Receiver<()>) {
        loop {
            self.refresh().await;
            let earliest = Instant::now() + DEBOUNCE;
            let pause = match self.sender.borrow().is_some() {
                true => PERIOD,
                false => RETRY,
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                asked = woken.recv() => {
                    if asked.is_none() {
                        return; // the map is gone: nobody reads the views any more
                    }
                    tokio::time::sleep_until(earliest).await;
                }
            }
            // This refresh answers every request made until now.
            while woken.try_recv().is_ok() {}
        }
    }

    /// Asks up to [`ASKED`] nodes at once (the seeds and the nodes of the view held, in random
    /// order), the next few if none of them answered, and adopts the best answer.
    async fn refresh(&self) {
        let mut candidates = self.seeds.clone();
        if let Some(view) = self.sender.borrow().as_ref() {
            for node in view.map.nodes() {
                if !candidates.contains(node) {
                    candidates.push(node.clone());
                }
            }
        }
        candidates.shuffle(&mut rand::rng());
        let mut answers = Vec::new();
        for batch in candidates.chunks(ASKED) {
            let asked = batch
                .iter()
                .map(|node| fetch_view(node, self.credentials.as_ref(), FETCH_TIMEOUT));
            for outcome in futures::future::join_all(asked).await {
                match outcome {
                    Ok(answer) => answers.push(answer),
                    Err(error) => {
                        tracing::debug!(%error, "cluster node did not describe the cluster");
                        *self.last_failure.lock() = Some(error.to_string());
                    }
                }
            }
            if !answers.is_empty() {
                break;
            }
        }
        if answers.is_empty() {
            tracing::warn!(
                last = self.last_failure.lock().as_deref().unwrap_or(""),
                "no cluster node described the cluster; keeping the map held"
            );
            return;
        }
        self.sender.send_if_modified(|current| {
            let Some(view) = adopt(current.as_deref(), std::mem::take(&mut answers)) else {
                return false;
            };
            tracing::info!(
                from = %view.from,
                epoch = view.epoch,
                generation = view.generation,
                masters = view.map.masters().len(),
                covered = view.map.covered(),
                "cluster slot map adopted"
            );
            *current = Some(Arc::new(view));
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::map::tests::{node, shard, tcp, three_shards};

    fn answer(map: Frame, epoch: u64) -> NodeView {
        let node = tcp("127.0.0.1", 7000);
        NodeView {
            map: SlotMap::from_shards(&map, &node).unwrap(),
            node,
            epoch,
        }
    }

    /// Only the first two of the three masters: a view that lost a master.
    fn two_shards() -> Frame {
        Frame::Array(vec![
            shard(&[(0, 5460)], vec![node(7000, "master", "online")]),
            shard(&[(5461, 10922)], vec![node(7001, "master", "online")]),
        ])
    }

    /// The three masters after 7003 took over the first one's slots.
    fn failed_over() -> Frame {
        Frame::Array(vec![
            shard(&[(0, 5460)], vec![node(7003, "master", "online")]),
            shard(&[(5461, 10922)], vec![node(7001, "master", "online")]),
            shard(&[(10923, 16383)], vec![node(7002, "master", "online")]),
        ])
    }

    fn view(map: Frame, epoch: u64, generation: u64) -> View {
        let answer = answer(map, epoch);
        View {
            map: answer.map,
            epoch,
            generation,
            from: answer.node,
        }
    }

    #[test]
    fn the_highest_epoch_wins_and_ties_go_to_the_most_slots_covered() {
        let first = adopt(
            None,
            vec![answer(three_shards(), 6), answer(failed_over(), 7)],
        )
        .unwrap();
        assert_eq!(first, view(failed_over(), 7, 1));
        // Fewer slots covered does not outweigh a higher epoch.
        let chosen = adopt(
            None,
            vec![answer(three_shards(), 6), answer(two_shards(), 7)],
        )
        .unwrap();
        assert_eq!(chosen.map.covered(), 10923);
        let tie = adopt(
            None,
            vec![answer(two_shards(), 7), answer(three_shards(), 7)],
        )
        .unwrap();
        assert_eq!(tie, view(three_shards(), 7, 1));
    }

    #[test]
    fn a_stale_view_never_replaces_a_newer_one() {
        let held = view(failed_over(), 7, 3);
        // A minority partition's view: the old master still in place, at the old epoch.
        assert_eq!(adopt(Some(&held), vec![answer(three_shards(), 6)]), None);
        assert_eq!(
            adopt(
                Some(&held),
                vec![answer(three_shards(), 6), answer(two_shards(), 5)]
            ),
            None
        );
        assert_eq!(adopt(Some(&held), vec![]), None);
    }

    #[test]
    fn a_new_map_bumps_the_generation_and_a_new_epoch_alone_does_not() {
        let held = view(three_shards(), 6, 3);
        assert_eq!(adopt(Some(&held), vec![answer(three_shards(), 6)]), None);
        assert_eq!(
            adopt(Some(&held), vec![answer(three_shards(), 8)]),
            Some(view(three_shards(), 8, 3))
        );
        // A slot moved without an epoch bump (resharding): same epoch, another map.
        assert_eq!(
            adopt(Some(&held), vec![answer(failed_over(), 6)]),
            Some(view(failed_over(), 6, 4))
        );
        assert_eq!(
            adopt(Some(&held), vec![answer(failed_over(), 9)]),
            Some(view(failed_over(), 9, 4))
        );
    }

    #[test]
    fn reads_the_current_epoch_from_cluster_info() {
        let info = "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_current_epoch:42\r\ncluster_my_epoch:2\r\n";
        assert_eq!(current_epoch(&Frame::Bulk(info.into())).unwrap(), 42);
        let verbatim = Frame::Verbatim {
            format: *b"txt",
            text: info.into(),
        };
        assert_eq!(current_epoch(&verbatim).unwrap(), 42);
        for refused in [
            Frame::Error("ERR This instance has cluster support disabled".into()),
            Frame::Bulk("cluster_state:ok\r\n".into()),
            Frame::Bulk("cluster_current_epoch:-1\r\n".into()),
            Frame::Bulk("cluster_current_epoch:\r\n".into()),
            Frame::Integer(42),
        ] {
            assert!(
                matches!(current_epoch(&refused), Err(FetchFailure::Info(_))),
                "{refused:?}"
            );
        }
    }
}
