//! `CLIENT TRACKING` for the listener's sessions: the daemon's [`Tracker`] (`crate::tracking`,
//! pure) fed by what the sessions send and by Redis's invalidations, and its deliveries posted to
//! the sessions' mailboxes (`mailbox.rs`), where each session holds its own behind its replies in
//! flight (`session.rs`, the ordering rule in `crate::tracking`'s header).
//!
//! What feeds it:
//! - **reads**: the keys of a read-only command a tracking session sends (a script: its declared
//!   keys), recorded once the command is counted in the session's schedule, before it can be
//!   answered ([`Hub::sent`]);
//! - **writes through the daemon** by a tracking session: the keys it writes, told to it alone
//!   as soon as the write is counted, so that its invalidation comes right after the write's
//!   reply (Redis's order), never after a later read of its cached value (`Tracker::wrote`);
//! - **Redis**: one connection with `CLIENT TRACKING ON BCAST` (`tollgate_lanes::invalidations`;
//!   on a cluster, one per master), open while some session tracks: every write by anyone, expiries and evictions, flushes. When
//!   it opens again after a loss, or is lost, every tracking client is told that everything
//!   changed (what happened meanwhile is unknown).
//!
//! Every other client hears of a write through the daemon from Redis, once, as from Redis. The
//! writer's own reads of the key leave the table when it is told, so Redis's invalidation does
//! not tell it again, and `NOLOOP` holds in default mode; a BCAST writer is told again by Redis
//! (which cannot say who wrote), and `NOLOOP` does not hold there.
//!
//! Confinement: a `REDIRECT` may name only a session the client could list (`CLIENT LIST`), and
//! no session is told of a key its caller may not `GET` (`Directory::may_read`).
//!
//! Cost for a session that does not track: one relaxed atomic load per admitted command.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tollgate_lanes::invalidations::{Event, Invalidations};
use tollgate_policy::{Admission, Descriptor};

use super::clients::{Client, Clients};
use super::local::Protocol;
use crate::services::Services;
use crate::tracking::{
    ClientId, Delivery, Directory, Finished, Peer, Stats, Tracker, TrackingInfo,
};

/// How long `CLIENT TRACKING ON` waits for the invalidation connection to open.
const OPEN_WITHIN: Duration = Duration::from_secs(5);

/// Every session's tracking.
pub struct Hub {
    inner: Mutex<Inner>,
    /// Redis's changes: one connection, or one per master of a cluster.
    feed: Invalidations,
    clients: Arc<Clients>,
    services: Arc<Services>,
}

struct Inner {
    tracker: Tracker,
    /// Sessions waiting in `CLIENT TRACKING ON` for the invalidation connection.
    waiting: usize,
}

/// What a session's read or write told the tracker, to be carried out once the command is
/// counted in the session's schedule ([`Hub::sent`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sent {
    pub reads: Vec<Bytes>,
    pub writes: Vec<Bytes>,
    /// Redis's whole database changed (`FLUSHDB`/`FLUSHALL` through the daemon).
    pub flush: bool,
    pub finished: Option<Finished>,
    /// `CONFIG SET tracking-table-max-keys`: the daemon's table is the one its clients' tracking
    /// uses, so it follows (Redis's own has only the invalidation connection, which broadcasts).
    pub max_keys: Option<usize>,
}

impl Sent {
    /// What an admitted command (`descriptor`, `argv`) of a tracking session tells: its keys
    /// read, when it only reads, and the keys it writes (a script: every declared key, both
    /// ways).
    pub fn of(descriptor: &Descriptor, argv: &[&[u8]]) -> Sent {
        let traits = &descriptor.traits;
        let script = traits.scripting;
        let keys = |wanted: &dyn Fn(&tollgate_policy::KeyAccess) -> bool| -> Vec<Bytes> {
            descriptor
                .keys
                .iter()
                .filter(|key| wanted(key))
                .filter_map(|key| argv.get(key.position))
                .map(|key| Bytes::copy_from_slice(key))
                .collect()
        };
        let reads = match traits.readonly || script {
            true => keys(&|_| true),
            false => Vec::new(),
        };
        // EVAL_RO and FCALL_RO are scripts that cannot write.
        let writes = match traits.write || (script && !traits.readonly) {
            true => keys(&|key| key.write || script),
            false => Vec::new(),
        };
        Sent {
            reads,
            writes,
            ..Sent::default()
        }
    }

