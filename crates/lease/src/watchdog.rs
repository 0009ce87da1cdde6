//! The watchdog: renews a lease every ttl/3 for as long as its holder (a process or a RESP
//! connection) lives, releases it the moment the holder dies, and stops at `leases.max_hold`. It keeps the same state machine as a client
//! ([`Holding`]), so it sends nothing once the lease is LOST, and it publishes what happens as
//! [`LeaseEvent`]s for the holder to watch.
//!
//! A process-bound watchdog holds a pidfd and every watchdog a task, so a principal may run only
//! `leases.max_watchdogs_per_principal` of them: a place is reserved ([`Slot`]) before the acquire
//! is sent and counted until the watchdog's entry is gone, so one user cannot exhaust the daemon's
//! file descriptors or fill it with renewals.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::api::LeaseEvent;
use crate::calls::{BoundAttempt, Calls};
use crate::holder::Holder;
use crate::keys::LeaseKeys;
use crate::metrics::LeaseMetrics;
use crate::outcome::{LostReason, ReleaseOutcome, RenewOutcome};
use crate::state::Holding;

/// Events buffered per watcher; one that falls further behind misses events (`Lagged`).
const EVENT_BUFFER: usize = 64;

/// Which lease a watchdog guards: its Redis key and the bound attempt holding it.
pub type WatchKey = (String, BoundAttempt);

struct Entry {
    id: u64,
    fence: u64,
    principal: String,
    stop: CancellationToken,
    events: broadcast::Sender<LeaseEvent>,
}

/// The running watchdogs, by lease.
#[derive(Clone, Default)]
pub struct Watchdogs {
    state: Arc<Mutex<State>>,
    next_id: Arc<AtomicU64>,
}

#[derive(Default)]
struct State {
    entries: HashMap<WatchKey, Entry>,
    /// Per principal: running watchdogs plus reserved slots. Absent means zero.
    counts: HashMap<String, usize>,
}

impl State {
    fn release(&mut self, principal: &str) {
        if let Some(count) = self.counts.get_mut(principal) {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(principal);
            }
        }
    }

    fn remove(&mut self, key: &WatchKey) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.release(&entry.principal);
        Some(entry)
    }
}

/// The principal already runs as many watchdogs as it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtLimit {
    pub limit: usize,
}

/// One principal's place for one more watchdog, reserved before the acquire is sent; given up when
/// dropped unless a watchdog took it over.
pub struct Slot {
    watchdogs: Watchdogs,
    principal: Option<String>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(principal) = self.principal.take() {
            self.watchdogs.state.lock().release(&principal);
        }
    }
}

/// Everything one watchdog needs to keep one lease alive.
pub struct Guard {
    pub calls: Calls,
    pub keys: LeaseKeys,
    pub attempt: BoundAttempt,
    pub ttl: Duration,
    pub holding: Holding,
    pub holder: Holder,
    pub hold_until: Instant,
    pub metrics: LeaseMetrics,
}

impl Watchdogs {
    /// Reserves a place for a watchdog of `principal` on `key`: `None` when one already guards `key`
    /// (a replayed acquire needs no second), refused when `principal` has `limit` already.
    pub fn reserve(
        &self,
        principal: &str,
        key: &WatchKey,
        limit: usize,
    ) -> Result<Option<Slot>, AtLimit> {
        let mut state = self.state.lock();
        if state.entries.contains_key(key) {
            return Ok(None);
        }
        let count = state.counts.get(principal).copied().unwrap_or(0);
        if count >= limit {
            return Err(AtLimit { limit });
        }
        state.counts.insert(principal.to_owned(), count + 1);
        Ok(Some(Slot {
            watchdogs: self.clone(),
            principal: Some(principal.to_owned()),
        }))
    }

    /// Starts guarding a lease in `slot` unless a watchdog already does (a replayed acquire).
    pub fn start(&self, guard: Guard, mut slot: Slot, shutdown: &CancellationToken) {
        let key = (guard.keys.lease.clone(), guard.attempt.clone());
        let mut state = self.state.lock();
        if state.entries.contains_key(&key) {
            drop(state);
            return; // `slot` is given up as it drops
        }
        let principal = slot
            .principal
            .take()
            .expect("a slot keeps its principal until a watchdog takes it over");
        let stop = shutdown.child_token();
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        state.entries.insert(
            key.clone(),
            Entry {
                id,
                fence: guard.holding.fence(),
                principal,
                stop: stop.clone(),
                events: events.clone(),
            },
        );
        let watchdogs = self.clone();
        tokio::spawn(async move {
            guard.run(&stop, &events).await;
            watchdogs.forget(&key, id);
        });
    }

