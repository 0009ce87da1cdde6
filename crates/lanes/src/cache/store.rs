//! The near cache's memory: keys → the value Redis gave for them, bounded in bytes (evicting the
//! least recently used), in entry size and in age; and the tickets that keep a read from filling
//! the cache with a value an invalidation has already made stale. Pure: no I/O, no clock of its
//! own (every call is told the time), so every rule here is tested without a server.
//!
//! **The fill race.** A read sent to Redis takes a [`Ticket`] ([`Store::begin`]); an invalidation
//! of its key, or a flush of everything, that arrives before the read's reply makes the ticket
//! stale, and [`Store::complete`] then refuses the fill. Only keys with a read in flight are
//! remembered for this, so the bookkeeping is bounded by the reads in flight.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hashlink::LinkedHashMap;
use tokio::time::Instant;

/// What one entry costs beyond its key and value: the map's slot and its links in the recency
/// order, the entry itself. An estimate, on the high side, so that `max_bytes` bounds real memory.
pub const ENTRY_OVERHEAD: usize = 128;

/// The store's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Every entry together (values, keys and [`ENTRY_OVERHEAD`] each).
    pub max_bytes: usize,
    /// One entry, counted as in `max_bytes`; a larger value is served but not kept.
    pub max_entry_bytes: usize,
    /// The oldest an entry may be when served, counted from when its read was sent.
    pub max_staleness: Duration,
}

/// What Redis answered a read of a key: a string (`GET`), fields of a hash (`HMGET`, `HGETALL`),
/// or that the key does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    String(Bulk),
    /// Some or all of a hash's fields.
    Hash(Arc<Hash>),
    /// A key that does not exist (a null `GET`, an empty `HGETALL`, with `PTTL` -2): worth
    /// keeping too, and it answers every read of any type.
    Missing,
}

/// A string value, kept as a `GET` reply writes it (`$<len>\r\n<value>\r\n`, the same in RESP2
/// and RESP3): a hit is answered with the kept bytes as they are, with no allocation or copy (the
/// encoding was a third of a pipelined hit's own work). Made from a copy of Redis's reply, so an
/// entry never holds on to a connection's read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bulk {
    encoded: Bytes,
    /// Where the value starts in `encoded`, after the header.
    start: usize,
}

impl Bulk {
    pub fn new(value: &[u8]) -> Bulk {
        let mut encoded = bytes::BytesMut::with_capacity(value.len() + 24);
        tollgate_resp::encode_bulk(value, &mut encoded);
        let start = encoded.len() - value.len() - 2;
        Bulk {
            encoded: encoded.freeze(),
            start,
        }
    }

    /// The value, sharing the kept bytes.
    pub fn value(&self) -> Bytes {
        self.encoded.slice(self.start..self.encoded.len() - 2)
    }

    /// The value's length in bytes.
    pub fn len(&self) -> usize {
        self.encoded.len() - self.start - 2
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value as the reply to a `GET`.
    pub fn reply(&self) -> &Bytes {
        &self.encoded
    }

    /// What it holds: the value and its header.
    fn size(&self) -> usize {
        self.encoded.len()
    }
}

/// What one field's hash bookkeeping costs beyond its name and value: an estimate on the high
/// side, as [`ENTRY_OVERHEAD`] is.
const FIELD_OVERHEAD: usize = 64;

/// A hash's fields as Redis gave them: every one (`HGETALL`, in Redis's order), or those some
/// `HMGET`s asked for, each with its value or absent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hash {
    fields: HashMap<Bytes, Option<Bytes>>,
    /// Every field, in `HGETALL`'s order, when one filled the entry.
    all: Option<Vec<Bytes>>,
}

impl Hash {
    /// The whole hash, as `HGETALL` answered it.
    pub fn whole(pairs: Vec<(Bytes, Bytes)>) -> Hash {
        let all = pairs.iter().map(|(field, _)| field.clone()).collect();
        Hash {
            fields: pairs
                .into_iter()
                .map(|(field, value)| (field, Some(value)))
                .collect(),
            all: Some(all),
        }
    }

