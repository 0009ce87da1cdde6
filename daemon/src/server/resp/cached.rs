//! The near cache at the front door (docs/cache.md): which admitted commands it answers, which it
//! must drop entries for, and how a cached read is served. Admission has always run first: only a
//! command the policy admitted reaches [`NearCache::plan`], so a hit never shows a principal what
//! its policy refuses.
//!
//! Served: `GET` of a key matching `cache.keys`, and `MGET` whose keys all match (key by key);
//! `HGET`, `HMGET` and `HGETALL` of such a key (a miss reads the fields asked for, or the whole
//! hash, and they join the fields already kept); `STRLEN` and `EXISTS` from the entries `GET`s
//! filled, when all are there (they fill nothing). A
//! hit is answered only while nothing of the session is in flight, and a miss is read through the
//! cache's tracking connection only then (and holds the session's later commands back until it is
//! answered, as an exclusive borrow does), so that no cached read overtakes, or is overtaken by,
//! an earlier command of the same client; otherwise the read is forwarded as if uncached.
//!
//! Writes through the daemon to a cacheable key drop its entry when their reply arrives, before
//! the client sees it (`Amend::Passed`), so every local client reads the daemon's writes at once;
//! a write by anyone else is seen when Redis's invalidation arrives. So do reads that reach Redis
//! past the cache (an uncached command, a cached read forwarded): their reply may be newer than
//! the entry, and the client must not read the older value after it.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tollgate_lanes::cache::{self, Cache, Cause, Fetched, Read, Value};
use tollgate_lanes::{Lanes, Route};
use tollgate_model::{Multiplexed, Protocol};
use tollgate_policy::glob::Glob;
use tollgate_policy::Descriptor;
use tollgate_resp::Command;

use super::amend::{Amend, Passed};
use super::pending::Pending;
use super::plan::{CachedRead, Forward, Plan, ReadShape};
use super::replies;

/// The cache and the keys it serves.
pub struct NearCache {
    pub cache: Cache,
    keys: Cacheable,
}

/// Which keys the cache serves (`cache.keys`), and what that makes of a command: pure.
pub struct Cacheable {
    /// As configured (`cache.keys`), for what the daemon reports.
    patterns: Vec<String>,
    /// The same, each with its literal prefix found once: every read asks them.
    globs: Vec<Glob>,
}

impl Cacheable {
    pub fn new(patterns: Vec<String>) -> Self {
        Cacheable {
            globs: patterns.iter().map(|p| Glob::new(p.as_bytes())).collect(),
            patterns,
        }
    }

    /// Whether reads of `key` may be answered from the cache.
    pub fn matches(&self, key: &[u8]) -> bool {
        self.globs.iter().any(|glob| glob.matches(key))
    }

    /// The read the cache may answer for `command`, which the catalog names `name`: a `GET` or a
    /// `STRLEN` of a cacheable key, an `MGET` or an `EXISTS` of cacheable keys only, an `HGET`,
    /// `HMGET` or `HGETALL` of a cacheable key. Nothing is taken from the command yet.
    pub fn read(&self, name: &str, command: &Command) -> Option<ReadShape> {
        let word = |at| command.word(at).unwrap_or_default();
        let len = command.len();
        let all_match = |from: usize| (from..len).all(|at| self.matches(word(at)));
        let shape = match name {
            "GET" if len == 2 => ReadShape::Get,
            "MGET" if len > 1 && all_match(1) => return Some(ReadShape::MGet),
            "STRLEN" if len == 2 => ReadShape::Strlen,
            "EXISTS" if len > 1 && all_match(1) => return Some(ReadShape::Exists),
            "HGET" if len == 3 => ReadShape::HGet,
            "HMGET" if len > 2 => ReadShape::HMGet,
            "HGETALL" if len == 2 => ReadShape::HGetAll,
            _ => return None,
        };
        self.matches(word(1)).then_some(shape)
    }

