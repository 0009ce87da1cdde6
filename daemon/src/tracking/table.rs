//! Which clients read each key (Redis's `TrackingTable`): invalidating a key finds the clients to
//! tell in one lookup and takes the whole entry out (a client is told once per read, and must read
//! again to be told again). Bounded by `tracking-table-max-keys`: past it, the least recently read
//! key is given up, its clients told as if it had changed (`trackingLimitUsedSlots`; Redis picks
//! a random key), since a key no longer tracked could otherwise change unannounced.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;

use super::ClientId;

/// Redis's default `tracking-table-max-keys`.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

#[derive(Debug)]
struct Entry {
    readers: BTreeSet<ClientId>,
    /// When it was last read, as a position in `KeyTable::order`.
    read_at: u64,
}

/// The tracked keys and their readers.
#[derive(Debug)]
pub struct KeyTable {
    entries: HashMap<Bytes, Entry>,
    /// Keys by when they were last read, oldest first.
    order: BTreeMap<u64, Bytes>,
    clock: u64,
    /// 0: no limit, as in Redis.
    max_keys: usize,
    /// Readers across every key (`tracking_total_items`).
    items: usize,
}

impl KeyTable {
    pub fn new(max_keys: usize) -> Self {
        KeyTable {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
            max_keys,
            items: 0,
        }
    }

    /// `client` read `key`; whether it was not in the table for it already.
    pub fn add(&mut self, key: &Bytes, client: ClientId) -> bool {
        self.clock += 1;
        let read_at = self.clock;
        // A new entry's `read_at` of 0 is in no place of `order` (the clock starts at 1).
        let entry = self.entries.entry(key.clone()).or_insert_with(|| Entry {
            readers: BTreeSet::new(),
            read_at: 0,
        });
        self.order.remove(&entry.read_at);
        entry.read_at = read_at;
        self.order.insert(read_at, key.clone());
        let added = entry.readers.insert(client);
        self.items += usize::from(added);
        added
    }

    /// Takes `key`'s entry out: the key as stored, and who read it.
    pub fn take(&mut self, key: &[u8]) -> Option<(Bytes, BTreeSet<ClientId>)> {
        let (key, entry) = self.entries.remove_entry(key)?;
        self.order.remove(&entry.read_at);
        self.items -= entry.readers.len();
        Some((key, entry.readers))
    }

    /// `client` is gone: it no longer reads `key` (a key nobody reads leaves the table).
    pub fn remove_reader(&mut self, key: &[u8], client: ClientId) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if entry.readers.remove(&client) {
            self.items -= 1;
        }
        if entry.readers.is_empty() {
            self.take(key);
        }
    }

    /// The key to give up next while over the limit: the least recently read.
    pub fn over_limit(&self) -> Option<Bytes> {
        let over = self.max_keys != 0 && self.entries.len() > self.max_keys;
        over.then(|| self.order.values().next().cloned()).flatten()
    }

    pub fn set_max_keys(&mut self, max_keys: usize) {
        self.max_keys = max_keys;
    }

    /// Forgets every key (a flush).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
        self.items = 0;
    }

    /// Keys tracked (`tracking_total_keys`).
    pub fn keys(&self) -> usize {
        self.entries.len()
    }

    /// Readers across every key (`tracking_total_items`).
    pub fn items(&self) -> usize {
        self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &'static str) -> Bytes {
        Bytes::from_static(name.as_bytes())
    }

    #[test]
    fn a_key_is_taken_out_whole_with_its_readers() {
        let mut table = KeyTable::new(0);
        assert!(table.add(&key("a"), 1));
        assert!(table.add(&key("a"), 2));
        assert!(!table.add(&key("a"), 1));
        assert!(table.add(&key("b"), 1));
        assert_eq!((table.keys(), table.items()), (2, 3));
        let (taken, readers) = table.take(b"a").unwrap();
        assert_eq!(taken, key("a"));
        assert_eq!(readers.into_iter().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!((table.keys(), table.items()), (1, 1));
        assert!(table.take(b"a").is_none());
    }

    #[test]
    fn a_key_read_by_no_one_leaves() {
        let mut table = KeyTable::new(0);
        table.add(&key("a"), 1);
        table.add(&key("a"), 2);
        table.remove_reader(b"a", 1);
        assert_eq!((table.keys(), table.items()), (1, 1));
        table.remove_reader(b"a", 1);
        assert_eq!(table.items(), 1);
        table.remove_reader(b"a", 2);
        assert_eq!((table.keys(), table.items()), (0, 0));
        assert!(table.order.is_empty());
    }

    #[test]
    fn past_the_limit_the_least_recently_read_key_goes_first() {
        let mut table = KeyTable::new(2);
        table.add(&key("a"), 1);
        table.add(&key("b"), 1);
        assert_eq!(table.over_limit(), None);
        // `a` read again: `b` is now the oldest.
        table.add(&key("a"), 2);
        table.add(&key("c"), 1);
        assert_eq!(table.over_limit(), Some(key("b")));
        table.take(b"b");
        assert_eq!(table.over_limit(), None);
        table.set_max_keys(1);
        assert_eq!(table.over_limit(), Some(key("a")));
        // 0: no limit.
        table.set_max_keys(0);
        assert_eq!(table.over_limit(), None);
        table.clear();
        assert_eq!((table.keys(), table.items()), (0, 0));
    }
}