    /// Some fields, as `HMGET` answered them (`None`: absent).
    pub fn fields(answers: impl IntoIterator<Item = (Bytes, Option<Bytes>)>) -> Hash {
        Hash {
            fields: answers.into_iter().collect(),
            all: None,
        }
    }

    /// `field`'s value (`Some(None)`: the hash has no such field), or `None` when not known.
    pub fn field(&self, field: &[u8]) -> Option<Option<Bytes>> {
        match self.fields.get(field) {
            Some(value) => Some(value.clone()),
            None if self.all.is_some() => Some(None),
            None => None,
        }
    }

    /// Every field and value in Redis's order, when the whole hash is known.
    pub fn all(&self) -> Option<Vec<(Bytes, Bytes)>> {
        let all = self.all.as_ref()?;
        Some(
            all.iter()
                .map(|field| {
                    let value = self.fields.get(field).cloned().flatten();
                    (field.clone(), value.unwrap_or_default())
                })
                .collect(),
        )
    }

    /// Whether no field of it has a value (every field read absent).
    pub fn is_empty(&self) -> bool {
        self.fields.values().all(Option::is_none)
    }

    /// What two reads of the same unchanged hash know together: the whole one if either is.
    fn merged(&self, newer: &Hash) -> Hash {
        if newer.all.is_some() {
            return newer.clone();
        }
        if self.all.is_some() {
            return self.clone();
        }
        let mut fields = self.fields.clone();
        fields.extend(newer.fields.iter().map(|(k, v)| (k.clone(), v.clone())));
        Hash { fields, all: None }
    }

    fn len(&self) -> usize {
        self.fields
            .iter()
            .map(|(field, value)| {
                field.len() + value.as_ref().map_or(0, Bytes::len) + FIELD_OVERHEAD
            })
            .sum()
    }
}

impl Value {
    fn len(&self) -> usize {
        match self {
            Value::String(bulk) => bulk.size(),
            Value::Hash(hash) => hash.len(),
            Value::Missing => 0,
        }
    }
}

/// Taken when a read is sent; shows at its reply whether anything invalidated the key meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The store's invalidation sequence when the read was sent.
    seq: u64,
    sent: Instant,
}

/// What became of a fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filled {
    /// Kept; `evicted` older entries made room for it.
    Kept { evicted: usize },
    /// An invalidation of the key (or a flush) arrived while the read was in flight.
    Raced,
    /// Larger than `max_entry_bytes` (or than `max_bytes`).
    TooLarge,
    /// Already older than `max_staleness` when its reply came.
    TooOld,
}

/// Why entries are dropped, as `tollgate_cache_invalidations_total{cause}` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Redis said the key changed (a tracking `invalidate` push).
    Redis,
    /// A write through the daemon.
    Write,
    /// A read through the daemon that did not come from the cache (an uncached command, or a
    /// cacheable read forwarded): what it saw may be newer than the entry.
    Read,
    /// Redis flushed its keys (`FLUSHDB`/`FLUSHALL`: a null invalidation).
    Flush,
    /// The tracking connection was lost or opened again: what it tracked is unknown.
    Connection,
}

impl Cause {
    pub fn label(self) -> &'static str {
        match self {
            Cause::Redis => "redis",
            Cause::Write => "write",
            Cause::Read => "read",
            Cause::Flush => "flush",
            Cause::Connection => "connection",
        }
    }
}

struct Entry {
    value: Value,
    /// When the read that filled it was sent: its age is counted from then.
    born: Instant,
    /// `born` plus `max_staleness`: past it the entry is not served (`None`: a staleness bound
    /// beyond the clock's range, never reached). Kept so that a hit compares two instants rather
    /// than working out the entry's age.
    stale_after: Option<Instant>,
    /// When the key expires in Redis, counted from when the read was sent (so no later than
    /// Redis's own expiry): Redis's invalidation of an expired key may come late (its active
    /// expiry samples keys), so the entry is not served past it.
    expires: Option<Instant>,
    /// The ticket's sequence of the fill, so that an older read never replaces a newer one.
    seq: u64,
    size: usize,
}

