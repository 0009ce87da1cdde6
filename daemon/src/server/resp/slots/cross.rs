//! The refusal of a command whose keys are in two slots, before anything is sent: which two keys,
//! which two slots, on one line whatever bytes the keys hold.

use std::fmt;

use tollgate_lanes::Slot;

use super::super::monitor::quote;

/// The most bytes of a key a refusal shows: enough to recognise it, not a hostile key's megabytes.
const SHOWN_BYTES: usize = 64;

/// Two keys of one request that are in different slots, so that no one node can serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrossSlot {
    first: KeyInSlot,
    second: KeyInSlot,
}

/// A key as a refusal names it, with its slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeyInSlot {
    /// The key quoted, escaped and truncated: kept so, since only a refusal ever shows it.
    shown: String,
    slot: Slot,
}

impl KeyInSlot {
    pub(super) fn new(key: &[u8], slot: Slot) -> KeyInSlot {
        KeyInSlot {
            shown: shown(key),
            slot,
        }
    }

    pub(super) fn slot(&self) -> Slot {
        self.slot
    }
}

impl CrossSlot {
    pub(super) fn between(first: KeyInSlot, second: KeyInSlot) -> CrossSlot {
        CrossSlot { first, second }
    }

    /// The two slots, the first key's first.
    #[cfg(test)]
    pub fn slots(&self) -> (Slot, Slot) {
        (self.first.slot, self.second.slot)
    }

    /// `CROSSSLOT tollgate: keys <k1> (slot a) and <k2> (slot b) are in different slots`, the
    /// refusal's text (`replies.rs` makes it the error reply).
    pub fn message(&self) -> String {
        format!("CROSSSLOT tollgate: {self}")
    }
}

impl fmt::Display for CrossSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "keys {} (slot {}) and {} (slot {}) are in different slots",
            self.first.shown, self.first.slot, self.second.shown, self.second.slot
        )
    }
}

/// Bytes from a client or a node as a message shows them: quoted and escaped as Redis's MONITOR
/// does (no CR or LF survives), the first [`SHOWN_BYTES`] only, `...` after a cut.
pub(super) fn shown(bytes: &[u8]) -> String {
    let mut out = String::new();
    quote(&bytes[..bytes.len().min(SHOWN_BYTES)], &mut out);
    if bytes.len() > SHOWN_BYTES {
        out.push_str("...");
    }
    out
}
