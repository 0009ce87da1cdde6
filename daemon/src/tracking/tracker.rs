//! Every client's tracking together: what a session calls for `CLIENT TRACKING`, `CLIENT CACHING`,
//! `CLIENT GETREDIR` and `CLIENT TRACKINGINFO`, for each read it sends and each command it
//! finishes, and what the daemon calls when keys change (an invalidation from Redis, or a write
//! through the daemon), when Redis is flushed, and when a client leaves. Each change returns the
//! [`Delivery`]s it causes; writing them, behind the replies in flight ([`super::Gate`]), is the
//! caller's.
//!
//! An invalidation of keys tells, in this order: each key's default-mode readers, key by key (a
//! message per key, as Redis sends them while the write runs), the entry gone with it; then each
//! BCAST client, once per prefix the keys fall under (the keys of the batch under that prefix, as
//! Redis sends them before its event loop sleeps).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::client::{Client, Mode, TrackingInfo};
use super::command::{Caching, Request, Switch, TrackingError};
use super::prefixes::PrefixTable;
use super::route::{self, Delivery, Invalidation};
use super::table::{KeyTable, DEFAULT_MAX_KEYS};
use super::{ClientId, Directory};

/// How a command of a client ended, for `CLIENT CACHING`, which holds for the next command only
/// (`resetClient`: the flag survives a `CLIENT` command, and every command inside `MULTI`, so it
/// covers the whole transaction up to and including `EXEC`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// A `CLIENT` subcommand (`CLIENT CACHING` itself among them): the flag stays.
    Client,
    /// `MULTI`, or a command queued after it: the flag stays.
    InMulti,
    /// Any other command (`EXEC` and `DISCARD` among them): the flag is spent.
    Command,
}

/// The counts Redis's `INFO` shows (`tracking_clients`, `tracking_total_keys`,
/// `tracking_total_items`, `tracking_total_prefixes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub clients: usize,
    pub keys: usize,
    pub items: usize,
    pub prefixes: usize,
}

/// The daemon's tracking of its clients.
#[derive(Debug)]
pub struct Tracker {
    /// Clients that tracked at some point, until they leave.
    clients: BTreeMap<ClientId, Client>,
    table: KeyTable,
    prefixes: PrefixTable,
}

impl Tracker {
    /// A tracker holding at most `max_keys` keys (`tracking-table-max-keys`; 0: no limit).
    pub fn new(max_keys: usize) -> Self {
        Tracker {
            clients: BTreeMap::new(),
            table: KeyTable::new(max_keys),
            prefixes: PrefixTable::default(),
        }
    }

    /// `CLIENT TRACKING <args>` from `client`.
    pub fn tracking(
        &mut self,
        client: ClientId,
        args: &[&[u8]],
        directory: &impl Directory,
    ) -> Result<(), TrackingError> {
        let request = Request::parse(args, |id| directory.peer(id).is_some())?;
        match request.switch {
            Switch::Off => self.off(client),
            Switch::On => {
                let added = self
                    .clients
                    .entry(client)
                    .or_default()
                    .enable(&request.options)?;
                for prefix in added {
                    self.prefixes.add(prefix, client);
                }
            }
        }
        Ok(())
    }

    /// Tracking off for `client` (`CLIENT TRACKING OFF`, `RESET`). The keys it read stay in the
    /// table, as in Redis.
    pub fn off(&mut self, client: ClientId) {
        if let Some(state) = self.clients.get_mut(&client) {
            for prefix in state.disable() {
                self.prefixes.remove(&prefix, client);
            }
        }
    }

    /// `CLIENT CACHING <args>` from `client`.
    pub fn caching(&mut self, client: ClientId, args: &[&[u8]]) -> Result<(), TrackingError> {
        let caching = Caching::parse(args)?;
        match self.clients.get_mut(&client) {
            Some(state) => state.caching(caching),
            None => Err(TrackingError::CachingNotTracking),
        }
    }

    /// `CLIENT GETREDIR` from `client`.
    pub fn getredir(&self, client: ClientId) -> i64 {
        self.clients.get(&client).map_or(-1, Client::getredir)
    }

    /// `CLIENT TRACKINGINFO` from `client`.
    pub fn info(&self, client: ClientId) -> TrackingInfo {
        self.clients
            .get(&client)
            .map_or_else(|| Client::default().info(), Client::info)
    }