/// A key with reads in flight: how many, and the last invalidation of it seen meanwhile.
#[derive(Default)]
struct InFlight {
    reads: usize,
    invalidated: u64,
}

/// The cache's entries and tickets. Not synchronised: the owner locks it.
pub struct Store {
    bounds: Bounds,
    /// Least recently used first: a hit moves its entry to the back and eviction pops the front,
    /// both O(1) (a recency index ordered by stamps cost a tree search each way per hit). Keys
    /// come from clients, so the hasher is the standard library's keyed SipHash.
    entries: LinkedHashMap<Bytes, Entry, RandomState>,
    bytes: usize,
    /// Bumped by every invalidation and flush.
    seq: u64,
    /// The sequence of the last flush of everything.
    flushed: u64,
    in_flight: HashMap<Bytes, InFlight>,
}

impl Store {
    pub fn new(bounds: Bounds) -> Self {
        Store {
            bounds,
            entries: LinkedHashMap::with_hasher(RandomState::new()),
            bytes: 0,
            seq: 0,
            flushed: 0,
            in_flight: HashMap::new(),
        }
    }

    /// The value of `key`, if kept and younger than `max_staleness` at `now` (an older one is
    /// dropped). A hit makes the entry the most recently used.
    pub fn get(&mut self, key: &[u8], now: Instant) -> Option<&Value> {
        // One lookup: the entry moves to the back first (and is read there), and is dropped if it
        // may not be served. Borrowed: a hit's caller copies what it needs (a reference count).
        let entry = self.entries.to_back(key)?;
        let expired = entry.expires.is_some_and(|expires| expires <= now);
        if expired || entry.stale_after.is_some_and(|stale| now > stale) {
            self.remove(key);
            return None;
        }
        self.entries.back().map(|(_, entry)| &entry.value)
    }

    /// A read of `key` is being sent now.
    pub fn begin(&mut self, key: &Bytes, now: Instant) -> Ticket {
        self.in_flight.entry(key.clone()).or_default().reads += 1;
        Ticket {
            seq: self.seq,
            sent: now,
        }
    }

    /// The reply of the read that took `ticket`: kept if nothing invalidated the key since, it fits
    /// and it is young enough at `now`; `None` when the read failed (nothing is kept).
    pub fn complete(
        &mut self,
        key: &Bytes,
        ticket: Ticket,
        value: Option<Value>,
        now: Instant,
    ) -> Option<Filled> {
        self.complete_expiring(key, ticket, value, None, now)
    }

    /// [`Store::complete`] of a key that Redis said expires in `expires_in` (its `PTTL` right
    /// after the read): the entry is not served from then on.
    pub fn complete_expiring(
        &mut self,
        key: &Bytes,
        ticket: Ticket,
        value: Option<Value>,
        expires_in: Option<Duration>,
        now: Instant,
    ) -> Option<Filled> {
        let invalidated = match self.in_flight.get_mut(key) {
            Some(in_flight) => {
                in_flight.reads -= 1;
                let invalidated = in_flight.invalidated;
                if in_flight.reads == 0 {
                    self.in_flight.remove(key);
                }
                invalidated
            }
            // A read not begun here: nothing shows what happened meanwhile.
            None => u64::MAX,
        };
        let value = value?;
        if invalidated > ticket.seq || self.flushed > ticket.seq {
            return Some(Filled::Raced);
        }
        if now.saturating_duration_since(ticket.sent) > self.bounds.max_staleness {
            return Some(Filled::TooOld);
        }
        // Fields of a hash already kept join the new ones: the kept entry is still here, so no
        // invalidation of the key came between the two reads (each would have dropped it, and
        // one before the new read's reply would have made its ticket stale). It is as old as
        // its oldest read.
        let (value, born, expires_in) = match (self.entries.get(key), &value) {
            (Some(kept), Value::Hash(newer)) if kept.seq <= ticket.seq => match &kept.value {
                Value::Hash(older) => {
                    let kept_expiry = kept
                        .expires
                        .map(|at| at.saturating_duration_since(ticket.sent));
                    let expires_in = match (kept_expiry, expires_in) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    (
                        Value::Hash(Arc::new(older.merged(newer))),
                        kept.born.min(ticket.sent),
                        expires_in,
                    )
                }
                _ => (value, ticket.sent, expires_in),
            },
            _ => (value, ticket.sent, expires_in),
        };
        let size = value.len() + key.len() + ENTRY_OVERHEAD;
        if size > self.bounds.max_entry_bytes || size > self.bounds.max_bytes {
            return Some(Filled::TooLarge);
        }
        if let Some(kept) = self.entries.get(key) {
            // A later read's reply is already kept (replies on one connection come in order, so
            // this is only a guard).
            if kept.seq > ticket.seq {
                return Some(Filled::Kept { evicted: 0 });
            }
            self.remove(key);
        }
        let mut evicted = 0;
        while self.bytes + size > self.bounds.max_bytes {
            let Some((_, entry)) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= entry.size;
            evicted += 1;
        }
        self.entries.insert(
            key.clone(),
            Entry {
                value,
                born,
                stale_after: born.checked_add(self.bounds.max_staleness),
                expires: expires_in.map(|ttl| ticket.sent + ttl),
                seq: ticket.seq,
                size,
            },
        );
        self.bytes += size;
        Some(Filled::Kept { evicted })
    }