    /// The cacheable keys a command that is not served from the cache touches in Redis — every
    /// key it writes or reads, a script's declared keys among them — and whether it writes. A
    /// write must be seen at once; a read's reply may be newer than the entry (Redis's invalidation
    /// still on its way), and its client must not see the older value after it.
    pub fn passed(&self, descriptor: &Descriptor, command: &Command) -> (Vec<Bytes>, Cause) {
        let cause = match descriptor.traits.write || descriptor.traits.scripting {
            true => Cause::Write,
            false => Cause::Read,
        };
        let keys = descriptor
            .keys
            .iter()
            .filter(|key| command.word(key.position).is_some_and(|k| self.matches(k)))
            .filter_map(|key| command.shared_word(key.position))
            .collect();
        (keys, cause)
    }
}

/// The keys and fields of `command`, a read of `shape` ([`Cacheable::read`]), sharing its buffer
/// (no copy); [`Cache::fill`] copies what it keeps.
pub fn read_of(shape: ReadShape, command: &Command) -> CachedRead {
    let share = |at| command.shared_word(at).unwrap_or_default();
    let shared = |from: usize| (from..command.len()).map(share).collect::<Vec<_>>();
    match shape {
        ReadShape::Get => CachedRead::Get(share(1)),
        ReadShape::MGet => CachedRead::MGet(shared(1)),
        ReadShape::Strlen => CachedRead::Strlen(share(1)),
        ReadShape::Exists => CachedRead::Exists(shared(1)),
        ReadShape::HGet => CachedRead::HGet(share(1), share(2)),
        ReadShape::HMGet => CachedRead::HMGet(share(1), shared(2)),
        ReadShape::HGetAll => CachedRead::HGetAll(share(1)),
    }
}

/// What a session's cached read became.
pub enum Served {
    /// Answered now, from the cache.
    Hit(Bytes),
    /// Read through the tracking connection; the session's later commands wait for it.
    Filling(Pending),
    /// Not for the cache now: send it on REGULAR as if uncached.
    Forward,
}

impl NearCache {
    pub fn new(cache: Cache, globs: Vec<String>) -> Self {
        NearCache {
            cache,
            keys: Cacheable::new(globs),
        }
    }

    /// The globs of the keys served (`cache.keys`).
    pub fn keys(&self) -> &[String] {
        &self.keys.patterns
    }

    /// What the cache makes of an admitted command's `plan`: a cacheable `GET` forwarded on
    /// REGULAR becomes [`Plan::Cached`]; a command that writes cacheable keys has its reply drop
    /// them first. `written` collects the keys a transaction's queued command writes (dropped
    /// after the transaction's command runs, see `SessionState`).
    pub fn plan(
        &self,
        plan: Plan,
        descriptor: &Descriptor,
        command: &Command,
        written: &mut Vec<Bytes>,
    ) -> Plan {
        // Only a read sent on REGULAR as it is (not inside a transaction, not amended, on a
        // cluster not split).
        let slot = match plan {
            Plan::Forward(Forward::Multiplexed(Multiplexed::Regular), None) => Some(None),
            Plan::Placed(Forward::Multiplexed(Multiplexed::Regular), slot, None) => {
                Some(Some(slot))
            }
            _ => None,
        };
        if let Some(slot) = slot {
            if let Some(read) = self.keys.read(&descriptor.name, command) {
                return Plan::Cached(read, slot);
            }
        }
        let (keys, cause) = self.keys.passed(descriptor, command);
        if keys.is_empty() {
            return plan;
        }
        match plan {
            Plan::Forward(forward, amend) => {
                Plan::Forward(forward, Some(self.passed(keys, cause, amend)))
            }
            Plan::Placed(forward, slot, amend) => {
                Plan::Placed(forward, slot, Some(self.passed(keys, cause, amend)))
            }
            Plan::Split(forward, split, amend) => {
                Plan::Split(forward, split, Some(self.passed(keys, cause, amend)))
            }
            Plan::Transaction | Plan::TransactionIn(_) => {
                written.extend(keys);
                plan
            }
            plan => plan,
        }
    }

    fn passed(&self, keys: Vec<Bytes>, cause: Cause, then: Option<Amend>) -> Amend {
        Amend::Passed(Box::new(Passed {
            cache: self.cache.clone(),
            keys,
            cause,
            then,
        }))
    }

