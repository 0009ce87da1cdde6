//! What the lease scripts answer, decoded: the integer arrays every script replies with, an
//! exclusive lease's holder (with its value), and the replies only the shared-resource scripts
//! give (a shape conflict, a shared resource's holders).

use std::time::Duration;

use tollgate_resp::Frame;

use crate::outcome::{AcquireOutcome, InspectOutcome};
use crate::shape::{HeldAs, HolderMode, SharedHolder};

pub(super) fn unexpected<T>(frame: &Frame, into: impl FnOnce(String) -> T) -> T {
    into(format!("unexpected reply from a lease script: {frame:?}"))
}

pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An array of exactly `N` integers.
pub(super) fn integers<const N: usize>(frame: &Frame) -> Option<[i64; N]> {
    numbers(frame)?.try_into().ok()
}

/// An array of integers, however many.
fn numbers(frame: &Frame) -> Option<Vec<i64>> {
    let Frame::Array(items) = frame else {
        return None;
    };
    items
        .iter()
        .map(|item| match item {
            Frame::Integer(n) => Some(*n),
            _ => None,
        })
        .collect()
}

fn held_as(code: i64) -> Option<HeldAs> {
    match code {
        0 => Some(HeldAs::Exclusive),
        1 => Some(HeldAs::Semaphore),
        2 => Some(HeldAs::ReadWrite),
        _ => None,
    }
}

/// `{4, shape, permits}`: the resource is held in another shape.
pub(super) fn shape_conflict(frame: &Frame) -> Option<AcquireOutcome> {
    let [4, shape, permits] = integers::<3>(frame)? else {
        return None;
    };
    let held_as = held_as(shape)?;
    Some(AcquireOutcome::ShapeConflict {
        held_as,
        permits: (held_as == HeldAs::Semaphore).then(|| u32::try_from(permits).unwrap_or_default()),
    })
}

/// `{1, fence, remaining, yours, value}`: an exclusive lease's holder; the value is nil when the
/// holder gave none.
pub(super) fn held_exclusive(frame: &Frame) -> Option<InspectOutcome> {
    let Frame::Array(items) = frame else {
        return None;
    };
    let [Frame::Integer(1), Frame::Integer(fence), Frame::Integer(remaining), Frame::Integer(yours), value] =
        items.as_slice()
    else {
        return None;
    };
    let value = match value {
        // Lua's false for a missing field: a null, or `false` to a RESP3 connection.
        Frame::Null | Frame::Boolean(false) => None,
        Frame::Bulk(value) => Some(String::from_utf8_lossy(value).into_owned()),
        _ => return None,
    };
    Some(InspectOutcome::Held {
        remaining: Duration::from_millis(u64::try_from(*remaining).unwrap_or_default()),
        fence: u64::try_from(*fence).unwrap_or_default(),
        yours: *yours == 1,
        value,
    })
}

/// `{2, shape, permits, (fence, remaining, count, mode, yours)*}`: a shared resource's holders.
pub(super) fn held_shared(frame: &Frame) -> Option<InspectOutcome> {
    let numbers = numbers(frame)?;
    let [2, shape, permits, holders @ ..] = numbers.as_slice() else {
        return None;
    };
    let held_as = held_as(*shape)?;
    if holders.len() % 5 != 0 {
        return None;
    }
    let holders = holders
        .chunks_exact(5)
        .map(|holder| {
            let [fence, remaining, count, mode, yours] = holder else {
                return None;
            };
            Some(SharedHolder {
                fence: u64::try_from(*fence).ok()?,
                remaining: Duration::from_millis(u64::try_from(*remaining).unwrap_or_default()),
                count: u32::try_from(*count).ok()?,
                mode: match mode {
                    0 => HolderMode::Permit,
                    1 => HolderMode::Read,
                    2 => HolderMode::Write,
                    _ => return None,
                },
                yours: *yours == 1,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let mut holders = holders;
    holders.sort_by_key(|holder| holder.fence);
    Some(InspectOutcome::HeldShared {
        held_as,
        permits: (held_as == HeldAs::Semaphore)
            .then(|| u32::try_from(*permits).unwrap_or_default()),
        holders,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(numbers: &[i64]) -> Frame {
        Frame::Array(numbers.iter().map(|n| Frame::Integer(*n)).collect())
    }

    #[test]
    fn shared_replies_decode_and_others_are_left_alone() {
        assert_eq!(
            shape_conflict(&array(&[4, 1, 3])),
            Some(AcquireOutcome::ShapeConflict {
                held_as: HeldAs::Semaphore,
                permits: Some(3)
            })
        );
        assert_eq!(
            shape_conflict(&array(&[4, 0, 0])),
            Some(AcquireOutcome::ShapeConflict {
                held_as: HeldAs::Exclusive,
                permits: None
            })
        );
        assert_eq!(shape_conflict(&array(&[0, 9, 100])), None);
        let Some(InspectOutcome::HeldShared {
            held_as, holders, ..
        }) = held_shared(&array(&[2, 2, 0, 9, 500, 1, 1, 0, 8, 400, 1, 1, 1]))
        else {
            panic!("two readers");
        };
        assert_eq!(held_as, HeldAs::ReadWrite);
        assert_eq!(
            holders
                .iter()
                .map(|h| (h.fence, h.yours))
                .collect::<Vec<_>>(),
            vec![(8, true), (9, false)],
            "oldest fence first"
        );
        assert_eq!(
            held_shared(&array(&[2, 2, 0, 9, 500])),
            None,
            "a cut holder"
        );
        assert_eq!(
            held_shared(&array(&[1, 7, 500, 0])),
            None,
            "an exclusive holder"
        );
    }

    #[test]
    fn an_exclusive_holder_decodes_with_or_without_its_value() {
        let held = |value: Frame| {
            let mut items: Vec<Frame> = [1, 7, 500, 1].map(Frame::Integer).into();
            items.push(value);
            held_exclusive(&Frame::Array(items))
        };
        assert_eq!(
            held(Frame::Bulk(b"10.0.0.1:80".to_vec().into())),
            Some(InspectOutcome::Held {
                remaining: Duration::from_millis(500),
                fence: 7,
                yours: true,
                value: Some("10.0.0.1:80".into()),
            })
        );
        for none in [Frame::Null, Frame::Boolean(false)] {
            assert!(
                matches!(held(none), Some(InspectOutcome::Held { value: None, .. })),
                "no value"
            );
        }
        assert_eq!(held(Frame::Integer(3)), None, "a value that is no string");
        assert_eq!(held_exclusive(&array(&[1, 7, 500, 1])), None, "a cut reply");
    }
}
