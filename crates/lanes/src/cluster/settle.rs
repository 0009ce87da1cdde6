//! Which slots are moving. A slot for which any session met a redirect (`MOVED`, `ASK`,
//! `TRYAGAIN`, `CLUSTERDOWN`) or an unreachable master in the last [`SETTLE`] is unsettled; while
//! it is, every session sends its commands for that slot one at a time (`line`), so that none can
//! run on a node ahead of an earlier one that a node turned away. Daemon-wide: the first session
//! to meet a migration warns every other.

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::time::{Duration, Instant};

use super::Slot;

/// How long a slot stays unsettled after its last redirect.
pub(crate) const SETTLE: Duration = Duration::from_secs(1);

/// The slots that met a redirect lately, and when last. At most one entry per slot (16384).
#[derive(Default)]
pub(crate) struct Unsettled {
    slots: Mutex<HashMap<Slot, Instant>>,
}

impl Unsettled {
    /// `slot` met a redirect now.
    pub(crate) fn mark(&self, slot: Slot) {
        let now = Instant::now();
        let mut slots = self.slots.lock();
        slots.insert(slot, now);
        // Keep the table to the slots moving now: a reshard of many slots leaves many behind.
        if slots.len() > 64 {
            slots.retain(|_, last| now.duration_since(*last) < SETTLE);
        }
    }

    /// Whether `slot` met a redirect within [`SETTLE`].
    pub(crate) fn is_unsettled(&self, slot: Slot) -> bool {
        self.unsettled_at(slot, Instant::now())
    }

    fn unsettled_at(&self, slot: Slot, now: Instant) -> bool {
        self.slots
            .lock()
            .get(&slot)
            .is_some_and(|last| now.saturating_duration_since(*last) < SETTLE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_unsettled_for_a_while_after_its_last_redirect() {
        let unsettled = Unsettled::default();
        let slot = Slot::new(3696).unwrap();
        assert!(!unsettled.is_unsettled(slot));
        unsettled.mark(slot);
        let marked = Instant::now();
        assert!(unsettled.is_unsettled(slot));
        assert!(!unsettled.is_unsettled(Slot::new(1).unwrap()));
        assert!(unsettled.unsettled_at(slot, marked + SETTLE / 2));
        assert!(!unsettled.unsettled_at(slot, marked + SETTLE));
        // Many slots marked long ago are forgotten.
        for n in 0..100 {
            unsettled
                .slots
                .lock()
                .insert(Slot::new(n).unwrap(), marked - SETTLE);
        }
        unsettled.mark(slot);
        assert_eq!(unsettled.slots.lock().len(), 1);
    }
}