    /// How a cached read forwarded as if uncached is amended: its keys dropped when its reply
    /// comes (see [`Cacheable::passed`]).
    pub fn forwarded(&self, read: &CachedRead) -> Amend {
        let keys = match read {
            CachedRead::Get(key)
            | CachedRead::Strlen(key)
            | CachedRead::HGet(key, _)
            | CachedRead::HMGet(key, _)
            | CachedRead::HGetAll(key) => vec![key.clone()],
            CachedRead::MGet(keys) | CachedRead::Exists(keys) => keys.clone(),
        };
        self.passed(keys, Cause::Read, None)
    }

    /// Drops `keys` (written by a transaction's command that has run).
    pub fn drop_written(&self, keys: &[Bytes]) {
        for key in keys {
            self.cache.written(key);
        }
    }

    /// Everything written through the daemon is gone (`FLUSHDB` served over SCAN).
    pub fn flushed(&self) {
        self.cache.flush(Cause::Write);
    }

    /// Serves `read` for a session speaking `protocol`; `quiet`: nothing of the session is in
    /// flight; `now`: the session's reading of the clock for this turn (`Cache::answer`). A miss
    /// waits for its reply at most `deadline`; should the tracking connection be
    /// lost first, the read is sent on REGULAR after all.
    ///
    /// Called once [`NearCache::hit`] has missed: a `GET` is not looked up again here but filled.
    /// (An entry another session filled in between costs one more read from Redis: correct, and
    /// rare, where looking twice cost every miss a second lookup under the cache's lock.)
    pub fn serve(
        &self,
        read: &CachedRead,
        quiet: bool,
        now: Instant,
        on: Fallback,
        deadline: Option<Duration>,
    ) -> Served {
        if !quiet {
            return Served::Forward;
        }
        let key = match read {
            CachedRead::Get(key) => key,
            CachedRead::MGet(keys) => return self.serve_mget(keys, now, on, deadline),
            CachedRead::Strlen(key) => {
                return self.answer_from(std::slice::from_ref(key), now, strlen)
            }
            CachedRead::Exists(keys) => return self.answer_from(keys, now, exists),
            CachedRead::HGet(..) | CachedRead::HMGet(..) | CachedRead::HGetAll(_) => {
                return self.serve_hash(read, now, on, deadline);
            }
        };
        let protocol = on.protocol;
        self.filled(key, Read::Get, on, deadline, move |value| {
            Some(cache::encode_get(value, protocol))
        })
    }

    /// A `GET`'s hit, answered at once (for a session speaking `protocol` with nothing in flight,
    /// see [`NearCache::serve`]): nothing of what a miss needs is prepared for it, and its key is
    /// looked up where the command holds it.
    pub fn hit(
        &self,
        shape: ReadShape,
        command: &Command,
        now: Instant,
        protocol: Protocol,
    ) -> Option<Bytes> {
        let (ReadShape::Get, Some(key)) = (shape, command.word(1)) else {
            return None;
        };
        self.cache.answer(key, now, |value| match value {
            // A hash's entry: Redis answers the GET (`WRONGTYPE`).
            Value::Hash(_) => None,
            value => Some(cache::encode_get(value, protocol)),
        })
    }

    /// A miss: `key` read (`read`) on the tracking connection, the client answered with what
    /// `answer` makes of the reply (`None`: sent on REGULAR as if uncached), Redis's error passed
    /// on; should the connection be lost first, the command goes on REGULAR after all.
    fn filled(
        &self,
        key: &Bytes,
        read: Read,
        on: Fallback,
        deadline: Option<Duration>,
        answer: impl FnOnce(&Value) -> Option<Bytes> + Send + 'static,
    ) -> Served {
        let Some(fill) = self.cache.fill(key.clone(), read) else {
            return Served::Forward;
        };
        Served::Filling(Pending::Exclusive(Box::pin(async move {
            let fetched = match within(fill, deadline).await {
                Ok(fetched) => fetched,
                Err(late) => return late,
            };
            match fetched {
                Ok(Fetched::Value(value)) => match answer(&value) {
                    Some(reply) => reply,
                    None => on.forward(deadline).await,
                },
                Ok(Fetched::Refused(line)) => line,
                Err(_lost) => on.forward(deadline).await,
            }
        })))
    }
}

