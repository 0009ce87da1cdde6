//! The watchdog: renews a lease every ttl/3 for as long as its holder (a process or a RESP
//! connection) lives, releases it the moment the holder dies, and stops at `leases.max_hold`. It keeps the same state machine as a client
//! ([`Holding`]), so it sends nothing once the lease is LOST, and it publishes what happens as
//! [`LeaseEvent`]s for the holder to watch.
//!
//! A process-bound watchdog holds a pidfd and every watchdog a task, so the daemon runs at most
//! `leases.max_watchdogs` of them, and each OS user of each principal (an [`Identity`]) at most
//! `leases.max_watchdogs_per_uid`: a place is reserved ([`Slot`]) before the acquire is sent and
//! counted until the watchdog's entry is gone, so one user can neither exhaust the daemon's file
//! descriptors nor take the places other users need. Shares are per user, not per principal,
//! because one principal may cover every local user (the default policy's `local`).

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
use crate::state::Holding;

/// Events buffered per watcher; one that falls further behind misses events (`Lagged`).
const EVENT_BUFFER: usize = 64;

/// Which lease a watchdog guards: its Redis key and the bound attempt holding it.
pub type WatchKey = (String, BoundAttempt);

struct Entry {
    id: u64,
    fence: u64,
    holder: Identity,
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
    /// Per user of a principal: running watchdogs plus reserved slots. Absent means zero.
    counts: HashMap<Identity, usize>,
    /// Every user's together.
    total: usize,
}

impl State {
    fn release(&mut self, holder: &Identity) {
        if let Some(count) = self.counts.get_mut(holder) {
            *count -= 1;
            self.total -= 1;
            if *count == 0 {
                self.counts.remove(holder);
            }
        }
    }

    fn remove(&mut self, key: &WatchKey) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.release(&entry.holder);
        Some(entry)
    }
}

/// How many watchdogs may run: in all, and for one user of one principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_uid: usize,
}

/// No place for another watchdog: the user already runs its share, or the daemon its total
/// (`limit` is the one reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtLimit {
    pub limit: usize,
}

/// One user's place for one more watchdog, reserved before the acquire is sent; given up when
/// dropped unless a watchdog took it over.
pub struct Slot {
    watchdogs: Watchdogs,
    holder: Option<Identity>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(holder) = self.holder.take() {
            self.watchdogs.state.lock().release(&holder);
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
    /// Reserves a place for a watchdog of `holder` on `key`: `None` when one already guards `key`
    /// (a replayed acquire needs no second), refused when `holder` already runs its share or the
    /// daemon its total.
    pub fn reserve(
        &self,
        holder: &Identity,
        key: &WatchKey,
        limits: Limits,
    ) -> Result<Option<Slot>, AtLimit> {
        let mut state = self.state.lock();
        if state.entries.contains_key(key) {
            return Ok(None);
        }
        let count = state.counts.get(holder).copied().unwrap_or(0);
        if count >= limits.per_uid {
            return Err(AtLimit {
                limit: limits.per_uid,
            });
        }
        if state.total >= limits.total {
            return Err(AtLimit {
                limit: limits.total,
            });
        }
        state.counts.insert(holder.clone(), count + 1);
        state.total += 1;
        Ok(Some(Slot {
            watchdogs: self.clone(),
            holder: Some(holder.clone()),
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
        let holder = slot
            .holder
            .take()
            .expect("a slot keeps its holder until a watchdog takes it over");
        let stop = shutdown.child_token();
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        state.entries.insert(
            key.clone(),
            Entry {
                id,
                fence: guard.holding.fence(),
                holder,
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

    fn user(principal: &str, uid: u32) -> Identity {
        Identity {
            principal: principal.into(),
            uid,
        }
    }

    const LIMITS: Limits = Limits {
        total: 3,
        per_uid: 2,
    };

    #[test]
    fn a_user_gets_at_most_its_share_of_places_and_gets_them_back() {
        let watchdogs = Watchdogs::default();
        let alice = user("local", 1000);
        let first = watchdogs.reserve(&alice, &key(1), LIMITS).unwrap();
        let second = watchdogs.reserve(&alice, &key(2), LIMITS).unwrap();
        assert!(first.is_some() && second.is_some());
        assert_eq!(
            watchdogs.reserve(&alice, &key(3), LIMITS).err(),
            Some(AtLimit { limit: 2 })
        );
        drop(first);
        assert!(watchdogs
            .reserve(&alice, &key(3), LIMITS)
            .unwrap()
            .is_some());
        let none = Limits {
            total: 3,
            per_uid: 0,
        };
        assert_eq!(
            watchdogs.reserve(&alice, &key(4), none).err(),
            Some(AtLimit { limit: 0 })
        );
    }

    /// The attack of issue 28: one user of the principal every local user shares takes its whole
    /// share; another user of the same principal still gets a place, and the total holds for all.
    #[test]
    fn one_user_filling_its_share_leaves_places_for_another_user_of_the_same_principal() {
        let watchdogs = Watchdogs::default();
        let attacker = user("local", 2002);
        let victim = user("local", 2001);
        let _a1 = watchdogs.reserve(&attacker, &key(1), LIMITS).unwrap();
        let _a2 = watchdogs.reserve(&attacker, &key(2), LIMITS).unwrap();
        assert_eq!(
            watchdogs.reserve(&attacker, &key(3), LIMITS).err(),
            Some(AtLimit { limit: 2 })
        );
        let v1 = watchdogs.reserve(&victim, &key(3), LIMITS).unwrap();
        assert!(v1.is_some(), "the victim's first place");
        // The total (3) is now reached: a third user is refused, naming the total.
        assert_eq!(
            watchdogs
                .reserve(&user("local", 2003), &key(4), LIMITS)
                .err(),
            Some(AtLimit { limit: 3 })
        );
        drop(v1);
        assert!(watchdogs
            .reserve(&user("local", 2003), &key(4), LIMITS)
            .unwrap()
            .is_some());
    }
}
