//! Admission time shared per tenant (a principal and one OS user of it). Guards and catalogs run
//! on the worker threads that serve every client, and each call is bounded, but not their sum: one
//! user with many connections pipelining at a spinning module kept the workers busy, and another
//! user's `GET` waited hundreds of milliseconds for one (issue 28).
//!
//! Each tenant's admission time is a debt, paid off at its share of the workers: all of them while
//! it is the only tenant admitting, an even split among the tenants that admitted anything in the
//! last [`ACTIVE_WINDOW`] otherwise. A session whose tenant owes more than [`BURST`] waits, before
//! its next admission, until the debt is paid down to it: a tenant past its share defers its own
//! commands and leaves the workers to the others. One tenant alone is never held back (it cannot
//! spend more than the workers' time), and an ordinary client never owes [`BURST`].
//!
//! On the request path this costs the two clock readings around each admission and one atomic
//! add; the settling (a lock over the connected tenants) happens only past [`BURST`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tollgate_model::Tenant;

use super::tenants::{Member, Tenants};

/// Admission time a tenant may owe before its sessions wait: about one spinning guard call, far
/// more than any number of ordinary admissions between two settlements.
pub const BURST: Duration = Duration::from_millis(2);
/// A tenant that admitted anything this recently shares the workers. Longer than one spinning
/// guard call can take (a client waiting behind one has not admitted for that long, and must
/// still count); for ordinary clients, whose admissions take microseconds, half of the workers'
/// time is more than their commands could ever need, so a tenant alone is not held back by
/// another's occasional command in any way it could notice.
pub const ACTIVE_WINDOW: Duration = Duration::from_secs(1);

/// One tenant's admission time not yet paid off, in nanoseconds on the clocks' time line.
pub struct Debt {
    owed: AtomicU64,
    /// When `owed` was last paid down (nanoseconds since the clocks began).
    settled: AtomicU64,
    /// When it last admitted anything (the same), plus one; 0: never.
    active: AtomicU64,
    /// All its admission time, and all its sessions' waits, since it connected (`/v1/principals`).
    spent_in_all: AtomicU64,
    waited_in_all: AtomicU64,
}

/// What `/v1/principals` shows of a tenant's admission time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionTime {
    /// In guards and catalogs, since its first session.
    pub spent: Duration,
    /// Its sessions' waits for its share.
    pub waited: Duration,
}

impl Debt {
    fn new(at: u64) -> Debt {
        Debt {
            owed: AtomicU64::new(0),
            settled: AtomicU64::new(at),
            active: AtomicU64::new(0),
            spent_in_all: AtomicU64::new(0),
            waited_in_all: AtomicU64::new(0),
        }
    }

    fn time(&self) -> AdmissionTime {
        let nanos = |counter: &AtomicU64| Duration::from_nanos(counter.load(Ordering::Relaxed));
        AdmissionTime {
            spent: nanos(&self.spent_in_all),
            waited: nanos(&self.waited_in_all),
        }
    }

    fn owes_more_than_a_burst(&self) -> bool {
        self.owed.load(Ordering::Relaxed) > BURST.as_nanos() as u64
    }

    /// `spent` nanoseconds of admission that ended at `at`.
    fn spend(&self, spent: u64, at: u64) {
        self.owed.fetch_add(spent, Ordering::Relaxed);
        self.spent_in_all.fetch_add(spent, Ordering::Relaxed);
        self.active.store(at + 1, Ordering::Relaxed);
    }

    /// Whether it admitted anything in the [`ACTIVE_WINDOW`] before `at`.
    fn admitting(&self, at: u64) -> bool {
        let active = self.active.load(Ordering::Relaxed);
        active > 0 && at.saturating_sub(active - 1) < ACTIVE_WINDOW.as_nanos() as u64
    }

    /// Pays off what the time since the last settlement pays at `rate`; how long until the rest
    /// is down to [`BURST`], if it is over.
    fn settle(&self, at: u64, rate: f64) -> Option<Duration> {
        let since = self.settled.swap(at, Ordering::Relaxed);
        let paid = paid(at.saturating_sub(since), rate);
        let owed = self
            .owed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |owed| {
                Some(owed.saturating_sub(paid))
            })
            .map_or(0, |before| before.saturating_sub(paid));
        wait_for(owed, rate)
    }
}

/// Every connected tenant's [`Debt`].
pub struct AdmissionClocks {
    debts: Arc<Tenants<Debt>>,
    workers: usize,
    began: Instant,
    /// Admissions that waited for their user's share, and how long in all (`/metrics`).
    deferrals: Counter,
    deferred_seconds: Counter<f64>,
}

impl AdmissionClocks {
    pub fn new(workers: usize) -> Arc<AdmissionClocks> {
        Arc::new(AdmissionClocks {
            debts: Arc::default(),
            workers: workers.max(1),
            began: Instant::now(),
            deferrals: Counter::default(),
            deferred_seconds: Counter::default(),
        })
    }

