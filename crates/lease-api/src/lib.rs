//! Tollgate leases on the wire, for the daemon and its clients alike: the HTTP requests and
//! events, the outcome table with each outcome's name and class, attempts, the shapes a resource
//! can be held in, validated resource names, and the holder-side state machine (ACTIVE, UNCERTAIN,
//! LOST, RELEASED). No Redis, no lanes: a client of the daemon depends on this crate alone.

pub mod api;
pub mod attempt;
mod invalid;
mod millis;
pub mod outcome;
pub mod resource;
pub mod shape;
pub mod state;

pub use attempt::{Attempt, Identity, InvalidAttempt};
pub use invalid::InvalidRequest;
pub use outcome::{
    AcquireOutcome, InspectOutcome, LostReason, Outcome, OutcomeClass, ReleaseOutcome, RenewOutcome,
};
pub use resource::{InvalidResource, Resource};
pub use shape::{HeldAs, HolderMode, Mode, Shape, Shared, SharedHolder};
pub use state::{Holding, LeaseState, Terminal};