    /// The `tracking-table-max-keys` a `CONFIG SET`'s `argv` sets, if it sets it to a number.
    pub fn max_keys(argv: &[&[u8]]) -> Option<usize> {
        let pairs = argv.get(2..)?.chunks_exact(2);
        let value = pairs
            .rev()
            .find(|pair| pair[0].eq_ignore_ascii_case(b"tracking-table-max-keys"))?[1];
        std::str::from_utf8(value).ok()?.parse().ok()
    }

    pub fn is_empty(&self) -> bool {
        self.reads.is_empty()
            && self.writes.is_empty()
            && !self.flush
            && self.finished.is_none()
            && self.max_keys.is_none()
    }
}

/// What `CLIENT TRACKING|CACHING|GETREDIR|TRACKINGINFO` answered.
pub enum Answered {
    Now(Result<Answer, String>),
    /// `TRACKING ON` while the invalidation connection is not open: wait for it
    /// ([`Hub::turn_on`]).
    OnceOpen,
}

/// A successful answer.
pub enum Answer {
    Ok,
    Redirect(i64),
    Info(TrackingInfo),
}

impl Hub {
    /// The hub of `clients`, its invalidation connection (on one server) opened on demand until
    /// `stop`.
    pub fn start(
        services: Arc<Services>,
        clients: Arc<Clients>,
        stop: CancellationToken,
    ) -> Arc<Hub> {
        Arc::new_cyclic(|hub: &Weak<Hub>| {
            let sink = {
                let hub = hub.clone();
                move |event: Event| {
                    if let Some(hub) = hub.upgrade() {
                        hub.redis(event);
                    }
                }
            };
            let feed = Invalidations::start(&services.lanes, sink, stop);
            Hub {
                inner: Mutex::new(Inner {
                    tracker: Tracker::default(),
                    waiting: 0,
                }),
                feed,
                clients,
                services,
            }
        })
    }

    /// `CLIENT <sub> <args>` from `me`, `sub` one of TRACKING, CACHING, GETREDIR, TRACKINGINFO.
    pub fn command(&self, me: &Client, sub: &[u8], args: &[&[u8]]) -> Answered {
        let is = |word: &[u8]| sub.eq_ignore_ascii_case(word);
        let mut inner = self.inner.lock();
        let tracker = &mut inner.tracker;
        if is(b"GETREDIR") {
            return Answered::Now(Ok(Answer::Redirect(tracker.getredir(me.id))));
        }
        if is(b"TRACKINGINFO") {
            return Answered::Now(Ok(Answer::Info(tracker.info(me.id))));
        }
        if is(b"CACHING") {
            let done = tracker.caching(me.id, args).map_err(|e| e.to_string());
            return Answered::Now(done.map(|()| Answer::Ok));
        }
        let on = args.first().is_some_and(|w| w.eq_ignore_ascii_case(b"ON"));
        if on && !self.feed.is_open() {
            inner.waiting += 1;
            self.feed.want(true);
            return Answered::OnceOpen;
        }
        let done = self.switch(&mut inner, me, args);
        Answered::Now(done.map(|()| Answer::Ok))
    }

    /// `CLIENT TRACKING ON …` once the invalidation connection is open (waited for at most
    /// [`OPEN_WITHIN`]); [`Hub::command`] said to wait.
    pub async fn turn_on(&self, me: &Client, args: &[&[u8]]) -> Result<(), String> {
        let opened = self.feed.opened(OPEN_WITHIN).await;
        let mut inner = self.inner.lock();
        inner.waiting -= 1;
        let done = match opened {
            Ok(()) => self.switch(&mut inner, me, args),
            Err(error) => Err(format!(
                "ERR tollgate: CLIENT TRACKING ON needs the daemon's invalidation connection to \
                 Redis: {error}"
            )),
        };
        self.settle(&inner);
        done
    }

