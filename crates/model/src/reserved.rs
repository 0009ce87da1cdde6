//! The daemon's reserved keyspace: every Redis key and channel whose name starts with
//! [`RESERVED_PREFIX`] belongs to the daemon (lease state, fence counters, release channels). No
//! client may name one: admission refuses them, and the client lanes' Redis ACL users cannot reach
//! them, so not even a script run on a client lane can (docs/design.md, "Trust model").

/// The prefix of every key and channel the daemon keeps for itself.
pub const RESERVED_PREFIX: &str = "tollgate:";

/// The Redis database the lease service keeps its keys in by default. Client lanes serve database 0
/// only and their ACL users may not `SELECT`, so `SCAN` and `KEYS` from a client never list them.
pub const DEFAULT_LEASE_DATABASE: u32 = 1;

/// Whether `name` (a key or a channel) lies in the reserved keyspace. Redis compares names
/// byte-wise and case-sensitively, and so does this.
pub fn is_reserved(name: &[u8]) -> bool {
    name.starts_with(RESERVED_PREFIX.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_under_the_exact_prefix_are_reserved() {
        assert!(is_reserved(b"tollgate:lease:{abc}"));
        assert!(is_reserved(b"tollgate:"));
        assert!(!is_reserved(b"tollgate"));
        assert!(!is_reserved(b"Tollgate:lease"));
        assert!(!is_reserved(b"x:tollgate:lease"));
        assert!(!is_reserved(b""));
    }
}
