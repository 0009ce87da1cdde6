//! Which commands each lane's Redis ACL user is granted: a plain value the daemon works out from
//! the active policy (the lanes know nothing of policies), with every command Redis may be asked
//! about and its arity, so that a lane user can be checked for commands it lacks and commands it
//! has and should not.

use std::collections::{BTreeMap, BTreeSet};

use tollgate_model::Lane;

/// Per lane, the commands as ACL rules name them (`get`, `client|list`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaneGrants {
    known: BTreeMap<String, i32>,
    granted: BTreeMap<Lane, BTreeSet<String>>,
}

impl LaneGrants {
    /// Records `name` (`CLIENT|LIST`, any case) as a command Redis may be asked about.
    pub fn know(&mut self, name: &str, arity: i32) {
        self.known.insert(name.to_ascii_lowercase(), arity);
    }

    /// Grants `name` to `lane`'s user.
    pub fn grant(&mut self, lane: Lane, name: &str) {
        self.granted
            .entry(lane)
            .or_default()
            .insert(name.to_ascii_lowercase());
    }

    /// The commands granted to `lane`'s user, sorted.
    pub fn granted(&self, lane: Lane) -> impl Iterator<Item = &str> + '_ {
        self.granted
            .get(&lane)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    pub fn is_granted(&self, lane: Lane, name: &str) -> bool {
        self.granted
            .get(&lane)
            .is_some_and(|names| names.contains(&name.to_ascii_lowercase()))
    }

    /// Every command recorded by [`LaneGrants::know`], with its arity.
    pub fn known(&self) -> impl Iterator<Item = (&str, i32)> + '_ {
        self.known
            .iter()
            .map(|(name, arity)| (name.as_str(), *arity))
    }
}
