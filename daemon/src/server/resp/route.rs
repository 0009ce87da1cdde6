//! Where the front door sends a command the policy admits, as the lane-ACL derivation
//! (`lane_acl.rs`) asks it: read off the session's own plan, so that each lane's Redis user is
//! granted what the session sends on it and nothing else.

use tollgate_lanes::Lane;
use tollgate_model::Protocol;

use super::kind::Kind;
use super::plan::{self, Context, Pinned, Plan};

/// Where the front door sends an admitted command, by its canonical name (`CLIENT|SETNAME`) and
/// the lane admission named: the lane-ACL derivation asks this rather than knowing the routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The daemon answers it itself; it never reaches Redis.
    Answered,
    /// On the lane's shared subscriber connection (SUBSCRIBE and the like); never in a transaction.
    Subscription,
    /// On this lane's connections, or on the TRANSACTION connection while the session holds one.
    Lane(Lane),
    /// A whole-keyspace command: never sent as it is; the daemon serves it with these commands
    /// on REGULAR (see `keyspace.rs`), and refuses it inside a transaction.
    ServedWith(&'static [&'static str]),
}

impl Route {
    /// What the session's plan makes of a command the policy admits as `name` for `admitted_on`,
    /// outside any transaction or subscription.
    pub fn of(name: &str, admitted_on: Lane) -> Route {
        let outside = Context {
            protocol: Protocol::Resp2,
            subscribed: false,
            watching: false,
            pinned: Pinned::No,
        };
        let kind = Kind::of_catalog(name);
        match plan::admitted(kind, name, None, admitted_on, outside) {
            Plan::Keyspace(whole) => Route::ServedWith(whole.served_with()),
            Plan::Subscribe(_) | Plan::Unsubscribe(_) => Route::Subscription,
            Plan::Transaction | Plan::TransactionIn(_) => Route::Lane(Lane::Transaction),
            // CONFIG GET is forwarded once admitted (and answered locally where Redis refuses).
            Plan::ConfigGet(forward)
            | Plan::Forward(forward, _)
            | Plan::Placed(forward, ..)
            | Plan::Split(forward, ..)
            | Plan::EveryMaster(forward, _) => Route::Lane(forward.lane()),
            // Filled on a connection of REGULAR's user, or forwarded on REGULAR.
            Plan::Cached(..) => Route::Lane(Lane::Regular),
            // Made for a tenant only (never here); served on SCRIPT's connections.
            Plan::Namespace(_) => Route::Lane(Lane::Script),
            // Never sent to Redis as it is.
            Plan::Answer(_)
            | Plan::Queue(_)
            | Plan::Refuse(_)
            | Plan::PingRedis
            | Plan::LeaseDocs
            | Plan::Lease
            | Plan::LeaseWatch
            | Plan::Admit => Route::Answered,
        }
    }
}
