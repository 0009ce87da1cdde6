//! Leases that can protect correctness (docs/design.md, "Leases"): Lua scripts run atomically on Redis,
//! owner tokens bound to the caller's principal and uid, replay after a lost reply, fencing
//! tokens, real waiting, a watchdog bound to the holder, and the holder-side state machine, for
//! resources held exclusively, as semaphores or as read/write leases.

pub mod api;
pub mod attempt;
mod calls;
pub mod config;
mod holder;
mod invalid;
mod metrics;
mod millis;
pub mod outcome;
mod queue;
pub mod resource;
pub mod scripts;
mod service;
pub mod shape;
pub mod state;
pub mod watch;
mod watchdog;

pub use attempt::{Attempt, Identity, InvalidAttempt};
pub use config::{LeaseConfig, LeaseConfigError};
pub use holder::Holder;
pub use invalid::InvalidRequest;
pub use outcome::{
    AcquireOutcome, InspectOutcome, LostReason, Outcome, OutcomeClass, ReleaseOutcome, RenewOutcome,
};
pub use resource::{InvalidResource, LeaseKeys, Resource};
pub use service::LeaseService;
pub use shape::{HeldAs, HolderMode, Mode, Shape, Shared, SharedHolder};
pub use state::{Holding, LeaseState, Terminal};
