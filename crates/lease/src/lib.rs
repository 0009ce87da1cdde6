//! Leases that can protect correctness (docs/design.md, "Leases"): Lua scripts run atomically on Redis,
//! owner tokens bound to the caller's principal and uid, replay after a lost reply, fencing
//! tokens, real waiting, a watchdog bound to the holder, and the holder-side state machine, for
//! resources held exclusively, as semaphores or as read/write leases. The wire types live in
//! `tollgate-lease-api` and are re-exported here under the same paths.

mod calls;
pub mod config;
mod holder;
mod keys;
mod keys_memo;
mod layout;
mod metrics;
mod places;
mod queue;
pub mod scripts;
mod service;
pub mod watch;
mod watchdog;

pub use tollgate_lease_api::{api, attempt, outcome, resource, shape, state};
pub use tollgate_lease_api::{
    AcquireOutcome, Attempt, HeldAs, HolderMode, Holding, Identity, InspectOutcome, InvalidAttempt,
    InvalidRequest, InvalidResource, LeaseState, LostReason, Mode, Outcome, OutcomeClass,
    ReleaseOutcome, RenewOutcome, Resource, Shape, Shared, SharedHolder, Terminal,
};

pub use config::{LeaseConfig, LeaseConfigError};
pub use holder::Holder;
pub use keys::{LeaseKeys, FENCE_BUCKETS};
pub use layout::{check_layout, EarlierLease, LayoutError, LAYOUT_VERSION};
pub use service::{LeaseCensus, LeaseService, UserPlaces};
