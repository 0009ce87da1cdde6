//! A small Rust client for Tollgate leases over the daemon's HTTP Unix socket. It makes attempts
//! before sending, retries indeterminate calls with the same attempt, and tracks each held lease
//! through ACTIVE, UNCERTAIN, LOST and RELEASED (see `tollgate_lease_api::state`).

mod client;
mod error;
mod events;
mod lease;
mod transport;

pub use client::{Answer, LeaseClient, Retried};
pub use error::ClientError;
pub use events::Events;
pub use lease::{Acquisition, Lease};
pub use tollgate_lease_api::api::HolderEvent;
pub use tollgate_lease_api::api::{AcquireRequest, LeaseEvent, ReleaseRequest, RenewRequest};
pub use tollgate_lease_api::{
    AcquireOutcome, Attempt, InspectOutcome, LeaseState, LostReason, Outcome, OutcomeClass,
    ReleaseOutcome, RenewOutcome, Resource,
};
pub use transport::TransportError;
