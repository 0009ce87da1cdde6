//! The near cache (docs/cache.md): `GET`, `HMGET` and `HGETALL` replies of configured keys kept in
//! the daemon (a hash's fields merged while the key is unchanged), filled only
//! through one tracking connection (`CLIENT TRACKING ON`, RESP3) whose `invalidate` pushes arrive
//! in order with the fills' replies, and dropped on every sign that Redis's value may have changed.
//! [`store`] is the memory and its rules, [`tracking`] the connection, [`metrics`] what `/metrics`
//! shows. Which commands are cacheable, and when a hit may be served, is the front door's
//! (`daemon/src/server/resp/cached.rs`): this crate never sees a client.
//!
//! On one server (standalone, or a Sentinel group's master) one tracking connection; on a Redis
//! Cluster one per master of the slot map in use, each fill sent to its key's master's, hits
//! served only while all are up. A fill its master refuses with a redirect (the slot moved) is
//! read by its session as if uncached; a key that moves is deleted on one master and restored on
//! the other, both told; when the masters change (a failover, a node added) the connections are
//! replaced and the cache emptied.

mod masters;
mod metrics;
mod store;
mod tracking;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use std::collections::HashMap;

use parking_lot::{Mutex, RwLock};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_model::Protocol;

pub use store::{Bounds, Bulk, Cause, Filled, Hash, Store, Ticket, Value, ENTRY_OVERHEAD};

use crate::cluster::ClusterLanes;
use crate::{Endpoint, Lanes};
use metrics::CacheMetrics;

/// How many fills may wait to be written on the tracking connection; past it a miss is forwarded
/// as if uncached.
const FILL_QUEUE: usize = 4096;

/// What a fill read got from Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    Value(Value),
    /// Redis refused the read (`WRONGTYPE`, `NOPERM` …): passed on, never kept. The error line as
    /// Redis wrote it (`-…\r\n`).
    Refused(Bytes),
}

/// Why a fill got no reply: the tracking connection was lost (the read may have run; it changed
/// nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the near cache's tracking connection was lost")]
pub struct FillLost;

/// What a fill reads of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// `GET`.
    Get,
    /// `HMGET` of these fields (an `HGET` is one).
    Fields(Vec<Bytes>),
    /// `HGETALL`.
    Hash,
}

/// A read waiting for the tracking connection.
struct Fill {
    key: Bytes,
    read: Read,
    ticket: Ticket,
    reply: oneshot::Sender<Result<Fetched, FillLost>>,
}

/// The near cache. Cheap to clone; all clones share it.
#[derive(Clone)]
pub struct Cache(Arc<Shared>);

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cache")
    }
}

/// The same cache.
impl PartialEq for Cache {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

struct Shared {
    store: Mutex<Store>,
    metrics: CacheMetrics,
    fills: Fills,
    /// The tracking connection is up and tracking: only then may anything be served or filled.
    tracking: AtomicBool,
}

impl Cache {
    /// Starts the cache on `lanes`' server (or cluster): its tracking connections open (and
    /// reopen) in the background until `stop`. Its metrics go in `registry` as `cache_…`.
    pub fn start(
        lanes: &Lanes,
        bounds: Bounds,
        registry: &mut Registry,
        stop: CancellationToken,
    ) -> Cache {
        let timeout = lanes.regular_timeout();
        let metrics = CacheMetrics::register(registry.sub_registry_with_prefix("cache"));
        let span = tracing::info_span!("cache");
        let shared = |fills| {
            Cache(Arc::new(Shared {
                store: Mutex::new(Store::new(bounds)),
                metrics,
                fills,
                tracking: AtomicBool::new(false),
            }))
        };
        match (lanes.regular_connector(), lanes.cluster()) {
            (Some(connector), _) => {
                let (fills, queue) = mpsc::channel(FILL_QUEUE);
                let cache = shared(Fills::One(fills));
                let up: Arc<dyn Fn(bool) + Send + Sync> = {
                    let cache = cache.clone();
                    Arc::new(move |up| cache.set_tracking(up))
                };
                let drive = tracking::drive(cache.clone(), connector, timeout, queue, up, stop);
                tokio::spawn(tracing::Instrument::instrument(drive, span));
                cache
            }
            (None, Some(cluster)) => {
                let cache = shared(Fills::Cluster {
                    cluster: cluster.clone(),
                    masters: RwLock::new(HashMap::new()),
                });
                let drive = masters::drive(cache.clone(), cluster.clone(), timeout, stop);
                tokio::spawn(tracing::Instrument::instrument(drive, span));
                cache
            }
            (None, None) => unreachable!("lanes lead to one server or to a cluster"),
        }
    }

