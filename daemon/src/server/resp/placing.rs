//! On a Redis Cluster, what an admitted command's plan becomes once its keys are placed
//! (`slots`): sent to its slot's master, split per slot, sent to every master, or refused as
//! cross-slot before anything is sent; inside a transaction, kept to the transaction's slot. On
//! one server no plan passes through here.

use tollgate_lanes::Splitting;
use tollgate_policy::KeyAccess;

use super::plan::{Plan, Refusal};
use super::slots::{self, Placement, Spread, TransactionSlot};

/// The command as placing needs it: its catalog name, its words and where its keys are.
pub struct Placed<'a> {
    pub name: &'a str,
    pub argv: &'a [&'a [u8]],
    pub keys: &'a [KeyAccess],
}

/// What `plan` (for `command`) becomes on a cluster; `transaction` is the slot the session's
/// transaction is pinned to, once one is.
pub fn on_cluster(
    plan: Plan,
    command: Placed<'_>,
    splitting: Splitting,
    transaction: Option<&TransactionSlot>,
) -> Plan {
    let Placed { name, argv, keys } = command;
    match plan {
        Plan::Forward(forward, amend) => match slots::place(name, argv, keys, splitting) {
            Placement::Keyless => match slots::spread(name) {
                Spread::AnyMaster => Plan::Forward(forward, amend),
                Spread::EveryMaster(combine) => Plan::EveryMaster(forward, combine),
            },
            Placement::Slot(slot) => Plan::Placed(forward, slot, amend),
            Placement::Split(split) => Plan::Split(forward, split, amend),
            Placement::Cross(cross) => Plan::Refuse(Refusal::CrossSlot(cross)),
        },
        // Nothing in a transaction is split: it runs on one connection, on one node.
        // The first command with keys pins the transaction to its first key's slot, and is held
        // to that slot like every later one.
        Plan::Transaction => match transaction {
            Some(pinned) => match slots::same_slot(pinned, argv, keys) {
                Ok(()) => Plan::Transaction,
                Err(cross) => Plan::Refuse(Refusal::CrossSlot(cross)),
            },
            None => match first_key(argv, keys) {
                None => Plan::Transaction,
                Some(key) => {
                    let pinned = TransactionSlot::of(key);
                    match slots::same_slot(&pinned, argv, keys) {
                        Ok(()) => Plan::TransactionIn(pinned),
                        Err(cross) => Plan::Refuse(Refusal::CrossSlot(cross)),
                    }
                }
            },
        },
        plan => plan,
    }
}

/// The command's first key, which names the slot a transaction it starts is pinned to.
fn first_key<'a>(argv: &[&'a [u8]], keys: &[KeyAccess]) -> Option<&'a [u8]> {
    keys.iter().find_map(|key| argv.get(key.position).copied())
}
