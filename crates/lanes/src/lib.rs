//! The six lanes of Redis connections (docs/design.md, "Lanes"): the daemon's only way to Redis.
//!
//! REGULAR and SCRIPT pipeline many callers' commands over a few connections ([`Channel`]); BLOCKING,
//! TRANSACTION and ADMIN lend one connection to one borrower ([`Borrowed`]); PUBSUB shares subscriber
//! connections with local fan-out ([`PubSub`]). Replies travel as raw frames ([`Reply`]) so that the
//! front door can pass them through unchanged.

mod acl;
mod budget;
mod busy;
pub mod cache;
mod ceilings;
mod channel;
mod cluster;
mod config;
mod conn;
mod connector;
mod credentials;
mod error;
mod exclusive;
mod gate;
mod grants;
mod hygiene;
pub mod invalidations;
mod kill;
mod lanes;
mod life;
mod locator;
mod metrics;
mod multiplex;
mod node;
mod others;
mod overrun;
mod pubsub;
mod quiet;
mod reach;
mod reply;
mod resend;
mod route;
mod scope_acl;
mod scope_check;
mod scope_pools;
mod script_limit;
mod share;
#[cfg(test)]
mod spans;
mod status;
mod stopper;
mod stream;
mod topology;
mod tracking_conn;
pub mod turn_clock;
mod turnaround;
mod wait_histogram;

pub use acl::{
    acl_rules, complement_patterns, configured, daemon_users, lease_acl_rules, password_in,
    plumbing, provision, runs_scripts, user_name, AclError, Admin, DaemonUser, Provisioned,
    ProvisionedUsers, ALWAYS_REFUSED, EMBEDDED_ADMIN, LEASE_USER, REFUSED_TO_SCRIPTS,
};
pub use budget::{Budget, Held, OverBudget};
pub use cache::Cache;
pub use channel::{Channel, SendFuture};
pub use cluster::{Slot, SLOT_COUNT};
pub use config::{
    LaneOverrides, LaneSettings, LanesConfig, LeaseConnections, ScopeSettings, ZeroSetting,
};
pub use connector::ServerIdentity;
pub use error::{CallError, Delivery, LaneError, OpenError, Saturation};
pub use exclusive::Borrowed;
pub use grants::LaneGrants;
pub use lanes::{Lanes, PubSub, Shape};
pub use life::LifeState;
pub use node::CloseOutcome;
pub use others::OtherUser;
pub use overrun::Kill;
pub use pubsub::{Message, Subscription, SubscriptionEnded, SubscriptionKind};
pub use quiet::Quiet;
pub use reach::{
    check_grants, check_reserved_unreachable, GrantMismatch, ReachError, Vouched, CHECK_PATIENCE,
};
pub use reply::Reply;
pub use route::Route;
pub use scope_acl::{ScopeSelector, ScopeUser};
pub use scope_check::{check_scope_users, ScopeUserCheck};
pub use scope_pools::ScopeLogin;
pub use script_limit::{Cooldown, ScriptLimit};
pub use status::{LaneStatus, LanesStatus, Rejections, Sharing};
pub use tollgate_model::{Exclusive, Lane, Multiplexed, Protocol};
pub use topology::{
    Endpoint, InvalidEndpoint, InvalidRedisConfig, RedisConfig, SentinelAuth, Splitting, Topology,
};