    /// `CLIENT TRACKING ON|OFF …` applied.
    fn switch(&self, inner: &mut Inner, me: &Client, args: &[&[u8]]) -> Result<(), String> {
        // A REDIRECT names only a session `me` could list.
        let seen = Seen {
            sessions: self.sessions(),
            me,
        };
        let done = inner.tracker.tracking(me.id, args, &seen);
        me.tracking
            .store(inner.tracker.is_tracking(me.id), Ordering::Relaxed);
        self.settle(inner);
        done.map_err(|error| error.to_string())
    }

    /// What session `id` sent (counted in its schedule now: its replies owed include it).
    pub fn sent(&self, id: ClientId, sent: Sent) {
        let mut deliveries = Vec::new();
        {
            let mut inner = self.inner.lock();
            let sessions = self.sessions();
            let tracker = &mut inner.tracker;
            // Reads, then writes: a script's declared keys are both, and a key it writes is
            // told (and leaves the table) as Redis tells a key a script wrote.
            if !sent.reads.is_empty() {
                deliveries.extend(tracker.read(id, &sent.reads, &sessions));
            }
            if !sent.writes.is_empty() {
                deliveries.extend(tracker.wrote(id, &sent.writes, &sessions));
            }
            if sent.flush {
                deliveries.extend(tracker.flush(&sessions));
            }
            if let Some(finished) = sent.finished {
                tracker.finished(id, finished);
            }
            if let Some(max_keys) = sent.max_keys {
                deliveries.extend(tracker.set_max_keys(max_keys, &sessions));
            }
            self.settle(&inner);
        }
        self.post(deliveries);
    }

    /// What `INFO` shows of the tracking of every client.
    pub fn stats(&self) -> Stats {
        self.inner.lock().tracker.stats()
    }

    /// Session `id` was reset (`RESET`): tracking off.
    pub fn reset(&self, me: &Client) {
        let mut inner = self.inner.lock();
        inner.tracker.off(me.id);
        me.tracking.store(false, Ordering::Relaxed);
        self.settle(&inner);
    }

    /// Session `id` ended.
    pub fn leave(&self, id: ClientId) {
        let mut inner = self.inner.lock();
        inner.tracker.forget(id);
        self.settle(&inner);
    }

    /// What Redis's invalidation connection reported.
    fn redis(&self, event: Event) {
        let deliveries = {
            let mut inner = self.inner.lock();
            let sessions = self.sessions();
            let tracker = &mut inner.tracker;
            match event {
                Event::Keys(keys) if !tracker.is_idle() => {
                    tracker.invalidate(&keys, None, &sessions)
                }
                Event::Keys(_) => Vec::new(),
                // Opened again after none was, or lost: what changed meanwhile is unknown.
                Event::Everything | Event::Opened | Event::Closed => tracker.flush(&sessions),
            }
        };
        self.post(deliveries);
    }

    /// Each delivery to the mailbox of the session whose tracking it comes from: that session
    /// holds it behind its replies, then writes it or passes it to its redirect target.
    fn post(&self, deliveries: Vec<Delivery>) {
        for delivery in deliveries {
            if let Some(client) = self.clients.get(delivery.tracking) {
                client.mailbox.post(client.id, delivery);
            }
        }
    }

    /// Passes a delivery on to its redirect target, once its tracking client's replies are out.
    pub fn forward(&self, delivery: Delivery) {
        if let Some(client) = self.clients.get(delivery.to) {
            client.mailbox.post(client.id, delivery);
        }
    }

    /// The invalidation connection, after a change: open while anyone tracks or waits to.
    fn settle(&self, inner: &Inner) {
        self.feed
            .want(inner.waiting > 0 || inner.tracker.anyone_tracking());
    }