    /// `key` changed: its entry is dropped and the reads of it in flight will not fill. Whether an
    /// entry was dropped.
    pub fn invalidate(&mut self, key: &[u8]) -> bool {
        self.seq += 1;
        if let Some(in_flight) = self.in_flight.get_mut(key) {
            in_flight.invalidated = self.seq;
        }
        self.remove(key)
    }

    /// Everything is dropped, and no read in flight will fill. How many entries were dropped.
    pub fn flush(&mut self) -> usize {
        self.seq += 1;
        self.flushed = self.seq;
        let dropped = self.entries.len();
        self.entries.clear();
        self.bytes = 0;
        dropped
    }

    fn remove(&mut self, key: &[u8]) -> bool {
        match self.entries.remove(key) {
            Some(entry) => {
                self.bytes -= entry.size;
                true
            }
            None => false,
        }
    }

    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// The bytes kept, counted as `max_bytes` counts them.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many keys have reads in flight (bounded by the reads in flight).
    pub fn reads_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The largest entries' keys and sizes, largest first (for `/v1/cache`).
    pub fn largest(&self, count: usize) -> Vec<(Bytes, usize)> {
        let mut sizes: Vec<_> = self
            .entries
            .iter()
            .map(|(key, entry)| (key.clone(), entry.size))
            .collect();
        sizes.sort_by_key(|(_, size)| std::cmp::Reverse(*size));
        sizes.truncate(count);
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> Bounds {
        Bounds {
            max_bytes: 10 * (ENTRY_OVERHEAD + 16),
            max_entry_bytes: ENTRY_OVERHEAD + 64,
            max_staleness: Duration::from_secs(60),
        }
    }

    fn key(text: &str) -> Bytes {
        Bytes::copy_from_slice(text.as_bytes())
    }

    fn string(text: &str) -> Value {
        Value::String(Bulk::new(text.as_bytes()))
    }

    fn fill(store: &mut Store, k: &str, v: &str, now: Instant) -> Option<Filled> {
        let ticket = store.begin(&key(k), now);
        store.complete(&key(k), ticket, Some(string(v)), now)
    }

    #[test]
    fn a_bulk_keeps_its_value_as_a_get_reply() {
        for value in [&b""[..], b"hi", &[b'x'; 1000][..], b"a\r\nb"] {
            let bulk = Bulk::new(value);
            assert_eq!(bulk.value(), value);
            assert_eq!(bulk.len(), value.len());
            let mut reply = bytes::BytesMut::new();
            tollgate_resp::encode(
                &tollgate_resp::Frame::Bulk(Bytes::copy_from_slice(value)),
                &mut reply,
            );
            assert_eq!(bulk.reply(), &reply.freeze());
        }
    }

    #[test]
    fn a_fill_is_served_until_invalidated() {
        let now = Instant::now();
        let mut store = Store::new(bounds());
        assert_eq!(store.get(b"a", now).cloned(), None);
        assert_eq!(
            fill(&mut store, "a", "1", now),
            Some(Filled::Kept { evicted: 0 })
        );
        assert_eq!(store.get(b"a", now).cloned(), Some(string("1")));
        assert!(store.invalidate(b"a"));
        assert_eq!(store.get(b"a", now).cloned(), None);
        assert_eq!(store.bytes(), 0);
        assert_eq!(store.reads_in_flight(), 0);
    }

    #[test]
    fn an_invalidation_while_the_read_is_in_flight_refuses_the_fill() {
        let now = Instant::now();
        let mut store = Store::new(bounds());
        let ticket = store.begin(&key("a"), now);
        store.invalidate(b"a");
        assert_eq!(
            store.complete(&key("a"), ticket, Some(string("old")), now),
            Some(Filled::Raced)
        );
        assert_eq!(store.get(b"a", now).cloned(), None);
        // Another key's invalidation does not matter.
        let ticket = store.begin(&key("a"), now);
        store.invalidate(b"b");
        assert_eq!(
            store.complete(&key("a"), ticket, Some(string("new")), now),
            Some(Filled::Kept { evicted: 0 })
        );
        assert_eq!(store.reads_in_flight(), 0);
    }

    #[test]
    fn a_flush_while_the_read_is_in_flight_refuses_the_fill() {
        let now = Instant::now();
        let mut store = Store::new(bounds());
        fill(&mut store, "b", "1", now);
        let ticket = store.begin(&key("a"), now);
        assert_eq!(store.flush(), 1);
        assert_eq!(
            store.complete(&key("a"), ticket, Some(string("1")), now),
            Some(Filled::Raced)
        );
        assert!(store.is_empty());
    }

    #[test]
    fn a_failed_read_keeps_nothing_and_forgets_its_ticket() {
        let now = Instant::now();
        let mut store = Store::new(bounds());
        let ticket = store.begin(&key("a"), now);
        assert_eq!(store.complete(&key("a"), ticket, None, now), None);
        assert_eq!(store.reads_in_flight(), 0);
        assert!(store.is_empty());
    }

    #[test]
    fn a_staleness_bound_past_the_clocks_range_never_expires_an_entry() {
        let start = Instant::now();
        let mut store = Store::new(Bounds {
            max_staleness: Duration::MAX,
            ..bounds()
        });
        fill(&mut store, "a", "1", start);
        let later = start + Duration::from_secs(365 * 24 * 3600);
        assert_eq!(store.get(b"a", later).cloned(), Some(string("1")));
    }

    #[test]
    fn an_entry_is_never_served_older_than_max_staleness() {
        let start = Instant::now();
        let mut store = Store::new(bounds());
        fill(&mut store, "a", "1", start);
        let limit = bounds().max_staleness;
        assert_eq!(store.get(b"a", start + limit).cloned(), Some(string("1")));
        assert_eq!(
            store
                .get(b"a", start + limit + Duration::from_millis(1))
                .cloned(),
            None
        );
        assert!(store.is_empty());
        // Counted from when the read was sent, not when its reply came.
        let ticket = store.begin(&key("a"), start);
        let late = start + limit + Duration::from_millis(1);
        assert_eq!(
            store.complete(&key("a"), ticket, Some(string("1")), late),
            Some(Filled::TooOld)
        );
    }

    #[test]
    fn entries_over_max_entry_bytes_are_not_kept() {
        let now = Instant::now();
        let mut store = Store::new(bounds());
        // An entry counts its key, its value as kept (with the reply's header) and the overhead.
        let size = |n: usize| 1 + string(&"x".repeat(n)).len() + ENTRY_OVERHEAD;
        let longest = (0..100)
            .filter(|&n| size(n) <= bounds().max_entry_bytes)
            .max()
            .unwrap();
        assert_eq!(
            size(longest),
            bounds().max_entry_bytes,
            "the bound is reached"
        );
        let big = "x".repeat(longest + 1);
        assert_eq!(fill(&mut store, "a", &big, now), Some(Filled::TooLarge));
        assert!(store.is_empty());
        let fits = "x".repeat(longest);
        assert_eq!(
            fill(&mut store, "a", &fits, now),
            Some(Filled::Kept { evicted: 0 })
        );
    }

    #[test]
    fn the_least_recently_used_entry_is_evicted_first() {
        let now = Instant::now();
        let bounds = Bounds {
            max_bytes: 3 * (ENTRY_OVERHEAD + 1 + string("1").len()),
            ..bounds()
        };
        let mut store = Store::new(bounds);
        for k in ["a", "b", "c"] {
            fill(&mut store, k, "1", now);
        }
        assert_eq!(store.get(b"a", now).cloned(), Some(string("1")));
        assert_eq!(
            fill(&mut store, "d", "1", now),
            Some(Filled::Kept { evicted: 1 })
        );
        assert_eq!(store.get(b"b", now).cloned(), None);
        for k in ["a", "c", "d"] {
            assert!(store.get(k.as_bytes(), now).is_some(), "{k}");
        }
        assert!(store.bytes() <= bounds.max_bytes);
    }

    #[test]
    fn an_entry_is_not_served_past_the_key_s_expiry_in_redis() {
        let start = Instant::now();
        let mut store = Store::new(bounds());
        let ticket = store.begin(&key("a"), start);
        let ttl = Duration::from_millis(500);
        let later = start + Duration::from_millis(100);
        store.complete_expiring(&key("a"), ticket, Some(string("1")), Some(ttl), later);
        // Counted from when the read was sent: never later than Redis's own expiry.
        assert_eq!(
            store
                .get(b"a", start + ttl - Duration::from_millis(1))
                .cloned(),
            Some(string("1"))
        );
        assert_eq!(store.get(b"a", start + ttl).cloned(), None);
        assert!(store.is_empty());
    }

    #[test]
    fn a_missing_key_is_kept_as_missing() {
        let now = Instant::now();
        let mut store = Store::new(bounds());
        let ticket = store.begin(&key("a"), now);
        store.complete(&key("a"), ticket, Some(Value::Missing), now);
        assert_eq!(store.get(b"a", now).cloned(), Some(Value::Missing));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// One step of a model run: Redis's value of a key changes (and its invalidation arrives
        /// at once or later), reads are sent and answered in order, entries are served.
        #[derive(Debug, Clone)]
        enum Op {
            /// A write to key `k` in Redis (its invalidation is queued on the connection).
            Write(u8),
            /// A read of `k` is sent.
            Read(u8),
            /// Redis runs the oldest read sent and queues its reply on the connection.
            Run,
            /// A write to `k` through the daemon, on another connection: the daemon drops the
            /// entry when its reply comes, before Redis's invalidation arrives.
            WriteThrough(u8),
            /// The connection delivers its next frame: an invalidation or a reply, in order.
            Deliver,
            /// A null invalidation (FLUSHALL) queued on the connection.
            FlushAll,
            /// A client reads `k` from the cache.
            Serve(u8),
            /// Time passes.
            Wait(u16),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0u8..4).prop_map(Op::Write),
                (0u8..4).prop_map(Op::Read),
                Just(Op::Run),
                Just(Op::Run),
                (0u8..4).prop_map(Op::WriteThrough),
                Just(Op::Deliver),
                Just(Op::Deliver),
                Just(Op::Deliver),
                Just(Op::FlushAll),
                (0u8..4).prop_map(Op::Serve),
                (0u16..2000).prop_map(Op::Wait),
            ]
        }

