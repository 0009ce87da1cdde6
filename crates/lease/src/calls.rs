//! One lease call = one script run, its reply decoded into the outcome table. Validity is counted
//! from the moment the call was sent, less the drift budget, and always from the server's own
//! remaining PTTL when the lease already existed (replay). Semaphores and read/write leases have
//! their own acquire (`shared`); renew, release and inspect are one script for every shape.

mod replies;
mod shared;

use std::time::{Duration, Instant};

use tollgate_resp::Frame;

use crate::keys::LeaseKeys;
use crate::outcome::{AcquireOutcome, InspectOutcome, LostReason, ReleaseOutcome, RenewOutcome};
use crate::scripts::{ScriptError, ScriptRunner, ACQUIRE, INSPECT, RELEASE, RENEW};
use replies::{held_exclusive, held_shared, integers, millis, shape_conflict, unexpected};

/// An attempt as Redis sees it: the owner already bound to the caller's principal and uid.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BoundAttempt {
    pub owner: String,
    pub operation_id: String,
}

#[derive(Clone)]
pub struct Calls {
    runner: ScriptRunner,
    drift: Duration,
}

/// How many replicas must confirm an acquisition, and for how long to wait for them.
#[derive(Debug, Clone, Copy)]
pub struct Durability {
    pub replicas: u32,
    pub timeout: Duration,
}

impl Calls {
    pub fn new(runner: ScriptRunner, drift: Duration) -> Calls {
        Calls { runner, drift }
    }

    /// One acquisition try. With replicas asked for, `WAIT` follows on the same connection; if
    /// fewer confirm in time, the acquisition is undone and the outcome is `unavailable`, because a
    /// failover could then rewind the fencing counter and hand the same fence out twice.
    pub async fn acquire(
        &self,
        keys: &LeaseKeys,
        attempt: &BoundAttempt,
        ttl: Duration,
        durability: Durability,
        value: Option<&str>,
    ) -> AcquireOutcome {
        let mut ttl_digits = itoa::Buffer::new();
        let ttl_ms = ttl_digits.format(millis(ttl));
        let (replicas, wait_ms) = match durability.replicas {
            0 => (String::new(), String::new()),
            n => (n.to_string(), millis(durability.timeout).max(1).to_string()),
        };
        let wait: [&[u8]; 3] = [b"WAIT", replicas.as_bytes(), wait_ms.as_bytes()];
        let then: &[&[&[u8]]] = if durability.replicas > 0 {
            &[&wait]
        } else {
            &[]
        };
        let sent_at = Instant::now();
        // On the stack: this runs for every acquire. The value goes last, when there is one.
        let every = [
            attempt.owner.as_bytes(),
            attempt.operation_id.as_bytes(),
            ttl_ms.as_bytes(),
            value.unwrap_or_default().as_bytes(),
        ];
        let args = &every[..3 + usize::from(value.is_some())];
        let frames = match self
            .runner
            .run(
                &ACQUIRE,
                &[&keys.lease, &keys.fence, &keys.channel],
                args,
                then,
            )
            .await
        {
            Ok(frames) => frames,
            Err(error) => return error.into(),
        };
        if let Some(conflict) = shape_conflict(&frames[0]) {
            return conflict;
        }
        let Some([status, fence, remaining]) = integers::<3>(&frames[0]) else {
            return unexpected(&frames[0], |reason| AcquireOutcome::Indeterminate {
                reason,
            });
        };
        let held = match status {
            1 | 2 => self.holding(status == 1, fence, remaining, sent_at),
            3 => return AcquireOutcome::Conflict,
            _ => {
                return AcquireOutcome::Contended {
                    retry_after: Duration::from_millis(
                        u64::try_from(remaining).unwrap_or_default(),
                    ),
                }
            }
        };
        if !matches!(
            held,
            AcquireOutcome::Acquired { .. } | AcquireOutcome::Replayed { .. }
        ) {
            return held;
        }
        if durability.replicas > 0 {
            let confirmed = match frames.get(1) {
                Some(Frame::Integer(n)) => *n,
                _ => 0,
            };
            if confirmed < i64::from(durability.replicas) {
                let undone = self.release(keys, attempt).await;
                return AcquireOutcome::Unavailable {
                    reason: format!(
                        "{confirmed} of {} replicas confirmed within {:?}; the acquisition was undone ({undone:?})",
                        durability.replicas, durability.timeout
                    ),
                };
            }
        }
        held
    }

    /// What an acquire script's "held" reply (`acquired` for a new holding, else replayed) means for
    /// the caller.
    fn holding(
        &self,
        acquired: bool,
        fence: i64,
        remaining: i64,
        sent_at: Instant,
    ) -> AcquireOutcome {
        // The script never hands out less than 1; anything else is a corrupt reply, and a fence is
        // only worth something if a wrong one is never given out.
        let Some(fence) = u64::try_from(fence).ok().filter(|fence| *fence >= 1) else {
            tracing::error!(fence, "acquire script answered an invalid fence");
            return AcquireOutcome::Indeterminate {
                reason: format!("redis answered fence {fence}, which is not a fence"),
            };
        };
        let remaining = Duration::from_millis(u64::try_from(remaining).unwrap_or_default());
        let Some(valid_for) = self.validity(remaining, sent_at) else {
            return AcquireOutcome::Indeterminate {
                reason: ran_out(sent_at),
            };
        };
        match acquired {
            true => AcquireOutcome::Acquired { fence, valid_for },
            false => AcquireOutcome::Replayed { fence, valid_for },
        }
    }

