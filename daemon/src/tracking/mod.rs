//! `CLIENT TRACKING` served to the daemon's own clients (issue 29): the pure core, with Redis
//! 7.0's semantics (`src/tracking.c`, and `clientCommand` in `src/networking.c`), and no I/O.
//!
//! # Why the daemon tracks, and not Redis
//!
//! Redis remembers the keys a *connection* read and tells that connection (or the one it
//! redirects to) when they change. The daemon's clients read through lane connections shared with
//! every other client, so Redis's tracking of those connections would tell no client anything. The
//! daemon keeps the tracking itself instead: one [`Tracker`] for all its clients, fed by the
//! daemon's one view of Redis (the invalidations it receives for every key any tracking client
//! read) and by the reads and writes its sessions send. Invalidating a key costs what Redis's
//! costs: the clients that read it (Redis's `TrackingTable`), plus the BCAST prefixes the key
//! falls under.
//!
//! - `command`: the words of `CLIENT TRACKING` and `CLIENT CACHING`, and Redis's error texts.
//! - `client`: one client's tracking state (Redis's `CLIENT_TRACKING_*` flags), and what
//!   `CLIENT GETREDIR` and `CLIENT TRACKINGINFO` answer from it.
//! - `prefixes`: BCAST prefixes: the overlap rule, and which prefixes a key falls under.
//! - `table`: which clients read each key, bounded by `tracking-table-max-keys`.
//! - `route`: where one client's invalidation goes: itself, its `REDIRECT`, or nowhere.
//! - `tracker`: all of it together ([`Tracker`]), as the sessions and the invalidation
//!   connection call it.
//! - `gate`: the ordering rule below, kept per session ([`Gate`]).
//!
//! # The ordering rule (`session.rs` keeps it)
//!
//! **An invalidation delivered to a client comes after every reply its commands had in flight
//! when the invalidation arrived.** The daemon reads a key for a client on a shared lane
//! connection and receives the invalidation of a later write on another connection, so the two
//! can cross: the reply carrying the old value `v1` may still be on its way when the
//! invalidation of the write that replaced it arrives. Delivered first, the invalidation finds
//! nothing cached; then `v1` arrives and the client caches it for ever. Held behind the replies
//! in flight (a [`Gate`] per session), it reaches the client after `v1`, which it then drops.
//! Redis keeps the same order for a client's own writes (`tracking_pending_keys`: an invalidation
//! caused by the command being run goes after its reply). With `REDIRECT`, the delivery waits for
//! the *tracking* client's replies ([`Delivery::tracking`]), then goes to the redirect target.
//!
//! Two more rules follow from it. **A read is recorded ([`Tracker::read`]) when it is sent, not
//! when its reply comes**: an invalidation arriving while the read is in flight must find the
//! client in the table (telling a client of a write that its read already saw is harmless; not
//! telling it of one it did not see is a stale cache). And **the reads answered without Redis**
//! (near-cache hits) are recorded too: a client tracks what it read, wherever it came from.
//!
//! # Confinement
//!
//! A client is never told about a key its principal may not read ([`Directory::may_read`]).
//! In default mode it only tracks keys it read, and a read is recorded only after admission let
//! the command through, so it is confined already; BCAST is not (a prefix, the empty one above
//! all, covers keys the principal was never let near), so every BCAST key is checked against the
//! tracking client. A redirected invalidation is also checked against the client it is written
//! to, which may belong to another principal.
//!
//! # Differences from Redis 7.0
//!
//! Each is a case where Redis's behaviour depends on its event loop or its memory layout, or is a
//! bug; none makes a client miss an invalidation it would have had from Redis.
//!
//! - A disconnected client's keys leave the table at once (Redis drops them lazily, when the key
//!   is next invalidated or evicted), so `tracking_total_items` can be lower than Redis's.
//! - `tracking-table-max-keys` is held after every read (Redis checks before each command and in
//!   its cron, with a bounded effort), and the key evicted is the least recently read (Redis's is
//!   random).
//! - BCAST invalidations are batched per call to [`Tracker::invalidate`] (one Redis invalidation
//!   message, or one write through the daemon), where Redis batches per turn of its event loop.
//!   So within one batch `NOLOOP` looks at the batch's writer, not at each key's last writer.
//! - `CLIENT TRACKING ON BCAST PREFIX a PREFIX b PREFIX bc`: Redis 7.0's overlap check reports an
//!   overlap found after the first prefix and then enables tracking anyway, answering twice
//!   (`return i` in `checkPrefixCollisionsOrReply`); here it is refused and nothing changes.

mod client;
mod command;
mod gate;
mod prefixes;
mod route;
mod table;
mod tracker;

#[cfg(test)]
mod suite;
#[cfg(test)]
mod testing;

use tollgate_model::Protocol;

pub use client::{Flag, TrackingInfo};
pub use command::TrackingError;
pub use gate::Gate;
pub use route::{Delivery, Invalidation, Message};
pub use table::DEFAULT_MAX_KEYS;
pub use tracker::{Finished, Stats, Tracker};

/// A client of the daemon, by the id `CLIENT ID` gives it (from 1; never reused).
pub type ClientId = u64;

/// How a message reaches a connected client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub protocol: Protocol,
    /// Subscribed to a channel or pattern (Redis's `CLIENT_PUBSUB`): only then does a RESP2
    /// redirect target get invalidations, as messages on `__redis__:invalidate`.
    pub subscribed: bool,
}

/// What the tracker asks of the daemon's sessions, at the moment it asks.
pub trait Directory {
    /// Client `id`, if it is connected.
    fn peer(&self, id: ClientId) -> Option<Peer>;

    /// Whether `client`'s principal may read `key`: no client is told of a key it may not read.
    fn may_read(&self, client: ClientId, key: &[u8]) -> bool;
}