    /// Stops the watchdog of a lease its holder released, and tells its watchers.
    /// How many watchdogs run.
    pub fn running(&self) -> usize {
        self.state.lock().entries.len()
    }

    pub fn stop(&self, key: &WatchKey) {
        let mut state = self.state.lock();
        // Most leases have no watchdog: then the key is not even hashed.
        if state.entries.is_empty() {
            return;
        }
        if let Some(entry) = state.remove(key) {
            entry.stop.cancel();
            let _ = entry
                .events
                .send(LeaseEvent::Released { fence: entry.fence });
        }
    }

    /// Watches a guarded lease; `None` when no watchdog guards it (never asked, or already ended).
    pub fn subscribe(&self, key: &WatchKey) -> Option<broadcast::Receiver<LeaseEvent>> {
        self.state
            .lock()
            .entries
            .get(key)
            .map(|entry| entry.events.subscribe())
    }

    fn forget(&self, key: &WatchKey, id: u64) {
        let mut state = self.state.lock();
        // A newer watchdog may guard the same lease by now; remove only our own entry.
        if state.entries.get(key).is_some_and(|entry| entry.id == id) {
            state.remove(key);
        }
    }
}

impl Guard {
    async fn run(mut self, stop: &CancellationToken, events: &broadcast::Sender<LeaseEvent>) {
        let fence = self.holding.fence();
        let period = self.ttl / 3;
        let mut next = Instant::now() + period;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = self.holder.gone() => {
                    let outcome = self.calls.release(&self.keys, &self.attempt).await;
                    tracing::info!(holder = %self.holder, ?outcome, "lease holder gone; released");
                    let _ = events.send(match outcome {
                        ReleaseOutcome::NotOwner => LeaseEvent::Lost { fence, reason: LostReason::NotOwner },
                        _ => LeaseEvent::Released { fence },
                    });
                    return;
                }
                () = tokio::time::sleep_until(next.into()) => {}
            }
            let now = Instant::now();
            if now >= self.hold_until {
                let _ = events.send(LeaseEvent::MaxHoldReached { fence });
                return;
            }
            if self.holding.may_send(now).is_err() {
                self.metrics.watchdog_loss();
                let _ = events.send(LeaseEvent::Lost {
                    fence,
                    reason: LostReason::Absent,
                });
                return;
            }
            let outcome = self.calls.renew(&self.keys, &self.attempt, self.ttl).await;
            self.holding.on_renew(now, &outcome);
            next = Instant::now() + period;
            match outcome {
                RenewOutcome::Renewed { valid_for } => {
                    self.metrics.watchdog_renewal();
                    let _ = events.send(LeaseEvent::Renewed { fence, valid_for });
                }
                RenewOutcome::Lost { reason } => {
                    self.metrics.watchdog_loss();
                    let _ = events.send(LeaseEvent::Lost { fence, reason });
                    return;
                }
                RenewOutcome::Indeterminate { .. } => {
                    let _ = events.send(LeaseEvent::Uncertain { fence });
                }
                // Not sent: try again next period while the local validity lasts.
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> WatchKey {
        let attempt = BoundAttempt {
            owner: "p:o".into(),
            operation_id: "op".into(),
        };
        (format!("lease:r{n}"), attempt)
    }

    #[test]
    fn a_principal_gets_at_most_its_limit_of_places_and_gets_them_back() {
        let watchdogs = Watchdogs::default();
        let first = watchdogs.reserve("alice", &key(1), 2).unwrap();
        let second = watchdogs.reserve("alice", &key(2), 2).unwrap();
        assert!(first.is_some() && second.is_some());
        assert_eq!(
            watchdogs.reserve("alice", &key(3), 2).err(),
            Some(AtLimit { limit: 2 })
        );
        // Another principal has its own count.
        assert!(watchdogs.reserve("bob", &key(3), 2).unwrap().is_some());
        drop(first);
        assert!(watchdogs.reserve("alice", &key(3), 2).unwrap().is_some());
        assert_eq!(
            watchdogs.reserve("alice", &key(4), 0).err(),
            Some(AtLimit { limit: 0 })
        );
    }
}
