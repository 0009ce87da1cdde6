//! How long a multiplexed connection's writes wait for their first reply: how far its Redis is,
//! which decides whether the connection's writer holds the next batch until the last write is
//! answered.
//!
//! Holding (one write unanswered at a time) makes bigger batches: Redis, the daemon and the kernel
//! pay one read, one write and one wake-up for many commands instead of one each, and a command
//! held behind a write Redis answers in tens of microseconds waits little longer than it would
//! have waited inside Redis. But a command held behind a write to a Redis one network round trip
//! away waits that whole round trip before its own write starts its own: two round trips a command
//! instead of one, and half the throughput a connection can carry (over a 0.5 ms hop, uncached
//! GETs at 0.65x twemproxy's rate; BENCHMARKS.md, "Writes to a far Redis not held"). So the writer
//! holds only while the distance is below [`HOLD_BELOW`]; past it every batch is written as soon
//! as it is gathered, as twemproxy does.
//!
//! One write at a time is timed (a probe): from just before it is written to the arrival of the
//! reply to its first command. The distance is the shortest such turnaround of the last
//! [`WINDOW`] probes, or a shorter one seen since (until the first window is full, the connection
//! holds): a network round trip is a floor under every
//! sample, while a Redis not yet scheduled on a busy machine, busy with other clients or forking
//! answers late only some of the time (on this project's two cores, with Redis, the daemon and
//! the load generator on them, 1 window in 600 had no turnaround under 100 µs). Writer and reader
//! are the two halves of one task, so the counters are never contended; they are atomics only
//! because the halves share them by reference across `.await`s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The distance below which a connection's writer holds the next batch while a write is
/// unanswered. A Redis on the same host answers a write's first command in 15–50 µs on this
/// project's two-core machine under full load (the shortest of a window's turnarounds); a round
/// trip between hosts is 50 µs within a rack to milliseconds between zones. Holding costs each
/// command held up to one turnaround; a write of its own costs Redis and the daemon a few
/// microseconds each.
pub(crate) const HOLD_BELOW: Duration = Duration::from_micros(150);

/// Samples over which the shortest turnaround is taken: a connection moves away (its distance
/// rises) at most once per this many timed writes; it comes nearer at once. Over 64, on this
/// project's two cores oversubscribed (three cluster nodes, the daemon and the load generator,
/// unpinned), a window's minimum passed 150 µs 169 times in a bench run, and each time the
/// connection stopped holding where holding pays most; over 1,024 it did not once. Moving away
/// takes a far connection 1,024 round trips (half a second at 0.5 ms), holding meanwhile.
const WINDOW: u64 = 1024;

#[derive(Default)]
pub(crate) struct Turnaround {
    /// Commands written on the connection, ever.
    written: AtomicU64,
    /// Commands answered, ever.
    answered: AtomicU64,
    /// The number (1-based, in write order) of the first command of the write being timed; 0:
    /// none is.
    probe: AtomicU64,
    /// When the timed write was made, in nanoseconds of the caller's clock.
    probe_at: AtomicU64,
    /// The shortest turnaround of the current window (0: no sample in it yet), and how many
    /// samples it has.
    window_min: AtomicU64,
    window_samples: AtomicU64,
    /// The distance: the shortest turnaround of the last full window, or a shorter one seen since;
    /// 0 (near) until the first window is full.
    distance: AtomicU64,
}

impl Turnaround {
    /// `commands` are about to be written, at `now` (nanoseconds of the caller's clock, read only
    /// when this write is to be timed).
    pub(crate) fn writing(&self, commands: usize, now: impl FnOnce() -> u64) {
        let first = self.written.fetch_add(commands as u64, Ordering::Relaxed) + 1;
        if commands > 0 && self.probe.load(Ordering::Relaxed) == 0 {
            self.probe_at.store(now(), Ordering::Relaxed);
            self.probe.store(first, Ordering::Relaxed);
        }
    }

    /// `commands` more replies arrived, at `now` (read only when they include the timed write's
    /// first).
    pub(crate) fn answered(&self, commands: usize, now: impl FnOnce() -> u64) {
        let answered =
            self.answered.fetch_add(commands as u64, Ordering::Relaxed) + commands as u64;
        let probe = self.probe.load(Ordering::Relaxed);
        if probe == 0 || answered < probe {
            return;
        }
        self.probe.store(0, Ordering::Relaxed);
        let sample = now()
            .saturating_sub(self.probe_at.load(Ordering::Relaxed))
            .max(1);
        // The shortest turnaround, not an average: a network round trip is a floor under every
        // sample, while a Redis that was not yet scheduled, busy or saving answers late only
        // some of the time. A window's minimum is the distance.
        let min = match self.window_min.load(Ordering::Relaxed) {
            0 => sample,
            min => min.min(sample),
        };
        let samples = self.window_samples.load(Ordering::Relaxed) + 1;
        let distance = self.distance.load(Ordering::Relaxed);
        if samples >= WINDOW {
            self.distance.store(min, Ordering::Relaxed);
            self.window_min.store(0, Ordering::Relaxed);
            self.window_samples.store(0, Ordering::Relaxed);
        } else {
            self.window_min.store(min, Ordering::Relaxed);
            self.window_samples.store(samples, Ordering::Relaxed);
            // Nearer at once; further only with a whole window's evidence (and not before the
            // first window: until then the connection holds, as one slow start proves nothing).
            if sample < distance {
                self.distance.store(sample, Ordering::Relaxed);
            }
        }
    }

    /// Commands written and not yet answered.
    pub(crate) fn unanswered(&self) -> u64 {
        self.written.load(Ordering::Relaxed) - self.answered.load(Ordering::Relaxed)
    }

