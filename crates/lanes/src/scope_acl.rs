//! Scope users: the Redis ACL users a key-constrained principal's scripts run as (the policy
//! works out their grants, `tollgate_policy::scope`; this module only writes them for Redis).
//!
//! The root of the user runs the script commands (their declared keys were admitted already,
//! so any key outside the reserved keyspace) and the few keyless commands the scope allows; each
//! selector runs its commands only when every key they name matches its patterns, read-only
//! (`%R~`) where no command of the selector writes. The commands no script's user may run
//! ([`ALWAYS_REFUSED`], [`REFUSED_TO_SCRIPTS`]) are never granted.
//!
//! Redis reads a selector's text as `sdssplitargs` does, where a `"` or `'` anywhere starts a
//! quoted string; every pattern in a selector is therefore written quoted, with `\xNN` for each
//! byte that is not plainly printable or that quoting would read.

use std::collections::BTreeSet;

use tollgate_model::reserved::RESERVED_PREFIX;

use crate::acl::{complement_patterns, ALWAYS_REFUSED, REFUSED_TO_SCRIPTS};

/// One scope's user, as plain values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeUser {
    /// `tollgate-scope-<digest>`.
    pub name: String,
    /// Commands of the root (canonical or lower case): the script commands and keyless ones.
    pub root: BTreeSet<String>,
    pub selectors: Vec<ScopeSelector>,
}

/// One selector of a scope user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeSelector {
    pub commands: BTreeSet<String>,
    /// Redis key patterns, never whitespace or NUL (the policy refuses globs that need them).
    pub patterns: Vec<Vec<u8>>,
    pub read_only: bool,
    /// The patterns are channel patterns (`&`), for the publishing commands.
    pub channels: bool,
}

/// What a scope connection sends on its own: `HELLO` (with `AUTH`) to open, `PING` to probe.
const PLUMBING: [&str; 2] = ["hello", "ping"];

/// A scoped principal's transaction runs on a TRANSACTION connection logged in as its scope's
/// user (so that a script inside `MULTI` or after `WATCH` is held to the scope too), which sends
/// these around the commands the selectors grant. They name no key, and Redis refuses every one
/// of them inside a script (`noscript`), so no `redis.call` gains anything by them. `WATCH` names
/// keys: the selectors grant it with the scope's keys where the policy grants it, never the root.
const TRANSACTIONS: [&str; 4] = ["multi", "exec", "discard", "unwatch"];

impl ScopeUser {
    /// `ACL SETUSER` rules, applied after `reset`.
    pub fn acl_rules(&self) -> Vec<String> {
        // No channel but those a channel selector grants, whatever `acl-pubsub-default` says.
        let mut rules: Vec<String> = std::iter::once("resetchannels".to_owned())
            .chain(
                complement_patterns(RESERVED_PREFIX)
                    .into_iter()
                    .map(|pattern| format!("~{pattern}")),
            )
            .collect();
        let root: BTreeSet<String> = PLUMBING
            .iter()
            .chain(TRANSACTIONS.iter())
            .map(|name| (*name).to_owned())
            .chain(self.root.iter().map(|name| name.to_ascii_lowercase()))
            .filter(|name| grantable(name))
            .collect();
        rules.extend(root.iter().map(|name| format!("+{name}")));
        for selector in &self.selectors {
            let commands: Vec<String> = selector
                .commands
                .iter()
                .map(|name| name.to_ascii_lowercase())
                .filter(|name| grantable(name))
                .collect();
            if commands.is_empty() || selector.patterns.is_empty() {
                continue;
            }
            let mut text = String::from("(resetchannels ");
            for pattern in &selector.patterns {
                let access: &[u8] = match (selector.channels, selector.read_only) {
                    (true, _) => b"&",
                    (false, true) => b"%R~",
                    (false, false) => b"~",
                };
                quoted(&mut text, &[access, pattern].concat());
                text.push(' ');
            }
            for name in &commands {
                text.push_str(&format!("+{name} "));
            }
            text.pop();
            text.push(')');
            rules.push(text);
        }
        rules
    }
}

fn grantable(name: &str) -> bool {
    !ALWAYS_REFUSED.contains(&name) && !REFUSED_TO_SCRIPTS.contains(&name)
}

/// `"…"` as `sdssplitargs` reads it back to exactly `bytes` (plain ASCII, whatever the bytes).
fn quoted(out: &mut String, bytes: &[u8]) {
    out.push('"');
    for &byte in bytes {
        if byte.is_ascii_graphic() && !matches!(byte, b'"' | b'\'' | b'\\') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_quote_their_patterns_and_never_grant_refused_commands() {
        let user = ScopeUser {
            name: "tollgate-scope-x".into(),
            root: ["EVAL".to_owned(), "PING".to_owned()].into(),
            selectors: vec![
                ScopeSelector {
                    commands: ["SET".to_owned(), "COPY".to_owned()].into(),
                    patterns: vec![b"acme:*".to_vec(), b"a\"b\\*".to_vec()],
                    read_only: false,
                    channels: false,
                },
                ScopeSelector {
                    commands: ["GET".to_owned()].into(),
                    patterns: vec![b"shared:*".to_vec()],
                    read_only: true,
                    channels: false,
                },
                ScopeSelector {
                    commands: ["PUBLISH".to_owned()].into(),
                    patterns: vec![b"acme:*".to_vec()],
                    read_only: false,
                    channels: true,
                },
            ],
        };
        let rules = user.acl_rules();
        assert!(rules.contains(&"~[^t]*".to_owned()), "{rules:?}");
        assert!(rules.contains(&"+eval".to_owned()) && rules.contains(&"+hello".to_owned()));
        // A transaction runs as the scope's user: its keyless commands are the root's, `WATCH`
        // (which names keys) only a selector's.
        assert!(rules.contains(&"+multi".to_owned()) && rules.contains(&"+exec".to_owned()));
        assert!(!rules.contains(&"+watch".to_owned()), "{rules:?}");
        assert!(
            rules.contains(&"(resetchannels \"~acme:*\" \"~a\\x22b\\x5c*\" +set)".to_owned()),
            "{rules:?}"
        );
        assert!(
            rules.contains(&"(resetchannels \"%R~shared:*\" +get)".to_owned()),
            "{rules:?}"
        );
        assert!(!rules.iter().any(|rule| rule.contains("copy")), "{rules:?}");
        assert_eq!(rules[0], "resetchannels");
        assert!(
            rules.contains(&"(resetchannels \"&acme:*\" +publish)".to_owned()),
            "{rules:?}"
        );
    }
}
