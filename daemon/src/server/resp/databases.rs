//! Database arguments: clients are served database 0 only (`SELECT` of another is answered with
//! an error, lane connections being shared), and the daemon keeps its leases in another. A command
//! whose database argument names any other — `MOVE key db`, `COPY … DB n`, `MIGRATE`'s destination
//! db (which may be this very server) — is refused before it is sent, whatever the policy says, as
//! `SELECT 1` is. (`SWAPDB` is refused by name with the reserved keyspace, `crates/policy`'s
//! `reserved.rs`.) A script's calls are not admitted: the lanes' ACL users lack these commands
//! where scripts run (`tollgate_lanes::REFUSED_TO_SCRIPTS`, `ALWAYS_REFUSED`).

/// The database other than 0 that `argv`, a command `name`d so by the catalog, names; `None` when
/// it names none. `0` is spelled as Redis parses zero (no sign, no leading zeros); any other
/// spelling is refused, whether Redis would take it or not.
/// `MOVE key db`, `MIGRATE host port key db timeout …` (the destination may be this very server)
/// and every `DB n` option of `COPY`, found as Redis's option loop finds it.
pub fn other_database<A: AsRef<[u8]>>(name: &str, argv: &[A]) -> Option<String> {
    let arg = |at: usize| argv.get(at).map(AsRef::as_ref);
    let databases: Vec<&[u8]> = match name {
        "MOVE" => arg(2).into_iter().collect(),
        "MIGRATE" => arg(4).into_iter().collect(),
        "COPY" => {
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
        _ => return None,
    };
    let other = databases.into_iter().find(|db| *db != b"0")?;
    Some(String::from_utf8_lossy(other).into_owned())
}

/// The error for `name`'s database argument `db` other than 0. Where Redis refuses the argument
/// too (not an integer as Redis reads one, or past the C `int` that all but `MIGRATE` take),
/// Redis's own words; else Redis's words for a database past the last (the daemon serves one, as
/// its `CONFIG GET databases` says) and why.
pub fn refusal(name: &str, db: &[u8]) -> String {
    let takes_int = name != "MIGRATE";
    match redis_integer(db) {
        None => "ERR value is not an integer or out of range".to_owned(),
        Some(n) if takes_int && i32::try_from(n).is_err() => format!(
            "ERR value is out of range, value must between {} and {}",
            i32::MIN,
            i32::MAX
        ),
        Some(_) => format!(
            "ERR DB index is out of range: tollgate serves database 0 only (lane connections are \
             shared between clients; the daemon keeps its leases in another): {name} names \
             database {}",
            String::from_utf8_lossy(db)
        ),
    }
}

/// `arg` as Redis's `string2ll` reads an integer: an optional `-`, then `0` alone or digits that
/// do not start with `0`, within an `i64`.
fn redis_integer(arg: &[u8]) -> Option<i64> {
    let digits = arg.strip_prefix(b"-").unwrap_or(arg);
    let canonical = arg == b"0"
        || matches!(digits.first(), Some(b'1'..=b'9')) && digits.iter().all(u8::is_ascii_digit);
    if !canonical {
        return None;
    }
    std::str::from_utf8(arg).ok()?.parse().ok()
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
        assert_eq!(refused("COPY a b DB 15").as_deref(), Some("15"));
    }

    #[test]
    fn a_refused_database_is_worded_as_redis_words_what_it_refuses_too() {
        let not_an_integer = "ERR value is not an integer or out of range";
        for db in ["x", "01", "-0", "+1", "1 ", "", "99999999999999999999"] {
            assert_eq!(refusal("COPY", db.as_bytes()), not_an_integer, "{db:?}");
        }
        assert!(refusal("MOVE", b"3000000000").starts_with("ERR value is out of range"));
        assert!(refusal("COPY", b"3000000000").starts_with("ERR value is out of range"));
        for (name, db) in [
            ("MIGRATE", "3000000000"),
            ("SELECT", "1000000"),
            ("MOVE", "-1"),
        ] {
            let text = refusal(name, db.as_bytes());
            assert!(
                text.starts_with("ERR DB index is out of range: tollgate serves database 0 only")
                    && text.ends_with(&format!("{name} names database {db}")),
                "{text}"
            );
        }
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
            "GET DB 1",
            "SET k DB 1",
        ] {
            assert_eq!(refused(line), None, "{line:?} was refused");
        }
    }
}
