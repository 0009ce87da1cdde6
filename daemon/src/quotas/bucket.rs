//! One token bucket kept as one number, the time at which it would be full again (the generic
//! cell rate algorithm's "theoretical arrival time"): taking from it is a compare-and-swap, no
//! lock, so every session of a principal can share its bucket without queueing on a mutex.
//!
//! Time is nanoseconds since the registry's epoch, passed in, so the arithmetic is pure and
//! tested without a clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_policy::quota::Rate;

const NANOS_PER_SECOND: u128 = 1_000_000_000;

#[derive(Debug)]
pub struct Bucket {
    rate: Rate,
    /// When the bucket is full again: at or before now, it is full.
    full_at: AtomicU64,
}

impl Bucket {
    pub fn new(rate: Rate) -> Bucket {
        Bucket {
            rate,
            full_at: AtomicU64::new(0),
        }
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Takes `n` tokens at `now`, or says how long until they could be taken. A take larger than
    /// the whole bucket (a request of more bytes than a second's worth) is let through when the
    /// bucket is full and leaves it in debt: refusing it would refuse it for ever.
    pub fn take(&self, n: u64, now: u64) -> Result<(), Duration> {
        let cost = self.nanos(n);
        let depth = self.nanos(self.rate.burst);
        let mut full_at = self.full_at.load(Ordering::Relaxed);
        loop {
            let from = full_at.max(now);
            let owed = from - now + cost;
            if owed > depth && full_at > now {
                // Until enough has come back for this take, or (for a take deeper than the
                // bucket) until it is full.
                return Err(Duration::from_nanos((owed - depth).min(full_at - now)));
            }
            match self.full_at.compare_exchange_weak(
                full_at,
                from.saturating_add(cost),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now_there) => full_at = now_there,
            }
        }
    }

    /// Takes `n` tokens whatever the bucket holds (bytes of a reply already read): what it lacks
    /// is owed, and later takes wait for it.
    pub fn owe(&self, n: u64, now: u64) {
        let cost = self.nanos(n);
        let _ = self
            .full_at
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |full_at| {
                Some(full_at.max(now).saturating_add(cost))
            });
    }

    /// Puts back `n` tokens taken for a command refused by another bucket.
    pub fn give_back(&self, n: u64) {
        let cost = self.nanos(n);
        let _ = self
            .full_at
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |full_at| {
                Some(full_at.saturating_sub(cost))
            });
    }

    /// What `n` tokens take to come back.
    fn nanos(&self, n: u64) -> u64 {
        let nanos = u128::from(n) * NANOS_PER_SECOND / u128::from(self.rate.per_second.max(1));
        u64::try_from(nanos).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const START: u64 = 1_000 * MS;

    fn bucket(per_second: u64, burst: u64) -> Bucket {
        Bucket::new(Rate { per_second, burst })
    }

    #[test]
    fn a_full_bucket_gives_its_burst_then_refuses_until_a_token_is_back() {
        // 1000/s: a token every millisecond.
        let b = bucket(1000, 5);
        for _ in 0..5 {
            assert_eq!(b.take(1, START), Ok(()));
        }
        assert_eq!(b.take(1, START), Err(Duration::from_millis(1)));
        assert_eq!(b.take(1, START + MS / 2), Err(Duration::from_nanos(MS / 2)));
        assert_eq!(b.take(1, START + MS), Ok(()));
        assert!(b.take(1, START + MS).is_err());
    }

    #[test]
    fn the_rate_holds_over_time_whatever_the_burst() {
        let b = bucket(1000, 50);
        let mut taken = 0;
        // One second, asked every 100 µs: the burst plus a second's worth, never more.
        for step in 0..10_000u64 {
            if b.take(1, START + step * MS / 10).is_ok() {
                taken += 1;
            }
        }
        assert!((1000..=1050).contains(&taken), "{taken}");
    }

    #[test]
    fn an_idle_bucket_refills_only_to_its_depth() {
        let b = bucket(1000, 3);
        // A long idle time buys the burst, not the rate times the time.
        let later = START + 10_000 * MS;
        for _ in 0..3 {
            assert_eq!(b.take(1, later), Ok(()));
        }
        assert!(b.take(1, later).is_err());
    }

    #[test]
    fn a_take_deeper_than_the_bucket_passes_when_full_and_leaves_a_debt() {
        // 1 KiB/s of bytes.
        let b = bucket(1024, 1024);
        assert_eq!(b.take(4096, START), Ok(()));
        // Four seconds owed: the next byte waits until the bucket is full again at most.
        let wait = b.take(1, START).unwrap_err();
        assert!(
            wait > Duration::from_secs(3) && wait <= Duration::from_secs(4),
            "{wait:?}"
        );
        assert_eq!(b.take(1, START + 4_000 * MS), Ok(()));
    }

    #[test]
    fn owed_bytes_delay_the_next_take_and_given_back_tokens_return() {
        let b = bucket(1000, 2);
        b.owe(2, START);
        assert_eq!(b.take(1, START), Err(Duration::from_millis(1)));
        b.owe(10, START);
        assert_eq!(b.take(1, START), Err(Duration::from_millis(11)));
        b.give_back(10);
        assert_eq!(b.take(1, START), Err(Duration::from_millis(1)));
    }

    #[test]
    fn the_arithmetic_does_not_overflow_at_the_extremes() {
        let b = bucket(1, u64::MAX);
        assert_eq!(b.take(1, START), Ok(()));
        let b = bucket(u64::MAX, 1);
        assert_eq!(b.take(1, START), Ok(()));
        b.owe(u64::MAX, START);
        assert!(b.take(1, START).is_err());
    }
}
