//! The daemon's one view of every key Redis changes, for `CLIENT TRACKING` served to its own
//! clients (issue 29; the tracking itself is the daemon's, `daemon/src/tracking`): a RESP3
//! connection of the REGULAR lane's user with `CLIENT TRACKING ON BCAST` and no prefix, so that
//! Redis pushes an `invalidate` for every key written, expired or evicted, and a null one for a
//! flush. It is open only while it is wanted (some client of the daemon tracks), since every
//! write in Redis then costs a push on it.
//!
//! What it reports ([`Event`]) is all a consumer needs to stay correct: keys changed, everything
//! changed, and the two moments when what changed is unknown — the connection lost (or the
//! master moved, Sentinel), and a connection opened after none was (writes meanwhile went
//! unseen). A connection that stops answering its `PING`s within the REGULAR lane's timeout is
//! treated as lost: a silent one would leave clients with values Redis no longer holds.
//!
//! On a Redis Cluster, one such connection per master of the slot map (a key's writes are
//! told by the master that holds it, a migrated key's by both), all of them open before the feed
//! counts as open; when the masters change (a failover, a node added), the connections are
//! replaced, and each one lost or opened tells the consumer that everything may have changed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tollgate_resp::{Frame, Limits};

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::cluster::ClusterLanes;
use crate::conn::Conn;
use crate::connector::Connector;
use crate::tracking_conn::{self, command, Lost};
use crate::{Endpoint, Lanes};

/// What the connection calls itself (`CLIENT LIST` on Redis).
const NAME: &str = "tollgate-invalidations";
/// First pause after a failed attempt; doubled per failure up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(25);
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// How often the connection is asked whether it is alive.
const PING_EVERY: Duration = Duration::from_secs(1);
/// How long a `PING` may go unanswered without a REGULAR timeout configured.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// What Redis told, or what the consumer must assume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The connection is open and tracking: from now on every change is reported. What changed
    /// while none was open is unknown.
    Opened,
    /// These keys changed (one `invalidate` push).
    Keys(Vec<Bytes>),
    /// Every key may have changed: Redis was flushed.
    Everything,
    /// The connection was lost, closed (no longer wanted) or the master moved: changes from now
    /// on are not reported until the next [`Event::Opened`].
    Closed,
}

/// Why the feed is not open.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("the invalidation connection to Redis did not open within {0:?}")]
    NotOpen(Duration),
}

/// The feed: say whether it is wanted, and wait for it to be open.
pub struct Invalidations {
    wanted: watch::Sender<bool>,
    /// Open and tracking.
    open: watch::Receiver<bool>,
}

impl Invalidations {
    /// The feed of `lanes`' server, reporting to `sink` (called on the feed's task, in order)
    /// until `stop`. Closed until [`Invalidations::want`]ed.
    pub fn start(
        lanes: &Lanes,
        sink: impl Fn(Event) + Send + Sync + 'static,
        stop: CancellationToken,
    ) -> Invalidations {
        let timeout = lanes.regular_timeout().unwrap_or(DEFAULT_TIMEOUT);
        let (wanted, wanted_rx) = watch::channel(false);
        let (open_tx, open) = watch::channel(false);
        let sink: Arc<dyn Fn(Event) + Send + Sync> = Arc::new(sink);
        let span = tracing::info_span!("invalidations");
        match (lanes.regular_connector(), lanes.cluster()) {
            (Some(connector), _) => {
                let feed = Feed {
                    connector,
                    timeout,
                    sink,
                    opened: Arc::new(move |open| {
                        open_tx.send_replace(open);
                    }),
                };
                let drive = feed.drive(wanted_rx, stop);
                tokio::spawn(tracing::Instrument::instrument(drive, span));
            }
            (None, Some(cluster)) => {
                let masters = Masters {
                    cluster: cluster.clone(),
                    timeout,
                    sink,
                    open: Arc::new(open_tx),
                };
                let drive = masters.drive(wanted_rx, stop);
                tokio::spawn(tracing::Instrument::instrument(drive, span));
            }
            (None, None) => unreachable!("lanes lead to one server or to a cluster"),
        }
        Invalidations { wanted, open }
    }

    /// Whether the connection should be open.
    pub fn want(&self, wanted: bool) {
        self.wanted
            .send_if_modified(|now| std::mem::replace(now, wanted) != wanted);
    }

