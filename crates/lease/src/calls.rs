//! One lease call = one script run, its reply decoded into the outcome table. Validity is counted
//! from the moment the call was sent, less the drift budget, and always from the server's own
//! remaining PTTL when the lease already existed (replay).

use std::time::{Duration, Instant};

use tollgate_resp::Frame;

use crate::outcome::{AcquireOutcome, InspectOutcome, LostReason, ReleaseOutcome, RenewOutcome};
use crate::resource::LeaseKeys;
use crate::scripts::{ScriptError, ScriptRunner, ACQUIRE, INSPECT, RELEASE, RENEW};

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
        let ttl_ms = millis(ttl).to_string();
        let replicas = durability.replicas.to_string();
        let wait_ms = millis(durability.timeout).max(1).to_string();
        let wait: [&[u8]; 3] = [b"WAIT", replicas.as_bytes(), wait_ms.as_bytes()];
        let then: &[&[&[u8]]] = if durability.replicas > 0 {
            &[&wait]
        } else {
            &[]
        };
        let sent_at = Instant::now();
        let mut args = vec![
            attempt.owner.as_bytes(),
            attempt.operation_id.as_bytes(),
            ttl_ms.as_bytes(),
        ];
        args.extend(value.map(str::as_bytes));
        let frames = match self
            .runner
            .run(
                &ACQUIRE,
                &[&keys.lease, &keys.fence, &keys.channel],
                &args,
                then,
            )
            .await
        {
            Ok(frames) => frames,
            Err(error) => return error.into(),
        };
        let Some([status, fence, remaining]) = integers::<3>(&frames[0]) else {
            return unexpected(&frames[0], |reason| AcquireOutcome::Indeterminate {
                reason,
            });
        };
        // The script never hands out less than 1; anything else is a corrupt reply, and a fence is
        // only worth something if a wrong one is never given out.
        let fence = match u64::try_from(fence) {
            Ok(fence) if fence >= 1 => fence,
            _ if status == 1 || status == 2 => {
                tracing::error!(fence, "acquire script answered an invalid fence");
                return AcquireOutcome::Indeterminate {
                    reason: format!("redis answered fence {fence}, which is not a fence"),
                };
            }
            _ => 0,
        };
        let remaining = Duration::from_millis(u64::try_from(remaining).unwrap_or_default());
        let held = match status {
            1 | 2 => {
                let Some(valid_for) = self.validity(remaining, sent_at) else {
                    return AcquireOutcome::Indeterminate {
                        reason: ran_out(sent_at),
                    };
                };
                if status == 1 {
                    AcquireOutcome::Acquired { fence, valid_for }
                } else {
                    AcquireOutcome::Replayed { fence, valid_for }
                }
            }
            3 => return AcquireOutcome::Conflict,
            _ => {
                return AcquireOutcome::Contended {
                    retry_after: remaining,
                }
            }
        };
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

    pub async fn renew(
        &self,
        keys: &LeaseKeys,
        attempt: &BoundAttempt,
        ttl: Duration,
    ) -> RenewOutcome {
        let ttl_ms = millis(ttl).to_string();
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
        // `{1, fence, remaining, yours, value}`; the value is nil when the holder gave none.
        let held = match &frames[0] {
            Frame::Array(items) if items.len() == 5 => {
                integers::<4>(&Frame::Array(items[..4].to_vec())).zip(match &items[4] {
                    // Lua's false for a missing field: a null, or `false` to a RESP3 connection.
                    Frame::Null | Frame::Boolean(false) => Some(None),
                    Frame::Bulk(value) => Some(Some(String::from_utf8_lossy(value).into_owned())),
                    _ => None,
                })
            }
            _ => None,
        };
        match held {
            Some(([1, fence, remaining, yours], value)) => InspectOutcome::Held {
                remaining: Duration::from_millis(u64::try_from(remaining).unwrap_or_default()),
                fence: u64::try_from(fence).unwrap_or_default(),
                yours: yours == 1,
                value,
            },
            _ => unexpected(&frames[0], |reason| InspectOutcome::Unavailable { reason }),
        }
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

fn unexpected<T>(frame: &Frame, into: impl FnOnce(String) -> T) -> T {
    into(format!("unexpected reply from a lease script: {frame:?}"))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An array of exactly `N` integers.
fn integers<const N: usize>(frame: &Frame) -> Option<[i64; N]> {
    let Frame::Array(items) = frame else {
        return None;
    };
    let values: Vec<i64> = items
        .iter()
        .map(|item| match item {
            Frame::Integer(n) => Some(*n),
            _ => None,
        })
        .collect::<Option<_>>()?;
    values.try_into().ok()
}

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
