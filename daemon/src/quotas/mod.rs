//! The policy's `quotas:` at work: a token bucket per quota and principal (commands per second,
//! bytes per second), taken from before an admitted command is sent, and a count of the leases
//! each principal holds at once (`held`), reserved before an acquire is sent; past either, the
//! command is refused with a typed [`Throttled`] (`-THROTTLED` over RESP, 429 with `Retry-After`
//! over HTTP).
//!
//! The buckets outlive sessions (reconnecting buys nothing) and policy reloads (a quota whose id
//! and rates are unchanged keeps its buckets; a changed one starts full). A session holds its
//! caller's [`Meters`] and looks them up again only when a reload changed the quotas, so a
//! command under no quota costs one atomic load.

mod bucket;
mod held;

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
use tollgate_lease::{AcquireOutcome, LeaseService, ReleaseOutcome, RenewOutcome};
use tollgate_policy::quota::{Limit, Quota};
use tollgate_policy::Admission;

use bucket::Bucket;
pub use held::{Acquired, LeaseKey};
use held::{Full, Held};

/// A command refused because its principal is past a quota's rate, or an acquire because its
/// principal holds the quota's leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    pub quota: Arc<str>,
    pub limit: Limit,
    /// The rate per second, or the leases held at once.
    pub allowed: u64,
    /// When the command would be admitted, if nothing else takes from the bucket meanwhile (or
    /// when the first held lease expires unless renewed); `None` when no time can be promised
    /// (every held lease is kept by a watchdog, or still being acquired).
    pub retry: Option<Duration>,
}

impl std::error::Error for Throttled {}

/// `quota acme-rate: over 2000 commands/s; retry in 12 ms`, `quota acme-rate: holds 100 leases
/// at once; retry in 3000 ms` (or `; release one first`).
impl std::fmt::Display for Throttled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (quota, allowed, limit) = (&self.quota, self.allowed, self.limit.as_str());
        match self.limit {
            Limit::Leases => write!(f, "quota {quota}: holds {allowed} {limit} at once")?,
            Limit::Commands | Limit::Bytes => write!(f, "quota {quota}: over {allowed} {limit}/s")?,
        }
        match self.retry {
            Some(retry) => write!(f, "; retry in {} ms", retry_ms(retry)),
            None => f.write_str("; release one first"),
        }
    }
}

/// Whole milliseconds, rounded up: a client that waits what it is told is admitted.
fn retry_ms(retry: Duration) -> u128 {
    retry.as_nanos().div_ceil(1_000_000).max(1)
}

