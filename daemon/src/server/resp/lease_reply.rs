//! The replies to `LEASE` calls: an outcome as the HTTP API writes it (`{"outcome": "acquired",
//! "fence": 7, …}`), as a RESP3 map or a RESP2 flat array, `outcome` first and the other fields by
//! name. The outcomes nearly every call ends in (acquired, replayed, renewed, released, already
//! absent, not owner) are written straight to bytes; every other goes through `serde_json::Value`.
//! A test holds the two ways to the same bytes for every outcome the fast one writes.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tollgate_lease::{AcquireOutcome, Attempt, ReleaseOutcome, RenewOutcome};
use tollgate_resp::Frame;

use super::local::Protocol;
use super::replies;

/// The reply to an acquire: its outcome with the attempt, which goes back with every acquire so
/// that a caller who let the daemon make it can renew, release and retry with it.
pub(super) fn acquired(outcome: &AcquireOutcome, attempt: &Attempt, protocol: Protocol) -> Bytes {
    match outcome {
        AcquireOutcome::Acquired { fence, valid_for }
        | AcquireOutcome::Replayed { fence, valid_for } => {
            let name = match outcome {
                AcquireOutcome::Acquired { .. } => Field::Wire(b"$8\r\nacquired\r\n"),
                _ => Field::Wire(b"$8\r\nreplayed\r\n"),
            };
            fields(
                &[
                    (OUTCOME, name),
                    (b"$5\r\nfence\r\n", Field::Number(*fence)),
                    (
                        b"$12\r\noperation_id\r\n",
                        Field::Text(&attempt.operation_id),
                    ),
                    (b"$5\r\nowner\r\n", Field::Text(&attempt.owner)),
                    (VALID_FOR_MS, millis(*valid_for)),
                ],
                protocol,
            )
        }
        other => encoded(&with_attempt(value(other), attempt), protocol),
    }
}

pub(super) fn renewed(outcome: &RenewOutcome, protocol: Protocol) -> Bytes {
    match outcome {
        RenewOutcome::Renewed { valid_for } => fields(
            &[
                (OUTCOME, Field::Wire(b"$7\r\nrenewed\r\n")),
                (VALID_FOR_MS, millis(*valid_for)),
            ],
            protocol,
        ),
        other => encoded(&value(other), protocol),
    }
}

pub(super) fn released(outcome: &ReleaseOutcome, protocol: Protocol) -> Bytes {
    let name = match outcome {
        ReleaseOutcome::Released => Field::Wire(b"$8\r\nreleased\r\n"),
        ReleaseOutcome::AlreadyAbsent => Field::Wire(b"$14\r\nalready_absent\r\n"),
        ReleaseOutcome::NotOwner => Field::Wire(b"$9\r\nnot_owner\r\n"),
        other => return encoded(&value(other), protocol),
    };
    fields(&[(OUTCOME, name)], protocol)
}

/// The names of the fields, and the outcomes' own names, are written here as the bulk strings the
/// wire has (`$7\r\noutcome\r\n`), not encoded for every reply, where they were a third of its
/// cost; the test below holds every reply to the bytes its JSON value encodes to.
const OUTCOME: &[u8] = b"$7\r\noutcome\r\n";
const VALID_FOR_MS: &[u8] = b"$12\r\nvalid_for_ms\r\n";