    /// What `answer` makes of `key`'s entry, if kept and fresh at `now`, while the tracking
    /// connection is up: a hit when it answers (a hash's entry may not know the field asked for).
    ///
    /// `now` is the caller's reading of the clock, which a session takes once per turn of its
    /// loop, before it serves the commands it read (as Redis reads its clock once per command, not
    /// per key): the precise clock was 2.6% of a pipelined hit's cycles.
    pub fn answer<T>(
        &self,
        key: &[u8],
        now: Instant,
        answer: impl FnOnce(&Value) -> Option<T>,
    ) -> Option<T> {
        if !self.0.tracking.load(Ordering::Acquire) {
            return None;
        }
        let mut store = self.0.store.lock();
        let answered = store.get(key, now).and_then(answer);
        match &answered {
            Some(_) => {
                self.0.metrics.hits.inc();
            }
            None => self.0.metrics.sizes(&store),
        }
        answered
    }

    /// [`Cache::answer`] of each of `keys`, looked up together (one moment of the cache), at `now`
    /// (as [`Cache::answer`]).
    pub fn hits(&self, keys: &[Bytes], now: Instant) -> Vec<Option<Value>> {
        if !self.0.tracking.load(Ordering::Acquire) {
            return vec![None; keys.len()];
        }
        let mut store = self.0.store.lock();
        let values: Vec<_> = keys
            .iter()
            .map(|key| store.get(key, now).cloned())
            .collect();
        let hits = values.iter().filter(|value| value.is_some()).count();
        self.0.metrics.hits.inc_by(hits as u64);
        if hits < keys.len() {
            self.0.metrics.sizes(&store);
        }
        values
    }

    /// Every one of `keys`' entries, looked up together, for a read answered only when all are
    /// here and that fills nothing on a miss (`EXISTS`, `STRLEN`): counted as hits then, and as
    /// one miss otherwise.
    pub fn all_hit(&self, keys: &[Bytes], now: Instant) -> Option<Vec<Value>> {
        if !self.0.tracking.load(Ordering::Acquire) {
            return None;
        }
        let mut store = self.0.store.lock();
        let mut values = Vec::with_capacity(keys.len());
        for key in keys {
            match store.get(key, now) {
                Some(value) => values.push(value.clone()),
                None => {
                    self.0.metrics.misses.inc();
                    self.0.metrics.sizes(&store);
                    return None;
                }
            }
        }
        self.0.metrics.hits.inc_by(keys.len() as u64);
        Some(values)
    }

