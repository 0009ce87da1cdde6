//! What each lease call can come to (the outcome table of docs/design.md, "Leases"). Callers match on these to decide
//! what to do next; on the wire each is a JSON object whose `outcome` names the variant.
//!
//! `Unavailable` always means the call was not sent, so nothing changed; `Indeterminate` means it was
//! sent and its reply is unknown, so the caller must retry with the same attempt (or inspect).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::shape::{HeldAs, SharedHolder};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AcquireOutcome {
    /// A new holding; `fence` is larger than any fence this resource handed out before.
    Acquired {
        fence: u64,
        #[serde(rename = "valid_for_ms", with = "crate::millis")]
        valid_for: Duration,
    },
    /// The same attempt already holds it (an earlier reply was lost); validity is what the server
    /// still has left, never the requested TTL.
    Replayed {
        fence: u64,
        #[serde(rename = "valid_for_ms", with = "crate::millis")]
        valid_for: Duration,
    },
    /// Another owner holds it, for about `retry_after` more.
    Contended {
        #[serde(rename = "retry_after_ms", with = "crate::millis")]
        retry_after: Duration,
    },
    /// The same owner holds it for another operation.
    Conflict,
    /// A watchdog was asked for, but the principal already runs `limit`
    /// (`leases.max_watchdogs_per_principal`); nothing was sent.
    TooManyWatchdogs {
        limit: usize,
    },
    /// The resource is held in another shape (exclusive, semaphore, read/write), or as a semaphore
    /// of another size (`permits`); the shape is fixed by the first holder while anyone holds it.
    ShapeConflict {
        held_as: HeldAs,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        permits: Option<u32>,
    },
    Unavailable {
        reason: String,
    },
    Indeterminate {
        reason: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LostReason {
    /// The lease expired or was deleted.
    Absent,
    /// Someone else holds it now.
    NotOwner,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RenewOutcome {
    Renewed {
        #[serde(rename = "valid_for_ms", with = "crate::millis")]
        valid_for: Duration,
    },
    Lost {
        reason: LostReason,
    },
    Unavailable {
        reason: String,
    },
    Indeterminate {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReleaseOutcome {
    Released,
    AlreadyAbsent,
    NotOwner,
    Unavailable { reason: String },
    Indeterminate { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum InspectOutcome {
    Free,
    Held {
        #[serde(rename = "remaining_ms", with = "crate::millis")]
        remaining: Duration,
        fence: u64,
        /// Whether the attempt named in the request is the holder.
        yours: bool,
        /// What the holder acquired with (`value`), if anything: a leader's address, say.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
    },
    /// Held as a semaphore or read/write lease: every live holder, oldest fence first.
    HeldShared {
        held_as: HeldAs,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        permits: Option<u32>,
        holders: Vec<SharedHolder>,
    },
    Unavailable {
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_carry_their_name_and_millisecond_fields() {
        let json = serde_json::to_value(AcquireOutcome::Replayed {
            fence: 7,
            valid_for: Duration::from_millis(1500),
        })
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({"outcome": "replayed", "fence": 7, "valid_for_ms": 1500})
        );
        let lost: RenewOutcome =
            serde_json::from_str(r#"{"outcome":"lost","reason":"not_owner"}"#).unwrap();
        assert_eq!(
            lost,
            RenewOutcome::Lost {
                reason: LostReason::NotOwner
            }
        );
        assert_eq!(
            serde_json::to_value(ReleaseOutcome::AlreadyAbsent).unwrap(),
            serde_json::json!({"outcome": "already_absent"})
        );
    }
}
