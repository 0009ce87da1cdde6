//! The watchdog: renews a lease every ttl/3 for as long as its holder lives, releases it the moment
//! the holder dies, and stops at `leases.max_hold`. It keeps the same state machine as a client
//! ([`Holding`]), so it sends nothing once the lease is LOST, and it publishes what happens as
//! [`LeaseEvent`]s for the holder to watch.

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
use crate::metrics::LeaseMetrics;
use crate::outcome::{LostReason, ReleaseOutcome, RenewOutcome};
use crate::resource::LeaseKeys;
use crate::state::Holding;

/// Events buffered per watcher; one that falls further behind misses events (`Lagged`).
const EVENT_BUFFER: usize = 64;

/// Which lease a watchdog guards: its Redis key and the bound attempt holding it.
pub type WatchKey = (String, BoundAttempt);

struct Entry {
    id: u64,
    fence: u64,
    stop: CancellationToken,
    events: broadcast::Sender<LeaseEvent>,
}

/// The running watchdogs, by lease.
#[derive(Clone, Default)]
pub struct Watchdogs {
    entries: Arc<Mutex<HashMap<WatchKey, Entry>>>,
    next_id: Arc<AtomicU64>,
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
    /// Starts guarding a lease unless a watchdog already does (a replayed acquire).
    pub fn start(&self, guard: Guard, shutdown: &CancellationToken) {
        let key = (guard.keys.lease.clone(), guard.attempt.clone());
        let mut entries = self.entries.lock();
        if entries.contains_key(&key) {
            return;
        }
        let stop = shutdown.child_token();
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        entries.insert(
            key.clone(),
            Entry {
                id,
                fence: guard.holding.fence(),
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
    pub fn stop(&self, key: &WatchKey) {
        if let Some(entry) = self.entries.lock().remove(key) {
            entry.stop.cancel();
            let _ = entry
                .events
                .send(LeaseEvent::Released { fence: entry.fence });
        }
    }

    /// Watches a guarded lease; `None` when no watchdog guards it (never asked, or already ended).
    pub fn subscribe(&self, key: &WatchKey) -> Option<broadcast::Receiver<LeaseEvent>> {
        self.entries
            .lock()
            .get(key)
            .map(|entry| entry.events.subscribe())
    }

    fn forget(&self, key: &WatchKey, id: u64) {
        let mut entries = self.entries.lock();
        // A newer watchdog may guard the same lease by now; remove only our own entry.
        if entries.get(key).is_some_and(|entry| entry.id == id) {
            entries.remove(key);
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
                    tracing::info!(holder_pid = self.holder.pid(), ?outcome, "lease holder gone; released");
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