        /// What Redis writes on the tracking connection, in order (with the version at which
        /// the invalidation's change happened).
        enum Frame {
            Invalidate(u8, u64),
            FlushAll(u64),
            Reply(u8, Ticket, Option<u64>),
        }

        fn name(k: u8) -> Bytes {
            key(&format!("k{k}"))
        }

        fn value(v: Option<u64>) -> Value {
            match v {
                Some(v) => Value::String(Bulk::new(v.to_string().as_bytes())),
                None => Value::Missing,
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Whatever the interleaving of writes, reads, replies and invalidations on the one
            /// connection, no value is served that an invalidation already delivered made stale,
            /// nothing is kept past its bounds, and once every frame has been delivered whatever
            /// is kept is Redis's current value.
            #[test]
            fn no_fill_outlives_its_invalidation(ops in proptest::collection::vec(op(), 1..200)) {
                let bounds = Bounds {
                    max_bytes: 3 * (ENTRY_OVERHEAD + 24),
                    max_entry_bytes: ENTRY_OVERHEAD + 24,
                    max_staleness: Duration::from_secs(1),
                };
                let mut store = Store::new(bounds);
                let mut now = Instant::now();
                // Redis's values: a version number per key (None: missing).
                let mut redis: [Option<u64>; 4] = [None; 4];
                let mut versions = 0u64;
                let mut wire: std::collections::VecDeque<Frame> = Default::default();
                // Per key, the version of the last change whose invalidation was delivered.
                let mut told: [u64; 4] = [0; 4];
                // Reads sent, not yet run by Redis (it runs them in order, later).
                let mut sent: std::collections::VecDeque<(u8, Ticket)> = Default::default();
                for op in ops {
                    match op {
                        Op::Write(k) => {
                            versions += 1;
                            redis[k as usize] = Some(versions);
                            wire.push_back(Frame::Invalidate(k, versions));
                        }
                        Op::FlushAll => {
                            versions += 1;
                            redis = [None; 4];
                            wire.push_back(Frame::FlushAll(versions));
                        }
                        Op::Read(k) => sent.push_back((k, store.begin(&name(k), now))),
                        Op::Run => {
                            if let Some((k, ticket)) = sent.pop_front() {
                                wire.push_back(Frame::Reply(k, ticket, redis[k as usize]));
                            }
                        }
                        Op::WriteThrough(k) => {
                            // Redis runs it, queues the invalidation, and its reply (on another
                            // connection) drops the entry at once.
                            versions += 1;
                            redis[k as usize] = Some(versions);
                            wire.push_back(Frame::Invalidate(k, versions));
                            store.invalidate(&name(k));
                            told[k as usize] = versions;
                        }
                        Op::Deliver => match wire.pop_front() {
                            Some(Frame::Invalidate(k, version)) => {
                                store.invalidate(&name(k));
                                told[k as usize] = told[k as usize].max(version);
                            }
                            Some(Frame::FlushAll(version)) => {
                                store.flush();
                                for told in &mut told {
                                    *told = (*told).max(version);
                                }
                            }
                            Some(Frame::Reply(k, ticket, v)) => {
                                store.complete(&name(k), ticket, Some(value(v)), now);
                            }
                            None => {}
                        },
                        Op::Serve(k) => {
                            if let Some(Value::String(bulk)) = store.get(&name(k), now) {
                                let served: u64 =
                                    std::str::from_utf8(&bulk.value()).unwrap().parse().unwrap();
                                prop_assert!(
                                    served >= told[k as usize],
                                    "served v{} after the invalidation of v{} arrived",
                                    served,
                                    told[k as usize]
                                );
                            }
                        }
                        Op::Wait(ms) => now += Duration::from_millis(ms.into()),
                    }
                    prop_assert!(store.bytes() <= bounds.max_bytes);
                }
                while let Some((k, ticket)) = sent.pop_front() {
                    wire.push_back(Frame::Reply(k, ticket, redis[k as usize]));
                }
                while let Some(frame) = wire.pop_front() {
                    match frame {
                        Frame::Invalidate(k, _) => {
                            store.invalidate(&name(k));
                        }
                        Frame::FlushAll(_) => {
                            store.flush();
                        }
                        Frame::Reply(k, ticket, v) => {
                            store.complete(&name(k), ticket, Some(value(v)), now);
                        }
                    }
                }
                // Quiescent: every kept entry is Redis's value now.
                for k in 0..4u8 {
                    if let Some(served) = store.get(&name(k), now) {
                        prop_assert_eq!(served, &value(redis[k as usize]), "k{}", k);
                    }
                }
                prop_assert_eq!(store.reads_in_flight(), 0);
            }
        }
    }

