//! The shapes a resource can be held in: exclusive (one holder), a semaphore of `permits` (each
//! permit a lease of its own; a request may take `count` of them at once), or a read/write lease
//! (many readers or one writer). Also what INSPECT tells about a resource held in a shared shape.
//! A resource's shape, and a semaphore's size, are fixed by its first holder for as long as
//! anyone holds it; a request for another answers `shape_conflict`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::invalid::InvalidRequest;

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
    /// The shape an acquire asks for (its `permits`, `count`, `mode` and `replicas`); `permits`/
    /// `count` and `mode` exclude each other.
    pub fn of(
        permits: Option<u32>,
        count: Option<u32>,
        mode: Option<Mode>,
        replicas: u32,
    ) -> Result<Shape, InvalidRequest> {
        let invalid = |field, message: String| Err(InvalidRequest { field, message });
        let shared = match (permits, count, mode) {
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
        if replicas > 0 {
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

    fn shape(permits: Option<u32>, count: Option<u32>, mode: Option<Mode>) -> Shape {
        Shape::of(permits, count, mode, 0).unwrap()
    }

    fn culprit(
        permits: Option<u32>,
        count: Option<u32>,
        mode: Option<Mode>,
        replicas: u32,
    ) -> &'static str {
        Shape::of(permits, count, mode, replicas).unwrap_err().field
    }

    #[test]
    fn the_fields_name_one_shape_or_the_culprit() {
        assert_eq!(shape(None, None, None), Shape::Exclusive);
        assert_eq!(
            shape(Some(3), None, None),
            Shape::Shared(Shared::Semaphore {
                permits: 3,
                count: 1
            })
        );
        assert_eq!(
            shape(None, None, Some(Mode::Write)),
            Shape::Shared(Shared::ReadWrite(Mode::Write))
        );
        assert_eq!(culprit(Some(3), Some(4), None, 0), "count");
        assert_eq!(culprit(Some(3), Some(0), None, 0), "count");
        assert_eq!(culprit(Some(0), None, None, 0), "permits");
        assert_eq!(culprit(Some(MAX_PERMITS + 1), None, None, 0), "permits");
        assert_eq!(culprit(None, Some(1), None, 0), "count");
        assert_eq!(culprit(Some(2), None, Some(Mode::Read), 0), "mode");
        assert_eq!(culprit(None, Some(1), Some(Mode::Read), 0), "mode");
        assert_eq!(culprit(Some(2), None, None, 1), "replicas");
    }
}