    /// Whether it is open and tracking now.
    pub fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// Wants it open, and waits at most `within` for it to be.
    pub async fn opened(&self, within: Duration) -> Result<(), FeedError> {
        self.want(true);
        let mut open = self.open.clone();
        let waited = async move { open.wait_for(|open| *open).await.is_ok() };
        match tokio::time::timeout(within, waited).await {
            Ok(true) => Ok(()),
            _ => Err(FeedError::NotOpen(within)),
        }
    }
}

/// One connection's feed, to one server.
struct Feed {
    connector: Arc<Connector>,
    timeout: Duration,
    sink: Arc<dyn Fn(Event) + Send + Sync>,
    /// Told when the connection is open and tracking (`true`) and when it no longer is.
    opened: Arc<dyn Fn(bool) + Send + Sync>,
}

impl Feed {
    async fn drive(self, mut wanted: watch::Receiver<bool>, stop: CancellationToken) {
        let mut pause = FIRST_PAUSE;
        let mut failing = false;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                wanted_now = async { wanted.wait_for(|wanted| *wanted).await.is_ok() } => {
                    if !wanted_now { return }
                }
            }
            let opened = tokio::select! {
                () = stop.cancelled() => return,
                opened = open(&self.connector) => opened,
            };
            let lost = match opened {
                Ok(conn) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!("invalidation connection open again");
                    }
                    pause = FIRST_PAUSE;
                    (self.sink)(Event::Opened);
                    (self.opened)(true);
                    let served = self.serve(conn, &mut wanted, &stop).await;
                    (self.opened)(false);
                    (self.sink)(Event::Closed);
                    served
                }
                Err(lost) => Err(lost),
            };
            if stop.is_cancelled() {
                return;
            }
            let Err(lost) = lost else {
                continue;
            };
            if !failing {
                tracing::warn!(error = %lost, "client tracking without invalidations until the connection is open");
                failing = true;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// Reports what `conn` is pushed until it is lost (`Err`), no longer wanted or the daemon
    /// stops (`Ok`).
    async fn serve(
        &self,
        conn: Conn,
        wanted: &mut watch::Receiver<bool>,
        stop: &CancellationToken,
    ) -> Result<(), Lost> {
        let generation = conn.generation();
        let (stream, mut read, _open) = conn.into_parts();
        let (mut reader, mut writer) = tokio::io::split(stream);
        let limits = Limits {
            max_elements: usize::MAX,
            ..Limits::default()
        };
        let ping = command(&[b"PING"]);
        let mut ticks = tokio::time::interval(PING_EVERY);
        // PINGs unanswered, and when the oldest was sent.
        let mut unanswered: std::collections::VecDeque<tokio::time::Instant> = Default::default();
        loop {
            while let Some(frame) = tollgate_resp::parse(&mut read, &limits)? {
                match frame {
                    Frame::Push(items) => {
                        if let Some(event) = pushed(items) {
                            (self.sink)(event);
                        }
                    }
                    _ => {
                        unanswered.pop_front();
                    }
                }
            }
            let overdue = async {
                match unanswered.front() {
                    Some(&sent) => tokio::time::sleep_until(sent + self.timeout).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = async { let _ = wanted.wait_for(|wanted| !*wanted).await; } => return Ok(()),
                () = self.connector.moved(generation) => return Err(Lost::Moved),
                () = overdue => return Err(Lost::Timeout(self.timeout)),
                _ = ticks.tick() => {
                    writer.write_all(&ping).await?;
                    unanswered.push_back(tokio::time::Instant::now());
                }
                got = reader.read_buf(&mut read) => {
                    if got? == 0 {
                        return Err(Lost::Eof);
                    }
                }
            }
        }
    }
}

/// A cluster's feeds: one per master of the slot map in use, replaced when the masters change.
struct Masters {
    cluster: Arc<ClusterLanes>,
    timeout: Duration,
    sink: Arc<dyn Fn(Event) + Send + Sync>,
    /// Open: every master's connection is.
    open: Arc<watch::Sender<bool>>,
}

impl Masters {
    async fn drive(self, mut wanted: watch::Receiver<bool>, stop: CancellationToken) {
        let mut changes = self.cluster.map_changes();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                wanted_now = async { wanted.wait_for(|wanted| *wanted).await.is_ok() } => {
                    if !wanted_now { return }
                }
            }
            let masters = tokio::select! {
                () = stop.cancelled() => return,
                masters = self.cluster.masters() => masters,
            };
            let masters = match masters {
                Ok(masters) if !masters.is_empty() => masters,
                _ => {
                    tokio::time::sleep(MAX_PAUSE).await;
                    continue;
                }
            };
            let masters_set: HashSet<Endpoint> = masters.iter().cloned().collect();
            let round = stop.child_token();
            // The feeds of this round want their connections while the round lasts.
            let (_want, feeds_want) = watch::channel(true);
            let count = Arc::new(AtomicUsize::new(0));
            for endpoint in &masters {
                let Ok(node) = self.cluster.node(endpoint) else {
                    continue;
                };
                let (count, needed, open) = (count.clone(), masters.len(), self.open.clone());
                let feed = Feed {
                    connector: node.regular_connector(),
                    timeout: self.timeout,
                    sink: self.sink.clone(),
                    opened: Arc::new(move |opened| {
                        if opened {
                            let now = count.fetch_add(1, Ordering::AcqRel) + 1;
                            open.send_replace(now == needed);
                        } else {
                            count.fetch_sub(1, Ordering::AcqRel);
                            open.send_replace(false);
                        }
                    }),
                };
                let span = tracing::info_span!("master", node = %endpoint);
                let drive = feed.drive(feeds_want.clone(), round.clone());
                tokio::spawn(tracing::Instrument::instrument(drive, span));
            }
            // Until the daemon stops, no client tracks, or the masters change.
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = async { let _ = wanted.wait_for(|wanted| !*wanted).await; } => break,
                    changed = changes.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let now = self.cluster.masters_now();
                        let now = now.map(|now| now.into_iter().collect::<HashSet<Endpoint>>());
                        if now.is_some_and(|now| now != masters_set) {
                            break;
                        }
                    }
                }
            }
            round.cancel();
            self.open.send_replace(false);
        }
    }
}

