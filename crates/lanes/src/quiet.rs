//! [`Quiet`]: a future that is polled again only after it has woken its task.
//!
//! A hot loop `select!`s over its work and a few futures that almost never finish (a cancellation
//! token, a failover notice). `select!` polls every branch each time the task wakes, and polling a
//! `CancellationToken`'s future takes two mutexes that every connection shares: measured, that was
//! 5% of the daemon's CPU under an unpipelined load. Wrapped in `Quiet`, such a future is polled
//! only when its own waker fired; otherwise a poll costs a waker comparison and an atomic swap.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

pub struct Quiet<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
    /// The waker handed to `inner`, made once.
    waker: Waker,
}

/// Set when `inner` woke; forwards the wake to the task that polled last.
struct Signal {
    woke: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woke.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future> Quiet<F> {
    pub fn new(inner: F) -> Quiet<F> {
        let signal = Arc::new(Signal {
            // Set, so the first poll reaches `inner` and registers its waker.
            woke: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        Quiet {
            inner: Box::pin(inner),
            waker: Waker::from(signal.clone()),
            signal,
        }
    }
}

impl<F: Future> Future for Quiet<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Registered before the flag is read, so a wake between the two is not lost.
        this.signal.task.register(cx.waker());
        if !this.signal.woke.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
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
