//! The shapes a resource can be held in: exclusive (one holder), a semaphore of `permits` (each
//! permit a lease of its own; a request may take `count` of them at once), or a read/write lease
//! (many readers or one writer). Also what INSPECT tells about a resource held in a shared shape.
//! A resource's shape, and a semaphore's size, are fixed by its first holder for as long as
//! anyone holds it; a request for another answers `shape_conflict`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::AcquireRequest;
use crate::service::InvalidRequest;

/// The most permits a semaphore may have: every call on it reads all its holders.
pub const MAX_PERMITS: u32 = 1000;

/// A read/write lease's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Read,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Exclusive,
    Shared(Shared),
}

/// The shapes more than one attempt can hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared {
    Semaphore { permits: u32, count: u32 },
    ReadWrite(Mode),
}

impl Shape {
    /// The shape an acquire asks for; `permits`/`count` and `mode` exclude each other.
    pub fn of(request: &AcquireRequest) -> Result<Shape, InvalidRequest> {
        let invalid = |field, message: String| Err(InvalidRequest { field, message });
        let shared = match (request.permits, request.count, request.mode) {
            (None, None, None) => return Ok(Shape::Exclusive),
            (None, None, Some(mode)) => Shared::ReadWrite(mode),
            (_, _, Some(_)) => {
                return invalid("mode", "a read/write lease has no permits or count".into())
            }
            (None, Some(_), None) => {
                return invalid("count", "only a semaphore (permits) has a count".into())
            }
            (Some(permits), count, None) => {
                let count = count.unwrap_or(1);
                if !(1..=MAX_PERMITS).contains(&permits) {
                    return invalid("permits", format!("must be 1 to {MAX_PERMITS}"));
                }
                if !(1..=permits).contains(&count) {
                    return invalid("count", format!("must be 1 to permits ({permits})"));
                }
                Shared::Semaphore { permits, count }
            }
        };
        if request.replicas > 0 {
            return invalid(
                "replicas",
                "is not yet supported for semaphores and read/write leases".into(),
            );
        }
        Ok(Shape::Shared(shared))
    }
}

/// The shape a resource is held in, as a `shape_conflict` or an INSPECT names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeldAs {
    Exclusive,
    Semaphore,
    ReadWrite,
}

/// What one holder of a shared resource holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderMode {
    Permit,
    Read,
    Write,
}

/// One holder of a shared resource as INSPECT shows it (its owner stays hidden, as for an
/// exclusive lease: `yours` tells the caller whether it is the attempt it named).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedHolder {
    pub fence: u64,
    #[serde(rename = "remaining_ms", with = "crate::millis")]
    pub remaining: Duration,
    /// Permits taken (1 for a reader or writer).
    pub count: u32,
    pub mode: HolderMode,
    pub yours: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::Attempt;

    fn request(permits: Option<u32>, count: Option<u32>, mode: Option<Mode>) -> AcquireRequest {
        AcquireRequest {
            attempt: Attempt {
                owner: "o".into(),
                operation_id: "op".into(),
            },
            ttl: Duration::from_secs(1),
            wait: Duration::ZERO,
            watchdog: false,
            replicas: 0,
            permits,
            count,
            mode,
        }
    }

    #[test]
    fn the_fields_name_one_shape_or_the_culprit() {
        let field = |r: AcquireRequest| Shape::of(&r).unwrap_err().field;
        assert_eq!(Shape::of(&request(None, None, None)), Ok(Shape::Exclusive));
        assert_eq!(
            Shape::of(&request(Some(3), None, None)),
            Ok(Shape::Shared(Shared::Semaphore {
                permits: 3,
                count: 1
            }))
        );
        assert_eq!(
            Shape::of(&request(None, None, Some(Mode::Write))),
            Ok(Shape::Shared(Shared::ReadWrite(Mode::Write)))
        );
        assert_eq!(field(request(Some(3), Some(4), None)), "count");
        assert_eq!(field(request(Some(3), Some(0), None)), "count");
        assert_eq!(field(request(Some(0), None, None)), "permits");
        assert_eq!(field(request(Some(MAX_PERMITS + 1), None, None)), "permits");
        assert_eq!(field(request(None, Some(1), None)), "count");
        assert_eq!(field(request(Some(2), None, Some(Mode::Read))), "mode");
        assert_eq!(field(request(None, Some(1), Some(Mode::Read))), "mode");
        let replicated = AcquireRequest {
            replicas: 1,
            ..request(Some(2), None, None)
        };
        assert_eq!(field(replicated), "replicas");
    }
}