    /// Whether an invalidation of keys would tell no one (no key tracked, no BCAST prefix): the
    /// daemon may skip the call (a flush still goes to every tracking client).
    pub fn is_idle(&self) -> bool {
        self.table.keys() == 0 && self.prefixes.is_empty()
    }

    /// Whether `client` has tracking on: a session need not call [`Tracker::read`] otherwise.
    pub fn is_tracking(&self, client: ClientId) -> bool {
        self.clients
            .get(&client)
            .is_some_and(|state| state.on.is_some())
    }

    /// `client` sends a read-only command of `keys` (after admission; a script: its declared
    /// keys): remembered if it tracks in default mode and `CLIENT CACHING` does not say otherwise.
    /// Call it when the command is sent (or answered from the near cache), before its reply, and
    /// before [`Tracker::finished`]. What going over `tracking-table-max-keys` evicts is returned.
    pub fn read(
        &mut self,
        client: ClientId,
        keys: &[Bytes],
        directory: &impl Directory,
    ) -> Vec<Delivery> {
        let Some(state) = self.clients.get_mut(&client) else {
            return Vec::new();
        };
        if !state.echoes.is_empty() {
            for key in keys {
                state.echoes.remove(key);
            }
        }
        if keys.is_empty() || !state.remembers_reads() {
            return Vec::new();
        }
        for key in keys {
            if self.table.add(key, client) {
                state.keys.insert(key.clone());
            }
        }
        self.evict(directory)
    }

    /// `client` finished a command (see [`Finished`]).
    pub fn finished(&mut self, client: ClientId, finished: Finished) {
        if finished != Finished::Command {
            return;
        }
        if let Some(on) = self
            .clients
            .get_mut(&client)
            .and_then(|state| state.on.as_mut())
        {
            on.caching = false;
        }
    }

    /// `keys` changed (one invalidation from Redis, or one write through the daemon); `writer`:
    /// the daemon's client that wrote them, when it was one (`NOLOOP` clients are not told of
    /// their own writes).
    pub fn invalidate(
        &mut self,
        keys: &[Bytes],
        writer: Option<ClientId>,
        directory: &impl Directory,
    ) -> Vec<Delivery> {
        let mut out = Vec::new();
        for key in keys {
            self.tell_readers(key, writer, directory, &mut out);
        }
        self.broadcast(keys, writer, directory, &mut out);
        out
    }

    /// `writer` wrote `keys` through the daemon (the command is sent, its reply still owed): it
    /// alone is told now, so that once it has the write's reply it never reads its old value;
    /// every other client hears of the write from Redis (the same invalidation, on its way
    /// through the daemon's invalidation connection), once, as from Redis. In default mode the
    /// writer's reads of `keys` leave the table, so Redis's invalidation does not tell it twice
    /// (and `NOLOOP` holds: not told now, not told then). A BCAST writer is not told again either
    /// (`Client::echoes`), but with `NOLOOP` it is: told nothing now, it holds its own value,
    /// and Redis's invalidation, which cannot say who wrote, may be another client's write.
    pub fn wrote(
        &mut self,
        writer: ClientId,
        keys: &[Bytes],
        directory: &impl Directory,
    ) -> Vec<Delivery> {
        let mut out = Vec::new();
        let Some(state) = self.clients.get_mut(&writer) else {
            return out;
        };
        let Some(on) = state.on.as_mut() else {
            return out;
        };
        if on.mode == Mode::Bcast {
            if on.noloop {
                return out;
            }
            let mut batches: BTreeMap<&Bytes, Vec<Bytes>> = BTreeMap::new();
            for key in keys {
                for prefix in on.prefixes.iter().filter(|prefix| key.starts_with(prefix)) {
                    if directory.may_read(writer, key) {
                        batches.entry(prefix).or_default().push(key.clone());
                        state.echoes.insert(key.clone());
                    }
                }
            }
            let batches: Vec<Vec<Bytes>> = batches.into_values().collect();
            for mut batch in batches {
                batch.sort();
                batch.dedup();
                route::send(writer, on, Invalidation::Keys(batch), directory, &mut out);
            }
            return out;
        }
        for key in keys {
            if !state.keys.remove(key) {
                continue;
            }
            self.table.remove_reader(key, writer);
            if !on.noloop {
                let keys = Invalidation::Keys(vec![key.clone()]);
                route::send(writer, on, keys, directory, &mut out);
            }
        }
        out
    }

