//! BCAST prefixes: the rule that one client's prefixes never overlap (so that a key written is
//! announced to a client once per prefix it falls under, and with non-overlapping prefixes once),
//! and the table of every prefix to the clients that asked for it (Redis's `PrefixTable`), which
//! finds the prefixes a written key falls under by looking up only the lengths some prefix has,
//! rather than walking every prefix as Redis does.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::command::TrackingError;
use super::ClientId;

/// Whether two prefixes would announce the same key: one starts the other
/// (`stringCheckPrefix`; the empty prefix overlaps every prefix).
pub fn overlap(a: &[u8], b: &[u8]) -> bool {
    let shorter = a.len().min(b.len());
    a[..shorter] == b[..shorter]
}

/// `given` may be added to a client's `existing` prefixes (`checkPrefixCollisionsOrReply`): for
/// each given prefix in order, first against the existing ones (in order), then against the given
/// ones after it; the first overlap found is the error.
pub fn check(existing: &BTreeSet<Bytes>, given: &[Bytes]) -> Result<(), TrackingError> {
    for (i, prefix) in given.iter().enumerate() {
        if let Some(existing) = existing.iter().find(|existing| overlap(existing, prefix)) {
            return Err(TrackingError::OverlapsExisting {
                prefix: prefix.clone(),
                existing: existing.clone(),
            });
        }
        if let Some(other) = given[i + 1..].iter().find(|other| overlap(prefix, other)) {
            return Err(TrackingError::OverlapsGiven {
                prefix: prefix.clone(),
                other: other.clone(),
            });
        }
    }
    Ok(())
}

/// Every BCAST prefix in use, and who asked for it.
#[derive(Debug, Default)]
pub struct PrefixTable {
    clients: BTreeMap<Bytes, BTreeSet<ClientId>>,
    /// How many prefixes there are of each length: a key is looked up at these lengths only.
    lengths: BTreeMap<usize, usize>,
}

impl PrefixTable {
    /// `client` is told of writes to keys under `prefix`.
    pub fn add(&mut self, prefix: Bytes, client: ClientId) {
        let len = prefix.len();
        let clients = self.clients.entry(prefix).or_insert_with(|| {
            *self.lengths.entry(len).or_default() += 1;
            BTreeSet::new()
        });
        clients.insert(client);
    }

    /// `client` no longer is; a prefix nobody asks for is forgotten.
    pub fn remove(&mut self, prefix: &[u8], client: ClientId) {
        let Some(clients) = self.clients.get_mut(prefix) else {
            return;
        };
        clients.remove(&client);
        if clients.is_empty() {
            self.clients.remove(prefix);
            if let Some(count) = self.lengths.get_mut(&prefix.len()) {
                *count -= 1;
                if *count == 0 {
                    self.lengths.remove(&prefix.len());
                }
            }
        }
    }

    /// The prefixes `key` falls under, shortest first, each with the clients that asked for it.
    pub fn matching<'a>(
        &'a self,
        key: &'a [u8],
    ) -> impl Iterator<Item = (&'a Bytes, &'a BTreeSet<ClientId>)> + 'a {
        self.lengths
            .range(..=key.len())
            .filter_map(move |(&len, _)| self.clients.get_key_value(&key[..len]))
    }

    /// How many prefixes are in use (`tracking_total_prefixes`).
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(prefixes: &[&'static str]) -> BTreeSet<Bytes> {
        prefixes
            .iter()
            .map(|p| Bytes::from_static(p.as_bytes()))
            .collect()
    }

    fn given(prefixes: &[&'static str]) -> Vec<Bytes> {
        prefixes
            .iter()
            .map(|p| Bytes::from_static(p.as_bytes()))
            .collect()
    }

    /// tracking.tcl, "BCAST with prefix collisions throw errors".
    #[test]
    fn overlapping_prefixes_are_refused_naming_both() {
        let err = check(&set(&[]), &given(&["FOOBAR", "FOO"])).unwrap_err();
        assert!(err.to_string().starts_with("ERR Prefix 'FOOBAR'"), "{err}");
        assert!(
            err.to_string().contains("another provided prefix 'FOO'"),
            "{err}"
        );
        let err = check(&set(&[]), &given(&["FOO", "FOOBAR"])).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("ERR Prefix 'FOO' overlaps with another provided prefix 'FOOBAR'"));
        let existing = set(&["FOO", "BAR"]);
        let err = check(&existing, &given(&["FO"])).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("ERR Prefix 'FO' overlaps with an existing prefix 'FOO'"));
        let err = check(&existing, &given(&["BARB"])).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("ERR Prefix 'BARB' overlaps with an existing prefix 'BAR'"));
        assert_eq!(check(&existing, &given(&["BAZ", "QUX"])), Ok(()));
    }

    /// tracking.c, `checkPrefixCollisionsOrReply`: the same prefix twice overlaps itself, the
    /// empty prefix overlaps everything, and existing prefixes are checked before later given
    /// ones.
    #[test]
    fn the_first_overlap_in_redis_order_is_the_one_named() {
        assert!(overlap(b"a", b"a"));
        assert!(overlap(b"", b"anything"));
        assert!(!overlap(b"ab", b"ac"));
        let err = check(&set(&["a"]), &given(&["a"])).unwrap_err();
        assert!(matches!(err, TrackingError::OverlapsExisting { .. }));
        let err = check(&set(&[""]), &given(&["b"])).unwrap_err();
        assert_eq!(
            err,
            TrackingError::OverlapsExisting {
                prefix: Bytes::from_static(b"b"),
                existing: Bytes::new(),
            }
        );
        // With `y` existing, given `x, yy, x`: the first `x` meets no existing prefix, then the
        // second `x`, before `yy` is ever checked against `y`.
        let err = check(&set(&["y"]), &given(&["x", "yy", "x"])).unwrap_err();
        assert_eq!(
            err,
            TrackingError::OverlapsGiven {
                prefix: Bytes::from_static(b"x"),
                other: Bytes::from_static(b"x"),
            }
        );
    }

    #[test]
    fn a_key_matches_every_prefix_that_starts_it() {
        let mut table = PrefixTable::default();
        table.add(Bytes::from_static(b""), 1);
        table.add(Bytes::from_static(b"user:"), 2);
        table.add(Bytes::from_static(b"user:"), 3);
        table.add(Bytes::from_static(b"user:1"), 4);
        table.add(Bytes::from_static(b"cfg"), 5);
        let matched: Vec<(Bytes, Vec<ClientId>)> = table
            .matching(b"user:12")
            .map(|(prefix, clients)| (prefix.clone(), clients.iter().copied().collect()))
            .collect();
        assert_eq!(
            matched,
            vec![
                (Bytes::new(), vec![1]),
                (Bytes::from_static(b"user:"), vec![2, 3]),
                (Bytes::from_static(b"user:1"), vec![4]),
            ]
        );
        // A prefix longer than the key is not looked at.
        assert_eq!(table.matching(b"us").count(), 1);
        assert_eq!(table.len(), 4);
        table.remove(b"user:", 2);
        assert_eq!(table.len(), 4);
        table.remove(b"user:", 3);
        table.remove(b"", 1);
        assert_eq!(table.len(), 2);
        assert_eq!(table.matching(b"user:12").count(), 1);
        assert_eq!(table.matching(b"other").count(), 0);
        table.remove(b"user:1", 4);
        table.remove(b"cfg", 5);
        assert!(table.is_empty() && table.lengths.is_empty());
    }
}
