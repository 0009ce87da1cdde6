//! The keys of the resources named lately, so that a resource named again (an acquire's release,
//! a renewal, the next acquire) does not cost its digest and three key names again: those were
//! the largest lease-specific item of a `LEASE` call's CPU in the daemon (`benches/instructions.py
//! --lease`). Direct-mapped: a resource has one place, taken by whichever resource named there
//! last, so the memo's size is fixed whatever names callers make up, and a collision or a caller
//! cycling through names only costs what every call cost before it.
//!
//! Only resources the policy admitted reach it (admission runs first), and what a hit returns is
//! exactly what [`LeaseKeys::of`] computes, so a memo hit or miss changes no outcome.

use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHasher;

use crate::keys::LeaseKeys;
use crate::resource::Resource;

/// How many resources are remembered at most: 256 names of at most 200 bytes and their keys, about
/// 130 KB when every place is taken by a name of the longest kind.
const PLACES: usize = 256;

pub struct KeysMemo {
    places: Mutex<Box<[Option<Remembered>]>>,
}

/// A resource and its keys.
type Remembered = (Resource, Arc<LeaseKeys>);

impl Default for KeysMemo {
    fn default() -> KeysMemo {
        KeysMemo {
            places: Mutex::new(vec![None; PLACES].into_boxed_slice()),
        }
    }
}

impl KeysMemo {
    /// `resource`'s keys, remembered or computed (and then remembered in its place).
    pub fn keys(&self, resource: &Resource) -> Arc<LeaseKeys> {
        let at = place_of(resource);
        if let Some((named, keys)) = &self.places.lock()[at] {
            if named == resource {
                return Arc::clone(keys);
            }
        }
        // Computed outside the lock: the digest is the expensive part.
        let keys = Arc::new(LeaseKeys::of(resource));
        self.places.lock()[at] = Some((resource.clone(), Arc::clone(&keys)));
        keys
    }
}

fn place_of(resource: &Resource) -> usize {
    let hash = BuildHasherDefault::<FxHasher>::default().hash_one(resource.as_str());
    // FxHash's high bits are its best mixed.
    (hash >> 56) as usize % PLACES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(name: &str) -> Resource {
        Resource::parse(name).unwrap()
    }

    #[test]
    fn a_remembered_resource_gets_the_keys_it_would_compute() {
        let memo = KeysMemo::default();
        let first = memo.keys(&resource("orders:42"));
        let again = memo.keys(&resource("orders:42"));
        assert!(
            Arc::ptr_eq(&first, &again),
            "the second naming is remembered"
        );
        assert_eq!(*again, LeaseKeys::of(&resource("orders:42")));
    }

    #[test]
    fn names_sharing_a_place_each_get_their_own_keys() {
        let memo = KeysMemo::default();
        // More names than places: some share one, and each still gets its own keys, in any order.
        let names: Vec<String> = (0..3 * PLACES).map(|n| format!("r{n}")).collect();
        for round in 0..2 {
            for name in names.iter().rev().skip(round) {
                assert_eq!(*memo.keys(&resource(name)), LeaseKeys::of(&resource(name)));
            }
        }
    }

    #[test]
    fn callers_on_many_threads_each_get_their_resources_keys() {
        // The daemon's runtimes share one memo: a place read, computed and written over by
        // several threads at once must still answer each with its own resource's keys.
        let memo = Arc::new(KeysMemo::default());
        let threads: Vec<_> = (0..4)
            .map(|thread| {
                let memo = Arc::clone(&memo);
                std::thread::spawn(move || {
                    for n in 0..2_000 {
                        let name = format!("r{}", (n * 7 + thread * 13) % (2 * PLACES + 88));
                        let keys = memo.keys(&resource(&name));
                        assert_eq!(*keys, LeaseKeys::of(&resource(&name)), "{name}");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }

    #[test]
    fn names_spread_over_the_places() {
        // A place function that sent most names to a few places would make the memo useless.
        let taken: std::collections::HashSet<usize> = (0..PLACES)
            .map(|n| place_of(&resource(&format!("orders:{n}"))))
            .collect();
        assert!(
            taken.len() > PLACES / 2,
            "{} of {PLACES} places",
            taken.len()
        );
    }
}
