//! The value of one RESP2/RESP3 frame.

use bytes::Bytes;

/// One complete RESP2 or RESP3 frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// `+OK`
    Simple(Bytes),
    /// `-ERR message`
    Error(Bytes),
    /// `!<len>` RESP3 blob error.
    BulkError(Bytes),
    /// `:42`
    Integer(i64),
    /// `$<len>`
    Bulk(Bytes),
    /// RESP2 null bulk (`$-1`) or RESP3 null (`_`); both encode as `$-1` unless `Null3` is asked for.
    Null,
    /// RESP3 `_`, kept apart from [`Frame::Null`] so that re-encoding gives back the same bytes.
    Null3,
    /// RESP2 null array (`*-1`).
    NullArray,
    Array(Vec<Frame>),
    Map(Vec<(Frame, Frame)>),
    Set(Vec<Frame>),
    Double(f64),
    Boolean(bool),
    BigNumber(Bytes),
    Verbatim {
        format: [u8; 3],
        text: Bytes,
    },
    /// Out-of-band data (pub/sub messages, invalidations in RESP3).
    Push(Vec<Frame>),
    /// RESP3 attributes and the reply they annotate, which together form one reply.
    Attribute {
        attributes: Vec<(Frame, Frame)>,
        value: Box<Frame>,
    },
}

impl Frame {
    /// True for `-ERR` and `!` errors.
    pub fn is_error(&self) -> bool {
        matches!(self, Frame::Error(_) | Frame::BulkError(_))
    }

    /// The bytes of a string-like frame (simple, bulk, error, verbatim text, big number).
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            Frame::Simple(b)
            | Frame::Error(b)
            | Frame::BulkError(b)
            | Frame::Bulk(b)
            | Frame::BigNumber(b) => Some(b),
            Frame::Verbatim { text, .. } => Some(text),
            _ => None,
        }
    }
}
