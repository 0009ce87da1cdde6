//! Every other ACL user a Redis server has: the users the daemon did not make and does not connect
//! as (Redis's `default`, an operator's admin, a replication or Sentinel user, another
//! application's). The reserved keyspace is only as safe as every one of them, so each enabled user
//! is asked about with `ACL DRYRUN` (nothing runs) and one that could touch it refuses the start,
//! unless the operator named it in `redis.trusted_users`.
//!
//! The probes, and why these: reading, writing and deleting a reserved key (`GET`, `SET`, `DEL`,
//! `UNLINK`, `INCRBY` — the fence counters are bumped with it —, `RESTORE`, `RENAME` into the
//! keyspace); publishing to and hearing the release channels (`PUBLISH`, `SPUBLISH`, `SUBSCRIBE`,
//! `SSUBSCRIBE`); the whole-keyspace commands that ignore key patterns (`FLUSHALL`, `FLUSHDB`,
//! `SWAPDB`); and `ACL SETUSER`, with which a user gives itself every key. `EVAL` is not probed:
//! a script's `redis.call`s are checked against the same user's rules, so it reaches no key the
//! command probes do not. `REPLICAOF`/`SLAVEOF`/`FAILOVER` and `CONFIG SET` are not probed either:
//! the Sentinel user needs them on every node (docs/cluster.md says what that leaves to the
//! operator).

use tollgate_model::reserved::RESERVED_PREFIX;

/// One enabled ACL user, as `ACL LIST` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) name: String,
    /// `nopass`: every local user who can open the socket connects as it, no password asked.
    pub(crate) open: bool,
}

/// The enabled users in `ACL LIST`'s lines (`user <name> on|off [nopass] …`); disabled ones
/// cannot log in and are left out.
pub(crate) fn enabled(lines: &[String]) -> Vec<Listed> {
    lines
        .iter()
        .filter_map(|line| {
            let mut words = line.split_ascii_whitespace();
            if words.next() != Some("user") {
                return None;
            }
            let name = words.next()?.to_owned();
            let rules: Vec<&str> = words.collect();
            rules.contains(&"on").then(|| Listed {
                open: rules.contains(&"nopass"),
                name,
            })
        })
        .collect()
}

/// The commands no user but the daemon's own may be able to run (see the module's header).
pub(crate) fn probes(lease_database: u32) -> Vec<Vec<String>> {
    let reserved = format!("{RESERVED_PREFIX}probe");
    let line = |words: &[&str]| -> Vec<String> {
        words
            .iter()
            .map(|word| word.replace("{r}", &reserved))
            .collect()
    };
    vec![
        line(&["GET", "{r}"]),
        line(&["SET", "{r}", "x"]),
        line(&["DEL", "{r}"]),
        line(&["UNLINK", "{r}"]),
        line(&["INCRBY", "{r}", "1"]),
        line(&["RESTORE", "{r}", "0", "x"]),
        line(&["RENAME", "decoy", "{r}"]),
        line(&["PUBLISH", "{r}", "x"]),
        line(&["SPUBLISH", "{r}", "x"]),
        line(&["SUBSCRIBE", "{r}"]),
        line(&["SSUBSCRIBE", "{r}"]),
        line(&["FLUSHALL"]),
        line(&["FLUSHDB"]),
        vec!["SWAPDB".into(), "0".into(), lease_database.to_string()],
        line(&["ACL", "SETUSER", "probe"]),
    ]
}

/// An enabled user the daemon did not make that may run one of [`probes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherUser {
    pub name: String,
    /// The first probe Redis allowed it.
    pub probe: String,
    /// It has no password (`nopass`): any local user can connect as it.
    pub open: bool,
}

impl std::fmt::Display for OtherUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` may run `{}`", self.name, self.probe)?;
        if self.open {
            write!(
                f,
                " and has no password (nopass): any local user can connect as it"
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_enabled_users_are_listed_and_nopass_ones_are_open() {
        let lines = [
            "user admin on #5e88 ~* &* +@all",
            "user default on nopass sanitize-payload ~* &* +@all",
            "user gone off nopass ~* +@all",
            "garbage",
        ]
        .map(str::to_owned);
        assert_eq!(
            enabled(&lines),
            [
                Listed {
                    name: "admin".into(),
                    open: false
                },
                Listed {
                    name: "default".into(),
                    open: true
                },
            ]
        );
    }

    #[test]
    fn every_probe_names_the_reserved_keyspace_or_ignores_key_patterns() {
        for probe in probes(1) {
            let names_it = probe.iter().any(|word| word.starts_with(RESERVED_PREFIX));
            let whole = ["FLUSHALL", "FLUSHDB", "SWAPDB", "ACL"].contains(&probe[0].as_str());
            assert!(names_it || whole, "{probe:?}");
        }
    }
}
