//! Each user's commands in flight on the multiplexed lanes (REGULAR, SCRIPT), against its share of
//! the lane (`lanes.<lane>.per_principal`, counted per user of a principal: half of the lane's
//! `in_flight + queue_length` unless set). A lane refuses every command past its
//! `in_flight + queue_length` at once, whoever sends it; without a share, one local user's
//! pipelining clients could fill that and have every other user's `GET` refused (issue 28).
//!
//! Past its share a user's client is paused, not refused: its session holds the next command
//! back (the schedule parks it, and the session stops reading) until its own commands in flight
//! on that lane are answered. A session with nothing in flight on the lane always sends one, so
//! every client makes progress without waiting on any other; one user's clients together exceed
//! the share by at most one command each (so the default, half, plus `limits.max_clients_per_uid`
//! clients still leaves the others room).
//!
//! Counted by the session's [`Schedule`](super::schedule::Schedule) as it sends and settles, two
//! uncontended atomic additions per command (a user's own sessions share the counter).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tollgate_model::{Multiplexed, Tenant};

use super::tenants::{Member, Tenants};

/// Every user's commands in flight, and each user's share, per multiplexed lane.
pub struct Flights {
    shares: [usize; 2],
    tenants: Arc<Tenants<[AtomicUsize; 2]>>,
}

/// One session's part in its user's count: what it has in flight on each lane, given back when
/// it is dropped (the session ended with replies still owed).
pub struct Flight {
    count: Member<[AtomicUsize; 2]>,
    shares: [usize; 2],
    own: [usize; 2],
}

fn index(lane: Multiplexed) -> usize {
    match lane {
        Multiplexed::Regular => 0,
        Multiplexed::Script => 1,
    }
}

impl Flights {
    /// `regular` and `script`: each lane's share per user.
    pub fn new(regular: usize, script: usize) -> Flights {
        Flights {
            shares: [regular, script],
            tenants: Arc::default(),
        }
    }

    /// The count of one more session of `tenant`.
    pub fn join(&self, tenant: Tenant) -> Flight {
        Flight {
            count: self.tenants.join(tenant, Default::default),
            shares: self.shares,
            own: [0; 2],
        }
    }
}

impl Flights {
    /// Each user with a session: its sessions, and its commands in flight on REGULAR and SCRIPT.
    pub fn census(&self) -> Vec<(Tenant, usize, [usize; 2])> {
        self.tenants.census(|count| {
            [
                count[0].load(Ordering::Relaxed),
                count[1].load(Ordering::Relaxed),
            ]
        })
    }
}

impl Flight {
    pub fn sent(&mut self, lane: Multiplexed) {
        let lane = index(lane);
        self.own[lane] += 1;
        self.count[lane].fetch_add(1, Ordering::Relaxed);
    }

    pub fn answered(&mut self, lane: Multiplexed) {
        let lane = index(lane);
        self.own[lane] -= 1;
        self.count[lane].fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether the next command on `lane` must wait: the user is at its share and this session
    /// has commands of its own in flight there, whose replies will let it try again.
    pub fn must_wait(&self, lane: Multiplexed) -> bool {
        let lane = index(lane);
        self.own[lane] > 0 && self.count[lane].load(Ordering::Relaxed) >= self.shares[lane]
    }

    /// Gives back everything this session had in flight (its replies will never be taken).
    pub fn forget(&mut self) {
        for lane in 0..2 {
            self.count[lane].fetch_sub(std::mem::take(&mut self.own[lane]), Ordering::Relaxed);
        }
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.forget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::resp::tenants::local as tenant;

    const REGULAR: Multiplexed = Multiplexed::Regular;

    #[test]
    fn a_user_at_its_share_waits_while_it_has_its_own_in_flight_and_others_do_not() {
        let flights = Flights::new(3, 1);
        let mut first = flights.join(tenant(1));
        let mut second = flights.join(tenant(1));
        let mut other = flights.join(tenant(2));
        first.sent(REGULAR);
        first.sent(REGULAR);
        assert!(!first.must_wait(REGULAR));
        second.sent(REGULAR);
        // Three in flight for user 1: both its sessions wait for their own replies.
        assert!(first.must_wait(REGULAR));
        assert!(second.must_wait(REGULAR));
        // A session of user 1 with nothing in flight still sends one.
        let idle = flights.join(tenant(1));
        assert!(!idle.must_wait(REGULAR));
        // Another user is not held by user 1's count.
        other.sent(REGULAR);
        other.sent(REGULAR);
        assert!(!other.must_wait(REGULAR));
        // The lanes are counted apart.
        assert!(!first.must_wait(Multiplexed::Script));
        first.answered(REGULAR);
        assert!(!first.must_wait(REGULAR));
    }

    #[test]
    fn a_session_that_ends_gives_back_what_it_had_in_flight() {
        let flights = Flights::new(2, 2);
        let mut gone = flights.join(tenant(1));
        gone.sent(REGULAR);
        gone.sent(REGULAR);
        let mut staying = flights.join(tenant(1));
        staying.sent(REGULAR);
        assert!(staying.must_wait(REGULAR));
        drop(gone);
        assert!(!staying.must_wait(REGULAR));
        staying.forget();
        staying.sent(REGULAR);
        staying.sent(REGULAR);
        assert!(staying.must_wait(REGULAR), "forgotten, then counted afresh");
    }
}