    pub async fn renew(
        &self,
        keys: &LeaseKeys,
        attempt: &BoundAttempt,
        ttl: Duration,
    ) -> RenewOutcome {
        let mut ttl_digits = itoa::Buffer::new();
        let ttl_ms = ttl_digits.format(millis(ttl));
        let sent_at = Instant::now();
        let args = [
            attempt.owner.as_bytes(),
            attempt.operation_id.as_bytes(),
            ttl_ms.as_bytes(),
        ];
        match self.runner.run(&RENEW, &[&keys.lease], &args, &[]).await {
            Ok(frames) => match frames[0] {
                Frame::Integer(1) => match self.validity(ttl, sent_at) {
                    Some(valid_for) => RenewOutcome::Renewed { valid_for },
                    None => RenewOutcome::Indeterminate {
                        reason: ran_out(sent_at),
                    },
                },
                Frame::Integer(0) => RenewOutcome::Lost {
                    reason: LostReason::Absent,
                },
                Frame::Integer(-1) => RenewOutcome::Lost {
                    reason: LostReason::NotOwner,
                },
                ref other => unexpected(other, |reason| RenewOutcome::Indeterminate { reason }),
            },
            Err(error) => error.into(),
        }
    }

    pub async fn release(&self, keys: &LeaseKeys, attempt: &BoundAttempt) -> ReleaseOutcome {
        let args = [attempt.owner.as_bytes(), attempt.operation_id.as_bytes()];
        match self
            .runner
            .run(&RELEASE, &[&keys.lease, &keys.channel], &args, &[])
            .await
        {
            Ok(frames) => match frames[0] {
                Frame::Integer(1) => ReleaseOutcome::Released,
                Frame::Integer(0) => ReleaseOutcome::AlreadyAbsent,
                Frame::Integer(-1) => ReleaseOutcome::NotOwner,
                ref other => unexpected(other, |reason| ReleaseOutcome::Indeterminate { reason }),
            },
            Err(error) => error.into(),
        }
    }

    pub async fn inspect(
        &self,
        keys: &LeaseKeys,
        attempt: Option<&BoundAttempt>,
    ) -> InspectOutcome {
        let (owner, operation) = attempt
            .map(|a| (a.owner.as_bytes(), a.operation_id.as_bytes()))
            .unwrap_or_default();
        self.read(keys, owner, operation, b"").await
    }

    /// An inspect that publishes `marker` on the change channel in the same atomic step (a watch
    /// placing its read among the announcements, see `watch.rs`).
    pub async fn observe(&self, keys: &LeaseKeys, marker: &str) -> InspectOutcome {
        self.read(keys, b"", b"", marker.as_bytes()).await
    }

    async fn read(
        &self,
        keys: &LeaseKeys,
        owner: &[u8],
        operation: &[u8],
        marker: &[u8],
    ) -> InspectOutcome {
        let frames = match self
            .runner
            .run(
                &INSPECT,
                &[&keys.lease, &keys.channel],
                &[owner, operation, marker],
                &[],
            )
            .await
        {
            Ok(frames) => frames,
            // Inspect changes nothing, so an unknown reply is just no answer.
            Err(error) => {
                return InspectOutcome::Unavailable {
                    reason: error.to_string(),
                }
            }
        };
        if let Some([0]) = integers::<1>(&frames[0]) {
            return InspectOutcome::Free;
        }
        if let Some(held) = held_shared(&frames[0]).or_else(|| held_exclusive(&frames[0])) {
            return held;
        }
        unexpected(&frames[0], |reason| InspectOutcome::Unavailable { reason })
    }

    /// Server-side remaining time, less drift, less the time since the call was sent.
    /// How long the holder may count on the lease: what the server had left, less the drift budget
    /// and the time since the call was sent. `None` when nothing is left: a reply that arrives
    /// after the lease's validity (Redis paused, a slow link) must not be reported as held.
    fn validity(&self, remaining: Duration, sent_at: Instant) -> Option<Duration> {
        Some(
            remaining
                .saturating_sub(self.drift)
                .saturating_sub(sent_at.elapsed()),
        )
        .filter(|valid_for| !valid_for.is_zero())
    }
}

/// Why a call that Redis answered "held" is indeterminate: its validity ran out in flight.
fn ran_out(sent_at: Instant) -> String {
    format!(
        "the lease's validity ran out before Redis's reply arrived ({} ms after sending); retry \
         with the same attempt to learn what Redis holds",
        sent_at.elapsed().as_millis()
    )
}

/// The three calls that change Redis share how a failed script maps onto their outcomes.
macro_rules! outcome_from_script_error {
    ($($outcome:ident),*) => {$(
        impl From<ScriptError> for $outcome {
            fn from(error: ScriptError) -> Self {
                match error {
                    ScriptError::NotSent(reason) => $outcome::Unavailable { reason },
                    ScriptError::Indeterminate(reason) => $outcome::Indeterminate { reason },
                }
            }
        }
    )*};
}
outcome_from_script_error!(AcquireOutcome, RenewOutcome, ReleaseOutcome);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_arrays_are_read_by_exact_length() {
        let frame = Frame::Array(vec![
            Frame::Integer(2),
            Frame::Integer(7),
            Frame::Integer(900),
        ]);
        assert_eq!(integers::<3>(&frame), Some([2, 7, 900]));
        assert_eq!(integers::<4>(&frame), None);
        assert_eq!(integers::<1>(&Frame::Integer(1)), None);
    }
}
