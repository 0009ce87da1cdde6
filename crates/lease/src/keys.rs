//! The Redis keys of a resource. Redis never sees a raw name: every key holds the SHA-256 digest.
//! Fences come from a counter shared by the resources of a *bucket* (one of [`FENCE_BUCKETS`],
//! chosen by the digest), not from a counter per resource, so that nothing of a resource outlives
//! its last lease: the lease hash goes when it is released or expires, and the counters stay
//! bounded in number however many resources were ever used. The bucket is the hash tag, so a
//! lease, its bucket's counter and its channel live in one cluster slot (a script may only touch
//! keys of one slot).

use sha2::{Digest, Sha256};
use tollgate_lease_api::Resource;
use tollgate_model::reserved::RESERVED_PREFIX;

/// How many fence counters there are at most. Part of the key layout: changing it would move every
/// resource to another bucket, whose counter may be behind the old one.
pub const FENCE_BUCKETS: u16 = 1024;

/// The Redis names belonging to one resource; all share the hash tag `{<bucket, 3 hex digits>}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseKeys {
    pub lease: String,
    pub fence: String,
    /// Where the scripts announce acquisitions and releases (waiters wake on releases, watchers
    /// follow both); named `…:released` from when it carried releases only.
    pub channel: String,
}

impl LeaseKeys {
    /// The names of `resource`'s lease, its bucket's fencing counter and its change channel, all
    /// in the daemon's reserved keyspace.
    pub fn of(resource: &Resource) -> LeaseKeys {
        let digest = Sha256::digest(resource.as_str().as_bytes());
        let bucket = u16::from_be_bytes([digest[0], digest[1]]) % FENCE_BUCKETS;
        // Written into place rather than with `format!` and `hex::encode`: this runs for every
        // lease call, and that way cost an eighth of a `LEASE ACQUIRE`'s CPU in the daemon.
        let mut hex = [0u8; 64];
        hex::encode_to_slice(digest, &mut hex).expect("64 hex digits for 32 bytes");
        let mut channel = String::with_capacity(KEY_HEAD + hex.len() + RELEASED.len());
        channel.push_str(RESERVED_PREFIX);
        channel.push_str("lease:{");
        channel.extend(hex_tag(bucket));
        channel.push_str("}:");
        let mut fence = String::with_capacity(KEY_HEAD + FENCE.len());
        fence.push_str(&channel);
        fence.push_str(FENCE);
        channel.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
        let lease = channel.clone();
        channel.push_str(RELEASED);
        LeaseKeys {
            lease,
            fence,
            channel,
        }
    }
}

/// The keys' shared beginning, `tollgate:lease:{xyz}:`, in bytes.
const KEY_HEAD: usize = RESERVED_PREFIX.len() + "lease:{xyz}:".len();
const FENCE: &str = "fence";
const RELEASED: &str = ":released";

/// A bucket as its hash tag: three lower-case hex digits (`{bucket:03x}`).
fn hex_tag(bucket: u16) -> [char; 3] {
    [8, 4, 0].map(|shift| {
        char::from_digit(u32::from((bucket >> shift) & 0xf), 16).expect("a nibble is a hex digit")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').unwrap();
        let close = key[open..].find('}').unwrap() + open;
        &key[open + 1..close]
    }

    #[test]
    fn keys_share_one_hash_tag_and_hide_the_name() {
        let keys = LeaseKeys::of(&Resource::parse("orders:42").unwrap());
        let tag = hash_tag(&keys.lease);
        assert_eq!(tag.len(), 3);
        assert_eq!(hash_tag(&keys.fence), tag);
        assert_eq!(hash_tag(&keys.channel), tag);
        for key in [&keys.lease, &keys.fence, &keys.channel] {
            assert!(!key.contains("orders"), "{key} leaks the raw name");
            assert!(tollgate_model::reserved::is_reserved(key.as_bytes()));
        }
        assert_ne!(keys.lease, keys.fence);
        assert_ne!(LeaseKeys::of(&Resource::parse("orders:43").unwrap()), keys);
    }

    #[test]
    fn the_key_layout_is_the_digest_under_its_bucket_tag() {
        // Part of what is stored in Redis: a daemon that named these differently would not find
        // the leases and fences an earlier one left.
        let keys = LeaseKeys::of(&Resource::parse("orders:42").unwrap());
        let lease =
            "tollgate:lease:{25f}:8a5f217ddb0c9f03d16c0db38f2ba1c3afba56ca9be31a6bbb468b7d2e03746c";
        assert_eq!(keys.lease, lease);
        assert_eq!(keys.fence, "tollgate:lease:{25f}:fence");
        assert_eq!(keys.channel, format!("{lease}:released"));
        // A bucket below 0x100 keeps its leading zeros.
        assert_eq!(
            LeaseKeys::of(&Resource::parse("r69").unwrap()).fence,
            "tollgate:lease:{00b}:fence"
        );
    }

    #[test]
    fn resources_share_a_bounded_set_of_fence_counters() {
        let counters: std::collections::HashSet<String> = (0..20_000)
            .map(|n| LeaseKeys::of(&Resource::parse(&format!("r{n}")).unwrap()).fence)
            .collect();
        // 20,000 names fill every bucket and no more.
        assert_eq!(counters.len(), usize::from(FENCE_BUCKETS));
        let leases: std::collections::HashSet<String> = (0..20_000)
            .map(|n| LeaseKeys::of(&Resource::parse(&format!("r{n}")).unwrap()).lease)
            .collect();
        assert_eq!(leases.len(), 20_000, "each resource keeps its own lease");
    }
}
