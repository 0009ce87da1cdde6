//! Calls on semaphores and read/write leases (`lua/shared.lua`, `lua/acquire_shared.lua`): one
//! acquisition try, optionally standing at the head of the resource's line; leaving the head when a
//! waiter gives up (their replies are decoded in `replies.rs`).

use std::time::{Duration, Instant};

use super::replies::{integers, millis, shape_conflict, unexpected};
use super::{BoundAttempt, Calls};
use crate::keys::LeaseKeys;
use crate::outcome::AcquireOutcome;
use crate::scripts::{ScriptError, ACQUIRE_SHARED, WITHDRAW};
use crate::shape::{Mode, Shared};

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
        let ttl_ms = millis(ttl).to_string();
        let (permits, count) = (permits.to_string(), count.to_string());
        let stand_ms = stand_for.map_or(0, |d| millis(d).max(1)).to_string();
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
