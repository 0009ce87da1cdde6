//! The holder's view of one lease (client library and watchdog alike): ACTIVE, UNCERTAIN (the last
//! call was sent but its reply is unknown), LOST and RELEASED. LOST and RELEASED are terminal: once
//! there, [`Holding::may_send`] refuses and no call reaches the daemon or Redis.
//!
//! Validity is local and conservative: it counts from the moment a call was *sent*, so time spent
//! in transit is already used up. When it runs out the lease is LOST without asking anyone.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::outcome::{ReleaseOutcome, RenewOutcome};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    Active,
    Uncertain,
    Lost,
    Released,
}

impl LeaseState {
    pub fn is_terminal(self) -> bool {
        matches!(self, LeaseState::Lost | LeaseState::Released)
    }
}

/// Why a call was refused without being sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lease is {0:?}; no further call is sent")]
pub struct Terminal(pub LeaseState);

/// One held lease and what is known about it.
#[derive(Debug, Clone)]
pub struct Holding {
    state: LeaseState,
    fence: u64,
    valid_until: Instant,
}

impl Holding {
    /// A lease just acquired (or replayed) by a call sent at `sent_at`.
    pub fn new(fence: u64, sent_at: Instant, valid_for: Duration) -> Holding {
        Holding {
            state: LeaseState::Active,
            fence,
            valid_until: sent_at + valid_for,
        }
    }

    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The state as of `now`; a lease whose validity ran out becomes LOST for good.
    pub fn state(&mut self, now: Instant) -> LeaseState {
        if !self.state.is_terminal() && now >= self.valid_until {
            self.state = LeaseState::Lost;
        }
        self.state
    }

    /// What validity is left as of `now` (zero once terminal).
    pub fn remaining(&mut self, now: Instant) -> Duration {
        match self.state(now) {
            LeaseState::Active | LeaseState::Uncertain => self.valid_until - now,
            LeaseState::Lost | LeaseState::Released => Duration::ZERO,
        }
    }

    /// Whether a renew or release may be sent now.
    pub fn may_send(&mut self, now: Instant) -> Result<(), Terminal> {
        match self.state(now) {
            state @ (LeaseState::Lost | LeaseState::Released) => Err(Terminal(state)),
            LeaseState::Active | LeaseState::Uncertain => Ok(()),
        }
    }

    /// Applies the outcome of a renew sent at `sent_at`.
    pub fn on_renew(&mut self, sent_at: Instant, outcome: &RenewOutcome) {
        if self.state.is_terminal() {
            return;
        }
        match outcome {
            RenewOutcome::Renewed { valid_for } => {
                self.state = LeaseState::Active;
                self.valid_until = sent_at + *valid_for;
            }
            RenewOutcome::Lost { .. } => self.state = LeaseState::Lost,
            // Sent, reply unknown: the TTL may or may not have moved, so the old validity stands.
            RenewOutcome::Indeterminate { .. } => self.state = LeaseState::Uncertain,
            // Not sent: nothing changed.
            RenewOutcome::Unavailable { .. } => {}
        }
    }

    /// Applies the outcome of a release.
    pub fn on_release(&mut self, outcome: &ReleaseOutcome) {
        if self.state.is_terminal() {
            return;
        }
        match outcome {
            ReleaseOutcome::Released | ReleaseOutcome::AlreadyAbsent => {
                self.state = LeaseState::Released
            }
            ReleaseOutcome::NotOwner => self.state = LeaseState::Lost,
            ReleaseOutcome::Indeterminate { .. } => self.state = LeaseState::Uncertain,
            ReleaseOutcome::Unavailable { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::LostReason;

    const SECOND: Duration = Duration::from_secs(1);

    fn renewed(secs: u64) -> RenewOutcome {
        RenewOutcome::Renewed {
            valid_for: Duration::from_secs(secs),
        }
    }

    fn indeterminate() -> RenewOutcome {
        RenewOutcome::Indeterminate {
            reason: "cut".into(),
        }
    }

    #[test]
    fn a_confirmed_renew_turns_uncertain_back_into_active_and_extends() {
        let t0 = Instant::now();
        let mut lease = Holding::new(3, t0, 10 * SECOND);
        lease.on_renew(t0, &indeterminate());
        assert_eq!(lease.state(t0), LeaseState::Uncertain);
        assert_eq!(
            lease.remaining(t0),
            10 * SECOND,
            "an unknown renew extends nothing"
        );
        lease.on_renew(t0 + 5 * SECOND, &renewed(10));
        assert_eq!(lease.state(t0 + 14 * SECOND), LeaseState::Active);
    }

    #[test]
    fn a_confirmed_absence_turns_uncertain_into_lost_for_good() {
        let t0 = Instant::now();
        let mut lease = Holding::new(3, t0, 10 * SECOND);
        lease.on_renew(t0, &indeterminate());
        lease.on_renew(
            t0,
            &RenewOutcome::Lost {
                reason: LostReason::Absent,
            },
        );
        assert_eq!(lease.state(t0), LeaseState::Lost);
        lease.on_renew(t0, &renewed(10));
        assert_eq!(lease.state(t0), LeaseState::Lost, "LOST is terminal");
        assert_eq!(lease.may_send(t0), Err(Terminal(LeaseState::Lost)));
    }

    #[test]
    fn running_out_of_validity_is_lost_without_asking() {
        let t0 = Instant::now();
        let mut lease = Holding::new(1, t0, SECOND);
        assert_eq!(lease.may_send(t0), Ok(()));
        assert_eq!(lease.may_send(t0 + SECOND), Err(Terminal(LeaseState::Lost)));
        assert_eq!(lease.remaining(t0), Duration::ZERO, "stays lost");
    }

    #[test]
    fn release_outcomes_map_to_states_and_released_is_terminal() {
        let t0 = Instant::now();
        let mut unsent = Holding::new(1, t0, SECOND);
        unsent.on_release(&ReleaseOutcome::Unavailable {
            reason: "down".into(),
        });
        assert_eq!(unsent.state(t0), LeaseState::Active);

        let mut stolen = Holding::new(1, t0, SECOND);
        stolen.on_release(&ReleaseOutcome::NotOwner);
        assert_eq!(stolen.state(t0), LeaseState::Lost);

        let mut done = Holding::new(1, t0, SECOND);
        done.on_release(&ReleaseOutcome::AlreadyAbsent);
        assert_eq!(done.state(t0), LeaseState::Released);
        done.on_renew(t0, &renewed(10));
        assert_eq!(done.may_send(t0), Err(Terminal(LeaseState::Released)));
    }
}
