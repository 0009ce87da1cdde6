//! The `leases:` section of `tollgate.yaml`: bounds on what callers may ask for, and the drift budget
//! every validity is reduced by.

use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// Subtracted from every validity to absorb clock drift between the daemon and Redis.
    #[serde(with = "humantime_serde")]
    pub drift_budget: Duration,
    /// Smallest TTL a caller may ask for; must exceed the drift budget.
    #[serde(with = "humantime_serde")]
    pub min_ttl: Duration,
    /// Largest TTL a caller may ask for.
    #[serde(with = "humantime_serde")]
    pub max_ttl: Duration,
    /// Longest `wait` a caller may ask for on acquire.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// The watchdog stops renewing a lease held longer than this, so a stuck holder cannot keep a
    /// resource forever; the lease then expires by its TTL.
    #[serde(with = "humantime_serde")]
    pub max_hold: Duration,
    /// How long acquire waits for replicas to confirm when the caller asks for `replicas`.
    #[serde(with = "humantime_serde")]
    pub replica_timeout: Duration,
    /// Watchdogs the daemon runs at once, for everyone together (a process-bound one holds a pidfd
    /// on its holder; RESP `SESSION` leases count too); past it, an acquire asking for a watchdog is
    /// refused before anything is sent.
    pub max_watchdogs: usize,
    /// Watchdogs one OS user of one principal (the pair a pooled resource is shared by: under the
    /// default policy every local user is the principal `local`) may run at once, so that one user
    /// filling its share never refuses another's. Zero refuses watchdogs. Accepted under its old
    /// name, `max_watchdogs_per_principal`, which counted a principal's users together.
    #[serde(alias = "max_watchdogs_per_principal")]
    pub max_watchdogs_per_uid: usize,
    /// Holder watches (`LEASE WATCH`, `GET …/holders`, election observers) open at once, for
    /// everyone together. Each buffers up to 64 messages and 64 events for a reader that falls
    /// behind, so this bounds what unread watches can hold.
    pub max_watches: usize,
    /// Holder watches one OS user of a principal may have open at once.
    pub max_watches_per_uid: usize,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            drift_budget: Duration::from_millis(10),
            min_ttl: Duration::from_millis(100),
            max_ttl: Duration::from_secs(3600),
            max_wait: Duration::from_secs(300),
            max_hold: Duration::from_secs(24 * 3600),
            replica_timeout: Duration::from_secs(1),
            max_watchdogs: 1024,
            // A quarter of the total: four users can fill it, one cannot.
            max_watchdogs_per_uid: 256,
            max_watches: 1024,
            max_watches_per_uid: 256,
        }
    }
}

impl LeaseConfig {
    /// Problems a YAML parser cannot see.
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        if self.min_ttl <= self.drift_budget {
            return Err(LeaseConfigError::MinTtlWithinDrift);
        }
        if self.max_ttl < self.min_ttl {
            return Err(LeaseConfigError::MaxTtlBelowMin);
        }
        if self.max_hold.is_zero() {
            return Err(LeaseConfigError::ZeroMaxHold);
        }
        if self.max_watchdogs_per_uid > self.max_watchdogs {
            return Err(LeaseConfigError::WatchdogShareOverTotal);
        }
        if self.max_watches_per_uid > self.max_watches {
            return Err(LeaseConfigError::WatchShareOverTotal);
        }
        Ok(())
    }
}

/// Lease settings that contradict each other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseConfigError {
    #[error("leases.min_ttl must be larger than leases.drift_budget")]
    MinTtlWithinDrift,
    #[error("leases.max_ttl must not be smaller than leases.min_ttl")]
    MaxTtlBelowMin,
    #[error("leases.max_hold must be positive")]
    ZeroMaxHold,
    #[error("leases.max_watchdogs_per_uid must not be larger than leases.max_watchdogs")]
    WatchdogShareOverTotal,
    #[error("leases.max_watches_per_uid must not be larger than leases.max_watches")]
    WatchShareOverTotal,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_contradictions_are_named() {
        assert_eq!(LeaseConfig::default().validate(), Ok(()));
        let tight = LeaseConfig {
            min_ttl: Duration::from_millis(5),
            ..LeaseConfig::default()
        };
        assert_eq!(tight.validate(), Err(LeaseConfigError::MinTtlWithinDrift));
        assert!(LeaseConfigError::MinTtlWithinDrift
            .to_string()
            .contains("min_ttl"));
        let share_over_total = LeaseConfig {
            max_watchdogs: 4,
            max_watchdogs_per_uid: 5,
            ..LeaseConfig::default()
        };
        assert_eq!(
            share_over_total.validate(),
            Err(LeaseConfigError::WatchdogShareOverTotal)
        );
    }

    /// A config written before the share was per user still loads, as the per-user share.
    #[test]
    fn the_old_per_principal_name_sets_the_per_uid_share() {
        let config: LeaseConfig =
            serde_json::from_str(r#"{"max_watchdogs_per_principal": 7}"#).expect("parses");
        assert_eq!(config.max_watchdogs_per_uid, 7);
    }
}
