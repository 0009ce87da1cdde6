//! Why a command is refused before it runs: the plan's verdict, which `replies.rs` words.

use tollgate_policy::Denial;

use super::slots::CrossSlot;
use crate::quotas::Throttled;

/// Why a command is refused before it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A RESP2 subscriber may only (un)subscribe, PING, QUIT and RESET, as in Redis.
    WhileSubscribed,
    /// A RESP2 client watching a lease may also `LEASE WATCH` and `LEASE UNWATCH`.
    WhileWatching,
    /// LEASE inside WATCH or MULTI: queued, it would have to run at EXEC, on Redis.
    LeaseInTransaction,
    /// The named command's argument count does not fit its arity.
    WrongArity(&'static str),
    Denied(Denial),
    /// A whole-keyspace command runs key by key, which a transaction cannot hold.
    WholeInTransaction,
    /// A database argument naming this database, not 0 (`MOVE k 1`, `COPY … DB 1`): only
    /// database 0 is served, as `SELECT` answers.
    OtherDatabase(String),
    /// `INFO` for a caller whose keys the policy constrains: its reply is edited per caller
    /// (`amend.rs`), which a transaction's EXEC reply is not.
    InfoInTransaction,
    /// On a cluster, keys in two slots that no one node serves (or outside the transaction's).
    CrossSlot(CrossSlot),
    /// Past a rate of one of the policy's quotas: `-THROTTLED`, with when to retry.
    Throttled(Throttled),
}

impl Refusal {
    /// Whether, inside MULTI, the refusal makes EXEC fail, as Redis fails a transaction with a
    /// command it refused to queue.
    pub fn aborts_multi(&self) -> bool {
        match self {
            // LEASE inside MULTI too: Redis fails EXEC for any command it refuses to queue (after
            // WATCH alone there is nothing to fail).
            Refusal::WrongArity(_)
            | Refusal::Denied(_)
            | Refusal::WholeInTransaction
            | Refusal::LeaseInTransaction
            | Refusal::InfoInTransaction
            | Refusal::OtherDatabase(_)
            | Refusal::CrossSlot(_)
            // Redis fails EXEC after a command it refused to queue; a throttled one is that.
            | Refusal::Throttled(_) => true,
            Refusal::WhileSubscribed | Refusal::WhileWatching => false,
        }
    }
}
