//! The error replies the daemon itself writes, so that each cause reads the same everywhere.

use bytes::{BufMut, Bytes, BytesMut};
use tollgate_lanes::{CallError, LaneError};
use tollgate_model::Protocol;
use tollgate_policy::Denial;
use tollgate_resp::Frame;

/// `-NOPERM tollgate: rule <id> denies <COMMAND>: <reason>`
pub fn denied(command: &[u8], denial: &Denial) -> Bytes {
    error(format!(
        "NOPERM tollgate: rule {} denies {}: {}",
        denial.rule,
        String::from_utf8_lossy(command).to_uppercase(),
        denial.reason
    ))
}

pub fn lane_failed(error: &LaneError) -> Bytes {
    call_failed(&CallError::from(error.clone()))
}

/// Saturation, unavailability and lost replies, each with its own error code.
pub fn call_failed(error: &CallError) -> Bytes {
    let text = match error {
        CallError::Saturated { .. } => format!("BUSY tollgate: {error}"),
        CallError::Unavailable { .. } => format!("UNAVAILABLE tollgate: {error}"),
        CallError::Indeterminate { .. } => format!("IOERR tollgate: {error}"),
        _ => format!("SHUTDOWN tollgate: {error}"),
    };
    error_bytes(text)
}

pub fn error(text: String) -> Bytes {
    error_bytes(text)
}

fn error_bytes(text: String) -> Bytes {
    // A newline would end the error line early and desynchronise the client.
    let line = text.replace(['\r', '\n'], " ");
    let mut out = BytesMut::with_capacity(line.len() + 3);
    out.put_u8(b'-');
    out.put_slice(line.as_bytes());
    out.put_slice(b"\r\n");
    out.freeze()
}

pub fn ok() -> Bytes {
    Bytes::from_static(b"+OK\r\n")
}

pub fn encode(frame: &Frame) -> Bytes {
    let mut out = BytesMut::new();
    tollgate_resp::encode(frame, &mut out);
    out.freeze()
}

/// A map reply: a map in RESP3, a flat array of keys and values in RESP2 (as Redis answers).
pub fn map(protocol: Protocol, pairs: Vec<(Frame, Frame)>) -> Frame {
    match protocol {
        Protocol::Resp3 => Frame::Map(pairs),
        Protocol::Resp2 => Frame::Array(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()),
    }
}
