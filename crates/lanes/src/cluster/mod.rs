//! Redis Cluster: which slot a key is in ([`Slot`]), which node serves it (`map`), how the map is
//! learned and kept current (`refresh`), what a node's redirects say (`redirect`), the lanes of each
//! master and the shard subscriptions that follow their slot to a new master (`nodes`), the
//! redirects followed so that clients never see one (`follow`), a session's order on each slot
//! through them (`line`) and the slots moving now (`settle`). The daemon-wide ceilings every
//! master's lanes sit under are `crate::ceilings`.

mod follow;
mod line;
mod map;
mod nodes;
mod redirect;
mod refresh;
mod settle;
mod slot;
#[cfg(test)]
mod tests;

pub(crate) use follow::{run_lent, ClusterChannel};
pub(crate) use nodes::ClusterLanes;
pub use slot::{Slot, SLOT_COUNT};
