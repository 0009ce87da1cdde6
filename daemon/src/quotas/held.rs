//! The leases one principal holds at once under one quota's `leases:`, as this daemon granted
//! them: a place is reserved before an acquire is sent (so that concurrent acquires cannot all
//! pass the count), kept while the lease is valid, and given up when it is released, lost or
//! expired.
//!
//! The count is the daemon's, not Redis's: it knows every lease it granted, until when each is
//! valid (the TTL each acquire and renewal came back with) and which ones a watchdog keeps alive.
//! It errs towards counting a lease still held: an acquire whose outcome is unknown (its reply was
//! lost, or its caller hung up while it waited) keeps its place for the TTL it asked for. What it
//! cannot see: leases granted before the quota existed (or before a reload changed it, or by
//! another daemon on the same Redis) are not counted until they are acquired again.
//!
//! Pure bookkeeping with the clock passed in, so the rules are unit-tested without a server.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tollgate_lease::{Attempt, Identity, Resource};

/// One lease as a quota counts it: the same attempt on the same resource is one lease however
/// often it is acquired again (a replay), and the identity keeps two users' equal attempts apart
/// (the lease service binds attempts to their caller's principal and uid).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseKey {
    pub identity: Identity,
    pub resource: Resource,
    pub attempt: Attempt,
}

impl LeaseKey {
    pub fn new(identity: &Identity, resource: &Resource, attempt: &Attempt) -> LeaseKey {
        LeaseKey {
            identity: identity.clone(),
            resource: resource.clone(),
            attempt: attempt.clone(),
        }
    }
}

/// Until when a counted lease holds its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// Its acquire is under way.
    Asking,
    /// Its last acquire or renewal said it is valid until then.
    Expires(Instant),
    /// A watchdog renews it for as long as its holder lives: it holds its place while the
    /// watchdog runs.
    Kept,
}

/// What an acquire came to, as the count needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// Held, valid for this long (and kept by a watchdog when `kept`).
    Held { valid_for: Duration, kept: bool },
    /// Not held: contended, refused, or never sent.
    NotHeld,
    /// Perhaps held: the outcome is unknown. Counted as held for the TTL the caller asked for.
    Unknown { ttl: Duration },
}

/// One principal's held leases under one quota.
#[derive(Debug)]
pub(super) struct Held {
    limit: u64,
    leases: Mutex<HashMap<LeaseKey, Until>>,
}

/// The principal already holds `limit` leases; one expires (unless renewed) after `retry`,
/// `None` when every one is kept by a watchdog or still being acquired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Full {
    pub limit: u64,
    pub retry: Option<Duration>,
}

impl Held {
    pub(super) fn new(limit: u64) -> Held {
        Held {
            limit,
            leases: Mutex::new(HashMap::new()),
        }
    }

    /// Reserves a place for `key`'s acquire. `Ok(true)`: a new place, which the caller settles;
    /// `Ok(false)`: `key` already has one (a replay, or an acquire of it under way). `kept` says
    /// whether a watchdog still keeps a lease.
    pub(super) fn reserve(
        &self,
        key: &LeaseKey,
        now: Instant,
        kept: &dyn Fn(&LeaseKey) -> bool,
    ) -> Result<bool, Full> {
        let mut leases = self.leases.lock();
        if leases.contains_key(key) {
            return Ok(false);
        }
        // Forget what no longer holds a place; this also bounds the map by `limit`, since nothing
        // enters it but through here.
        leases.retain(|key, until| match until {
            Until::Asking => true,
            Until::Expires(at) => *at > now,
            Until::Kept => kept(key),
        });
        if leases.len() as u64 >= self.limit {
            let retry = leases
                .values()
                .filter_map(|until| match until {
                    Until::Expires(at) => Some(at.saturating_duration_since(now)),
                    Until::Asking | Until::Kept => None,
                })
                .min();
            return Err(Full {
                limit: self.limit,
                retry,
            });
        }
        leases.insert(key.clone(), Until::Asking);
        Ok(true)
    }

    /// Settles `key`'s acquire; `new` says whether it reserved the place itself.
    pub(super) fn settle(&self, key: &LeaseKey, new: bool, acquired: Acquired, now: Instant) {
        let mut leases = self.leases.lock();
        match acquired {
            Acquired::Held { valid_for, kept } => {
                let until = match kept {
                    true => Until::Kept,
                    false => Until::Expires(now + valid_for),
                };
                leases.insert(key.clone(), until);
            }
            // Only the acquire that reserved the place gives it up, and only while it is still
            // being asked for: a concurrent acquire of the same lease may have settled it held.
            Acquired::NotHeld => {
                if new && leases.get(key) == Some(&Until::Asking) {
                    leases.remove(key);
                }
            }
            Acquired::Unknown { ttl } => {
                if new && leases.get(key) == Some(&Until::Asking) {
                    leases.insert(key.clone(), Until::Expires(now + ttl));
                }
            }
        }
    }

    /// A renewal said `key`'s lease is valid for `valid_for` more. Leases the count does not know
    /// (granted before the quota) stay unknown; one a watchdog keeps stays kept.
    pub(super) fn renewed(&self, key: &LeaseKey, valid_for: Duration, now: Instant) {
        if let Some(until @ Until::Expires(_)) = self.leases.lock().get_mut(key) {
            *until = Until::Expires(now + valid_for);
        }
    }

    /// `key`'s lease is no longer held (released, already gone, or lost to another owner).
    pub(super) fn gone(&self, key: &LeaseKey) {
        self.leases.lock().remove(key);
    }

