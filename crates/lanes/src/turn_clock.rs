//! One clock reading for what a task sends in one turn. A multiplexed command is stamped with the
//! time it was queued (where its lane's bounded wait counts from), and a client pipelining sixteen
//! commands queues them in one poll of its session: one reading serves them all. A vDSO
//! `clock_gettime` per command was ~5% of the daemon's CPU at `-P 16` (BENCHMARKS.md).
//!
//! A reading is kept only inside a [`Turns`] poll, so it never outlives a suspension, and code
//! that may run long inside a turn (admission, which runs the guards) hands its own fresh reading
//! in with [`set`]. What it can be behind by is the synchronous work of one session's turn since
//! its first reading or its last admission: planning and queueing commands, microseconds for
//! ordinary ones (a command of many megabytes copied in the same turn makes it milliseconds,
//! against that client's own commands only, beside a 2 s `acquire_timeout` by default). Behind
//! only ever makes a wait look longer, never shorter: the bound on waiting holds. Outside a turn
//! (lane drivers, the HTTP API, the lease service's own tasks) every call reads the clock.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Instant;

/// Where this thread is: in no turn, or in a turn that has or has not read the clock yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Outside,
    Unread,
    Read(Instant),
}

thread_local! {
    static TURN: Cell<Turn> = const { Cell::new(Turn::Outside) };
}

/// Now: the turn's reading (read at the first call of the turn), or outside a turn the clock's.
pub(crate) fn now() -> Instant {
    TURN.with(|turn| match turn.get() {
        Turn::Read(at) => at,
        Turn::Unread => {
            let at = Instant::now();
            turn.set(Turn::Read(at));
            at
        }
        Turn::Outside => Instant::now(),
    })
}

/// A reading just taken elsewhere in this turn, kept for the rest of it; ignored outside a turn.
pub fn set(at: Instant) {
    TURN.with(|turn| {
        if turn.get() != Turn::Outside {
            turn.set(Turn::Read(at));
        }
    });
}

/// A future whose every poll is one turn. Nested, the inner turn ends where it began and the
/// outer one takes up its own reading again.
pub struct Turns<F>(F);

impl<F> Turns<F> {
    pub fn new(future: F) -> Self {
        Turns(future)
    }
}

impl<F: Future + Unpin> Future for Turns<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _turn = Begun(TURN.with(|turn| turn.replace(Turn::Unread)));
        Pin::new(&mut self.0).poll(cx)
    }
}

/// Ends a turn, even by unwinding: a reading left behind would be taken up by the next task
/// polled on this thread.
struct Begun(Turn);

impl Drop for Begun {
    fn drop(&mut self) {
        TURN.with(|turn| turn.set(self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_turn_reads_once_and_a_suspension_ends_it() {
        let (first, same, after) = Turns::new(Box::pin(async {
            let first = now();
            std::thread::sleep(Duration::from_millis(2));
            let same = now();
            tokio::task::yield_now().await;
            (first, same, now())
        }))
        .await;
        assert_eq!(first, same, "one reading for the whole turn");
        assert!(
            after >= first + Duration::from_millis(2),
            "a new turn reads again"
        );
    }

    #[tokio::test]
    async fn outside_a_turn_every_call_reads_and_set_is_ignored() {
        let before = now();
        set(before - Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(2));
        assert!(now() >= before + Duration::from_millis(2));
    }

    #[tokio::test]
    async fn a_reading_handed_in_is_kept_and_nested_turns_end_where_they_began() {
        Turns::new(Box::pin(async {
            let base = Instant::now();
            let handed = base - Duration::from_secs(1);
            set(handed);
            assert_eq!(now(), handed);
            let inner = Turns::new(Box::pin(async { now() })).await;
            assert!(inner >= base, "the inner turn reads the clock itself");
            assert_eq!(now(), handed, "the outer turn's reading again");
        }))
        .await;
        assert_eq!(TURN.with(Cell::get), Turn::Outside);
    }

    #[test]
    fn a_panicking_turn_leaves_no_reading_behind() {
        let caught = std::panic::catch_unwind(|| {
            let mut turn = Turns::new(Box::pin(async {
                let _ = now();
                panic!("in the turn");
            }));
            let waker = futures::task::noop_waker();
            let _ = Pin::new(&mut turn).poll(&mut Context::from_waker(&waker));
        });
        assert!(caught.is_err());
        assert_eq!(TURN.with(Cell::get), Turn::Outside);
    }
}
