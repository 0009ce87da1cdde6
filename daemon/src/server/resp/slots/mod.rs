//! Redis Cluster from one command's point of view: which slot its keys are in, and what it becomes
//! there — sent to that slot's node ([`place`]), split per slot with the parts' replies merged back
//! in the client's order ([`Split`]), refused as cross-slot before anything is sent
//! ([`CrossSlot`]), or, keyless, sent to any master or to every master with the replies combined
//! ([`spread`]). Pure logic over argv and frames: the cluster hub routes what this decides.

mod combine;
mod cross;
#[cfg(test)]
mod fixtures;
mod place;
mod split;
mod spread;

pub use combine::Combine;
pub use cross::CrossSlot;
pub use place::{place, same_slot, Placement, TransactionSlot};
pub use split::Split;
pub use spread::{spread, Spread};
