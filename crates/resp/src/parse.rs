//! The bounded incremental parser: `Ok(None)` until a whole frame is buffered, a typed error when the
//! bytes are not RESP or break a limit. One walker serves both [`parse`] (builds the frame) and
//! [`frame_len`] (only measures it, for replies passed through unchanged).

use bytes::{Bytes, BytesMut};

use crate::Frame;

/// Bounds on what one frame may hold, so that a peer cannot make us buffer or nest without limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest encoded frame, and largest single bulk string.
    pub max_frame_bytes: usize,
    /// Most elements in one aggregate (array, map pairs, set, push).
    pub max_elements: usize,
    /// Deepest nesting of aggregates.
    pub max_depth: usize,
    /// Longest inline command or simple line (`+`, `-`, `:` …) without its CRLF.
    pub max_inline_bytes: usize,
}

impl Default for Limits {
    /// Redis's own ceilings: 512 MiB bulk strings, 64 KiB inline commands.
    fn default() -> Self {
        Limits {
            max_frame_bytes: 512 * 1024 * 1024,
            max_elements: 16 * 1024 * 1024,
            max_depth: 64,
            max_inline_bytes: 64 * 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    #[error("protocol error: unknown frame type byte 0x{0:02x}")]
    UnknownType(u8),
    #[error("protocol error: invalid length `{0}`")]
    InvalidLength(String),
    #[error("protocol error: invalid {what} `{text}`")]
    InvalidValue { what: &'static str, text: String },
    #[error("protocol error: missing CRLF after a bulk string")]
    MissingCrlf,
    #[error("protocol error: frame larger than {limit} bytes")]
    FrameTooLarge { limit: usize },
    #[error("protocol error: aggregate of {count} elements exceeds {limit}")]
    TooManyElements { count: i64, limit: usize },
    #[error("protocol error: nesting deeper than {limit}")]
    TooDeep { limit: usize },
    #[error("protocol error: line longer than {limit} bytes")]
    LineTooLong { limit: usize },
    #[error("protocol error: expected a bulk string in a command, got type byte 0x{0:02x}")]
    ExpectedBulk(u8),
    #[error("protocol error: unbalanced quotes in inline command")]
    UnbalancedQuotes,
}

/// Parses and consumes one frame from the front of `buf`; `Ok(None)` leaves `buf` untouched.
pub fn parse(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Frame>, ProtocolError> {
    let Some(len) = frame_len(buf, limits)? else {
        return Ok(None);
    };
    let bytes = buf.split_to(len).freeze();
    let mut walker = Walker::new(&bytes, limits);
    let frame = walker
        .frame(0, Some(&bytes))?
        .expect("a measured frame is complete");
    Ok(Some(frame.expect("building walk yields a frame")))
}

/// The length of the first complete frame in `buf`, without building it.
pub fn frame_len(buf: &[u8], limits: &Limits) -> Result<Option<usize>, ProtocolError> {
    let mut walker = Walker::new(buf, limits);
    Ok(walker.frame(0, None)?.map(|_| walker.pos))
}

/// Walks one frame. With `source` it builds the frame (slicing bulk strings out of `source` without
/// copying); without it only checks and measures.
pub(crate) struct Walker<'a> {
    buf: &'a [u8],
    pub(crate) pos: usize,
    limits: &'a Limits,
}

type Step<T> = Result<Option<T>, ProtocolError>;

impl<'a> Walker<'a> {
    pub(crate) fn new(buf: &'a [u8], limits: &'a Limits) -> Self {
        Walker {
            buf,
            pos: 0,
            limits,
        }
    }

    pub(crate) fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// `Ok(Some(None))`: measured only; `Ok(Some(Some(frame)))`: built; `Ok(None)`: incomplete.
    fn frame(&mut self, depth: usize, source: Option<&Bytes>) -> Step<Option<Frame>> {
        if depth > self.limits.max_depth {
            return Err(ProtocolError::TooDeep {
                limit: self.limits.max_depth,
            });
        }
        let Some(&tag) = self.buf.get(self.pos) else {
            return Ok(None);
        };
        self.pos += 1;
        let Some(line) = self.line()? else {
            return Ok(None);
        };
        let build = source.is_some();
        let text = |line: (usize, usize)| source.map(|s| s.slice(line.0..line.1));
        let frame = match tag {
            b'+' => text(line).map(Frame::Simple),
            b'-' => text(line).map(Frame::Error),
            b'(' => text(line).map(Frame::BigNumber),
            b':' => {
                let n = self.number(line, "integer")?;
                build.then_some(Frame::Integer(n))
            }
            b',' => {
                let d = self.double(line)?;
                build.then_some(Frame::Double(d))
            }
            b'#' => match &self.buf[line.0..line.1] {
                b"t" => build.then_some(Frame::Boolean(true)),
                b"f" => build.then_some(Frame::Boolean(false)),
                other => return Err(invalid("boolean", other)),
            },
            b'_' => build.then_some(Frame::Null3),
            b'$' | b'!' | b'=' => {
                let len = self.length(line)?;
                if len < 0 {
                    if tag != b'$' {
                        return Err(ProtocolError::InvalidLength(lossy(
                            &self.buf[line.0..line.1],
                        )));
                    }
                    build.then_some(Frame::Null)
                } else {
                    let Some((start, end)) = self.blob(len as usize)? else {
                        return Ok(None);
                    };
                    match (tag, source) {
                        (_, None) => None,
                        (b'$', Some(s)) => Some(Frame::Bulk(s.slice(start..end))),
                        (b'!', Some(s)) => Some(Frame::BulkError(s.slice(start..end))),
                        (_, Some(s)) => {
                            if end - start < 4 || s[start + 3] != b':' {
                                return Err(invalid("verbatim string", &s[start..end]));
                            }
                            let format = [s[start], s[start + 1], s[start + 2]];
                            Some(Frame::Verbatim {
                                format,
                                text: s.slice(start + 4..end),
                            })
                        }
                    }
                }
            }
            b'*' | b'~' | b'>' => {
                let count = self.length(line)?;
                if count < 0 {
                    if tag != b'*' {
                        return Err(ProtocolError::InvalidLength(lossy(
                            &self.buf[line.0..line.1],
                        )));
                    }
                    build.then_some(Frame::NullArray)
                } else {
                    let Some(items) = self.items(count, depth, source)? else {
                        return Ok(None);
                    };
                    items.map(|items| match tag {
                        b'*' => Frame::Array(items),
                        b'~' => Frame::Set(items),
                        _ => Frame::Push(items),
                    })
                }
            }
            b'%' | b'|' => {
                let count = self.length(line)?;
                let Some(pairs) = self.pairs(count, depth, source)? else {
                    return Ok(None);
                };
                if tag == b'%' {
                    pairs.map(Frame::Map)
                } else {
                    // An attribute annotates the reply that follows; together they are one reply.
                    let Some(value) = self.frame(depth + 1, source)? else {
                        return Ok(None);
                    };
                    pairs
                        .zip(value)
                        .map(|(attributes, value)| Frame::Attribute {
                            attributes,
                            value: Box::new(value),
                        })
                }
            }
            other => return Err(ProtocolError::UnknownType(other)),
        };
        if self.pos > self.limits.max_frame_bytes {
            return Err(ProtocolError::FrameTooLarge {
                limit: self.limits.max_frame_bytes,
            });
        }
        Ok(Some(frame))
    }

    /// The span of the line at `pos` without its CRLF; moves past the CRLF.
    pub(crate) fn line(&mut self) -> Step<(usize, usize)> {
        let rest = &self.buf[self.pos..];
        let window = &rest[..rest.len().min(self.limits.max_inline_bytes + 2)];
        match window.windows(2).position(|w| w == b"\r\n") {
            Some(at) => {
                let span = (self.pos, self.pos + at);
                self.pos += at + 2;
                Ok(Some(span))
            }
            // A trailing `\r` may still be the start of the CRLF.
            None if window.len() - usize::from(window.ends_with(b"\r"))
                > self.limits.max_inline_bytes =>
            {
                Err(ProtocolError::LineTooLong {
                    limit: self.limits.max_inline_bytes,
                })
            }
            None => Ok(None),
        }
    }

    /// A bulk payload of `len` bytes plus CRLF at `pos`.
    pub(crate) fn blob(&mut self, len: usize) -> Step<(usize, usize)> {
        if len > self.limits.max_frame_bytes {
            return Err(ProtocolError::FrameTooLarge {
                limit: self.limits.max_frame_bytes,
            });
        }
        let start = self.pos;
        let end = start + len;
        if self.buf.len() < end + 2 {
            return Ok(None);
        }
        if &self.buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError::MissingCrlf);
        }
        self.pos = end + 2;
        Ok(Some((start, end)))
    }

    pub(crate) fn length(&self, line: (usize, usize)) -> Result<i64, ProtocolError> {
        let raw = &self.buf[line.0..line.1];
        let n = parse_i64(raw).ok_or_else(|| ProtocolError::InvalidLength(lossy(raw)))?;
        if n < -1 {
            return Err(ProtocolError::InvalidLength(lossy(raw)));
        }
        Ok(n)
    }

    fn count(&self, count: i64) -> Result<usize, ProtocolError> {
        if count < 0 || count as u64 > self.limits.max_elements as u64 {
            return Err(ProtocolError::TooManyElements {
                count,
                limit: self.limits.max_elements,
            });
        }
        Ok(count as usize)
    }

    fn items(
        &mut self,
        count: i64,
        depth: usize,
        source: Option<&Bytes>,
    ) -> Step<Option<Vec<Frame>>> {
        let count = self.count(count)?;
        let mut items = source.map(|_| Vec::with_capacity(count.min(1024)));
        for _ in 0..count {
            let Some(item) = self.frame(depth + 1, source)? else {
                return Ok(None);
            };
            if let (Some(items), Some(item)) = (items.as_mut(), item) {
                items.push(item);
            }
        }
        Ok(Some(items))
    }

    fn pairs(
        &mut self,
        count: i64,
        depth: usize,
        source: Option<&Bytes>,
    ) -> Step<Option<Vec<(Frame, Frame)>>> {
        let count = self.count(count)?;
        let mut pairs = source.map(|_| Vec::with_capacity(count.min(1024)));
        for _ in 0..count {
            let Some(key) = self.frame(depth + 1, source)? else {
                return Ok(None);
            };
            let Some(value) = self.frame(depth + 1, source)? else {
                return Ok(None);
            };
            if let (Some(pairs), Some(key), Some(value)) = (pairs.as_mut(), key, value) {
                pairs.push((key, value));
            }
        }
        Ok(Some(pairs))
    }

    fn number(&self, line: (usize, usize), what: &'static str) -> Result<i64, ProtocolError> {
        let raw = &self.buf[line.0..line.1];
        parse_i64(raw).ok_or_else(|| invalid(what, raw))
    }

    fn double(&self, line: (usize, usize)) -> Result<f64, ProtocolError> {
        let raw = &self.buf[line.0..line.1];
        let text = std::str::from_utf8(raw).map_err(|_| invalid("double", raw))?;
        match text {
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            "nan" => Ok(f64::NAN),
            _ => text.parse().map_err(|_| invalid("double", raw)),
        }
    }
}

pub(crate) fn parse_i64(raw: &[u8]) -> Option<i64> {
    std::str::from_utf8(raw).ok()?.parse().ok()
}

fn invalid(what: &'static str, raw: &[u8]) -> ProtocolError {
    ProtocolError::InvalidValue {
        what,
        text: lossy(raw),
    }
}

pub(crate) fn lossy(raw: &[u8]) -> String {
    String::from_utf8_lossy(&raw[..raw.len().min(64)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode;

    fn sample() -> Vec<Frame> {
        vec![
            Frame::Simple("OK".into()),
            Frame::Error("ERR bad".into()),
            Frame::BulkError("SYNTAX x".into()),
            Frame::Integer(-42),
            Frame::Bulk(Bytes::from_static(b"a\r\nb")),
            Frame::Bulk(Bytes::new()),
            Frame::Null,
            Frame::Null3,
            Frame::NullArray,
            Frame::Array(vec![Frame::Integer(1), Frame::Array(vec![]), Frame::Null]),
            Frame::Map(vec![(Frame::Simple("k".into()), Frame::Double(1.5))]),
            Frame::Set(vec![Frame::Boolean(true), Frame::Boolean(false)]),
            Frame::Double(f64::INFINITY),
            Frame::BigNumber("123456789012345678901234567890".into()),
            Frame::Verbatim {
                format: *b"txt",
                text: "hello".into(),
            },
            Frame::Push(vec![Frame::Bulk("message".into())]),
            Frame::Attribute {
                attributes: vec![(Frame::Simple("ttl".into()), Frame::Integer(3))],
                value: Box::new(Frame::Bulk("v".into())),
            },
        ]
    }

    #[test]
    fn every_frame_round_trips_and_is_measured_exactly() {
        for frame in sample() {
            let mut wire = BytesMut::new();
            encode(&frame, &mut wire);
            let len = wire.len();
            wire.extend_from_slice(b"+next\r\n");
            assert_eq!(
                frame_len(&wire, &Limits::default()).unwrap(),
                Some(len),
                "{frame:?}"
            );
            assert_eq!(parse(&mut wire, &Limits::default()).unwrap(), Some(frame));
            assert_eq!(&wire[..], b"+next\r\n");
        }
    }

    #[test]
    fn incomplete_input_consumes_nothing_at_every_cut() {
        let whole = encode_one(&Frame::Array(sample()));
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(
                parse(&mut buf, &Limits::default()).unwrap(),
                None,
                "cut at {cut}"
            );
            assert_eq!(buf.len(), cut);
        }
    }

    fn encode_one(frame: &Frame) -> BytesMut {
        let mut out = BytesMut::new();
        encode(frame, &mut out);
        out
    }

    #[test]
    fn limits_and_garbage_give_typed_errors() {
        let limits = Limits {
            max_frame_bytes: 16,
            max_elements: 2,
            max_depth: 1,
            max_inline_bytes: 8,
        };
        let cases: [(&[u8], ProtocolError); 6] = [
            (b"$100\r\n", ProtocolError::FrameTooLarge { limit: 16 }),
            (
                b"*3\r\n",
                ProtocolError::TooManyElements { count: 3, limit: 2 },
            ),
            (
                b"*1\r\n*1\r\n*1\r\n:1\r\n",
                ProtocolError::TooDeep { limit: 1 },
            ),
            (b"+123456789", ProtocolError::LineTooLong { limit: 8 }),
            (b"?x\r\n", ProtocolError::UnknownType(b'?')),
            (b"$1\r\nab\r\n", ProtocolError::MissingCrlf),
        ];
        for (input, expected) in cases {
            assert_eq!(frame_len(input, &limits), Err(expected), "{input:?}");
        }
        assert!(matches!(
            frame_len(b":12x\r\n", &Limits::default()),
            Err(ProtocolError::InvalidValue {
                what: "integer",
                ..
            })
        ));
    }
}
