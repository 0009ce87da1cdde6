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
        let digest = hex::encode(digest);
        LeaseKeys {
            lease: format!("{RESERVED_PREFIX}lease:{{{bucket:03x}}}:{digest}"),
            fence: format!("{RESERVED_PREFIX}lease:{{{bucket:03x}}}:fence"),
            channel: format!("{RESERVED_PREFIX}lease:{{{bucket:03x}}}:{digest}:released"),
        }
    }
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
