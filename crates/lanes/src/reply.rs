//! One reply from Redis as the raw bytes of one complete frame, so the front door can write it to a
//! client unchanged and only callers that need the value pay for parsing it; and the reader that
//! cuts a shared connection's stream into replies without letting one reply fail the others.

use bytes::{Buf, Bytes, BytesMut};
use tollgate_resp::{parse_i64, Discarded, Frame, Limits, ProtocolError, Scanner};

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
        if let Some(frame) = integers(&self.0) {
            return Ok(frame);
        }
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

    /// Whether the server refused the command as a replica refuses writes: the master the lanes
    /// write to has been demoted.
    pub(crate) fn is_readonly(&self) -> bool {
        self.0.starts_with(b"-READONLY ")
    }
}

/// `:<n>`, or an array of one to eight of them: what the lease scripts answer, read in one pass
/// over the reply's own bytes. The general parser copies the reply, measures it and then builds it,
/// about 1,900 instructions a lease call (callgrind) for three integers. `None` for anything else,
/// which the general parser then reads; where this answers, it answers what that would.
fn integers(bytes: &[u8]) -> Option<Frame> {
    fn line(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let end = bytes.iter().position(|&byte| byte == b'\r')?;
        if bytes.get(end + 1) != Some(&b'\n') || end == 0 {
            return None;
        }
        Some((bytes[0], &bytes[1..end], &bytes[end + 2..]))
    }
    match line(bytes)? {
        (b':', text, []) => parse_i64(text).map(Frame::Integer),
        (b'*', count, mut rest) => {
            let count = usize::try_from(parse_i64(count)?).ok()?;
            if !(1..=8).contains(&count) {
                return None;
            }
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                let (b':', text, after) = line(rest)? else {
                    return None;
                };
                items.push(Frame::Integer(parse_i64(text)?));
                rest = after;
            }
            rest.is_empty().then_some(Frame::Array(items))
        }
        _ => None,
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

/// What the next frame on a connection turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    Reply(Reply),
    /// A reply larger than [`reply_limits`] allows: dropped as it streams past, so that the
    /// connection reads on; the command it answers must be told.
    TooLarge {
        limit: usize,
    },
}

/// Cuts replies out of one connection's read buffer, resuming across reads. RESP3 pushes answer no
/// command and are dropped here.
pub(crate) struct ReplyReader {
    scanner: Scanner,
    limits: Limits,
    /// The frame being read is one too large to keep: its bytes are dropped as they arrive.
    discarding: bool,
}

impl ReplyReader {
    pub(crate) fn new(limits: Limits) -> Self {
        ReplyReader {
            scanner: Scanner::default(),
            limits,
            discarding: false,
        }
    }