    fn hash_of(fields: &[(&str, Option<&str>)]) -> Value {
        Value::Hash(Arc::new(Hash::fields(
            fields.iter().map(|(f, v)| (key(f), v.map(key))),
        )))
    }

    fn field(store: &mut Store, k: &str, f: &str, now: Instant) -> Option<Option<Bytes>> {
        match store.get(k.as_bytes(), now)? {
            Value::Hash(hash) => hash.field(f.as_bytes()),
            other => panic!("not a hash: {other:?}"),
        }
    }

    #[test]
    fn a_hashs_fields_read_apart_are_kept_together_until_the_key_changes() {
        let big = Bounds {
            max_entry_bytes: 4096,
            max_bytes: 16 * 4096,
            ..bounds()
        };
        let now = Instant::now();
        let mut store = Store::new(big);
        let ticket = store.begin(&key("h"), now);
        store.complete(
            &key("h"),
            ticket,
            Some(hash_of(&[("a", Some("1")), ("b", None)])),
            now,
        );
        let ticket = store.begin(&key("h"), now);
        store.complete(&key("h"), ticket, Some(hash_of(&[("c", Some("3"))])), now);
        assert_eq!(field(&mut store, "h", "a", now), Some(Some(key("1"))));
        assert_eq!(field(&mut store, "h", "b", now), Some(None), "known absent");
        assert_eq!(field(&mut store, "h", "c", now), Some(Some(key("3"))));
        assert_eq!(
            field(&mut store, "h", "d", now),
            None,
            "never read: not known"
        );
        // An invalidation between the two reads drops what the first knew.
        store.invalidate(b"h");
        let ticket = store.begin(&key("h"), now);
        store.complete(&key("h"), ticket, Some(hash_of(&[("c", Some("4"))])), now);
        assert_eq!(field(&mut store, "h", "a", now), None);
        assert_eq!(field(&mut store, "h", "c", now), Some(Some(key("4"))));
        // The whole hash knows every field, in Redis's order, and absent ones too.
        let whole = Value::Hash(Arc::new(Hash::whole(vec![
            (key("z"), key("26")),
            (key("c"), key("4")),
        ])));
        let ticket = store.begin(&key("h"), now);
        store.complete(&key("h"), ticket, Some(whole), now);
        assert_eq!(field(&mut store, "h", "d", now), Some(None));
        let Some(Value::Hash(hash)) = store.get(b"h", now).cloned() else {
            panic!("the hash is kept");
        };
        assert_eq!(
            hash.all(),
            Some(vec![(key("z"), key("26")), (key("c"), key("4"))])
        );
        // A later partial read adds nothing to the whole hash.
        let ticket = store.begin(&key("h"), now);
        store.complete(&key("h"), ticket, Some(hash_of(&[("c", Some("4"))])), now);
        assert!(
            matches!(store.get(b"h", now).cloned(), Some(Value::Hash(hash)) if hash.all().is_some())
        );
    }

    #[test]
    fn merged_fields_are_as_old_as_the_oldest_read() {
        let big = Bounds {
            max_entry_bytes: 4096,
            max_bytes: 16 * 4096,
            max_staleness: Duration::from_secs(10),
        };
        let start = Instant::now();
        let mut store = Store::new(big);
        let ticket = store.begin(&key("h"), start);
        store.complete(&key("h"), ticket, Some(hash_of(&[("a", Some("1"))])), start);
        let later = start + Duration::from_secs(8);
        let ticket = store.begin(&key("h"), later);
        store.complete(&key("h"), ticket, Some(hash_of(&[("b", Some("2"))])), later);
        assert_eq!(field(&mut store, "h", "b", later), Some(Some(key("2"))));
        // Past max_staleness from the first read, the merged entry goes whole.
        assert_eq!(
            store.get(b"h", start + Duration::from_secs(11)).cloned(),
            None
        );
    }
}
