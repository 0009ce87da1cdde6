//! The watchdog: renews a lease every ttl/3 for as long as its holder (a process or a RESP
//! connection) lives, releases it the moment the holder dies, and stops at `leases.max_hold`. It keeps the same state machine as a client
//! ([`Holding`]), so it sends nothing once the lease is LOST, and it publishes what happens as
//! [`LeaseEvent`]s for the holder to watch.
//!
//! A process-bound watchdog holds a pidfd and every watchdog a task, so the daemon runs at most
//! `leases.max_watchdogs` of them, and each OS user of each principal (an [`Identity`]) at most
//! `leases.max_watchdogs_per_uid` (`places.rs`): a place is reserved ([`Slot`]) before the
//! acquire is sent and counted until the watchdog's entry is gone, so one user can neither exhaust
//! the daemon's file descriptors nor take the places other users need.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::api::LeaseEvent;
use crate::attempt::Identity;
use crate::calls::{BoundAttempt, Calls};
use crate::holder::Holder;
use crate::keys::LeaseKeys;
use crate::metrics::LeaseMetrics;
use crate::outcome::{LostReason, ReleaseOutcome, RenewOutcome};
use crate::places::{AtLimit, Limits, Place, Places};
use crate::state::Holding;

/// Events buffered per watcher; one that falls further behind misses events (`Lagged`).
const EVENT_BUFFER: usize = 64;

/// Which lease a watchdog guards: its Redis key and the bound attempt holding it.
pub type WatchKey = (String, BoundAttempt);

struct Entry {
    id: u64,
    fence: u64,
    /// The holder's place among the watchdogs, given back with the entry.
    _place: Place,
    stop: CancellationToken,
    events: broadcast::Sender<LeaseEvent>,
}

/// The running watchdogs, by lease.
#[derive(Clone, Default)]
pub struct Watchdogs {
    state: Arc<Mutex<State>>,
    places: Places,
    next_id: Arc<AtomicU64>,
}

#[derive(Default)]
struct State {
    entries: HashMap<WatchKey, Entry>,
}

impl State {
    fn remove(&mut self, key: &WatchKey) -> Option<Entry> {
        self.entries.remove(key)
    }
}

/// One user's place for one more watchdog, reserved before the acquire is sent; given up when
/// dropped unless a watchdog took it over.
pub struct Slot(Place);

/// Everything one watchdog needs to keep one lease alive.
pub struct Guard {
    pub calls: Calls,
    pub keys: Arc<LeaseKeys>,
    pub attempt: BoundAttempt,
    pub ttl: Duration,
    pub holding: Holding,
    pub holder: Holder,
    pub hold_until: Instant,
    pub metrics: LeaseMetrics,
}

impl Watchdogs {
    /// Reserves a place for a watchdog of `holder` on `key`: `None` when one already guards `key`
    /// (a replayed acquire needs no second), refused when `holder` already runs its share or the
    /// daemon its total.
    pub fn reserve(
        &self,
        holder: &Identity,
        key: &WatchKey,
        limits: Limits,
    ) -> Result<Option<Slot>, AtLimit> {
        // Held while the place is taken, so that two acquires of one lease take one place.
        let state = self.state.lock();
        if state.entries.contains_key(key) {
            return Ok(None);
        }
        self.places
            .take(holder, limits)
            .map(|place| Some(Slot(place)))
    }

    /// Starts guarding a lease in `slot` unless a watchdog already does (a replayed acquire).
    pub fn start(&self, guard: Guard, slot: Slot, shutdown: &CancellationToken) {
        let key = (guard.keys.lease.clone(), guard.attempt.clone());
        let mut state = self.state.lock();
        if state.entries.contains_key(&key) {
            drop(state);
            return; // `slot` is given up as it drops
        }
        let stop = shutdown.child_token();
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        state.entries.insert(
            key.clone(),
            Entry {
                id,
                fence: guard.holding.fence(),
                _place: slot.0,
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

    /// Whether a watchdog guards `key`.
    pub fn guards(&self, key: &WatchKey) -> bool {
        self.state.lock().entries.contains_key(key)
    }

    /// How many watchdogs run.
    pub fn running(&self) -> usize {
        self.state.lock().entries.len()
    }

    /// How many watchdogs each user runs (places taken, counted from before the acquire).
    pub fn by_user(&self) -> Vec<(Identity, usize)> {
        self.places.by_user()
    }

    /// Stops the watchdog of a lease its holder released, and tells its watchers.
    pub fn stop(&self, lease: &str, attempt: &BoundAttempt) {
        let mut state = self.state.lock();
        // Most leases have no watchdog: then the key is not even made.
        if state.entries.is_empty() {
            return;
        }
        if let Some(entry) = state.remove(&(lease.to_owned(), attempt.clone())) {
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

    fn user(uid: u32) -> Identity {
        Identity {
            principal: "local".into(),
            uid,
        }
    }

    const LIMITS: Limits = Limits {
        total: 3,
        per_uid: 2,
    };

    /// Places are counted per user of a principal (see `places.rs`); a reservation refused for one
    /// user leaves another user of the same principal its own.
    #[test]
    fn reservations_count_against_the_users_share() {
        let watchdogs = Watchdogs::default();
        let _a1 = watchdogs.reserve(&user(2002), &key(1), LIMITS).unwrap();
        let _a2 = watchdogs.reserve(&user(2002), &key(2), LIMITS).unwrap();
        assert_eq!(
            watchdogs.reserve(&user(2002), &key(3), LIMITS).err(),
            Some(AtLimit { limit: 2 })
        );
        assert!(watchdogs
            .reserve(&user(2001), &key(3), LIMITS)
            .unwrap()
            .is_some());
    }
}
