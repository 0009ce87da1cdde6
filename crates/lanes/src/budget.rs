//! What the lanes hold for one caller, counted against that caller's [`Budget`]: a multiplexed
//! reply from the moment it is cut from the shared connection's stream until its caller takes it,
//! and a pub/sub message from its fan-out until the subscriber takes it. The lane never waits on a
//! budget (a shared connection must keep reading for everyone): a reply or message the budget
//! refuses is dropped at once, and the caller is told ([`CallError::OverBudget`]).
//!
//! [`CallError::OverBudget`]: crate::CallError::OverBudget

use std::sync::Arc;

/// One caller's allowance of held bytes; the daemon decides the limits and what a refusal means.
pub trait Budget: Send + Sync {
    /// Counts `bytes` more as held for this caller, or refuses them (they are then dropped).
    fn hold(&self, bytes: usize) -> Result<(), OverBudget>;
    /// Gives back bytes [`Budget::hold`] counted.
    fn release(&self, bytes: usize);
}

/// Why a budget refused to hold more bytes, in words for the caller's error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OverBudget(pub String);

/// Bytes counted against a budget while they are held; given back when dropped, however the holder
/// goes (taken by its caller, or dropped with a caller that went away).
pub struct Held {
    budget: Arc<dyn Budget>,
    bytes: usize,
}

impl Held {
    /// Counts `bytes` against `budget` for as long as the returned guard lives.
    pub fn new(budget: &Arc<dyn Budget>, bytes: usize) -> Result<Held, OverBudget> {
        budget.hold(bytes)?;
        Ok(Held {
            budget: budget.clone(),
            bytes,
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").field("bytes", &self.bytes).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    struct Capped {
        held: AtomicUsize,
        cap: usize,
    }

    impl Budget for Capped {
        fn hold(&self, bytes: usize) -> Result<(), OverBudget> {
            let now = self.held.load(Ordering::Relaxed) + bytes;
            if now > self.cap {
                return Err(OverBudget(format!("{now} > {}", self.cap)));
            }
            self.held.store(now, Ordering::Relaxed);
            Ok(())
        }

        fn release(&self, bytes: usize) {
            self.held.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    #[test]
    fn held_bytes_count_until_dropped_and_a_refusal_holds_nothing() {
        let capped = Arc::new(Capped {
            held: AtomicUsize::new(0),
            cap: 10,
        });
        let budget: Arc<dyn Budget> = capped.clone();
        let first = Held::new(&budget, 6).unwrap();
        assert_eq!(
            Held::new(&budget, 5).unwrap_err(),
            OverBudget("11 > 10".into())
        );
        assert_eq!(capped.held.load(Ordering::Relaxed), 6);
        drop(first);
        assert_eq!(capped.held.load(Ordering::Relaxed), 0);
        let _again = Held::new(&budget, 10).unwrap();
    }
}