    /// A miss: `key` read (`read`) through the tracking connection, its reply kept if nothing
    /// invalidated the key meanwhile. `None` when the connection is down or its queue is full: the
    /// caller reads the key as if uncached.
    pub fn fill(
        &self,
        key: Bytes,
        read: Read,
    ) -> Option<impl Future<Output = Result<Fetched, FillLost>> + Send + 'static> {
        if !self.0.tracking.load(Ordering::Acquire) {
            return None;
        }
        // Its own copies: a caller's key (and fields) are slices of a client's read buffer (a hit
        // costs no copy), which the entry must not keep alive, nor count a few bytes of against
        // `max_bytes`.
        let key = Bytes::copy_from_slice(&key);
        let read = match read {
            Read::Fields(fields) => {
                Read::Fields(fields.iter().map(|f| Bytes::copy_from_slice(f)).collect())
            }
            read => read,
        };
        let ticket = self.0.store.lock().begin(&key, Instant::now());
        let (reply, answer) = oneshot::channel();
        let fill = Fill {
            key: key.clone(),
            read,
            ticket,
            reply,
        };
        if self.0.fills.send(fill).is_err() {
            // Never sent: the ticket is given back.
            self.0
                .store
                .lock()
                .complete(&key, ticket, None, Instant::now());
            return None;
        }
        self.0.metrics.misses.inc();
        Some(async move { answer.await.unwrap_or(Err(FillLost)) })
    }

    /// `key` was written through the daemon: its entry is dropped, and no read in flight fills it.
    /// Called before the write's reply reaches its client.
    pub fn written(&self, key: &[u8]) {
        self.invalidate(key, Cause::Write);
    }

    /// `key` was written (`Cause::Write`) or read past the cache (`Cause::Read`) through the
    /// daemon: as [`Cache::written`], so that no later hit shows an older value than that
    /// command's reply did.
    pub fn passed(&self, key: &[u8], cause: Cause) {
        self.invalidate(key, cause);
    }

    /// Everything is dropped (a `FLUSHDB` or `FLUSHALL` through the daemon, among others).
    pub fn flush(&self, cause: Cause) {
        let mut store = self.0.store.lock();
        let dropped = store.flush();
        self.0.metrics.invalidated(cause, dropped as u64);
        self.0.metrics.sizes(&store);
    }

    fn invalidate(&self, key: &[u8], cause: Cause) {
        let mut store = self.0.store.lock();
        if store.invalidate(key) {
            self.0.metrics.invalidated(cause, 1);
            self.0.metrics.sizes(&store);
        }
    }

    /// A fill's reply arrived (or, `None`, never will); the key expires in Redis in `expires_in`.
    fn complete(
        &self,
        key: &Bytes,
        ticket: Ticket,
        value: Option<Value>,
        expires_in: Option<std::time::Duration>,
    ) {
        let mut store = self.0.store.lock();
        let now = Instant::now();
        if let Some(filled) = store.complete_expiring(key, ticket, value, expires_in, now) {
            self.0.metrics.filled(filled);
            self.0.metrics.sizes(&store);
        }
    }

    fn set_tracking(&self, on: bool) {
        self.0.tracking.store(on, Ordering::Release);
    }

    /// What `/v1/cache` shows: the counts and the largest entries.
    pub fn summary(&self, largest: usize) -> Summary {
        let store = self.0.store.lock();
        Summary {
            tracking: self.0.tracking.load(Ordering::Acquire),
            entries: store.len(),
            bytes: store.bytes(),
            bounds: store.bounds(),
            hits: self.0.metrics.hits.get(),
            misses: self.0.metrics.misses.get(),
            largest: store.largest(largest),
        }
    }
}

/// Where fills go: the one tracking connection, or the one of the key's master.
enum Fills {
    One(mpsc::Sender<Fill>),
    Cluster {
        cluster: Arc<ClusterLanes>,
        /// Each master's tracking connection's queue, for the slot map in use (`masters.rs`).
        masters: RwLock<HashMap<Endpoint, mpsc::Sender<Fill>>>,
    },
}

impl Fills {
    /// Queues `fill` for its connection; given back when there is none (a cluster's key whose
    /// master is not known yet) or its queue is full.
    fn send(&self, fill: Fill) -> Result<(), Fill> {
        let sent = match self {
            Fills::One(queue) => queue.try_send(fill),
            Fills::Cluster { cluster, masters } => {
                let slot = crate::Slot::of(&fill.key);
                let Some(master) = cluster.target_now(&crate::Route::Slot(slot)) else {
                    return Err(fill);
                };
                let masters = masters.read();
                let Some(queue) = masters.get(&master) else {
                    return Err(fill);
                };
                queue.try_send(fill)
            }
        };
        sent.map_err(|error| match error {
            mpsc::error::TrySendError::Full(fill) | mpsc::error::TrySendError::Closed(fill) => fill,
        })
    }
}