    /// Whether the writer should hold the next batch while a write is unanswered: until a first
    /// window of turnarounds is measured, and while the distance is below [`HOLD_BELOW`].
    pub(crate) fn near(&self) -> bool {
        self.distance.load(Ordering::Relaxed) < HOLD_BELOW.as_nanos() as u64
    }

    /// The distance (zero until a first window is measured).
    #[cfg(test)]
    fn distance(&self) -> Duration {
        Duration::from_nanos(self.distance.load(Ordering::Relaxed))
    }

    /// The shortest turnaround of the window being measured (zero: none yet).
    #[cfg(test)]
    fn shortest(&self) -> Duration {
        Duration::from_nanos(self.window_min.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    /// A write of `commands` at `at` µs whose replies all arrive at `reply` µs.
    fn round(turnaround: &Turnaround, commands: usize, at: u64, reply: u64) {
        turnaround.writing(commands, || at * US);
        turnaround.answered(commands, || reply * US);
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_connection_holds_until_it_knows_better() {
        assert!(Turnaround::default().near());
    }

    #[test]
    fn a_redis_answering_in_tens_of_microseconds_is_near() {
        let turnaround = Turnaround::default();
        for n in 0..WINDOW + 100 {
            round(&turnaround, 5, n * 1_000, n * 1_000 + 30 + n % 40);
        }
        assert!(turnaround.near());
        assert_eq!(turnaround.distance(), us(30));
    }

    #[test]
    fn a_redis_half_a_millisecond_away_is_far_after_a_window() {
        let turnaround = Turnaround::default();
        for n in 0..WINDOW {
            assert!(turnaround.near(), "far after {n} answers, before a window");
            round(&turnaround, 3, n * 1_000, n * 1_000 + 520 + n % 7);
        }
        assert!(!turnaround.near());
        assert_eq!(turnaround.distance(), us(520));
    }

    #[test]
    fn one_slow_start_proves_nothing() {
        let turnaround = Turnaround::default();
        round(&turnaround, 1, 0, 5_000);
        assert!(turnaround.near());
        for n in 1..WINDOW {
            round(&turnaround, 1, n * 1_000, n * 1_000 + 30);
        }
        assert!(turnaround.near());
        assert_eq!(turnaround.distance(), us(30));
    }

    #[test]
    fn late_answers_from_a_near_redis_do_not_stop_the_holding() {
        let turnaround = Turnaround::default();
        // Most writes wait long (Redis not yet scheduled, busy, forking); one in a window does not.
        for n in 0..10 * WINDOW {
            let wait = if n % WINDOW == WINDOW / 2 {
                40
            } else {
                300 + n % 700
            };
            round(&turnaround, 5, n * 2_000, n * 2_000 + wait);
            assert!(turnaround.near(), "write {n}: {:?}", turnaround.distance());
        }
    }

    #[test]
    fn a_redis_that_moves_away_is_followed_within_a_window() {
        let turnaround = Turnaround::default();
        for n in 0..WINDOW {
            round(&turnaround, 5, n * 1_000, n * 1_000 + 30);
        }
        let mut writes = 0;
        while turnaround.near() {
            round(
                &turnaround,
                5,
                200_000 + writes * 1_000,
                200_000 + writes * 1_000 + 700,
            );
            writes += 1;
            assert!(
                writes <= 2 * WINDOW,
                "still holding after {writes} far writes"
            );
        }
        assert_eq!(turnaround.distance(), us(700));
    }

    #[test]
    fn a_redis_that_comes_near_is_followed_at_once() {
        let turnaround = Turnaround::default();
        for n in 0..WINDOW {
            round(&turnaround, 5, n * 1_000, n * 1_000 + 700);
        }
        assert!(!turnaround.near());
        round(&turnaround, 5, 2_000_000, 2_000_040);
        assert!(turnaround.near());
    }

    #[test]
    fn only_the_timed_writes_first_reply_is_a_sample() {
        let turnaround = Turnaround::default();
        // Two writes overlap: the first (commands 1-4) is timed from 0; the second (5-8) is not,
        // as the first still is when it is written.
        turnaround.writing(4, || 0);
        turnaround.writing(4, || panic!("a second write is not timed while one is"));
        // Three replies arrive: the timed write's first is among them.
        turnaround.answered(3, || 400 * US);
        assert_eq!(turnaround.shortest(), us(400));
        // The rest later; nothing is being timed, so no clock is read.
        assert_eq!(turnaround.unanswered(), 5);
        turnaround.answered(5, || panic!("no write is being timed"));
        assert_eq!(turnaround.unanswered(), 0);
        // The next write is timed again, from its first command (the 9th).
        turnaround.writing(2, || 1_000 * US);
        turnaround.answered(1, || 1_090 * US);
        assert_eq!(turnaround.shortest(), us(90));
    }

    #[test]
    fn replies_to_earlier_writes_are_not_the_timed_writes_sample() {
        let turnaround = Turnaround::default();
        turnaround.writing(2, || 0); // commands 1-2, timed
        turnaround.answered(2, || 500 * US); // its sample: 500 µs
        assert_eq!(turnaround.shortest(), us(500));
        turnaround.writing(3, || 1_000 * US); // commands 3-5, timed from 1,000
        turnaround.writing(3, || unreachable!("one write is being timed")); // 6-8
        turnaround.answered(0, || unreachable!("no reply arrived"));
        turnaround.answered(2, || 1_300 * US); // commands 3-4: the timed write's first is 3
        assert_eq!(turnaround.shortest(), us(300));
    }
}