    /// The next frame at the front of `read`, taken off it; `Ok(None)` until more bytes arrive.
    /// `Err` only when the stream itself cannot be followed (not RESP, or one string longer than
    /// the limit): then the connection is lost.
    pub(crate) fn next(&mut self, read: &mut BytesMut) -> Result<Option<Next>, ProtocolError> {
        loop {
            match self.scanner.scan(read, &self.limits) {
                Ok(Some(len)) if self.discarding => {
                    read.advance(len);
                    self.discarding = false;
                }
                Ok(Some(len)) => {
                    let frame = read.split_to(len).freeze();
                    if !is_push(&frame) {
                        return Ok(Some(Next::Reply(Reply::new(frame))));
                    }
                }
                Ok(None) => {
                    if self.discarding {
                        self.scanner.discard(read);
                    }
                    return Ok(None);
                }
                Err(error @ ProtocolError::FrameTooLarge { limit }) => {
                    let starts = !self.discarding;
                    let push = is_push(read);
                    self.discarding = match self.scanner.discard(read) {
                        Discarded::Whole => false,
                        Discarded::Part { dropped: 0 } => return Err(error),
                        Discarded::Part { .. } => true,
                    };
                    if starts && !push {
                        return Ok(Some(Next::TooLarge { limit }));
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Whether `frame` is a RESP3 push (`>`), which answers no command. The front door refuses what
/// would make Redis send one on a shared connection (client-side caching); should one arrive all
/// the same, it is dropped rather than taken for the next command's reply.
fn is_push(frame: &[u8]) -> bool {
    frame.first() == Some(&b'>')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reply as the general parser reads it.
    fn parsed(bytes: &[u8]) -> Result<Frame, ProtocolError> {
        let mut buf = BytesMut::from(bytes);
        Ok(tollgate_resp::parse(&mut buf, &reply_limits())?.expect("one whole frame"))
    }

    #[test]
    fn integer_replies_read_in_one_pass_are_what_the_parser_reads() {
        let read = [
            &b":0\r\n"[..],
            b":-42\r\n",
            b":+7\r\n",
            b":9223372036854775807\r\n",
            b"*3\r\n:1\r\n:17\r\n:29998\r\n",
            b"*1\r\n:-1\r\n",
            b"*8\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n:6\r\n:7\r\n:8\r\n",
        ];
        for bytes in read {
            assert_eq!(integers(bytes), Some(parsed(bytes).unwrap()), "{bytes:?}");
            assert_eq!(
                Reply::new(Bytes::copy_from_slice(bytes)).frame(),
                parsed(bytes)
            );
        }
        // Everything else is left to the parser, errors and all.
        let left = [
            &b":9223372036854775808\r\n"[..],
            b":\r\n",
            b":1x\r\n",
            b"*0\r\n",
            b"*-1\r\n",
            b"*9\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n:6\r\n:7\r\n:8\r\n:9\r\n",
            b"*2\r\n:1\r\n$1\r\nx\r\n",
            b"*2\r\n:1\r\n*1\r\n:2\r\n",
            b"$3\r\nabc\r\n",
            b"-ERR no\r\n",
            b"+OK\r\n",
        ];
        for bytes in left {
            assert_eq!(integers(bytes), None, "{bytes:?}");
            assert_eq!(
                Reply::new(Bytes::copy_from_slice(bytes)).frame().ok(),
                parsed(bytes).ok()
            );
        }
    }

    #[test]
    fn a_reply_over_the_limit_is_read_past_at_any_cut_and_the_next_ones_still_arrive() {
        let limits = Limits {
            max_frame_bytes: 64,
            ..reply_limits()
        };
        let mut big = b"*40\r\n".to_vec();
        for _ in 0..40 {
            big.extend_from_slice(b"$3\r\nxxx\r\n");
        }
        let mut wire = b"+first\r\n".to_vec();
        wire.extend_from_slice(&big);
        // A push over the limit answers no command: dropped without a word.
        wire.push(b'>');
        wire.extend_from_slice(&big[1..]);
        wire.extend_from_slice(b">1\r\n+pushed\r\n:7\r\n");
        wire.extend_from_slice(&big);
        wire.extend_from_slice(b"$4\r\nlast\r\n");
        let reply = |bytes: &'static [u8]| Next::Reply(Reply::new(Bytes::from_static(bytes)));
        let expected = [
            reply(b"+first\r\n"),
            Next::TooLarge { limit: 64 },
            reply(b":7\r\n"),
            Next::TooLarge { limit: 64 },
            reply(b"$4\r\nlast\r\n"),
        ];
        for piece in [1, 3, 10, 64, wire.len()] {
            let mut reader = ReplyReader::new(limits);
            let mut read = BytesMut::new();
            let mut seen = Vec::new();
            for chunk in wire.chunks(piece) {
                read.extend_from_slice(chunk);
                while let Some(next) = reader.next(&mut read).unwrap() {
                    seen.push(next);
                }
                // Nothing of a dropped reply is kept for long.
                assert!(read.len() <= 2 * 64 + piece, "{} bytes held", read.len());
            }
            assert_eq!(seen, expected, "pieces of {piece} bytes");
            assert!(read.is_empty());
        }
    }

    #[test]
    fn a_single_string_over_the_limit_cannot_be_read_past() {
        let limits = Limits {
            max_frame_bytes: 8,
            ..reply_limits()
        };
        let mut read = BytesMut::from(&b"$9\r\n"[..]);
        assert_eq!(
            ReplyReader::new(limits).next(&mut read),
            Err(ProtocolError::FrameTooLarge { limit: 8 })
        );
    }
}
