//! [`Quiet`]: a future that is polled again only after it has woken its task.
//!
//! A hot loop `select!`s over its work and a few futures that almost never finish (a cancellation
//! token, a failover notice). `select!` polls every branch each time the task wakes, and polling a
//! `CancellationToken`'s future takes two mutexes that every connection shares: measured, that was
//! 5% of the daemon's CPU under an unpipelined load. Wrapped in `Quiet`, such a future is polled
//! only when its own waker fired; otherwise a poll costs a waker comparison and two loads.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

pub struct Quiet<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
    /// The waker handed to `inner`, made once.
    waker: Waker,
    /// The task waker in `signal.task`, and `signal.wakes` when it was put there: a wake takes it
    /// out, so it is registered again only after a wake or for another task.
    registered: Option<(Waker, u64)>,
    /// `signal.wakes` when `inner` was last polled.
    polled_at: u64,
}

/// Counts the wakes of `inner` and forwards each to the task that polled last.
struct Signal {
    wakes: AtomicU64,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Counted before the task waker is taken: a poll that sees the old count knows the
        // waker it registered is still there, or about to be used.
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.task.wake();
    }
}

impl<F: Future> Quiet<F> {
    pub fn new(inner: F) -> Quiet<F> {
        let signal = Arc::new(Signal {
            // One wake counted, so the first poll reaches `inner` and registers its waker.
            wakes: AtomicU64::new(1),
            task: AtomicWaker::new(),
        });
        Quiet {
            inner: Box::pin(inner),
            waker: Waker::from(signal.clone()),
            signal,
            registered: None,
            polled_at: 0,
        }
    }
}

impl<F: Future> Future for Quiet<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let wakes = this.signal.wakes.load(Ordering::SeqCst);
        let still_registered = this
            .registered
            .as_ref()
            .is_some_and(|(waker, at)| *at == wakes && waker.will_wake(cx.waker()));
        if !still_registered {
            // Registered before the count is read again, so a wake between the two is not lost.
            this.signal.task.register(cx.waker());
            this.registered = Some((cx.waker().clone(), wakes));
        }
        let wakes = this.signal.wakes.load(Ordering::SeqCst);
        if wakes == this.polled_at {
            return Poll::Pending;
        }
        this.polled_at = wakes;
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn finishes_when_its_future_does() {
        let token = CancellationToken::new();
        let mut quiet = Box::pin(Quiet::new(token.clone().cancelled_owned()));
        assert!(futures::poll!(quiet.as_mut()).is_pending());
        // Not woken: polled again, it stays pending without asking the token.
        assert!(futures::poll!(quiet.as_mut()).is_pending());
        token.cancel();
        assert!(futures::poll!(quiet.as_mut()).is_ready());
    }

    #[tokio::test]
    async fn follows_its_future_through_several_wakes() {
        let (count, mut seen) = tokio::sync::watch::channel(0);
        let waiter = tokio::spawn(Quiet::new(async move {
            while *seen.borrow_and_update() < 3 {
                seen.changed().await.expect("the sender lives");
            }
        }));
        for i in 1..=3 {
            tokio::task::yield_now().await;
            count.send(i).unwrap();
        }
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the wait ended after the third change")
            .unwrap();
    }

    #[tokio::test]
    async fn wakes_a_task_that_waits_on_it() {
        let token = CancellationToken::new();
        let waiter = tokio::spawn(Quiet::new(token.clone().cancelled_owned()));
        tokio::task::yield_now().await;
        token.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the wait ended once the token was cancelled")
            .unwrap();
    }
}