    /// Redis was flushed (`FLUSHALL`, `FLUSHDB`: Redis's null invalidation): every tracking
    /// client is told that everything changed, whoever flushed (`NOLOOP` or not), and the table
    /// is emptied (`trackingInvalidateKeysOnFlush`).
    pub fn flush(&mut self, directory: &impl Directory) -> Vec<Delivery> {
        let mut out = Vec::new();
        for (&id, state) in &mut self.clients {
            state.keys.clear();
            state.echoes.clear();
            if let Some(on) = state.on.as_mut() {
                route::send(id, on, Invalidation::Everything, directory, &mut out);
            }
        }
        self.table.clear();
        out
    }

    /// `client` left: everything of it goes. Clients redirecting to it find it gone when they are
    /// next told something.
    pub fn forget(&mut self, client: ClientId) {
        let Some(mut state) = self.clients.remove(&client) else {
            return;
        };
        for prefix in state.disable() {
            self.prefixes.remove(&prefix, client);
        }
        for key in state.keys {
            self.table.remove_reader(&key, client);
        }
    }

    /// `CONFIG SET tracking-table-max-keys`: what going over the new limit evicts.
    pub fn set_max_keys(&mut self, max_keys: usize, directory: &impl Directory) -> Vec<Delivery> {
        self.table.set_max_keys(max_keys);
        self.evict(directory)
    }

    /// What `INFO` shows.
    /// Whether any client has tracking on: [`Tracker::stats`]'s `clients > 0`, without counting
    /// them all (asked on every command of a tracking session, which is one of them).
    pub fn anyone_tracking(&self) -> bool {
        self.clients.values().any(|client| client.on.is_some())
    }

    pub fn stats(&self) -> Stats {
        Stats {
            clients: self.clients.values().filter(|c| c.on.is_some()).count(),
            keys: self.table.keys(),
            items: self.table.items(),
            prefixes: self.prefixes.len(),
        }
    }

    /// Keys given up to stay under the limit, their readers told as if they changed (but not
    /// BCAST clients, and `NOLOOP` has no writer to skip: `trackingInvalidateKey(NULL, key, 0)`).
    fn evict(&mut self, directory: &impl Directory) -> Vec<Delivery> {
        let mut out = Vec::new();
        while let Some(key) = self.table.over_limit() {
            self.tell_readers(&key, None, directory, &mut out);
        }
        out
    }

    /// `key`'s entry taken out, and its default-mode readers told (`trackingInvalidateKey`):
    /// not those with tracking off or in BCAST (their old reads are dropped), nor a `NOLOOP` writer.
    fn tell_readers(
        &mut self,
        key: &[u8],
        writer: Option<ClientId>,
        directory: &impl Directory,
        out: &mut Vec<Delivery>,
    ) {
        let Some((key, readers)) = self.table.take(key) else {
            return;
        };
        for id in readers {
            let Some(state) = self.clients.get_mut(&id) else {
                continue;
            };
            state.keys.remove(&key);
            let Some(on) = state.on.as_mut() else {
                continue;
            };
            if on.mode == Mode::Bcast || (on.noloop && writer == Some(id)) {
                continue;
            }
            let keys = Invalidation::Keys(vec![key.clone()]);
            route::send(id, on, keys, directory, out);
        }
    }

