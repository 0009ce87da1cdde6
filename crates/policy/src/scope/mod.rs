//! Scopes: what Redis itself must hold a principal's scripts to. A script's `redis.call`s are
//! not admitted one by one (admission sees only the keys the script declares), so for a
//! principal whose keys the policy constrains, each distinct set of key grants becomes a Redis
//! ACL user (a *scope*) that the principal's scripts run as.
//!
//! A scope is a list of ACL *selectors* (Redis 7), one per allow rule and group of commands,
//! because a first-match policy is exactly a union of allow rules each minus the deny rules
//! before it ([`derive`] says how each is cut): a selector allows a command only when all its
//! keys match its patterns, as an allow rule does. One user with every pattern and every command
//! would let a command reach keys that only another rule's commands may touch.
//!
//! Patterns are the rules' globs written for Redis's matcher ([`pattern`]), with the keys of
//! earlier deny rules and of the reserved keyspace `tollgate:` taken out ([`minus`]); what cannot
//! be written exactly is a compile error at the rule, never a wider grant.

mod bytes;
mod derive;
mod minus;
mod pattern;
mod relation;

use std::collections::BTreeSet;

pub use derive::{derive, ScopeInput};
pub use pattern::{redis_matches, redis_pattern, Unwritable};

/// The scopes of one generation, and which principal's scripts run in which.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scopes {
    pub scopes: Vec<Scope>,
    /// Every principal the policy names, and `None` for callers it names no principal for,
    /// each with the index of its scope in `scopes` (`None`: its scripts are not confined).
    pub assigned: Vec<(Option<String>, Option<usize>)>,
}

impl Scopes {
    /// The scope `principal`'s scripts run in, if its keys are constrained; a principal the
    /// policy does not name (`uid:<n>`) is judged as callers no principal names.
    pub fn of(&self, principal: &str) -> Option<&Scope> {
        let entry = self
            .assigned
            .iter()
            .find(|(name, _)| name.as_deref() == Some(principal))
            .or_else(|| self.assigned.iter().find(|(name, _)| name.is_none()))?;
        entry.1.map(|at| &self.scopes[at])
    }
}

/// One scope: a Redis ACL user's commands and key patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// `tollgate-scope-<digest of what follows>`: the same grants, the same user, whichever
    /// principals share it and whichever reload made it.
    pub user: String,
    /// The principals whose scripts run in it (`None`: callers no principal names).
    pub principals: Vec<Option<String>>,
    /// The ids of the allow rules whose grants make up its selectors, in policy order.
    pub rules: Vec<String>,
    /// Of those, the rules with `channels:`: whose channel grants the scope holds.
    pub channel_rules: Vec<String>,
    /// The commands its principals may send on the SCRIPT lane (`EVAL`, `FCALL_RO`, `SCRIPT
    /// LOAD`, …): its user runs them on any key outside the reserved keyspace (their declared
    /// keys were admitted already).
    pub scripts: BTreeSet<String>,
    /// Commands that name no key, that a rule without `keys:` lets its principals run and that
    /// see nothing of other tenants' keys (no `@keyspace`, `@dangerous`, `@admin`, `@pubsub`).
    pub keyless: BTreeSet<String>,
    pub selectors: Vec<Selector>,
}

/// One ACL selector: these commands, when every key they name matches one of these patterns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Selector {
    /// Redis patterns (`acme:*`, `[^t]*`), as bytes.
    pub patterns: Vec<Vec<u8>>,
    /// No command here writes (Redis: `%R~`), so the patterns are granted for reading only.
    pub read_only: bool,
    /// Canonical names, upper case, subcommand after a bar (`OBJECT|ENCODING`).
    pub commands: BTreeSet<String>,
    /// The patterns are channel patterns (Redis: `&`), for the commands that publish
    /// (`PUBLISH`, `SPUBLISH`): the channels the principal's rules grant them.
    pub channels: bool,
}

impl Scope {
    /// Whether Redis, as this scope's user, lets a script's `command` (canonical name, whether
    /// it writes) touch `keys`: some selector has the command and a pattern for every key. The
    /// plain reading of [`Selector`]; Redis's own is tested against it.
    pub fn allows(&self, command: &str, keys: &[&[u8]]) -> bool {
        (self.keyless.contains(command) && keys.is_empty())
            || self.selectors.iter().any(|selector| {
                !selector.channels
                    && selector.commands.contains(command)
                    && keys.iter().all(|key| {
                        selector
                            .patterns
                            .iter()
                            .any(|pattern| redis_matches(pattern, key))
                    })
            })
    }

    /// Whether Redis, as this scope's user, lets a script's `command` (`PUBLISH`, `SPUBLISH`)
    /// reach `channel`: some channel selector has the command and a pattern for it.
    pub fn publishes(&self, command: &str, channel: &[u8]) -> bool {
        self.selectors.iter().any(|selector| {
            selector.channels
                && selector.commands.contains(command)
                && selector
                    .patterns
                    .iter()
                    .any(|pattern| redis_matches(pattern, channel))
        })
    }

    /// The words a refused `PUBLISH` of this scope's user gains: which rules' channels it holds.
    pub fn channel_words(&self) -> String {
        match self.channel_rules.as_slice() {
            [] => "tollgate: no rule grants this script's caller channels".to_owned(),
            [one] => format!("tollgate: scope of rule {one} does not include that channel"),
            many => format!(
                "tollgate: scope of rules {} does not include that channel",
                many.join(", ")
            ),
        }
    }

    /// The words a refusal of this scope's user gains: which rules' keys the scope holds.
    pub fn words(&self) -> String {
        match self.rules.as_slice() {
            [] => "tollgate: no rule grants this script's caller keys".to_owned(),
            [one] => format!("tollgate: scope of rule {one} does not include that key"),
            many => format!(
                "tollgate: scope of rules {} does not include that key",
                many.join(", ")
            ),
        }
    }
}