impl NearCache {
    /// A read answered from the entries `GET`s filled, when every one of `keys` has one; on a
    /// miss it goes to Redis as if uncached and fills nothing, so that a `STRLEN` never pulls a
    /// large value into the daemon to measure it.
    fn answer_from(
        &self,
        keys: &[Bytes],
        now: Instant,
        reply: fn(&[Value]) -> Option<Bytes>,
    ) -> Served {
        match self
            .cache
            .all_hit(keys, now)
            .and_then(|values| reply(&values))
        {
            Some(reply) => Served::Hit(reply),
            None => Served::Forward,
        }
    }

    /// `MGET`, key by key: the hits (looked up together), and the misses filled on the tracking
    /// connection. Each value is one Redis held for its key, but not necessarily all at one moment
    /// (docs/cache.md).
    fn serve_mget(
        &self,
        keys: &[Bytes],
        now: Instant,
        on: Fallback,
        deadline: Option<Duration>,
    ) -> Served {
        // A hash's entry is no value for MGET (Redis answers it null): read it from Redis.
        let hits: Vec<Option<Value>> = (self.cache.hits(keys, now).into_iter())
            .map(|hit| hit.filter(|value| !matches!(value, Value::Hash(_))))
            .collect();
        if hits.iter().all(Option::is_some) {
            let values: Vec<Value> = hits.into_iter().flatten().collect();
            return Served::Hit(mget_reply(&values, on.protocol));
        }
        let mut fills = Vec::new();
        for (key, hit) in keys.iter().zip(&hits) {
            if hit.is_none() {
                match self.cache.fill(key.clone(), Read::Get) {
                    Some(fill) => fills.push(fill),
                    // The fills queued already complete on their own.
                    None => return Served::Forward,
                }
            }
        }
        Served::Filling(Pending::Exclusive(Box::pin(async move {
            let filled = futures::future::join_all(fills);
            let filled = match within(filled, deadline).await {
                Ok(filled) => filled,
                Err(late) => return late,
            };
            let mut filled = filled.into_iter();
            let mut values = Vec::with_capacity(hits.len());
            for hit in hits {
                let value = match hit {
                    Some(value) => value,
                    None => match filled.next().expect("one fill per miss") {
                        Ok(Fetched::Value(value)) => value,
                        // MGET answers null for a key of another type.
                        Ok(Fetched::Refused(line)) if line.starts_with(b"-WRONGTYPE") => {
                            Value::Missing
                        }
                        Ok(Fetched::Refused(line)) => return line,
                        Err(_lost) => return on.forward(deadline).await,
                    },
                };
                values.push(value);
            }
            mget_reply(&values, on.protocol)
        })))
    }
}

impl NearCache {
    /// `HGET`, `HMGET`, `HGETALL`: answered from the key's entry when it knows what is asked (a
    /// missing key answers everything); otherwise the fields asked for (or the whole hash) are
    /// read on the tracking connection, answered from that reply, and kept with what the entry
    /// knew. A key of another type is Redis's to answer (`WRONGTYPE`).
    fn serve_hash(
        &self,
        read: &CachedRead,
        now: Instant,
        on: Fallback,
        deadline: Option<Duration>,
    ) -> Served {
        let protocol = on.protocol;
        let (key, fill) = match read {
            CachedRead::HGet(key, field) => (key, Read::Fields(vec![field.clone()])),
            CachedRead::HMGet(key, fields) => (key, Read::Fields(fields.clone())),
            CachedRead::HGetAll(key) => (key, Read::Hash),
            _ => return Served::Forward,
        };
        let read = read.clone();
        match self
            .cache
            .answer(key, now, |value| hash_reply(&read, value, protocol))
        {
            Some(Ok(reply)) => return Served::Hit(reply),
            Some(Err(())) => return Served::Forward,
            None => {}
        }
        // The fill's reply answers what it read; anything else is not for here.
        self.filled(key, fill, on, deadline, move |value| {
            hash_reply(&read, value, protocol).and_then(Result::ok)
        })
    }
}

