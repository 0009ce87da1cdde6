//! At most one run of an expensive action at a time, and a pause after each: the policy reload,
//! where every run compiles and self-tests every module. The pause counts from the end of a run, so
//! a slow compile cannot be followed back to back by the next one.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub struct Throttle {
    interval: Duration,
    /// When the next run may start; pushed out while a run is under way.
    next: Mutex<Instant>,
}

/// A run refused for now; `retry_after` says when one may start at the earliest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    pub retry_after: Duration,
}

/// The right to run once; dropping it at the end of the run starts the pause.
pub struct Claim<'a> {
    throttle: &'a Throttle,
}

impl Throttle {
    pub fn new(interval: Duration) -> Throttle {
        Throttle {
            interval,
            next: Mutex::new(Instant::now()),
        }
    }

    /// The least time between the end of one run and the start of the next.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Claims a run now, or says how long to wait.
    pub fn claim(&self) -> Result<Claim<'_>, Throttled> {
        self.claim_at(Instant::now())
    }

    fn claim_at(&self, now: Instant) -> Result<Claim<'_>, Throttled> {
        let mut next = self.next.lock();
        if now < *next {
            return Err(Throttled {
                retry_after: *next - now,
            });
        }
        // Until the run ends, others wait at least a whole interval.
        *next = now + self.interval;
        Ok(Claim { throttle: self })
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        *self.throttle.next.lock() = Instant::now() + self.throttle.interval;
    }
}

impl Throttled {
    /// Whole seconds for `Retry-After`, rounded up so that a client that waits that long gets in.
    pub fn retry_after_secs(&self) -> u64 {
        let millis = self.retry_after.as_millis();
        u64::try_from(millis.div_ceil(1000))
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_run_at_a_time_and_a_pause_after_it() {
        let throttle = Throttle::new(Duration::from_secs(60));
        let claim = throttle.claim().expect("the first run starts");
        let during = throttle.claim().err().expect("refused while running");
        assert!(during.retry_after > Duration::from_secs(59));
        drop(claim);
        let after = throttle.claim().err().expect("refused right after the run");
        assert!(after.retry_after <= Duration::from_secs(60));
        let later = Instant::now() + Duration::from_secs(61);
        assert!(
            throttle.claim_at(later).is_ok(),
            "allowed once the pause is over"
        );
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let wait = |millis| Throttled {
            retry_after: Duration::from_millis(millis),
        };
        assert_eq!(wait(1).retry_after_secs(), 1);
        assert_eq!(wait(1000).retry_after_secs(), 1);
        assert_eq!(wait(1001).retry_after_secs(), 2);
    }
}
