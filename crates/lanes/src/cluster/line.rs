//! A session's order on each slot: its commands for one slot run on Redis in the order it sent
//! them, through `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN` and a master's loss.
//!
//! A command is sent at once ("direct") only when nothing can overtake it or be overtaken by it:
//! no earlier command of its slot is held or following a redirect, the earlier ones still in
//! flight went to the same node (which runs them in order), and, if any are in flight, the slot is
//! settled (`settle`). Otherwise it is *held*: sent when the session polls it, which is once every
//! earlier command of the session has its final reply (the session polls only its oldest). While
//! a slot is moving, a session's commands for it thus go one at a time.
//!
//! Commands already sent at once when a migration begins are the one exposure; docs/cluster.md
//! ("Order through redirects") argues which of them can and cannot run out of order, and `follow`
//! acts on it: a stale `ASK` is asked again, and a `TRYAGAIN`/`CLUSTERDOWN` with later commands of
//! its slot already sent is given to the client rather than retried behind them.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::Slot;
use crate::Endpoint;

/// One session channel's slots with commands not yet final.
#[derive(Clone, Default)]
pub(crate) struct Lines(Arc<Mutex<HashMap<Slot, Line>>>);

#[derive(Default)]
struct Line {
    /// Where the commands sent at once went.
    node: Option<Endpoint>,
    /// Commands sent at once, not yet final and not following a redirect.
    direct: usize,
    /// Commands held, or following a redirect.
    held: usize,
}

/// How one command of a slot goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Direct,
    Held,
}

/// One command's place in its slot's line, given back when dropped (its reply final, or the
/// session gone).
pub(crate) struct Place {
    lines: Lines,
    slot: Slot,
    kind: Kind,
}

impl Lines {
    /// The place of a command for `slot` that the map sends to `node`; `unsettled` says whether
    /// the slot met a redirect lately (asked only when it matters).
    pub(crate) fn admit(
        &self,
        slot: Slot,
        node: &Endpoint,
        unsettled: impl FnOnce() -> bool,
    ) -> Place {
        let mut lines = self.0.lock();
        let line = lines.entry(slot).or_default();
        let direct = line.held == 0
            && (line.direct == 0 || (line.node.as_ref() == Some(node) && !unsettled()));
        let kind = match direct {
            true => {
                line.direct += 1;
                if line.node.as_ref() != Some(node) {
                    line.node = Some(node.clone());
                }
                Kind::Direct
            }
            false => {
                line.held += 1;
                Kind::Held
            }
        };
        Place {
            lines: self.clone(),
            slot,
            kind,
        }
    }

    /// A place for a command that waits for its turn whatever the line holds (no map yet).
    pub(crate) fn hold(&self, slot: Slot) -> Place {
        self.0.lock().entry(slot).or_default().held += 1;
        Place {
            lines: self.clone(),
            slot,
            kind: Kind::Held,
        }
    }

    #[cfg(test)]
    fn counts(&self, slot: Slot) -> Option<(usize, usize)> {
        let lines = self.0.lock();
        lines.get(&slot).map(|line| (line.direct, line.held))
    }
}

impl Place {
    /// Whether the command was sent at once (else it is sent when polled).
    pub(crate) fn is_direct(&self) -> bool {
        self.kind == Kind::Direct
    }

    /// The command met a redirect: later commands of its slot are held until it is final. Returns
    /// how many other commands of the slot were sent at once and are not yet final: sent after
    /// it (it is the session's oldest), they may have run on the node already.
    pub(crate) fn redirected(&mut self) -> usize {
        let mut lines = self.lines.0.lock();
        let line = lines.get_mut(&self.slot).expect("a place's line lives");
        if self.kind == Kind::Direct {
            line.direct -= 1;
            line.held += 1;
            self.kind = Kind::Held;
        }
        line.direct
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut lines = self.lines.0.lock();
        let line = lines.get_mut(&self.slot).expect("a place's line lives");
        match self.kind {
            Kind::Direct => line.direct -= 1,
            Kind::Held => line.held -= 1,
        }
        if line.direct == 0 && line.held == 0 {
            lines.remove(&self.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(port: u16) -> Endpoint {
        Endpoint::Tcp {
            host: "127.0.0.1".into(),
            port,
        }
    }

    const SLOT: Slot = Slot(7);

    #[test]
    fn commands_to_one_node_of_a_settled_slot_are_sent_at_once() {
        let lines = Lines::default();
        let a = lines.admit(SLOT, &node(1), || false);
        let b = lines.admit(SLOT, &node(1), || false);
        assert!(a.is_direct() && b.is_direct());
        assert_eq!(lines.counts(SLOT), Some((2, 0)));
        drop((a, b));
        assert_eq!(lines.counts(SLOT), None, "an empty line is forgotten");
    }

    #[test]
    fn a_command_for_another_node_waits_for_the_line_to_empty() {
        let lines = Lines::default();
        let a = lines.admit(SLOT, &node(1), || false);
        let b = lines.admit(SLOT, &node(2), || false);
        assert!(!b.is_direct(), "it could run on node 2 before a on node 1");
        // Everything after a held command is held too, whatever its node.
        let c = lines.admit(SLOT, &node(1), || false);
        assert!(!c.is_direct());
        drop((a, b, c));
        let d = lines.admit(SLOT, &node(2), || false);
        assert!(d.is_direct(), "nothing is in flight any more");
    }

    #[test]
    fn an_unsettled_slot_sends_one_command_at_a_time() {
        let lines = Lines::default();
        let a = lines.admit(SLOT, &node(1), || true);
        assert!(a.is_direct(), "nothing ahead of it");
        let b = lines.admit(SLOT, &node(1), || true);
        assert!(!b.is_direct());
        // Other slots are not held.
        let other = lines.admit(Slot::new(8).unwrap(), &node(2), || false);
        assert!(other.is_direct());
    }

    #[test]
    fn a_redirected_command_holds_the_commands_after_it_and_counts_those_already_sent() {
        let lines = Lines::default();
        let mut a = lines.admit(SLOT, &node(1), || false);
        let b = lines.admit(SLOT, &node(1), || false);
        let c = lines.admit(SLOT, &node(1), || false);
        assert_eq!(a.redirected(), 2, "b and c were sent behind it");
        assert_eq!(a.redirected(), 2, "a second redirect changes nothing");
        let d = lines.admit(SLOT, &node(1), || false);
        assert!(!d.is_direct());
        drop((b, c));
        assert_eq!(lines.counts(SLOT), Some((0, 2)));
        drop((a, d));
        assert_eq!(lines.counts(SLOT), None);
    }
}
