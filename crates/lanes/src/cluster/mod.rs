//! Redis Cluster: which slot a key is in, and (as it grows) which node serves it.

mod slot;

pub use slot::{Slot, SLOT_COUNT};