/// The reply to a hash read from an entry: `None` when the entry does not know what is asked;
/// `Err` when the key holds another type (Redis answers that).
fn hash_reply(read: &CachedRead, value: &Value, protocol: Protocol) -> Option<Result<Bytes, ()>> {
    let hash = match value {
        Value::Hash(hash) => Some(hash),
        Value::Missing => None,
        Value::String(_) => return Some(Err(())),
    };
    let reply = match read {
        CachedRead::HGet(_, field) => {
            let value = match hash {
                Some(hash) => hash.field(field)?,
                None => None,
            };
            cache::encode_field(value, protocol)
        }
        CachedRead::HMGet(_, fields) => {
            let mut out = bytes::BytesMut::new();
            tollgate_resp::encode_header(b'*', fields.len(), &mut out);
            for field in fields {
                let value = match hash {
                    Some(hash) => hash.field(field)?,
                    None => None,
                };
                out.extend_from_slice(&cache::encode_field(value, protocol));
            }
            out.freeze()
        }
        CachedRead::HGetAll(_) => match hash {
            Some(hash) => cache::encode_hash(&hash.all()?, protocol),
            None => cache::encode_hash(&[], protocol),
        },
        _ => return None,
    };
    Some(Ok(reply))
}

/// The reply of an `MGET` of these values, as Redis writes it in `protocol`.
fn mget_reply(values: &[Value], protocol: Protocol) -> Bytes {
    let mut out = bytes::BytesMut::new();
    tollgate_resp::encode_header(b'*', values.len(), &mut out);
    for value in values {
        out.extend_from_slice(&cache::encode_get(value, protocol));
    }
    out.freeze()
}

/// `STRLEN`'s reply from its key's entry: a cached value's length, 0 for a key cached as missing;
/// `None` for a hash (Redis answers `WRONGTYPE`).
fn strlen(values: &[Value]) -> Option<Bytes> {
    let length = match values {
        [Value::String(value)] => value.len(),
        [Value::Missing] => 0,
        _ => return None,
    };
    Some(Bytes::from(format!(":{length}\r\n")))
}

/// `EXISTS`'s reply from its keys' entries: how many hold a value (a string, or a hash: a hash's
/// entry is kept only while its key exists), each key counted as often as it is named, as Redis
/// counts it.
fn exists(values: &[Value]) -> Option<Bytes> {
    let count = values
        .iter()
        .filter(|value| !matches!(value, Value::Missing))
        .count();
    Some(Bytes::from(format!(":{count}\r\n")))
}

/// `work`'s outcome, or the error its client gets when `deadline` passes first.
async fn within<T>(
    work: impl std::future::Future<Output = T>,
    deadline: Option<Duration>,
) -> Result<T, Bytes> {
    match deadline {
        Some(deadline) => tokio::time::timeout(deadline, work)
            .await
            .map_err(|_| no_reply_within(deadline)),
        None => Ok(work.await),
    }
}

fn no_reply_within(deadline: Duration) -> Bytes {
    replies::error(format!(
        "IOERR tollgate: no reply from redis within {} on the cache's connection",
        humantime::format_duration(deadline)
    ))
}

/// How a cached read is sent as if uncached when the tracking connection is lost under it.
pub struct Fallback {
    pub lanes: Lanes,
    pub protocol: Protocol,
    pub encoded: Bytes,
    /// Where: anywhere on one server, its slot's master on a cluster.
    pub route: Route,
}

impl Fallback {
    async fn forward(self, deadline: Option<Duration>) -> Bytes {
        let channel = match self
            .lanes
            .multiplexed_speaking(Multiplexed::Regular, self.protocol)
        {
            Ok(channel) => channel,
            Err(error) => return replies::lane_failed(&error),
        };
        match channel
            .send_routed(self.route, self.encoded, deadline)
            .await
        {
            Ok(reply) => reply.into_bytes(),
            Err(error) => replies::call_failed(&error),
        }
    }
}

#[cfg(test)]
mod tests {
    use tollgate_model::Lane;
    use tollgate_policy::{CategorySet, KeyAccess, Traits};

    use super::*;

    fn cacheable() -> Cacheable {
        Cacheable::new(vec!["user:*".into(), "config:?".into()])
    }