    fn sessions(&self) -> Sessions<'_> {
        Sessions {
            clients: &self.clients,
            admission: &self.services.admission,
        }
    }
}

/// The listener's sessions, as the tracker asks after them.
struct Sessions<'a> {
    clients: &'a Clients,
    admission: &'a Admission,
}

impl Directory for Sessions<'_> {
    fn peer(&self, id: ClientId) -> Option<Peer> {
        let (resp, subscribed) = self.clients.get(id)?.peer();
        Some(Peer {
            protocol: match resp {
                3 => Protocol::Resp3,
                _ => Protocol::Resp2,
            },
            subscribed,
        })
    }

    fn may_read(&self, client: ClientId, key: &[u8]) -> bool {
        self.clients.get(client).is_some_and(|client| {
            !self
                .admission
                .touchable(&client.caller, "GET", vec![key])
                .is_empty()
        })
    }
}

/// The sessions `me` may name in `REDIRECT`: those it could list.
struct Seen<'a> {
    sessions: Sessions<'a>,
    me: &'a Client,
}

impl Directory for Seen<'_> {
    fn peer(&self, id: ClientId) -> Option<Peer> {
        match self.sessions.clients.sees_id(self.me, id) {
            true => self.sessions.peer(id),
            false => None,
        }
    }

    fn may_read(&self, client: ClientId, key: &[u8]) -> bool {
        self.sessions.may_read(client, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_model::Lane;
    use tollgate_policy::{KeyAccess, Traits};

    fn descriptor(name: &str, traits: Traits, keys: &[(usize, bool)]) -> Descriptor {
        Descriptor {
            name: name.into(),
            lane: Lane::Regular,
            categories: Default::default(),
            traits,
            arity: -2,
            keys: keys
                .iter()
                .map(|&(position, write)| KeyAccess {
                    position,
                    read: !write,
                    write,
                })
                .collect(),
        }
    }

    #[test]
    fn config_set_of_the_table_limit_is_read_from_its_pairs() {
        let max = |line: &str| Sent::max_keys(&words(line));
        assert_eq!(max("CONFIG SET tracking-table-max-keys 10"), Some(10));
        assert_eq!(
            max("CONFIG SET maxmemory 0 TRACKING-TABLE-MAX-KEYS 5"),
            Some(5)
        );
        assert_eq!(max("CONFIG SET maxmemory 10"), None);
        assert_eq!(max("CONFIG SET tracking-table-max-keys -1"), None);
        assert_eq!(max("CONFIG SET tracking-table-max-keys"), None);
    }

    fn words(line: &str) -> Vec<&[u8]> {
        line.split(' ').map(str::as_bytes).collect()
    }

    #[test]
    fn a_command_tells_the_keys_it_reads_if_it_only_reads_and_those_it_writes() {
        let readonly = Traits {
            readonly: true,
            ..Traits::default()
        };
        let mget = descriptor("MGET", readonly, &[(1, false), (2, false)]);
        let argv = words("MGET a b");
        let told = Sent::of(&mget, &argv);
        assert_eq!(told.reads, vec![Bytes::from("a"), Bytes::from("b")]);
        assert!(told.writes.is_empty());

        let write = Traits {
            write: true,
            ..Traits::default()
        };
        // LMOVE src dst: both keys are written.
        let lmove = descriptor("LMOVE", write, &[(1, true), (2, true)]);
        let argv = words("LMOVE src dst LEFT RIGHT");
        let told = Sent::of(&lmove, &argv);
        assert!(told.reads.is_empty(), "a write is not a read Redis tracks");
        assert_eq!(told.writes, vec![Bytes::from("src"), Bytes::from("dst")]);

        let scripting = Traits {
            scripting: true,
            ..Traits::default()
        };
        let eval = descriptor("EVAL", scripting, &[(3, false)]);
        let argv = words("EVAL body 1 k");
        let told = Sent::of(&eval, &argv);
        assert_eq!(told.reads, vec![Bytes::from("k")]);
        assert_eq!(told.writes, vec![Bytes::from("k")]);
    }
}
