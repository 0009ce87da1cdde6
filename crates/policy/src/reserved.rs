//! What no client may do whatever the policy says: name a key or channel in the daemon's reserved
//! keyspace, or run a server-wide command that would reach it around key patterns. Checked by the
//! host on every command before any guard runs, so the refusal is the same under every policy and
//! module, and a client learns why before Redis (whose ACL refuses the same) is asked.

use tollgate_model::reserved::{is_reserved, RESERVED_PREFIX};
use tollgate_policy_rules::channels;

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
    // SWAPDB ignores key patterns: it would trade the lease database for one a client can write.
    if REFUSED_BY_NAME.contains(&descriptor.name.as_str()) {
        return Some(format!(
            "it reaches every database, the daemon's reserved keyspace {RESERVED_PREFIX}* among \
             them"
        ));
    }
    let (_, channels) = channels::of(&descriptor.name, argv)?;
    channels
        .iter()
        .find(|channel| is_reserved(channel.as_ref()))
        .map(|channel| {
            format!(
                "channel {} is in the daemon's reserved keyspace {RESERVED_PREFIX}*",
                String::from_utf8_lossy(channel.as_ref())
            )
        })
}