    fn descriptor(name: &str, traits: Traits, keys: &[(usize, bool)]) -> Descriptor {
        Descriptor {
            name: name.into(),
            lane: Lane::Regular,
            categories: CategorySet::default(),
            traits,
            arity: -1,
            keys: (keys.iter())
                .map(|&(position, write)| KeyAccess {
                    position,
                    read: !write,
                    write,
                })
                .collect(),
        }
    }

    fn command(words: &[&str]) -> Command {
        let mut buf = bytes::BytesMut::new();
        tollgate_resp::encode_command(words, &mut buf);
        let limits = tollgate_resp::Limits::default();
        (tollgate_resp::parse_command(&mut buf, &limits).unwrap()).expect("a whole command")
    }

    fn bytes(words: &[&str]) -> Vec<Bytes> {
        words
            .iter()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect()
    }

    #[test]
    fn a_get_or_an_mget_of_cacheable_keys_only_is_a_cached_read() {
        let keys = cacheable();
        let read = |words: &[&str]| {
            let command = command(words);
            keys.read(words[0], &command)
                .map(|shape| read_of(shape, &command))
        };
        assert_eq!(
            read(&["GET", "user:1"]),
            Some(CachedRead::Get(bytes(&["user:1"])[0].clone()))
        );
        assert_eq!(
            read(&["GET", "config:a"]),
            Some(CachedRead::Get(bytes(&["config:a"])[0].clone()))
        );
        assert_eq!(read(&["GET", "config:ab"]), None);
        assert_eq!(read(&["GET", "session:1"]), None);
        assert_eq!(read(&["GET", "user:1", "extra"]), None);
        assert_eq!(
            read(&["MGET", "user:1", "config:a"]),
            Some(CachedRead::MGet(bytes(&["user:1", "config:a"])))
        );
        assert_eq!(read(&["MGET", "user:1", "session:1"]), None);
        assert_eq!(read(&["MGET"]), None);
        assert_eq!(read(&["GETRANGE", "user:1"]), None);
        assert_eq!(
            read(&["STRLEN", "user:1"]),
            Some(CachedRead::Strlen(bytes(&["user:1"])[0].clone()))
        );
        assert_eq!(read(&["STRLEN", "session:1"]), None);
        assert_eq!(
            read(&["EXISTS", "user:1", "config:a", "user:1"]),
            Some(CachedRead::Exists(bytes(&["user:1", "config:a", "user:1"])))
        );
        assert_eq!(read(&["EXISTS", "user:1", "session:1"]), None);
        assert_eq!(read(&["EXISTS"]), None);
    }

    #[test]
    fn writes_and_reads_past_the_cache_name_the_cacheable_keys_they_touch() {
        let keys = cacheable();
        let sent = command(&["MSET", "user:1", "a", "other", "b", "user:2", "c"]);
        let write = Traits {
            write: true,
            ..Traits::default()
        };
        let mset = descriptor("MSET", write, &[(1, true), (3, true), (5, true)]);
        assert_eq!(
            keys.passed(&mset, &sent),
            (bytes(&["user:1", "user:2"]), Cause::Write)
        );
        // A script's declared keys, whatever the catalog says of them.
        let script = Traits {
            scripting: true,
            ..Traits::default()
        };
        let sent = command(&["EVAL", "return 1", "1", "user:9"]);
        let eval = descriptor("EVAL", script, &[(3, false)]);
        assert_eq!(
            keys.passed(&eval, &sent),
            (bytes(&["user:9"]), Cause::Write)
        );
        // A read past the cache.
        let read = Traits {
            readonly: true,
            ..Traits::default()
        };
        let sent = command(&["STRLEN", "user:1"]);
        let strlen = descriptor("STRLEN", read, &[(1, false)]);
        assert_eq!(
            keys.passed(&strlen, &sent),
            (bytes(&["user:1"]), Cause::Read)
        );
        let sent = command(&["STRLEN", "other"]);
        assert_eq!(keys.passed(&strlen, &sent).0, Vec::<Bytes>::new());
    }