    /// How many leases hold a place now.
    pub(super) fn count(&self, now: Instant, kept: &dyn Fn(&LeaseKey) -> bool) -> usize {
        self.leases
            .lock()
            .iter()
            .filter(|(key, until)| match until {
                Until::Asking => true,
                Until::Expires(at) => *at > now,
                Until::Kept => kept(key),
            })
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> LeaseKey {
        LeaseKey {
            identity: Identity {
                principal: "app".into(),
                uid: 1000,
            },
            resource: Resource::parse(name).unwrap(),
            attempt: Attempt {
                owner: "worker".into(),
                operation_id: "op".into(),
            },
        }
    }

    fn never_kept(_: &LeaseKey) -> bool {
        false
    }

    const SECOND: Duration = Duration::from_secs(1);

    fn held(seconds: u64) -> Acquired {
        Acquired::Held {
            valid_for: Duration::from_secs(seconds),
            kept: false,
        }
    }

    #[test]
    fn past_the_limit_an_acquire_is_refused_with_the_soonest_expiry_as_its_retry() {
        let now = Instant::now();
        let held_leases = Held::new(2);
        for (name, seconds) in [("a", 10), ("b", 3)] {
            assert_eq!(held_leases.reserve(&key(name), now, &never_kept), Ok(true));
            held_leases.settle(&key(name), true, held(seconds), now);
        }
        assert_eq!(
            held_leases.reserve(&key("c"), now + SECOND, &never_kept),
            Err(Full {
                limit: 2,
                retry: Some(2 * SECOND)
            })
        );
        // Once `b` has expired, its place is `c`'s.
        assert_eq!(
            held_leases.reserve(&key("c"), now + 3 * SECOND, &never_kept),
            Ok(true)
        );
    }

    #[test]
    fn acquires_under_way_hold_their_places_so_concurrent_ones_cannot_all_pass() {
        let now = Instant::now();
        let held_leases = Held::new(1);
        assert_eq!(held_leases.reserve(&key("a"), now, &never_kept), Ok(true));
        assert_eq!(
            held_leases.reserve(&key("b"), now, &never_kept),
            Err(Full {
                limit: 1,
                retry: None
            })
        );
        // The first is contended: its place is free again.
        held_leases.settle(&key("a"), true, Acquired::NotHeld, now);
        assert_eq!(held_leases.reserve(&key("b"), now, &never_kept), Ok(true));
    }

    #[test]
    fn the_same_lease_acquired_again_takes_no_second_place() {
        let now = Instant::now();
        let held_leases = Held::new(1);
        assert_eq!(held_leases.reserve(&key("a"), now, &never_kept), Ok(true));
        held_leases.settle(&key("a"), true, held(10), now);
        assert_eq!(held_leases.reserve(&key("a"), now, &never_kept), Ok(false));
        // A replay that comes back contended does not give up the place its first acquire holds.
        held_leases.settle(&key("a"), false, Acquired::NotHeld, now);
        assert_eq!(held_leases.count(now, &never_kept), 1);
        // Another user's equal attempt is another lease.
        let other = LeaseKey {
            identity: Identity {
                principal: "app".into(),
                uid: 1001,
            },
            ..key("a")
        };
        assert!(held_leases.reserve(&other, now, &never_kept).is_err());
    }

    #[test]
    fn an_unknown_outcome_holds_the_place_for_the_ttl_asked_for() {
        let now = Instant::now();
        let held_leases = Held::new(1);
        assert_eq!(held_leases.reserve(&key("a"), now, &never_kept), Ok(true));
        held_leases.settle(&key("a"), true, Acquired::Unknown { ttl: 5 * SECOND }, now);
        assert_eq!(
            held_leases.reserve(&key("b"), now, &never_kept),
            Err(Full {
                limit: 1,
                retry: Some(5 * SECOND)
            })
        );
        assert_eq!(held_leases.count(now + 5 * SECOND, &never_kept), 0);
    }

    #[test]
    fn renewals_extend_a_place_and_releases_give_it_up() {
        let now = Instant::now();
        let held_leases = Held::new(1);
        held_leases.reserve(&key("a"), now, &never_kept).unwrap();
        held_leases.settle(&key("a"), true, held(2), now);
        held_leases.renewed(&key("a"), 10 * SECOND, now + SECOND);
        assert_eq!(held_leases.count(now + 5 * SECOND, &never_kept), 1);
        held_leases.gone(&key("a"));
        assert_eq!(held_leases.count(now, &never_kept), 0);
        // A renewal of a lease the count never saw does not make it counted.
        held_leases.renewed(&key("b"), 10 * SECOND, now);
        assert_eq!(held_leases.count(now, &never_kept), 0);
    }

    #[test]
    fn a_lease_a_watchdog_keeps_holds_its_place_until_the_watchdog_ends() {
        let now = Instant::now();
        let held_leases = Held::new(1);
        held_leases.reserve(&key("a"), now, &never_kept).unwrap();
        held_leases.settle(
            &key("a"),
            true,
            Acquired::Held {
                valid_for: SECOND,
                kept: true,
            },
            now,
        );
        let running = |_: &LeaseKey| true;
        // Long past its first TTL, still kept: no retry time can be promised.
        assert_eq!(
            held_leases.reserve(&key("b"), now + 60 * SECOND, &running),
            Err(Full {
                limit: 1,
                retry: None
            })
        );
        // Its holder hung up and the watchdog ended.
        assert_eq!(
            held_leases.reserve(&key("b"), now + 60 * SECOND, &never_kept),
            Ok(true)
        );
    }
}
