//! `cache:`: the near cache (docs/cache.md). Off unless `keys` names at least one glob.

use std::time::Duration;

use serde::Deserialize;
use tollgate_lanes::cache::{Bounds, ENTRY_OVERHEAD};
use tollgate_model::ByteSize;

/// `cache:`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Globs (Redis's `KEYS` syntax) of the keys whose reads may be answered from the cache.
    /// None, the default: the cache is off.
    pub keys: Vec<String>,
    /// Every entry together: values, keys and bookkeeping; the least recently used are evicted.
    pub max_bytes: ByteSize,
    /// One entry, counted as in `max_bytes`; a larger value is served but not kept.
    pub max_entry_bytes: ByteSize,
    /// The oldest an entry may be when served, counted from when its read was sent, whether or
    /// not Redis's invalidation came.
    #[serde(with = "humantime_serde")]
    pub max_staleness: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            keys: Vec::new(),
            max_bytes: ByteSize::mib(256),
            max_entry_bytes: ByteSize::mib(1),
            max_staleness: Duration::from_secs(60),
        }
    }
}

impl CacheConfig {
    /// Whether the cache is on.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The store's bounds.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            max_bytes: self.max_bytes.0,
            max_entry_bytes: self.max_entry_bytes.0,
            max_staleness: self.max_staleness,
        }
    }

    /// Checks what types alone cannot: the offending key (under `cache.`) and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let invalid = |key: &str, message: String| Err((format!("cache.{key}"), message));
        if let Some(at) = self.keys.iter().position(String::is_empty) {
            return invalid(
                &format!("keys[{at}]"),
                "an empty glob matches no key".into(),
            );
        }
        // Checked even while the cache is off, so that turning it on needs no second fix.
        let smallest = ENTRY_OVERHEAD + 1;
        if self.max_entry_bytes.0 < smallest {
            return invalid(
                "max_entry_bytes",
                format!(
                    "must be at least {smallest} bytes (each entry costs {ENTRY_OVERHEAD} bytes \
                     of bookkeeping besides its key and value)"
                ),
            );
        }
        if self.max_bytes < self.max_entry_bytes {
            return invalid(
                "max_bytes",
                format!(
                    "must be at least max_entry_bytes ({})",
                    self.max_entry_bytes
                ),
            );
        }
        if self.max_staleness.is_zero() {
            return invalid("max_staleness", "must be longer than zero".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(Path::new("tollgate.yaml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn the_cache_is_off_by_default() {
        let config = parse("").unwrap();
        assert!(!config.cache.enabled());
        let config = parse("cache:\n  max_bytes: 1MiB\n").unwrap();
        assert!(!config.cache.enabled());
    }

    #[test]
    fn the_issue_s_example_parses() {
        let config = parse(
            "cache:\n  keys: [\"user:*\", \"config:*\"]\n  max_bytes: 256MiB\n  \
             max_entry_bytes: 1MiB\n  max_staleness: 60s\n",
        )
        .unwrap();
        assert!(config.cache.enabled());
        let bounds = config.cache.bounds();
        assert_eq!(bounds.max_bytes, 256 << 20);
        assert_eq!(bounds.max_entry_bytes, 1 << 20);
        assert_eq!(bounds.max_staleness, std::time::Duration::from_secs(60));
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key, says) in [
            (
                "cache:\n  max_bytes: lots\n",
                "cache.max_bytes",
                "invalid size `lots`",
            ),
            ("cache:\n  max_staleness: soon\n", "cache.max_staleness", ""),
            (
                "cache:\n  max_staleness: 0s\n",
                "cache.max_staleness",
                "longer than zero",
            ),
            (
                "cache:\n  max_bytes: 1KiB\n  max_entry_bytes: 2KiB\n",
                "cache.max_bytes",
                "at least max_entry_bytes",
            ),
            (
                "cache:\n  max_entry_bytes: 10\n",
                "cache.max_entry_bytes",
                "at least",
            ),
            ("cache:\n  keys: [\"\"]\n", "cache.keys[0]", "empty glob"),
            (
                "cache:\n  keys: user:*\n",
                "cache.keys",
                "expected a sequence",
            ),
            ("cache:\n  size: 1\n", "cache.size", "unknown field"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(&format!("key `{key}`")), "{text}: {error}");
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