impl Throttled {
    /// Whole seconds, rounded up, for `Retry-After`; `None` when no time can be promised.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry
            .map(|retry| retry.as_nanos().div_ceil(1_000_000_000).max(1) as u64)
    }

    pub fn retry_ms(&self) -> Option<u128> {
        self.retry.map(retry_ms)
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

/// One principal's buckets and held leases under one quota.
#[derive(Debug)]
pub struct Meter {
    quota: Arc<str>,
    commands: Option<Bucket>,
    bytes: Option<Bucket>,
    held: Option<Held>,
    /// The quota's `script_time_limit`: how long the principal's scripts may run.
    script_time_limit: Option<Duration>,
    admitted: Counter,
    throttled: [Counter; 3],
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
    /// Leases held at once, under a quota that counts them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leases_held: Option<usize>,
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
            held: quota.leases.map(Held::new),
            script_time_limit: quota.script_time_limit,
            admitted: self.admitted.get_or_create(&labels).clone(),
            throttled,
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Each principal's state under each quota (`/v1/principals`).
    pub fn states(&self, leases: &LeaseService) -> Vec<(String, QuotaState)> {
        let kept_alive = kept_by(leases);
        let kept = self.kept.lock();
        let now = Instant::now();
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
                        leases_held: meter.held.as_ref().map(|held| held.count(now, &kept_alive)),
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

    /// The quotas' version these meters are of: it changes whenever a reload changes a quota.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The shortest `script_time_limit` of the quotas holding the caller, and the quota that sets
    /// it.
    pub fn script_time_limit(&self) -> Option<(Duration, &str)> {
        self.meters
            .iter()
            .filter_map(|meter| Some((meter.script_time_limit?, &*meter.quota)))
            .min_by_key(|(limit, _)| *limit)
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

/// Whether a watchdog of `leases` keeps a counted lease alive.
fn kept_by(leases: &LeaseService) -> impl Fn(&LeaseKey) -> bool + '_ {
    |key| leases.keeps(&key.identity, &key.resource, &key.attempt)
}

/// The places an acquire reserved under each quota that counts its caller's leases; settled with
/// the acquire's outcome. Dropped unsettled (its caller hung up while it waited, say), each place
/// is kept for the TTL asked for: the lease may have been granted.
pub struct LeaseHold {
    /// None when no quota counts the caller's leases: nothing to settle.
    key: Option<LeaseKey>,
    ttl: Duration,
    /// Each meter counting leases, and whether this acquire reserved its place there.
    places: Vec<(Arc<Meter>, bool)>,
}

impl Meters {
    /// Reserves a place for `key`'s acquire (of `ttl`) under every quota that counts the
    /// caller's leases, or refuses it with the first quota whose leases it holds (reserving
    /// nothing). `leases` says which leases a watchdog still keeps. The key is built only if a
    /// quota counts the caller's leases (four strings cloned, on every lease call otherwise).
    pub fn hold_lease(
        &mut self,
        (quotas, leases): (&Quotas, &LeaseService),
        key: impl FnOnce() -> LeaseKey,
        ttl: Duration,
    ) -> Result<LeaseHold, Throttled> {
        if quotas.version.load(Ordering::Acquire) != self.version {
            *self = quotas.meters(&self.principal, self.admin);
        }
        if !self.counts_leases() {
            return Ok(LeaseHold {
                key: None,
                ttl,
                places: Vec::new(),
            });
        }
        let key = key();
        let kept = kept_by(leases);
        let now = Instant::now();
        let mut places = Vec::new();
        for meter in self.meters.iter() {
            let Some(held) = &meter.held else { continue };
            match held.reserve(&key, now, &kept) {
                Ok(new) => places.push((meter.clone(), new)),
                Err(Full { limit, retry }) => {
                    for (meter, new) in &places {
                        if let Some(held) = &meter.held {
                            held.settle(&key, *new, Acquired::NotHeld, now);
                        }
                    }
                    places.clear();
                    meter.throttled[Limit::Leases as usize].inc();
                    return Err(Throttled {
                        quota: meter.quota.clone(),
                        limit: Limit::Leases,
                        allowed: limit,
                        retry,
                    });
                }
            }
        }
        Ok(LeaseHold {
            key: Some(key),
            ttl,
            places,
        })
    }

    /// Whether any quota of this principal counts its leases.
    fn counts_leases(&self) -> bool {
        self.meters.iter().any(|meter| meter.held.is_some())
    }

    /// A renewal of `key`'s lease came back: a renewed lease keeps its place for as long as it
    /// is now valid, a lost one gives it up.
    pub fn lease_renewed(&self, key: impl FnOnce() -> LeaseKey, outcome: &RenewOutcome) {
        if !self.counts_leases() {
            return;
        }
        let key = &key();
        let now = Instant::now();
        for held in self.meters.iter().filter_map(|meter| meter.held.as_ref()) {
            match outcome {
                RenewOutcome::Renewed { valid_for } => held.renewed(key, *valid_for, now),
                RenewOutcome::Lost { .. } => held.gone(key),
                RenewOutcome::Unavailable { .. } | RenewOutcome::Indeterminate { .. } => {}
            }
        }
    }

    /// A release of `key`'s lease came back: released, already gone or someone else's, it no
    /// longer holds a place.
    pub fn lease_released(&self, key: impl FnOnce() -> LeaseKey, outcome: &ReleaseOutcome) {
        if let ReleaseOutcome::Released | ReleaseOutcome::AlreadyAbsent | ReleaseOutcome::NotOwner =
            outcome
        {
            if !self.counts_leases() {
                return;
            }
            let key = &key();
            for held in self.meters.iter().filter_map(|meter| meter.held.as_ref()) {
                held.gone(key);
            }
        }
    }
}

impl LeaseHold {
    /// Settles the places with what the acquire came to; `kept`: a watchdog keeps the lease.
    pub fn settle(mut self, outcome: &AcquireOutcome, kept: bool) {
        let acquired = match outcome {
            AcquireOutcome::Acquired { valid_for, .. }
            | AcquireOutcome::Replayed { valid_for, .. } => Acquired::Held {
                valid_for: *valid_for,
                kept,
            },
            AcquireOutcome::Indeterminate { .. } => Acquired::Unknown { ttl: self.ttl },
            AcquireOutcome::Contended { .. }
            | AcquireOutcome::Conflict
            | AcquireOutcome::TooManyWatchdogs { .. }
            | AcquireOutcome::ShapeConflict { .. }
            | AcquireOutcome::Unavailable { .. } => Acquired::NotHeld,
        };
        self.finish(acquired);
    }

    /// The acquire was never sent (its request was invalid).
    pub fn unsent(mut self) {
        self.finish(Acquired::NotHeld);
    }

    fn finish(&mut self, acquired: Acquired) {
        let Some(key) = &self.key else { return };
        let now = Instant::now();
        for (meter, new) in self.places.drain(..) {
            if let Some(held) = &meter.held {
                held.settle(key, new, acquired, now);
            }
        }
    }
}

impl Drop for LeaseHold {
    fn drop(&mut self) {
        let ttl = self.ttl;
        self.finish(Acquired::Unknown { ttl });
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
            limit,
            allowed: bucket.rate().per_second,
            retry: Some(retry),
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
            limit: Limit::Commands,
            allowed: 2000,
            retry: Some(Duration::from_micros(11_200)),
        };
        assert_eq!(
            throttled.to_string(),
            "quota acme-rate: over 2000 commands/s; retry in 12 ms"
        );
        assert_eq!(throttled.retry_after_secs(), Some(1));
        let later = Throttled {
            retry: Some(Duration::from_millis(2_001)),
            ..throttled.clone()
        };
        assert_eq!(later.retry_after_secs(), Some(3));
        let held = Throttled {
            limit: Limit::Leases,
            allowed: 100,
            ..later
        };
        assert_eq!(
            held.to_string(),
            "quota acme-rate: holds 100 leases at once; retry in 2001 ms"
        );
        let kept = Throttled {
            retry: None,
            ..held
        };
        assert_eq!(
            kept.to_string(),
            "quota acme-rate: holds 100 leases at once; release one first"
        );
        assert_eq!(kept.retry_after_secs(), None);
    }
}
