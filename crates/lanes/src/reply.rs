//! One reply from Redis as the raw bytes of one complete frame, so the front door can write it to a
//! client unchanged and only callers that need the value pay for parsing it.

use bytes::{Bytes, BytesMut};
use tollgate_resp::{Frame, Limits, ProtocolError};

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

    /// The parsed value. Passing a reply through never needs this; building one can fail where
    /// measuring it did not: a reply nested deeper than a [`Frame`] is built ([`Limits::max_depth`]).
    pub fn frame(&self) -> Result<Frame, ProtocolError> {
        let mut buf = BytesMut::from(&self.0[..]);
        match tollgate_resp::parse(&mut buf, &reply_limits())? {
            Some(frame) => Ok(frame),
            // By construction: the reader measured these bytes as one complete frame.
            None => unreachable!("a Reply holds one complete frame"),
        }
    }

    /// True for `-ERR …` and RESP3 `!` errors (the first byte decides; no parse).
    pub fn is_error(&self) -> bool {
        matches!(self.0.first(), Some(b'-' | b'!'))
    }
}

/// What we accept from Redis: its own ceilings (512 MiB strings). Any nesting and any element
/// count are measured (both cost bytes); only [`Reply::frame`] refuses what is too deep to build.
pub(crate) fn reply_limits() -> Limits {
    Limits {
        max_elements: usize::MAX,
        ..Limits::default()
    }
}
