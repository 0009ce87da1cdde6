//! A warning that may fire thousands of times a second (a full descriptor table, a flood of
//! refused connections) logged at most once per interval, with how many occurrences it stands for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counts occurrences and says when one should be logged.
pub struct Occasional {
    interval: Duration,
    last: Mutex<Option<Instant>>,
    unlogged: AtomicU64,
}

impl Occasional {
    pub fn new(interval: Duration) -> Self {
        Occasional {
            interval,
            last: Mutex::new(None),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Records one occurrence; `Some(n)` when it should be logged, standing for `n` occurrences
    /// (itself and those not logged since the last time).
    pub fn occurred(&self) -> Option<u64> {
        let now = Instant::now();
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let due = last.is_none_or(|at| now.duration_since(at) >= self.interval);
        if !due {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.unlogged.swap(0, Ordering::Relaxed) + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_first_then_once_per_interval_counting_the_rest() {
        let occasional = Occasional::new(Duration::from_secs(3600));
        assert_eq!(occasional.occurred(), Some(1));
        for _ in 0..5 {
            assert_eq!(occasional.occurred(), None);
        }
        *occasional.last.lock().unwrap() = Some(Instant::now() - Duration::from_secs(7200));
        assert_eq!(
            occasional.occurred(),
            Some(6),
            "itself and the five not logged"
        );
        assert_eq!(occasional.occurred(), None);
        let every_time = Occasional::new(Duration::ZERO);
        assert_eq!(every_time.occurred(), Some(1));
        assert_eq!(every_time.occurred(), Some(1));
    }
}
