//! What no client may do whatever the policy says: name a key or channel in the daemon's reserved
//! keyspace, run a server-wide command that would reach it around key patterns, or name a
//! database other than 0 (the only one clients are served, as `SELECT` answers; the lease
//! database is another) in a command's database argument. Checked by the
//! host on every command before any guard runs, so the refusal is the same under every policy and
//! module, and a client learns why before Redis (whose ACL refuses the same) is asked.

use tollgate_model::reserved::{is_reserved, RESERVED_PREFIX};

use crate::decision::Descriptor;

/// The rule a refusal names.
pub const RULE: &str = "reserved";

/// Commands refused by name, whatever their arguments: they reach every database around key
/// patterns. (FLUSHALL is not among them: the front door serves it as UNLINK of the caller's own
/// keys, and Redis's ACL refuses a raw one on every client lane.)
pub const REFUSED_BY_NAME: [&str; 1] = ["SWAPDB"];

/// Why `argv`, described by `descriptor`, may not run; `None` when it may go on to the guards.
pub fn refusal<A: AsRef<[u8]>>(descriptor: &Descriptor, argv: &[A]) -> Option<String> {
    if let Some(key) = descriptor.keys(argv).find(|key| is_reserved(key.as_ref())) {
        return Some(format!(
            "key {} is in the daemon's reserved keyspace {RESERVED_PREFIX}*",
            String::from_utf8_lossy(key.as_ref())
        ));
    }
    let channels = match descriptor.name.as_str() {
        "PUBLISH" | "SPUBLISH" => argv.get(1..2),
        "SUBSCRIBE" | "SSUBSCRIBE" | "PSUBSCRIBE" => argv.get(1..),
        // SWAPDB ignores key patterns: it would trade the lease database for one a client can write.
        name if REFUSED_BY_NAME.contains(&name) => {
            return Some(format!(
                "it reaches every database, the daemon's reserved keyspace {RESERVED_PREFIX}* \
                 among them"
            ))
        }
        "MOVE" | "COPY" | "MIGRATE" => return other_database(&descriptor.name, argv),
        _ => None,
    };
    channels?
        .iter()
        .find(|channel| is_reserved(channel.as_ref()))
        .map(|channel| {
            format!(
                "channel {} is in the daemon's reserved keyspace {RESERVED_PREFIX}*",
                String::from_utf8_lossy(channel.as_ref())
            )
        })
}

/// Why a command's database argument may not run: any but `0`, spelled as Redis parses zero (no
/// sign, no leading zeros), names a database no client is served — the lease database among them.
/// `MOVE key db`, `MIGRATE host port key db timeout …` (the destination may be this very server)
/// and every `DB n` option of `COPY`, found as Redis's option loop finds it.
fn other_database<A: AsRef<[u8]>>(name: &str, argv: &[A]) -> Option<String> {
    let arg = |at: usize| argv.get(at).map(AsRef::as_ref);
    let databases: Vec<&[u8]> = match name {
        "MOVE" => arg(2).into_iter().collect(),
        "MIGRATE" => arg(4).into_iter().collect(),
        _ => {
            let mut databases = Vec::new();
            let mut at = 3;
            while at < argv.len() {
                if is_keyword(argv[at].as_ref(), b"DB") && at + 1 < argv.len() {
                    databases.push(argv[at + 1].as_ref());
                    at += 1;
                }
                at += 1;
            }
            databases
        }
    };
    let other = databases.into_iter().find(|db| *db != b"0")?;
    Some(format!(
        "database {} is not served: clients have database 0 only (the lease database is the \
         daemon's)",
        String::from_utf8_lossy(other)
    ))
}

/// Whether `arg` is `keyword` as Redis's `strcasecmp` sees it: up to its first NUL.
fn is_keyword(arg: &[u8], keyword: &[u8]) -> bool {
    let c_string = arg.split(|&b| b == 0).next().unwrap_or_default();
    c_string.eq_ignore_ascii_case(keyword)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(line: &str) -> Option<String> {
        let argv: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let name = line.split(' ').next().unwrap().to_ascii_uppercase();
        other_database(&name, &argv)
    }

    #[test]
    fn a_database_argument_other_than_zero_is_refused() {
        for line in [
            "MOVE k 1",
            "MOVE k 01",
            "MOVE k -0",
            "COPY a b DB 1",
            "COPY a b db 1 REPLACE",
            "COPY a b REPLACE DB 15",
            "COPY a b DB 0 DB 1",
            "COPY a b DB\0x 1",
            "MIGRATE 127.0.0.1 6379 k 1 1000",
            "MIGRATE 127.0.0.1 6379  1 1000 KEYS a b",
        ] {
            assert!(refused(line).is_some(), "{line:?} was not refused");
        }
        assert!(refused("COPY a b DB 1")
            .unwrap()
            .starts_with("database 1 is not served"));
    }

    #[test]
    fn database_zero_and_commands_without_one_go_on() {
        for line in [
            "MOVE k 0",
            "COPY a b",
            "COPY a b REPLACE",
            "COPY a b DB 0 REPLACE",
            "COPY a b DB",
            "MIGRATE 127.0.0.1 6379 k 0 1000",
        ] {
            assert_eq!(refused(line), None, "{line:?} was refused");
        }
    }
}