/// The cache at a glance.
#[derive(Debug, Clone)]
pub struct Summary {
    pub tracking: bool,
    pub entries: usize,
    pub bytes: usize,
    pub bounds: Bounds,
    pub hits: u64,
    pub misses: u64,
    /// Keys and their entries' sizes, largest first.
    pub largest: Vec<(Bytes, usize)>,
}

/// `value` as the reply to a `GET`, in `protocol`.
pub fn encode_get(value: &Value, protocol: Protocol) -> Bytes {
    match (value, protocol) {
        (Value::String(bulk), _) => bulk.reply().clone(),
        (Value::Missing, Protocol::Resp2) => Bytes::from_static(b"$-1\r\n"),
        (Value::Missing, Protocol::Resp3) => Bytes::from_static(b"_\r\n"),
        // Never asked: a hash's entry answers a GET with WRONGTYPE, which the front door leaves
        // to Redis.
        (Value::Hash(_), _) => Bytes::from_static(
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        ),
    }
}

/// One field's value (`None`: absent) as the reply to an `HGET`, in `protocol`.
pub fn encode_field(value: Option<Bytes>, protocol: Protocol) -> Bytes {
    match value {
        Some(bytes) => Bulk::new(&bytes).reply().clone(),
        None => encode_get(&Value::Missing, protocol),
    }
}

/// A whole hash's fields and values as the reply to an `HGETALL`: an array of fields and values
/// in RESP2, a map in RESP3, in the order Redis gave them.
pub fn encode_hash(pairs: &[(Bytes, Bytes)], protocol: Protocol) -> Bytes {
    let mut out = BytesMut::new();
    match protocol {
        Protocol::Resp2 => tollgate_resp::encode_header(b'*', pairs.len() * 2, &mut out),
        Protocol::Resp3 => tollgate_resp::encode_header(b'%', pairs.len(), &mut out),
    }
    for (field, value) in pairs {
        tollgate_resp::encode_bulk(field, &mut out);
        tollgate_resp::encode_bulk(value, &mut out);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_reply_is_written_as_redis_writes_it_in_each_protocol() {
        let value = Value::String(Bulk::new(b"hi"));
        assert_eq!(encode_get(&value, Protocol::Resp2), &b"$2\r\nhi\r\n"[..]);
        assert_eq!(encode_get(&value, Protocol::Resp3), &b"$2\r\nhi\r\n"[..]);
        assert_eq!(
            encode_get(&Value::Missing, Protocol::Resp2),
            &b"$-1\r\n"[..]
        );
        assert_eq!(encode_get(&Value::Missing, Protocol::Resp3), &b"_\r\n"[..]);
    }

    #[test]
    fn a_hash_reply_is_written_as_redis_writes_it_in_each_protocol() {
        let pairs = [(Bytes::from_static(b"f"), Bytes::from_static(b"v1"))];
        assert_eq!(
            encode_hash(&pairs, Protocol::Resp2),
            &b"*2\r\n$1\r\nf\r\n$2\r\nv1\r\n"[..]
        );
        assert_eq!(
            encode_hash(&pairs, Protocol::Resp3),
            &b"%1\r\n$1\r\nf\r\n$2\r\nv1\r\n"[..]
        );
        assert_eq!(encode_hash(&[], Protocol::Resp2), &b"*0\r\n"[..]);
        assert_eq!(encode_hash(&[], Protocol::Resp3), &b"%0\r\n"[..]);
        assert_eq!(encode_field(None, Protocol::Resp3), &b"_\r\n"[..]);
    }
}