    /// Shows the waits in `/metrics`: `tollgate_admission_deferrals_total` and
    /// `tollgate_admission_deferred_seconds_total`, over every user (a label per user would be
    /// unbounded; `/v1/principals` has them per user).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "admission_deferrals",
            "Admissions that waited because their user was past its share of the workers",
            self.deferrals.clone(),
        );
        registry.register(
            "admission_deferred_seconds",
            "Time admissions waited for their user's share of the workers",
            self.deferred_seconds.clone(),
        );
    }

    /// The clock of one more session of `tenant`.
    pub fn clock(self: &Arc<Self>, tenant: Tenant) -> AdmissionClock {
        AdmissionClock {
            // A tenant's first debt is paid from when it joined, so that reconnecting buys
            // nothing.
            debt: self
                .debts
                .join(tenant, || Debt::new(self.nanos(Instant::now()))),
            clocks: self.clone(),
        }
    }

    /// Each connected tenant: its RESP sessions and its admission time.
    pub fn census(&self) -> Vec<(Tenant, usize, AdmissionTime)> {
        self.debts.census(Debt::time)
    }

    fn nanos(&self, at: Instant) -> u64 {
        at.duration_since(self.began).as_nanos() as u64
    }
}

/// A session's view of its tenant's admission time.
pub struct AdmissionClock {
    debt: Member<Debt>,
    clocks: Arc<AdmissionClocks>,
}

impl AdmissionClock {
    /// Whether the tenant owes more than [`BURST`]: then [`AdmissionClock::pay`] before admitting.
    pub fn in_debt(&self) -> bool {
        self.debt.owes_more_than_a_burst()
    }

    /// Adds the admission that began at `started` and ends now to the tenant's debt.
    pub fn spent(&self, started: Instant) {
        let now = Instant::now();
        // Admission can run long (the guards): what the session queues next counts from here.
        tollgate_lanes::turn_clock::set(now);
        let spent = now.duration_since(started).as_nanos() as u64;
        self.debt.spend(spent, self.clocks.nanos(now));
    }

    /// Pays the debt down at the tenant's share of the workers, waiting while it is over [`BURST`].
    /// Returns how long it waited.
    pub async fn pay(&self) -> Duration {
        let mut waited = Duration::ZERO;
        loop {
            let at = self.clocks.nanos(Instant::now());
            let admitting = self.clocks.debts.count(|debt| debt.admitting(at));
            let Some(wait) = self.debt.settle(at, share(self.clocks.workers, admitting)) else {
                if !waited.is_zero() {
                    self.clocks.deferrals.inc();
                    self.clocks.deferred_seconds.inc_by(waited.as_secs_f64());
                }
                return waited;
            };
            tokio::time::sleep(wait).await;
            self.debt
                .waited_in_all
                .fetch_add(wait.as_nanos() as u64, Ordering::Relaxed);
            waited += wait;
        }
    }
}

/// The workers' time a tenant pays off per unit of time: all of them alone, an even split among
/// the tenants admitting.
fn share(workers: usize, admitting: usize) -> f64 {
    workers as f64 / admitting.max(1) as f64
}

/// What `elapsed` nanoseconds pay off at `rate`.
fn paid(elapsed: u64, rate: f64) -> u64 {
    (elapsed as f64 * rate) as u64
}

/// How long until `owed` is down to [`BURST`] at `rate`; `None` when it is already.
fn wait_for(owed: u64, rate: f64) -> Option<Duration> {
    let burst = BURST.as_nanos() as u64;
    (owed > burst).then(|| Duration::from_nanos(((owed - burst) as f64 / rate).ceil() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::server::resp::tenants::local as tenant;

    #[test]
    fn the_workers_are_split_evenly_among_the_tenants_admitting() {
        assert_eq!(share(2, 0), 2.0);
        assert_eq!(share(2, 1), 2.0);
        assert_eq!(share(2, 4), 0.5);
        assert_eq!(paid(10_000, 0.5), 5_000);
        let burst = BURST.as_nanos() as u64;
        assert_eq!(wait_for(burst, 0.5), None);
        assert_eq!(
            wait_for(burst + 1_000_000, 0.5),
            Some(Duration::from_millis(2))
        );
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn a_tenant_alone_never_waits_and_one_past_its_share_waits_for_it() {
        let spinner = Debt::new(0);
        let bystander = Debt::new(0);
        let mut at = 0;
        // Alone, a tenant that spends all of the one worker's time pays it off as it goes.
        for _ in 0..10 {
            at += 7 * MS;
            spinner.spend(7 * MS, at);
            assert!(spinner.owes_more_than_a_burst());
            assert_eq!(spinner.settle(at, share(1, 1)), None);
        }
        // With the bystander admitting too, the spinner's time is paid at half the worker: after
        // the first call (7 ms, 3.5 paid meanwhile, 2 of credit) it waits 3 ms, then as long as
        // it spins: half the worker's time.
        bystander.spend(10_000, at);
        let mut waits = Vec::new();
        for _ in 0..3 {
            at += 7 * MS;
            spinner.spend(7 * MS, at);
            let admitting = [&spinner, &bystander]
                .iter()
                .filter(|debt| debt.admitting(at))
                .count();
            let wait = spinner.settle(at, share(1, admitting)).expect("in debt");
            at += wait.as_nanos() as u64;
            assert_eq!(spinner.settle(at, share(1, admitting)), None);
            waits.push(wait.as_millis());
        }
        assert_eq!(waits, [3, 7, 7]);
        assert!(!bystander.owes_more_than_a_burst());
        // Out of the window, the bystander no longer counts.
        assert!(!bystander.admitting(at + ACTIVE_WINDOW.as_nanos() as u64));
    }

    #[tokio::test]
    async fn sessions_of_one_tenant_share_its_debt() {
        let clocks = AdmissionClocks::new(1);
        let first = clocks.clock(tenant(2002));
        let second = clocks.clock(tenant(2002));
        let other = clocks.clock(tenant(2001));
        first.spent(Instant::now() - 3 * BURST);
        assert!(second.in_debt());
        assert!(!other.in_debt());
    }
}
