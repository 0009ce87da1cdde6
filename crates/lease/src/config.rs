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
    /// Watchdogs one principal may run at once (a process-bound one holds a pidfd on its holder;
    /// RESP `SESSION` leases count too); past it, an acquire asking for a watchdog is refused
    /// before anything is sent. Zero refuses watchdogs.
    pub max_watchdogs_per_principal: usize,
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
            max_watchdogs_per_principal: 256,
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
    }
}
