//! Calls on semaphores and read/write leases (`lua/shared.lua`, `lua/acquire_shared.lua`): one
//! acquisition try, optionally standing at the head of the resource's line; leaving the head when a
//! waiter gives up; and decoding what the shared scripts answer where the exclusive ones would.

use std::time::{Duration, Instant};

use tollgate_resp::Frame;

use super::{integers, unexpected, BoundAttempt, Calls};
use crate::outcome::{AcquireOutcome, InspectOutcome};
use crate::resource::LeaseKeys;
use crate::scripts::{ScriptError, ACQUIRE_SHARED, WITHDRAW};
use crate::shape::{HeldAs, HolderMode, Mode, Shared, SharedHolder};

/// The key naming the waiter at the head of a shared resource's line (same hash slot as its lease).
fn head_key(keys: &LeaseKeys) -> String {
    format!("{}:head", keys.lease)
}

impl Calls {
    /// One try for `shape`. With `stand_for`, a contended try also takes the head of the line (if
    /// free) for that long, so that nobody else is served until this attempt is.
    pub async fn acquire_shared(
        &self,
        keys: &LeaseKeys,
        attempt: &BoundAttempt,
        ttl: Duration,
        shape: Shared,
        stand_for: Option<Duration>,
    ) -> AcquireOutcome {
        let (code, permits, count, mode) = match shape {
            Shared::Semaphore { permits, count } => ("1", permits, count, "p"),
            Shared::ReadWrite(Mode::Read) => ("2", 0, 1, "r"),
            Shared::ReadWrite(Mode::Write) => ("2", 0, 1, "w"),
        };
        let ttl_ms = super::millis(ttl).to_string();
        let (permits, count) = (permits.to_string(), count.to_string());
        let stand_ms = stand_for.map_or(0, |d| super::millis(d).max(1)).to_string();
        let head = head_key(keys);
        let args = [
            attempt.owner.as_bytes(),
            attempt.operation_id.as_bytes(),
            ttl_ms.as_bytes(),
            code.as_bytes(),
            permits.as_bytes(),
            count.as_bytes(),
            mode.as_bytes(),
            stand_ms.as_bytes(),
        ];
        let sent_at = Instant::now();
        let frames = match self
            .runner
            .run(
                &ACQUIRE_SHARED,
                &[&keys.lease, &keys.fence, &head],
                &args,
                &[],
            )
            .await
        {
            Ok(frames) => frames,
            Err(error) => return error.into(),
        };
        if let Some(conflict) = shape_conflict(&frames[0]) {
            return conflict;
        }
        match integers::<3>(&frames[0]) {
            Some([status @ (1 | 2), fence, remaining]) => {
                self.holding(status == 1, fence, remaining, sent_at)
            }
            Some([0, _, retry_after]) => AcquireOutcome::Contended {
                retry_after: Duration::from_millis(u64::try_from(retry_after).unwrap_or_default()),
            },
            _ => unexpected(&frames[0], |reason| AcquireOutcome::Indeterminate {
                reason,
            }),
        }
    }

    /// Leaves the head of the line if `attempt` stands there; nothing else changes either way.
    pub async fn withdraw(
        &self,
        keys: &LeaseKeys,
        attempt: &BoundAttempt,
    ) -> Result<(), ScriptError> {
        let args = [attempt.owner.as_bytes(), attempt.operation_id.as_bytes()];
        self.runner
            .run(&WITHDRAW, &[&head_key(keys), &keys.channel], &args, &[])
            .await
            .map(drop)
    }
}

fn held_as(code: i64) -> Option<HeldAs> {
    match code {
        0 => Some(HeldAs::Exclusive),
        1 => Some(HeldAs::Semaphore),
        2 => Some(HeldAs::ReadWrite),
        _ => None,
    }
}

/// `{4, shape, permits}`: the resource is held in another shape.
pub(super) fn shape_conflict(frame: &Frame) -> Option<AcquireOutcome> {
    let [4, shape, permits] = integers::<3>(frame)? else {
        return None;
    };
    let held_as = held_as(shape)?;
    Some(AcquireOutcome::ShapeConflict {
        held_as,
        permits: (held_as == HeldAs::Semaphore).then(|| u32::try_from(permits).unwrap_or_default()),
    })
}

/// `{2, shape, permits, (fence, remaining, count, mode, yours)*}`: a shared resource's holders.
pub(super) fn held_shared(frame: &Frame) -> Option<InspectOutcome> {
    let Frame::Array(items) = frame else {
        return None;
    };
    let numbers: Vec<i64> = items
        .iter()
        .map(|item| match item {
            Frame::Integer(n) => Some(*n),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let [2, shape, permits, holders @ ..] = numbers.as_slice() else {
        return None;
    };
    let held_as = held_as(*shape)?;
    if holders.len() % 5 != 0 {
        return None;
    }
    let holders = holders
        .chunks_exact(5)
        .map(|holder| {
            let [fence, remaining, count, mode, yours] = holder else {
                return None;
            };
            Some(SharedHolder {
                fence: u64::try_from(*fence).ok()?,
                remaining: Duration::from_millis(u64::try_from(*remaining).unwrap_or_default()),
                count: u32::try_from(*count).ok()?,
                mode: match mode {
                    0 => HolderMode::Permit,
                    1 => HolderMode::Read,
                    2 => HolderMode::Write,
                    _ => return None,
                },
                yours: *yours == 1,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let mut holders = holders;
    holders.sort_by_key(|holder| holder.fence);
    Some(InspectOutcome::HeldShared {
        held_as,
        permits: (held_as == HeldAs::Semaphore)
            .then(|| u32::try_from(*permits).unwrap_or_default()),
        holders,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(numbers: &[i64]) -> Frame {
        Frame::Array(numbers.iter().map(|n| Frame::Integer(*n)).collect())
    }

    #[test]
    fn shared_replies_decode_and_others_are_left_alone() {
        assert_eq!(
            shape_conflict(&array(&[4, 1, 3])),
            Some(AcquireOutcome::ShapeConflict {
                held_as: HeldAs::Semaphore,
                permits: Some(3)
            })
        );
        assert_eq!(
            shape_conflict(&array(&[4, 0, 0])),
            Some(AcquireOutcome::ShapeConflict {
                held_as: HeldAs::Exclusive,
                permits: None
            })
        );
        assert_eq!(shape_conflict(&array(&[0, 9, 100])), None);
        let Some(InspectOutcome::HeldShared {
            held_as, holders, ..
        }) = held_shared(&array(&[2, 2, 0, 9, 500, 1, 1, 0, 8, 400, 1, 1, 1]))
        else {
            panic!("two readers");
        };
        assert_eq!(held_as, HeldAs::ReadWrite);
        assert_eq!(
            holders
                .iter()
                .map(|h| (h.fence, h.yours))
                .collect::<Vec<_>>(),
            vec![(8, true), (9, false)],
            "oldest fence first"
        );
        assert_eq!(
            held_shared(&array(&[2, 2, 0, 9, 500])),
            None,
            "a cut holder"
        );
        assert_eq!(
            held_shared(&array(&[1, 7, 500, 0])),
            None,
            "an exclusive holder"
        );
    }
}
