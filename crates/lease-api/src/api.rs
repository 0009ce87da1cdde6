//! The request bodies of the HTTP lease API and the events a holder can watch, shared by the daemon
//! and the client so both sides agree on one definition. Unknown fields are rejected.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::attempt::Attempt;
use crate::invalid::InvalidRequest;
use crate::outcome::LostReason;
use crate::shape::{Mode, Shape};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    pub attempt: Attempt,
    #[serde(rename = "ttl_ms", with = "crate::millis")]
    pub ttl: Duration,
    /// How long to wait for the lease when it is held; zero tries once.
    #[serde(rename = "wait_ms", with = "crate::millis", default)]
    pub wait: Duration,
    /// Renew every ttl/3 for as long as the calling process lives; release when it dies.
    #[serde(default)]
    pub watchdog: bool,
    /// Replicas that must confirm the acquisition before it is reported (`WAIT`).
    #[serde(default)]
    pub replicas: u32,
    /// Kept with the lease while it is held and shown to inspectors and watchers: leader election's
    /// value (the leader's address, say). At most [`MAX_VALUE_LEN`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// A semaphore of this many permits, each a lease of its own (`crate::shape`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// How many of the semaphore's permits to take at once (1 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// A read/write lease, taken as a reader or as the writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
}

impl AcquireRequest {
    /// The shape this acquire asks for, or which of its fields is wrong.
    pub fn shape(&self) -> Result<Shape, InvalidRequest> {
        Shape::of(self.permits, self.count, self.mode, self.replicas)
    }
}

/// The longest `value` accepted with an acquisition.
pub const MAX_VALUE_LEN: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    pub attempt: Attempt,
    #[serde(rename = "ttl_ms", with = "crate::millis")]
    pub ttl: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    pub attempt: Attempt,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InspectRequest {
    /// Name an attempt to learn whether it is the holder (`yours`).
    #[serde(default)]
    pub attempt: Option<Attempt>,
}

/// Something the watchdog did or saw for one lease; streamed as JSON lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum LeaseEvent {
    Renewed {
        fence: u64,
        #[serde(rename = "valid_for_ms", with = "crate::millis")]
        valid_for: Duration,
    },
    /// The lease is gone; the holder must stop acting on it.
    Lost { fence: u64, reason: LostReason },
    /// A renewal went unanswered; the lease may still be held.
    Uncertain { fence: u64 },
    /// The holder released it, or the holder died and the daemon released it.
    Released { fence: u64 },
    /// The watchdog stopped renewing at `leases.max_hold`; the lease runs out by its TTL.
    MaxHoldReached { fence: u64 },
}

impl LeaseEvent {
    /// Whether the watchdog stops after this event.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            LeaseEvent::Renewed { .. } | LeaseEvent::Uncertain { .. }
        )
    }
}

/// One holder change, streamed as JSON lines over HTTP and as maps (flat arrays in RESP2) over RESP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum HolderEvent {
    /// Who holds it: first event of a watch, or a new holder. `value` is what the holder acquired
    /// with (`VALUE`: a leader's address, say); `remaining_ms` is its TTL as of the event.
    Held {
        fence: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
        #[serde(rename = "remaining_ms", with = "crate::millis")]
        remaining: Duration,
    },
    /// First event of a watch: nobody holds it.
    Free,
    /// The holder with `fence` released it (or its session or process ended and the daemon did).
    Released { fence: u64 },
    /// The holder with `fence` let its TTL run out.
    Expired { fence: u64 },
    /// The watch lost track (`reason`) and ends: changes from here on may be missed; watch again.
    Interrupted { reason: String },
}