/// A connection of the REGULAR lane's user, named [`NAME`], speaking RESP3, told of every key.
async fn open(connector: &Connector) -> Result<Conn, Lost> {
    let tracking: [&[u8]; 4] = [b"CLIENT", b"TRACKING", b"ON", b"BCAST"];
    tracking_conn::open(connector, NAME, "CLIENT TRACKING ON BCAST", &tracking).await
}

/// What an `invalidate` push says: `[invalidate, [key …]]`, or `[invalidate, null]` for a flush.
/// Anything else pushed is not an invalidation; anything malformed is taken as everything.
fn pushed(items: Vec<Frame>) -> Option<Event> {
    let mut items = items.into_iter();
    let is_invalidate = items
        .next()
        .as_ref()
        .and_then(Frame::as_bytes)
        .is_some_and(|kind| kind.eq_ignore_ascii_case(b"invalidate"));
    if !is_invalidate {
        return None;
    }
    Some(match items.next() {
        Some(Frame::Array(keys) | Frame::Set(keys)) => {
            let keys: Option<Vec<Bytes>> = keys
                .into_iter()
                .map(|key| key.as_bytes().map(|key| Bytes::copy_from_slice(key)))
                .collect();
            match keys {
                Some(keys) => Event::Keys(keys),
                None => Event::Everything,
            }
        }
        _ => Event::Everything,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Frame {
        Frame::Bulk(Bytes::copy_from_slice(text.as_bytes()))
    }

    #[test]
    fn an_invalidate_push_names_its_keys_and_a_null_one_everything() {
        let keys = pushed(vec![
            bulk("invalidate"),
            Frame::Array(vec![bulk("a"), bulk("b")]),
        ]);
        assert_eq!(
            keys,
            Some(Event::Keys(vec![
                Bytes::from_static(b"a"),
                Bytes::from_static(b"b")
            ]))
        );
        assert_eq!(
            pushed(vec![bulk("invalidate"), Frame::Null3]),
            Some(Event::Everything)
        );
        // A key that is not a string cannot be told apart: everything, to be sure.
        assert_eq!(
            pushed(vec![
                bulk("invalidate"),
                Frame::Array(vec![Frame::Integer(1)])
            ]),
            Some(Event::Everything)
        );
        assert_eq!(pushed(vec![bulk("message"), bulk("x")]), None);
    }
}
