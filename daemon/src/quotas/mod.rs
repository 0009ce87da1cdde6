//! The policy's `quotas:` at work: a token bucket per quota and principal (commands per second,
//! bytes per second), taken from before an admitted command is sent and refused with a typed
//! [`Throttled`] (`-THROTTLED` over RESP, 429 with `Retry-After` over HTTP).
//!
//! The buckets outlive sessions (reconnecting buys nothing) and policy reloads (a quota whose id
//! and rates are unchanged keeps its buckets; a changed one starts full). A session holds its
//! caller's [`Meters`] and looks them up again only when a reload changed the quotas, so a
//! command under no quota costs one atomic load.

mod bucket;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tollgate_policy::quota::{Limit, Quota};
use tollgate_policy::Admission;

use bucket::Bucket;

/// A command refused because its principal is past a quota's rate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "quota {quota}: over {per_second} {limit}/s; retry in {} ms",
    retry_ms(*.retry)
)]
pub struct Throttled {
    pub quota: Arc<str>,
    pub limit: &'static str,
    pub per_second: u64,
    /// When the command would be admitted, if nothing else takes from the bucket meanwhile.
    pub retry: Duration,
}

/// Whole milliseconds, rounded up: a client that waits what it is told is admitted.
fn retry_ms(retry: Duration) -> u128 {
    retry.as_nanos().div_ceil(1_000_000).max(1)
}

impl Throttled {
    /// Whole seconds, rounded up, for `Retry-After`.
    pub fn retry_after_secs(&self) -> u64 {
        self.retry.as_nanos().div_ceil(1_000_000_000).max(1) as u64
    }

    pub fn retry_ms(&self) -> u128 {
        retry_ms(self.retry)
    }
}

/// Every quota's buckets, kept across sessions and reloads.
pub struct Quotas {
    epoch: Instant,
    /// Bumped whenever the quotas change, so sessions know to look theirs up again.
    version: AtomicU64,
    kept: Mutex<Vec<Arc<Kept>>>,
    admitted: Family<QuotaLabels, Counter>,
    throttled: Family<ThrottleLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabels {
    quota: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ThrottleLabels {
    quota: String,
    limit: &'static str,
}

/// One quota and the buckets of each principal it has held.
struct Kept {
    quota: Quota,
    /// By principal. Never pruned while the quota stands: forgetting a bucket would refill it.
    /// Bounded by the principals that exist (the policy's, and `uid:<n>` per local user).
    meters: Mutex<HashMap<String, Arc<Meter>>>,
}

/// One principal's buckets under one quota.
#[derive(Debug)]
pub struct Meter {
    quota: Arc<str>,
    commands: Option<Bucket>,
    bytes: Option<Bucket>,
    admitted: Counter,
    throttled: [Counter; 2],
}

/// A caller's meters under the quotas of one version.
#[derive(Debug, Clone)]
pub struct Meters {
    version: u64,
    principal: String,
    admin: bool,
    meters: Arc<[Arc<Meter>]>,
}

/// A quota's state for one principal, as `/v1/principals` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct QuotaState {
    pub quota: String,
    pub limits: String,
    pub admitted: u64,
    pub throttled: u64,
}

impl Quotas {
    pub fn new(admission: &Admission, registry: &mut Registry) -> Arc<Quotas> {
        let admitted = Family::<QuotaLabels, Counter>::default();
        registry.register(
            "quota_admitted",
            "Commands admitted under each policy quota (RESP commands, LEASE calls, HTTP lease requests)",
            admitted.clone(),
        );
        let throttled = Family::<ThrottleLabels, Counter>::default();
        registry.register(
            "quota_throttled",
            "Commands refused past a policy quota's rate, by quota and limit (commands, bytes)",
            throttled.clone(),
        );
        let quotas = Arc::new(Quotas {
            epoch: Instant::now(),
            version: AtomicU64::new(0),
            kept: Mutex::new(Vec::new()),
            admitted,
            throttled,
        });
        quotas.follow(admission);
        quotas
    }

    /// Takes up the active generation's quotas: one unchanged (same id, principals and rates)
    /// keeps its buckets, anything else starts afresh.
    pub fn follow(&self, admission: &Admission) {
        let generation = admission.current();
        let mut kept = self.kept.lock();
        let next: Vec<Arc<Kept>> = generation
            .quotas()
            .map(|quota| {
                kept.iter()
                    .find(|old| old.quota.id == quota.id && old.quota.same_limits(quota))
                    .cloned()
                    .unwrap_or_else(|| {
                        Arc::new(Kept {
                            quota: quota.clone(),
                            meters: Mutex::default(),
                        })
                    })
            })
            .collect();
        let changed = next.len() != kept.len()
            || next
                .iter()
                .zip(kept.iter())
                .any(|(a, b)| !Arc::ptr_eq(a, b));
        *kept = next;
        if changed {
            self.version.fetch_add(1, Ordering::Release);
        }
    }

