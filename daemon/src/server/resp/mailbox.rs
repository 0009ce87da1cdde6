//! A session's tracking mailbox: the invalidations `CLIENT TRACKING` sends it (its own, or those
//! of clients redirecting to it), posted by whichever task caused them (another session's write,
//! the invalidation connection) and taken by the session's loop, which holds its own behind its
//! replies in flight (`crate::tracking::Gate`) and writes the rest.
//!
//! Bounded: a client that does not read its invalidations does not grow the daemon. At
//! [`CAPACITY`], everything queued is replaced by one invalidation of every key, in the shape
//! the newest had, held behind the session's replies like its own: a client told that
//! everything changed drops everything, so nothing it would have been told is lost.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use parking_lot::Mutex;

use crate::tracking::{ClientId, Delivery, Invalidation, Message};

/// Deliveries queued for one session before they collapse into one.
pub const CAPACITY: usize = 4096;

/// Polled by its session on every turn of its loop, which costs a waker's registration and a
/// load: no lock unless something was posted.
#[derive(Default)]
pub struct Mailbox {
    queue: Mutex<VecDeque<Delivery>>,
    /// Something is queued.
    posted: AtomicBool,
    waker: AtomicWaker,
}

impl Mailbox {
    /// Queues `delivery` for session `me`.
    pub fn post(&self, me: ClientId, delivery: Delivery) {
        {
            let mut queue = self.queue.lock();
            if queue.len() + 1 >= CAPACITY {
                let everything = collapsed(me, &delivery);
                queue.clear();
                queue.push_back(everything);
            } else {
                queue.push_back(delivery);
            }
        }
        // After the queue's lock is given back: a `take` that emptied it cleared the flag first.
        self.posted.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Up to `max` deliveries, oldest first.
    pub fn take(&self, max: usize) -> Vec<Delivery> {
        let mut queue = self.queue.lock();
        let n = max.min(queue.len());
        let taken = queue.drain(..n).collect();
        if queue.is_empty() {
            self.posted.store(false, Ordering::Release);
        }
        taken
    }

    /// Ready while something is queued; the session is woken when something is posted.
    pub fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.waker.register(cx.waker());
        match self.posted.load(Ordering::Acquire) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    }
}

/// One invalidation of every key posted to session `me`, in the shape of `newest` (a push, or a
/// `__redis__:invalidate` message for a RESP2 redirect target) and to where it went, held behind
/// `me`'s replies (later than any of those it replaces: never too early).
fn collapsed(me: ClientId, newest: &Delivery) -> Delivery {
    let message = match newest.message {
        Message::PubSub(_) => Message::PubSub(Invalidation::Everything),
        Message::Push(_) | Message::RedirectBroken(_) => Message::Push(Invalidation::Everything),
    };
    Delivery {
        tracking: me,
        to: newest.to,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn keys(tracking: ClientId, to: ClientId, key: &'static str) -> Delivery {
        Delivery {
            tracking,
            to,
            message: Message::Push(Invalidation::Keys(vec![Bytes::from_static(key.as_bytes())])),
        }
    }

    #[test]
    fn a_full_mailbox_becomes_one_invalidation_of_everything_held_behind_the_replies() {
        let mailbox = Mailbox::default();
        for _ in 0..CAPACITY - 2 {
            mailbox.post(7, keys(7, 7, "k"));
        }
        assert_eq!(mailbox.take(usize::MAX).len(), CAPACITY - 2);
        for _ in 0..CAPACITY + 10 {
            // Redirected to 7 by client 3: written at once, until they collapse.
            mailbox.post(7, keys(3, 7, "k"));
        }
        let left = mailbox.take(usize::MAX);
        assert!(left.len() < CAPACITY, "{}", left.len());
        assert_eq!(
            left[0],
            Delivery {
                tracking: 7,
                to: 7,
                message: Message::Push(Invalidation::Everything)
            }
        );
        assert!(left[1..].iter().all(|d| d == &keys(3, 7, "k")));
    }
}
