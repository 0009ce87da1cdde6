//! Redis Cluster: which slot a key is in ([`Slot`]), which node serves it (`map`), how the map is
//! learned and kept current (`refresh`), and what a node's redirects say (`redirect`).

// used by the hub (lead), not yet merged
#[allow(dead_code)]
mod map;
// used by the hub (lead), not yet merged
#[allow(dead_code)]
mod redirect;
// used by the hub (lead), not yet merged
#[allow(dead_code)]
mod refresh;
mod slot;
#[cfg(test)]
mod tests;

pub use slot::{Slot, SLOT_COUNT};
