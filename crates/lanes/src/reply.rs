//! One reply from Redis as the raw bytes of one complete frame, so the front door can write it to a
//! client unchanged and only callers that need the value pay for parsing it.

use bytes::{Bytes, BytesMut};
use tollgate_resp::{Frame, Limits};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply(Bytes);

impl Reply {
    /// Wraps bytes already measured as exactly one frame under [`reply_limits`].
    pub(crate) fn new(bytes: Bytes) -> Self {
        Reply(bytes)
    }

    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    pub fn into_bytes(self) -> Bytes {
        self.0
    }

    /// The parsed value.
    pub fn frame(&self) -> Frame {
        let mut buf = BytesMut::from(&self.0[..]);
        match tollgate_resp::parse(&mut buf, &reply_limits()) {
            Ok(Some(frame)) => frame,
            // Unreachable by construction: the reader measured these bytes as one frame with the same limits.
            other => unreachable!("a Reply holds one complete frame, got {other:?}"),
        }
    }

    /// True for `-ERR …` and RESP3 `!` errors (the first byte decides; no parse).
    pub fn is_error(&self) -> bool {
        matches!(self.0.first(), Some(b'-' | b'!'))
    }
}

/// What we accept from Redis: its own ceilings (512 MiB strings), deep nesting for module replies.
pub(crate) fn reply_limits() -> Limits {
    Limits::default()
}