    /// BCAST clients told of `keys`: per prefix and client, the keys under it that the client
    /// may read, sorted and once each (`trackingBroadcastInvalidationMessages`).
    fn broadcast(
        &mut self,
        keys: &[Bytes],
        writer: Option<ClientId>,
        directory: &impl Directory,
        out: &mut Vec<Delivery>,
    ) {
        if self.prefixes.is_empty() {
            return;
        }
        let mut batches: BTreeMap<(Bytes, ClientId), BTreeSet<Bytes>> = BTreeMap::new();
        for key in keys {
            for (prefix, clients) in self.prefixes.matching(key) {
                for &id in clients {
                    let Some(state) = self.clients.get_mut(&id) else {
                        continue;
                    };
                    // Its own write through the daemon, told already.
                    if state.echoes.remove(key) {
                        continue;
                    }
                    let noloop = state.on.as_ref().is_some_and(|on| on.noloop);
                    if (noloop && writer == Some(id)) || !directory.may_read(id, key) {
                        continue;
                    }
                    let batch = batches.entry((prefix.clone(), id)).or_default();
                    batch.insert(key.clone());
                }
            }
        }
        for ((_, id), keys) in batches {
            if let Some(on) = self.clients.get_mut(&id).and_then(|s| s.on.as_mut()) {
                let keys = Invalidation::Keys(keys.into_iter().collect());
                route::send(id, on, keys, directory, out);
            }
        }
    }
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker::new(DEFAULT_MAX_KEYS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::testing::{keys, push, words, Clients};
    use tollgate_model::Protocol;

    const W: ClientId = 1;
    const OTHER: ClientId = 2;

    fn world(w: &str) -> (Tracker, Clients) {
        let mut clients = Clients::default();
        clients.connect(W, Protocol::Resp3);
        clients.connect(OTHER, Protocol::Resp3);
        let mut tracker = Tracker::default();
        tracker.tracking(W, &words(w), &clients).unwrap();
        tracker.tracking(OTHER, &words("ON"), &clients).unwrap();
        (tracker, clients)
    }

    #[test]
    fn anyone_tracking_follows_every_client_turning_tracking_on_and_off() {
        let (mut tracker, clients) = world("ON");
        assert!(tracker.anyone_tracking());
        tracker.off(W);
        assert!(tracker.anyone_tracking(), "OTHER still tracks");
        assert_eq!(tracker.stats().clients, 1);
        tracker.forget(OTHER);
        assert!(!tracker.anyone_tracking());
        assert_eq!(tracker.stats().clients, 0);
        tracker.tracking(W, &words("ON BCAST"), &clients).unwrap();
        assert!(tracker.anyone_tracking());
    }

    /// The daemon's flow for a write through it: `wrote` when it is sent, then Redis's
    /// invalidation of the same write (`invalidate` without a writer).
    #[test]
    fn the_writer_is_told_once_at_once_and_everyone_else_by_redis() {
        let (mut tracker, clients) = world("ON");
        tracker.read(W, &keys(&["k"]), &clients);
        tracker.read(OTHER, &keys(&["k"]), &clients);
        assert_eq!(
            tracker.wrote(W, &keys(&["k"]), &clients),
            vec![push(W, W, &["k"])]
        );
        assert_eq!(
            tracker.invalidate(&keys(&["k"]), None, &clients),
            vec![push(OTHER, OTHER, &["k"])],
            "Redis's invalidation tells the other reader, not the writer again"
        );
        // A key the writer never read: nothing now.
        assert!(tracker.wrote(W, &keys(&["j"]), &clients).is_empty());
    }

    #[test]
    fn noloop_holds_in_default_mode() {
        let (mut tracker, clients) = world("ON NOLOOP");
        tracker.read(W, &keys(&["k"]), &clients);
        assert!(tracker.wrote(W, &keys(&["k"]), &clients).is_empty());
        assert!(tracker.invalidate(&keys(&["k"]), None, &clients).is_empty());
    }

    #[test]
    fn a_bcast_writer_is_told_of_its_keys_under_its_prefixes() {
        let (mut tracker, clients) = world("ON BCAST PREFIX a PREFIX b");
        assert_eq!(
            tracker.wrote(W, &keys(&["b1", "a2", "c", "a1"]), &clients),
            vec![push(W, W, &["a1", "a2"]), push(W, W, &["b1"])]
        );
        // Redis's invalidation of the same write is not passed on again; after a read of the
        // key, the next one is news.
        assert!(tracker
            .invalidate(&keys(&["a1", "b1"]), None, &clients)
            .is_empty());
        tracker.read(W, &keys(&["a1"]), &clients);
        assert_eq!(
            tracker.invalidate(&keys(&["a1", "b1"]), None, &clients),
            vec![push(W, W, &["a1"]), push(W, W, &["b1"])]
        );
        // NOLOOP: told nothing now; Redis's invalidation cannot say who wrote, and is passed on.
        let (mut tracker, clients) = world("ON BCAST NOLOOP");
        assert!(tracker.wrote(W, &keys(&["k"]), &clients).is_empty());
        assert_eq!(
            tracker.invalidate(&keys(&["k"]), None, &clients),
            vec![push(W, W, &["k"])]
        );
    }
}
