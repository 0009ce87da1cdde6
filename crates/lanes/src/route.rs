//! `Route`: where a command must run, which on one server is always that server and on a cluster
//! picks the master (`cluster::nodes`).

use crate::{Endpoint, Slot};

/// Where a command must run in a cluster. On one server every route leads to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Any master will do: the command touches no key.
    Any,
    /// The master that serves this slot: the command's keys are in it.
    Slot(Slot),
    /// This node: one part of a command sent to every master.
    Node(Endpoint),
}
