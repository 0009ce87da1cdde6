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
    /// A watchdog was asked for, but the caller's OS user already runs `limit` for its principal
    /// (`leases.max_watchdogs_per_uid`), or the daemon runs `limit` in all (`leases.max_watchdogs`);
    /// nothing was sent.
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
pub enum ReleaseOutcome {
    Released,
    AlreadyAbsent,
    NotOwner,
    Unavailable { reason: String },
    Indeterminate { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
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

/// What kind of answer an outcome is. The HTTP status, the CLI's exit code and the retry rules all
/// follow from it, so a new outcome is classified once, here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeClass {
    /// The call did what was asked (acquired, renewed, released, inspected).
    Done,
    /// A definite answer that it did not, and why (lost, not the owner): nothing to retry.
    Answered,
    /// Someone else holds what was asked for, or holds it otherwise (HTTP 409).
    Conflict,
    /// A limit of the caller's principal refused it before anything was sent (HTTP 429).
    Limited,
    /// Not sent: nothing changed; retrying is safe (HTTP 503).
    Unavailable,
    /// Sent, reply unknown: retry with the same attempt (HTTP 502).
    Indeterminate,
}

/// The name and class of every outcome: its `outcome` tag on the wire (and metric label), and
/// what kind of answer it is.
pub trait Outcome {
    fn name(&self) -> &'static str;
    fn class(&self) -> OutcomeClass;
}

impl Outcome for AcquireOutcome {
    fn name(&self) -> &'static str {
        match self {
            AcquireOutcome::Acquired { .. } => "acquired",
            AcquireOutcome::Replayed { .. } => "replayed",
            AcquireOutcome::Contended { .. } => "contended",
            AcquireOutcome::Conflict => "conflict",
            AcquireOutcome::TooManyWatchdogs { .. } => "too_many_watchdogs",
            AcquireOutcome::ShapeConflict { .. } => "shape_conflict",
            AcquireOutcome::Unavailable { .. } => "unavailable",
            AcquireOutcome::Indeterminate { .. } => "indeterminate",
        }
    }

    fn class(&self) -> OutcomeClass {
        match self {
            AcquireOutcome::Acquired { .. } | AcquireOutcome::Replayed { .. } => OutcomeClass::Done,
            AcquireOutcome::Contended { .. }
            | AcquireOutcome::Conflict
            | AcquireOutcome::ShapeConflict { .. } => OutcomeClass::Conflict,
            AcquireOutcome::TooManyWatchdogs { .. } => OutcomeClass::Limited,
            AcquireOutcome::Unavailable { .. } => OutcomeClass::Unavailable,
            AcquireOutcome::Indeterminate { .. } => OutcomeClass::Indeterminate,
        }
    }
}

impl Outcome for RenewOutcome {
    fn name(&self) -> &'static str {
        match self {
            RenewOutcome::Renewed { .. } => "renewed",
            RenewOutcome::Lost { .. } => "lost",
            RenewOutcome::Unavailable { .. } => "unavailable",
            RenewOutcome::Indeterminate { .. } => "indeterminate",
        }
    }

    fn class(&self) -> OutcomeClass {
        match self {
            RenewOutcome::Renewed { .. } => OutcomeClass::Done,
            RenewOutcome::Lost { .. } => OutcomeClass::Answered,
            RenewOutcome::Unavailable { .. } => OutcomeClass::Unavailable,
            RenewOutcome::Indeterminate { .. } => OutcomeClass::Indeterminate,
        }
    }
}

impl Outcome for ReleaseOutcome {
    fn name(&self) -> &'static str {
        match self {
            ReleaseOutcome::Released => "released",
            ReleaseOutcome::AlreadyAbsent => "already_absent",
            ReleaseOutcome::NotOwner => "not_owner",
            ReleaseOutcome::Unavailable { .. } => "unavailable",
            ReleaseOutcome::Indeterminate { .. } => "indeterminate",
        }
    }

    fn class(&self) -> OutcomeClass {
        match self {
            // Released either way: what the caller wanted is true.
            ReleaseOutcome::Released | ReleaseOutcome::AlreadyAbsent => OutcomeClass::Done,
            ReleaseOutcome::NotOwner => OutcomeClass::Answered,
            ReleaseOutcome::Unavailable { .. } => OutcomeClass::Unavailable,
            ReleaseOutcome::Indeterminate { .. } => OutcomeClass::Indeterminate,
        }
    }
}

impl Outcome for InspectOutcome {
    fn name(&self) -> &'static str {
        match self {
            InspectOutcome::Free => "free",
            InspectOutcome::Held { .. } => "held",
            InspectOutcome::HeldShared { .. } => "held_shared",
            InspectOutcome::Unavailable { .. } => "unavailable",
        }
    }

    fn class(&self) -> OutcomeClass {
        match self {
            InspectOutcome::Free
            | InspectOutcome::Held { .. }
            | InspectOutcome::HeldShared { .. } => OutcomeClass::Done,
            InspectOutcome::Unavailable { .. } => OutcomeClass::Unavailable,
        }
    }
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

    /// The names the table gives are the tags serde writes, for one value of every variant.
    #[test]
    fn every_outcome_is_named_as_on_the_wire() {
        fn wire<O: Serialize>(outcome: &O) -> String {
            serde_json::to_value(outcome).unwrap()["outcome"]
                .as_str()
                .unwrap()
                .to_owned()
        }
        let reason = || "r".to_owned();
        let second = Duration::from_secs(1);
        let acquires = [
            AcquireOutcome::Acquired {
                fence: 1,
                valid_for: second,
            },
            AcquireOutcome::Replayed {
                fence: 1,
                valid_for: second,
            },
            AcquireOutcome::Contended {
                retry_after: second,
            },
            AcquireOutcome::Conflict,
            AcquireOutcome::TooManyWatchdogs { limit: 1 },
            AcquireOutcome::ShapeConflict {
                held_as: HeldAs::Exclusive,
                permits: None,
            },
            AcquireOutcome::Unavailable { reason: reason() },
            AcquireOutcome::Indeterminate { reason: reason() },
        ];
        for outcome in &acquires {
            assert_eq!(outcome.name(), wire(outcome));
        }
        let renews = [
            RenewOutcome::Renewed { valid_for: second },
            RenewOutcome::Lost {
                reason: LostReason::Absent,
            },
            RenewOutcome::Unavailable { reason: reason() },
            RenewOutcome::Indeterminate { reason: reason() },
        ];
        for outcome in &renews {
            assert_eq!(outcome.name(), wire(outcome));
        }
        let releases = [
            ReleaseOutcome::Released,
            ReleaseOutcome::AlreadyAbsent,
            ReleaseOutcome::NotOwner,
            ReleaseOutcome::Unavailable { reason: reason() },
            ReleaseOutcome::Indeterminate { reason: reason() },
        ];
        for outcome in &releases {
            assert_eq!(outcome.name(), wire(outcome));
        }
        let inspects = [
            InspectOutcome::Free,
            InspectOutcome::Held {
                remaining: second,
                fence: 1,
                yours: false,
                value: None,
            },
            InspectOutcome::HeldShared {
                held_as: HeldAs::Semaphore,
                permits: Some(2),
                holders: Vec::new(),
            },
            InspectOutcome::Unavailable { reason: reason() },
        ];
        for outcome in &inspects {
            assert_eq!(outcome.name(), wire(outcome));
        }
    }
}