    #[test]
    fn strlen_and_exists_are_answered_from_entries_as_redis_answers_them() {
        let hello = Value::String(cache::Bulk::new(b"hello"));
        let empty = Value::String(cache::Bulk::new(b""));
        let hash = Value::Hash(std::sync::Arc::new(cache::Hash::fields([(
            Bytes::from_static(b"f"),
            None,
        )])));
        let answer = |reply: Option<Bytes>| reply.expect("answered from the entries");
        assert_eq!(answer(strlen(std::slice::from_ref(&hello))), &b":5\r\n"[..]);
        assert_eq!(answer(strlen(&[Value::Missing])), &b":0\r\n"[..]);
        // A hash's STRLEN is Redis's to refuse.
        assert_eq!(strlen(std::slice::from_ref(&hash)), None);
        // An empty string exists, and so does a hash whatever fields were read; a missing key
        // does not; a key named twice counts twice.
        assert_eq!(answer(exists(&[empty, Value::Missing])), &b":1\r\n"[..]);
        assert_eq!(answer(exists(&[hello.clone(), hello])), &b":2\r\n"[..]);
        assert_eq!(answer(exists(&[hash])), &b":1\r\n"[..]);
        assert_eq!(answer(exists(&[Value::Missing])), &b":0\r\n"[..]);
    }

    #[test]
    fn hash_reads_are_cacheable_and_answered_from_what_the_entry_knows() {
        let keys = cacheable();
        let read = |words: &[&str]| {
            let command = command(words);
            keys.read(words[0], &command)
                .map(|shape| read_of(shape, &command))
        };
        let b = |text: &str| Bytes::copy_from_slice(text.as_bytes());
        assert_eq!(
            read(&["HGET", "user:1", "name"]),
            Some(CachedRead::HGet(b("user:1"), b("name")))
        );
        assert_eq!(
            read(&["HMGET", "user:1", "a", "b"]),
            Some(CachedRead::HMGet(b("user:1"), vec![b("a"), b("b")]))
        );
        assert_eq!(read(&["HMGET", "user:1"]), None);
        assert_eq!(
            read(&["HGETALL", "user:1"]),
            Some(CachedRead::HGetAll(b("user:1")))
        );
        assert_eq!(read(&["HGETALL", "session:1"]), None);

        let partial = Value::Hash(std::sync::Arc::new(cache::Hash::fields([
            (b("a"), Some(b("1"))),
            (b("b"), None),
        ])));
        let hget = |field: &str| CachedRead::HGet(b("user:1"), b(field));
        let resp2 = Protocol::Resp2;
        assert_eq!(
            hash_reply(&hget("a"), &partial, resp2),
            Some(Ok(b("$1\r\n1\r\n")))
        );
        assert_eq!(
            hash_reply(&hget("b"), &partial, resp2),
            Some(Ok(b("$-1\r\n")))
        );
        assert_eq!(
            hash_reply(&hget("c"), &partial, resp2),
            None,
            "not known: a miss"
        );
        let hmget = CachedRead::HMGet(b("user:1"), vec![b("b"), b("a")]);
        assert_eq!(
            hash_reply(&hmget, &partial, Protocol::Resp3),
            Some(Ok(b("*2\r\n_\r\n$1\r\n1\r\n")))
        );
        let all = CachedRead::HGetAll(b("user:1"));
        assert_eq!(
            hash_reply(&all, &partial, resp2),
            None,
            "only some fields known"
        );
        // A missing key answers every hash read; a string is Redis's to refuse.
        assert_eq!(
            hash_reply(&all, &Value::Missing, resp2),
            Some(Ok(b("*0\r\n")))
        );
        assert_eq!(
            hash_reply(&hget("a"), &Value::Missing, resp2),
            Some(Ok(b("$-1\r\n")))
        );
        assert_eq!(
            hash_reply(&hget("a"), &Value::String(cache::Bulk::new(b"x")), resp2),
            Some(Err(()))
        );
    }

    #[test]
    fn an_mget_reply_is_written_as_redis_writes_it() {
        let values = [Value::String(cache::Bulk::new(b"1")), Value::Missing];
        assert_eq!(
            mget_reply(&values, Protocol::Resp2),
            &b"*2\r\n$1\r\n1\r\n$-1\r\n"[..]
        );
        assert_eq!(
            mget_reply(&values, Protocol::Resp3),
            &b"*2\r\n$1\r\n1\r\n_\r\n"[..]
        );
    }
}