    /// The meters of a caller of `principal` (`admin`: an administrator of the daemon).
    pub fn meters(&self, principal: &str, admin: bool) -> Meters {
        let kept = self.kept.lock();
        // Read under the lock `follow` bumps it under: these meters are of this version.
        let version = self.version.load(Ordering::Acquire);
        let meters = kept
            .iter()
            .filter(|kept| kept.quota.holds(principal, admin))
            .map(|kept| {
                kept.meters
                    .lock()
                    .entry(principal.to_owned())
                    .or_insert_with(|| Arc::new(self.meter(&kept.quota)))
                    .clone()
            })
            .collect();
        Meters {
            version,
            principal: principal.to_owned(),
            admin,
            meters,
        }
    }

    fn meter(&self, quota: &Quota) -> Meter {
        let labels = QuotaLabels {
            quota: quota.id.clone(),
        };
        let throttled = Limit::ALL.map(|limit| {
            self.throttled
                .get_or_create(&ThrottleLabels {
                    quota: quota.id.clone(),
                    limit: limit.as_str(),
                })
                .clone()
        });
        Meter {
            quota: quota.id.as_str().into(),
            commands: quota.commands.map(Bucket::new),
            bytes: quota.bytes.map(Bucket::new),
            admitted: self.admitted.get_or_create(&labels).clone(),
            throttled,
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Each principal's state under each quota (`/v1/principals`).
    pub fn states(&self) -> Vec<(String, QuotaState)> {
        let kept = self.kept.lock();
        let mut states = Vec::new();
        for kept in kept.iter() {
            for (principal, meter) in kept.meters.lock().iter() {
                states.push((
                    principal.clone(),
                    QuotaState {
                        quota: kept.quota.id.clone(),
                        limits: kept.quota.to_string(),
                        admitted: meter.admitted.get(),
                        throttled: meter.throttled.iter().map(Counter::get).sum(),
                    },
                ));
            }
        }
        states
    }
}

impl Meters {
    /// Meters under no quota, until [`Meters::admit`] first looks.
    pub fn none(principal: &str, admin: bool) -> Meters {
        Meters {
            // No version `Quotas` has: the first admission looks the meters up.
            version: u64::MAX,
            principal: principal.to_owned(),
            admin,
            meters: Arc::new([]),
        }
    }

    /// Takes one command of `bytes` request bytes from every quota holding the caller, or
    /// refuses it with the first quota it is past (taking nothing).
    pub fn admit(&mut self, quotas: &Quotas, bytes: usize) -> Result<(), Throttled> {
        if quotas.version.load(Ordering::Acquire) != self.version {
            *self = quotas.meters(&self.principal, self.admin);
        }
        if self.meters.is_empty() {
            return Ok(());
        }
        let now = quotas.now();
        for (index, meter) in self.meters.iter().enumerate() {
            if let Err(throttled) = meter.take(bytes as u64, now) {
                for taken in &self.meters[..index] {
                    taken.give_back(bytes as u64);
                }
                return Err(throttled);
            }
        }
        for meter in self.meters.iter() {
            meter.admitted.inc();
        }
        Ok(())
    }

    /// Owes `bytes` of replies already read to every quota of bytes holding the caller.
    pub fn owe(&self, quotas: &Quotas, bytes: usize) {
        if self.meters.is_empty() {
            return;
        }
        let now = quotas.now();
        for meter in self.meters.iter() {
            if let Some(bucket) = &meter.bytes {
                bucket.owe(bytes as u64, now);
            }
        }
    }
}

impl Meter {
    /// One command of `bytes`: both buckets, or neither.
    fn take(&self, bytes: u64, now: u64) -> Result<(), Throttled> {
        if let Some(commands) = &self.commands {
            commands
                .take(1, now)
                .map_err(|retry| self.throttled(Limit::Commands, commands, retry))?;
        }
        if let Some(bucket) = &self.bytes {
            if let Err(retry) = bucket.take(bytes, now) {
                if let Some(commands) = &self.commands {
                    commands.give_back(1);
                }
                return Err(self.throttled(Limit::Bytes, bucket, retry));
            }
        }
        Ok(())
    }

    fn give_back(&self, bytes: u64) {
        if let Some(commands) = &self.commands {
            commands.give_back(1);
        }
        if let Some(bucket) = &self.bytes {
            bucket.give_back(bytes);
        }
    }

    fn throttled(&self, limit: Limit, bucket: &Bucket, retry: Duration) -> Throttled {
        self.throttled[limit as usize].inc();
        Throttled {
            quota: self.quota.clone(),
            limit: limit.as_str(),
            per_second: bucket.rate().per_second,
            retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_the_quota_the_rate_and_when_to_retry_rounded_up() {
        let throttled = Throttled {
            quota: "acme-rate".into(),
            limit: "commands",
            per_second: 2000,
            retry: Duration::from_micros(11_200),
        };
        assert_eq!(
            throttled.to_string(),
            "quota acme-rate: over 2000 commands/s; retry in 12 ms"
        );
        assert_eq!(throttled.retry_after_secs(), 1);
        let later = Throttled {
            retry: Duration::from_millis(2_001),
            ..throttled
        };
        assert_eq!(later.retry_after_secs(), 3);
    }
}
