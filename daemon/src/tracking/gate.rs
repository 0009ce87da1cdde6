//! The ordering rule, kept per session: an invalidation waits behind every reply its tracking
//! client had in flight when the invalidation arrived (see the module's header for why: a read's
//! reply and the invalidation of a write after it travel on different connections and can cross).
//! Commands are counted as they are started and as their replies are handed out, in order, so an
//! invalidation arriving with `n` replies owed is released once `n` more replies are handed out;
//! invalidations leave in the order they arrived. Replies the client does not hear (`CLIENT REPLY
//! OFF`) count as handed out when the session passes them by.

use std::collections::VecDeque;

/// Invalidations (or anything else) held behind one session's replies in flight. The session
/// counts (its schedule does: commands started, replies handed out, both ever); the gate keeps,
/// for each item, how many replies must be out before it leaves.
#[derive(Debug)]
pub struct Gate<T> {
    /// Each held item with the count of replies that must be handed out before it.
    held: VecDeque<(u64, T)>,
}

impl<T> Default for Gate<T> {
    fn default() -> Self {
        Gate {
            held: VecDeque::new(),
        }
    }
}

impl<T> Gate<T> {
    /// An invalidation arrived while `started` commands had been started, ever: it leaves once
    /// as many replies are handed out.
    pub fn hold(&mut self, item: T, started: u64) {
        self.held.push_back((started, item));
    }

    /// The next item whose replies have all been handed out (`answered`, ever), oldest first.
    pub fn next_due(&mut self, answered: u64) -> Option<T> {
        match self.held.front() {
            Some(&(after, _)) if after <= answered => self.held.pop_front().map(|(_, t)| t),
            _ => None,
        }
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A gate with the session's counts beside it, as the schedule keeps them.
    #[derive(Default)]
    struct Counted {
        gate: Gate<u32>,
        started: u64,
        answered: u64,
    }

    impl Counted {
        fn started(&mut self) {
            self.started += 1;
        }
        fn answered(&mut self) {
            assert!(self.answered < self.started, "a reply nobody owed");
            self.answered += 1;
        }
        fn hold(&mut self, item: u32) {
            self.gate.hold(item, self.started);
        }
        fn in_flight(&self) -> u64 {
            self.started - self.answered
        }
        fn is_empty(&self) -> bool {
            self.gate.is_empty()
        }
    }

    fn due(gate: &mut Counted) -> Vec<u32> {
        std::iter::from_fn(|| gate.gate.next_due(gate.answered)).collect()
    }

    #[test]
    fn with_nothing_in_flight_an_invalidation_leaves_at_once() {
        let mut gate = Counted::default();
        gate.hold(1);
        assert_eq!(due(&mut gate), vec![1]);
        assert!(gate.is_empty());
    }

    /// tracking.tcl, "hdel deliver invalidate message after response in the same connection"
    /// and "Tracking invalidation message is not interleaved with transaction response": the
    /// invalidation of a client's own write comes after that write's reply (`HDEL`'s `1`,
    /// `EXEC`'s array). And the daemon's race: `GET k` in flight (its reply `v1`), `k` written
    /// elsewhere, the invalidation arrives first: it waits for `v1`.
    #[test]
    fn an_invalidation_waits_for_the_replies_in_flight_when_it_arrived() {
        let mut gate = Counted::default();
        gate.started(); // GET k: v1 on its way
        gate.hold(1); // invalidate k
        gate.started(); // a later command: not waited for
        assert_eq!(due(&mut gate), Vec::<u32>::new());
        assert_eq!(gate.in_flight(), 2);
        gate.answered(); // v1 handed out
        assert_eq!(due(&mut gate), vec![1]);
        gate.hold(2);
        assert_eq!(due(&mut gate), Vec::<u32>::new());
        gate.answered();
        assert_eq!(due(&mut gate), vec![2]);
        assert_eq!(gate.in_flight(), 0);
    }

    /// tracking.tcl, "Unblocked BLMOVE gets notification after response": a blocked command's
    /// reply still comes first.
    #[test]
    fn invalidations_leave_in_the_order_they_arrived() {
        let mut gate = Counted::default();
        gate.started(); // BLMOVE, blocked
        gate.hold(1);
        gate.started();
        gate.hold(2);
        gate.hold(3);
        gate.answered();
        assert_eq!(due(&mut gate), vec![1]);
        gate.answered();
        assert_eq!(due(&mut gate), vec![2, 3]);
    }

    proptest! {
        /// Whatever the interleaving: an item is released only once every reply owed when it
        /// arrived is handed out, as soon as that is so, in arrival order, and none is lost.
        #[test]
        fn items_leave_exactly_when_their_replies_are_out(ops in proptest::collection::vec(0u8..3, 0..200)) {
            let mut gate = Counted::default();
            let (mut started, mut answered) = (0u64, 0u64);
            let mut waiting: Vec<(u32, u64)> = Vec::new();
            let mut released = Vec::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    0 => { gate.started(); started += 1; }
                    1 if answered < started => { gate.answered(); answered += 1; }
                    1 => {}
                    _ => { gate.hold(n as u32); waiting.push((n as u32, started)); }
                }
                let out = due(&mut gate);
                let expected: Vec<u32> = waiting
                    .iter()
                    .take_while(|(_, after)| *after <= answered)
                    .map(|(n, _)| *n)
                    .collect();
                waiting.drain(..expected.len());
                prop_assert_eq!(&out, &expected);
                released.extend(out);
            }
            while answered < started { gate.answered(); answered += 1; }
            released.extend(due(&mut gate));
            prop_assert!(gate.is_empty());
            prop_assert!(released.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