/// One field of a fast outcome, as `serde_json` would hold it.
enum Field<'a> {
    Text(&'a str),
    Number(u64),
    /// A fixed string, already a bulk string on the wire.
    Wire(&'static [u8]),
}

/// Milliseconds as the wire has them (`crate::millis` in the lease API).
fn millis(duration: Duration) -> Field<'static> {
    Field::Number(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// `fields` (each name already a bulk string), in the wire's order, as a map (RESP3) or flat
/// array (RESP2).
fn fields(fields: &[(&'static [u8], Field)], protocol: Protocol) -> Bytes {
    // Exactly its size: room to spare would cost a second allocation when frozen (the shared
    // header `Bytes` keeps for a vector whose length is not its capacity), on every lease call.
    let size = tollgate_resp::header_len(match protocol {
        Protocol::Resp3 => fields.len(),
        Protocol::Resp2 => 2 * fields.len(),
    }) + fields
        .iter()
        .map(|(name, field)| name.len() + field.wire_len())
        .sum::<usize>();
    let mut out = BytesMut::with_capacity(size);
    map_header(fields.len(), protocol, &mut out);
    for (name, field) in fields {
        out.extend_from_slice(name);
        match field {
            Field::Text(text) => tollgate_resp::encode_bulk(text.as_bytes(), &mut out),
            Field::Wire(bulk) => out.extend_from_slice(bulk),
            // A number past i64 is a string in `serde_json`'s `as_i64`, and so here.
            Field::Number(n) => match i64::try_from(*n) {
                // `:n`: an integer reply is its header alone.
                Ok(n) => tollgate_resp::encode_header(b':', n as usize, &mut out),
                Err(_) => tollgate_resp::encode_bulk(n.to_string().as_bytes(), &mut out),
            },
        }
    }
    debug_assert_eq!(out.len(), size, "the reply's size, computed in advance");
    out.freeze()
}

impl Field<'_> {
    /// The bytes `fields` writes for this field's value.
    fn wire_len(&self) -> usize {
        match self {
            Field::Text(text) => tollgate_resp::bulk_len(text.len()),
            Field::Wire(bulk) => bulk.len(),
            Field::Number(n) => match i64::try_from(*n) {
                Ok(n) => tollgate_resp::header_len(n as usize),
                Err(_) => tollgate_resp::bulk_len(n.checked_ilog10().unwrap_or(0) as usize + 1),
            },
        }
    }
}

/// The header of a map of `len` pairs: `%len` in RESP3, `*2len` (a flat array) in RESP2.
fn map_header(len: usize, protocol: Protocol, out: &mut BytesMut) {
    match protocol {
        Protocol::Resp3 => tollgate_resp::encode_header(b'%', len, out),
        Protocol::Resp2 => tollgate_resp::encode_header(b'*', 2 * len, out),
    }
}

/// Any outcome, by way of its JSON value.
pub(super) fn encoded(value: &serde_json::Value, protocol: Protocol) -> Bytes {
    let mut out = BytesMut::with_capacity(256);
    write(value, protocol, &mut out);
    out.freeze()
}

/// An outcome as the HTTP API writes it: `{"outcome": "acquired", "fence": 7, …}`.
pub(super) fn value(outcome: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(outcome).expect("lease outcomes always serialise")
}

/// `outcome` with the attempt's owner and operation id.
fn with_attempt(mut outcome: serde_json::Value, attempt: &Attempt) -> serde_json::Value {
    if let Some(fields) = outcome.as_object_mut() {
        fields.insert("owner".into(), attempt.owner.clone().into());
        fields.insert("operation_id".into(), attempt.operation_id.clone().into());
    }
    outcome
}

/// JSON as RESP: objects are maps in RESP3 and flat arrays in RESP2, `true`/`false` booleans in
/// RESP3 and 1/0 in RESP2, strings bulk strings. Taken by value: its strings become the frame's
/// without a copy.
pub(super) fn frame(value: serde_json::Value, protocol: Protocol) -> Frame {
    use serde_json::Value;
    match value {
        Value::Null => Frame::Null,
        Value::Bool(flag) => match protocol {
            Protocol::Resp3 => Frame::Boolean(flag),
            Protocol::Resp2 => Frame::Integer(i64::from(flag)),
        },
        Value::Number(number) => match number.as_i64() {
            Some(integer) => Frame::Integer(integer),
            None => Frame::Bulk(Bytes::from(number.to_string())),
        },
        Value::String(text) => Frame::Bulk(Bytes::from(text)),
        Value::Array(items) => Frame::Array(
            items
                .into_iter()
                .map(|item| frame(item, protocol))
                .collect(),
        ),
        Value::Object(fields) => {
            let mut pairs: Vec<(Frame, Frame)> = fields
                .into_iter()
                .map(|(name, item)| (Frame::Bulk(Bytes::from(name)), frame(item, protocol)))
                .collect();
            // `outcome` first, so that a person reading redis-cli sees it at the top.
            let outcome =
                |(name, _): &(Frame, Frame)| matches!(name, Frame::Bulk(name) if name == "outcome");
            if let Some(at) = pairs.iter().position(outcome) {
                pairs[..=at].rotate_right(1);
            }
            replies::map(protocol, pairs)
        }
    }
}

/// Writes `value` exactly as `replies::encode(&frame(value, protocol))` would, without building
/// the frame: every lease call's reply is written this way, and the frame, its strings and their
/// drop cost a LEASE call about 3,000 instructions (callgrind) where the bytes cost a few hundred.
/// `frame` stays for the watch events, which are pushed as frames.
fn write(value: &serde_json::Value, protocol: Protocol, out: &mut BytesMut) {
    use serde_json::Value;
    match value {
        Value::Null => tollgate_resp::encode(&Frame::Null, out),
        Value::Bool(flag) => tollgate_resp::encode(
            &match protocol {
                Protocol::Resp3 => Frame::Boolean(*flag),
                Protocol::Resp2 => Frame::Integer(i64::from(*flag)),
            },
            out,
        ),
        Value::Number(number) => match number.as_i64() {
            Some(integer) => tollgate_resp::encode(&Frame::Integer(integer), out),
            None => tollgate_resp::encode_bulk(number.to_string().as_bytes(), out),
        },
        Value::String(text) => tollgate_resp::encode_bulk(text.as_bytes(), out),
        Value::Array(items) => {
            tollgate_resp::encode_header(b'*', items.len(), out);
            for item in items {
                write(item, protocol, out);
            }
        }
        Value::Object(fields) => {
            map_header(fields.len(), protocol, out);
            // `outcome` first, then the rest in the map's order, as `frame` rotates them.
            let first = fields.get_key_value("outcome");
            let rest = fields.iter().filter(|(name, _)| name.as_str() != "outcome");
            for (name, item) in first.into_iter().chain(rest) {
                tollgate_resp::encode_bulk(name.as_bytes(), out);
                write(item, protocol, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_lease::LostReason;

    #[test]
    fn fast_outcomes_are_the_bytes_of_their_json_values() {
        let attempt = Attempt {
            owner: "5:alice:1000:tok é".into(),
            operation_id: "op-1".into(),
        };
        let long = Duration::from_millis(u64::MAX);
        for protocol in [Protocol::Resp2, Protocol::Resp3] {
            for outcome in [
                AcquireOutcome::Acquired {
                    fence: 7,
                    valid_for: Duration::from_millis(2950),
                },
                AcquireOutcome::Replayed {
                    fence: u64::MAX,
                    valid_for: long,
                },
                AcquireOutcome::Contended {
                    retry_after: Duration::from_millis(3),
                },
                AcquireOutcome::Conflict,
                AcquireOutcome::Unavailable {
                    reason: "down".into(),
                },
            ] {
                assert_eq!(
                    acquired(&outcome, &attempt, protocol),
                    encoded(&with_attempt(value(&outcome), &attempt), protocol),
                    "{outcome:?} in {protocol:?}"
                );
            }
            for outcome in [
                RenewOutcome::Renewed {
                    valid_for: Duration::from_millis(10),
                },
                RenewOutcome::Renewed { valid_for: long },
                RenewOutcome::Lost {
                    reason: LostReason::NotOwner,
                },
            ] {
                assert_eq!(
                    renewed(&outcome, protocol),
                    encoded(&value(&outcome), protocol)
                );
            }
            for outcome in [
                ReleaseOutcome::Released,
                ReleaseOutcome::AlreadyAbsent,
                ReleaseOutcome::NotOwner,
                ReleaseOutcome::Indeterminate {
                    reason: "lost".into(),
                },
            ] {
                assert_eq!(
                    released(&outcome, protocol),
                    encoded(&value(&outcome), protocol)
                );
            }
        }
    }

    #[test]
    fn an_outcome_is_written_as_its_frame_is_encoded() {
        let values = [
            serde_json::json!({"outcome": "held", "fence": 7, "yours": true, "holders": [
                {"owner": "o", "fence": 3, "remaining_ms": 10}, {"owner": "p", "value": null}]}),
            serde_json::json!({"zeta": 1.5, "alpha": -3, "outcome": "acquired", "owner": "é",
                "operation_id": "", "valid_for_ms": 18446744073709551615_u64, "on": false}),
            serde_json::json!({"reason": "no outcome field"}),
            serde_json::json!({}),
            serde_json::json!([1, "two", null, [], {"outcome": "x"}]),
            serde_json::json!("released"),
            serde_json::json!(null),
        ];
        for value in values {
            for protocol in [Protocol::Resp2, Protocol::Resp3] {
                let mut written = BytesMut::new();
                write(&value, protocol, &mut written);
                assert_eq!(
                    written.freeze(),
                    replies::encode(&frame(value.clone(), protocol)),
                    "{value} in {protocol:?}"
                );
            }
        }
    }

    #[test]
    fn outcomes_are_maps_in_resp3_and_flat_arrays_in_resp2() {
        let outcome = serde_json::json!({"outcome": "held", "fence": 7, "yours": true});
        let bulk = |s: &'static str| Frame::Bulk(Bytes::from_static(s.as_bytes()));
        assert_eq!(
            frame(outcome.clone(), Protocol::Resp3),
            Frame::Map(vec![
                (bulk("outcome"), bulk("held")),
                (bulk("fence"), Frame::Integer(7)),
                (bulk("yours"), Frame::Boolean(true)),
            ])
        );
        assert_eq!(
            frame(outcome, Protocol::Resp2),
            Frame::Array(vec![
                bulk("outcome"),
                bulk("held"),
                bulk("fence"),
                Frame::Integer(7),
                bulk("yours"),
                Frame::Integer(1),
            ])
        );
    }
}
