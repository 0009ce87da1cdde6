//! The bounded incremental parser: `Ok(None)` until a whole frame is buffered, a typed error when the
//! bytes are not RESP or break a limit. One walker serves both [`parse`] (builds the frame) and
//! [`frame_len`] (only measures it, for replies passed through unchanged).
//!
//! Measuring is iterative: the [`Scanner`] keeps the open aggregates on the heap, so nesting costs
//! only bytes and no depth is refused there (a Lua table 1,000 deep is a valid reply). Building a
//! [`Frame`] recurses, and so does dropping one: only [`parse`] refuses nesting past `max_depth`.

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::Frame;

/// Bounds on what one frame may hold, so that a peer cannot make us buffer or nest without limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest encoded frame, and largest single bulk string.
    pub max_frame_bytes: usize,
    /// Most elements in one aggregate (array, map pairs, set, push).
    pub max_elements: usize,
    /// Deepest nesting of aggregates in a frame [`parse`] builds; measuring ([`Scanner`]) has none.
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
pub enum ProtocolError {
    #[error("Protocol error: unknown frame type byte 0x{0:02x}")]
    UnknownType(u8),
    #[error("Protocol error: invalid length `{0}`")]
    InvalidLength(String),
    #[error("Protocol error: invalid {what} `{text}`")]
    InvalidValue { what: &'static str, text: String },
    #[error("Protocol error: missing CRLF after a bulk string")]
    MissingCrlf,
    #[error("Protocol error: frame larger than {limit} bytes")]
    FrameTooLarge { limit: usize },
    #[error("Protocol error: aggregate of {count} elements exceeds {limit}")]
    TooManyElements { count: i64, limit: usize },
    #[error("Protocol error: nesting deeper than {limit}")]
    TooDeep { limit: usize },
    #[error("Protocol error: line longer than {limit} bytes")]
    LineTooLong { limit: usize },
    /// A command's argument count is not a number (Redis's text).
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    /// A command's argument length is not a length (Redis's text).
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    #[error("Protocol error: expected '$', got '{}'", char::from(*.0))]
    ExpectedBulk(u8),
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
}

/// Parses and consumes one frame from the front of `buf`; `Ok(None)` leaves `buf` untouched. A
/// complete frame nested deeper than `max_depth` is consumed all the same and refused
/// ([`ProtocolError::TooDeep`]), so that what follows it can still be read.
pub fn parse(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Frame>, ProtocolError> {
    let Some(len) = frame_len(buf, limits)? else {
        return Ok(None);
    };
    let bytes = buf.split_to(len).freeze();
    let mut walker = Walker::new(&bytes, limits);
    let frame = walker
        .frame(&bytes, 0)?
        .expect("a measured frame is complete");
    Ok(Some(frame))
}

/// The length of the first complete frame in `buf`, without building it.
pub fn frame_len(buf: &[u8], limits: &Limits) -> Result<Option<usize>, ProtocolError> {
    Scanner::default().scan(buf, limits)
}

/// Measures the first frame of a buffer that grows between calls, resuming where the previous call
/// stopped: a large aggregate arriving over many reads is scanned once, not once per read.
/// Between calls the caller may only append to the buffer; after `Ok(Some(len))` the scanner starts
/// over for the next frame.
#[derive(Debug, Default, Clone)]
pub struct Scanner {
    /// Start of the first element not yet scanned.
    pos: usize,
    /// Children still expected by each open aggregate, innermost last; replies nest shallowly,
    /// and a vector here cost an allocation per array reply.
    open: SmallVec<[usize; 4]>,
}

/// What one element header turned out to be.
enum Element {
    /// Complete by itself (a scalar, a string, an empty or null aggregate).
    Whole,
    /// An aggregate that completes after this many more elements.
    Open(usize),
}

impl Scanner {
    /// `Ok(Some(len))` once the first frame of `buf` is complete; `Ok(None)` to wait for more bytes.
    pub fn scan(&mut self, buf: &[u8], limits: &Limits) -> Result<Option<usize>, ProtocolError> {
        loop {
            // A run of bulk strings inside the innermost aggregate (the replies of LRANGE, MGET,
            // HGETALL …) is measured without going through the stack for each: all but its last
            // element, which may complete the aggregate and goes the usual way below.
            self.run_of_strings(buf, limits)?;
            let element = if let Some(end) = bulk_end(buf, self.pos, limits) {
                self.pos = end;
                Element::Whole
            } else if let Some((end, element)) = short_element(buf, self.pos, limits) {
                self.pos = end;
                element
            } else {
                let mut walker = Walker::new(buf, limits);
                walker.pos = self.pos;
                let Some(element) = walker.element()? else {
                    return Ok(None);
                };
                self.pos = walker.pos;
                element
            };
            match element {
                Element::Open(children) => self.open.push(children),
                Element::Whole => {
                    while let Some(remaining) = self.open.last_mut() {
                        *remaining -= 1;
                        if *remaining > 0 {
                            break;
                        }
                        self.open.pop();
                    }
                }
            }
            // Checked once the element is counted, so that the scanner still knows where the frame
            // stands after this error (see [`Scanner::discard`]).
            within_frame(self.pos, limits)?;
            if self.open.is_empty() {
                let len = self.pos;
                *self = Scanner::default();
                return Ok(Some(len));
            }
        }
    }

    /// Measures all but the last of a run of bulk strings inside the innermost open aggregate.
    /// Position and count are kept in locals and stored once: written back through `self` on each
    /// element, they cost a third of the loop.
    #[inline]
    fn run_of_strings(&mut self, buf: &[u8], limits: &Limits) -> Result<(), ProtocolError> {
        let Some(remaining) = self.open.last_mut() else {
            return Ok(());
        };
        // The short path written out here rather than through `bulk_end`, with the limits checked
        // once for the run: calling `bulk_end` per element (even forced inline) cost 6% more
        // instructions at `-P 16` LRANGE_100 (15,700 against 14,771 a request).
        let shorts = short_bulks_allowed(limits);
        let (mut pos, mut left) = (self.pos, *remaining);
        let mut measured = Ok(());
        while left > 1 {
            let short = match shorts {
                true => short_bulk_header(buf, pos),
                false => None,
            };
            let end = match short {
                Some((start, len)) if buf.get(start + len..start + len + 2) == Some(b"\r\n") => {
                    start + len + 2
                }
                // Incomplete or not well formed: the general path says which.
                Some(_) => break,
                None => match bulk_end(buf, pos, limits) {
                    Some(end) => end,
                    None => break,
                },
            };
            pos = end;
            left -= 1;
            // Checked once the element is counted, as in `scan`.
            measured = within_frame(pos, limits);
            if measured.is_err() {
                break;
            }
        }
        self.pos = pos;
        *remaining = left;
        measured
    }

    /// After [`ProtocolError::FrameTooLarge`], drops what is measured of the frame from the front
    /// of `buf`, so that a reader can read past a frame too large to keep instead of failing the
    /// stream. Until it says [`Discarded::Whole`], scan again after each read and discard again
    /// after each `Ok(None)` or `FrameTooLarge`; the `Ok(Some(len))` that ends the frame is its
    /// last `len` bytes, to drop too.
    pub fn discard(&mut self, buf: &mut BytesMut) -> Discarded {
        let dropped = self.pos;
        buf.advance(dropped);
        self.pos = 0;
        if dropped > 0 && self.open.is_empty() {
            Discarded::Whole
        } else {
            Discarded::Part { dropped }
        }
    }
}

/// Whether a frame measured up to `pos` is still within the limit.
fn within_frame(pos: usize, limits: &Limits) -> Result<(), ProtocolError> {
    match pos > limits.max_frame_bytes {
        true => Err(ProtocolError::FrameTooLarge {
            limit: limits.max_frame_bytes,
        }),
        false => Ok(()),
    }
}

/// What [`Scanner::discard`] dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discarded {
    /// The rest of the frame: what follows is the next frame.
    Whole,
    /// Part of the frame; more of it is to come. Nothing dropped after `FrameTooLarge` means one
    /// string by itself is over the limit: the stream cannot be read past it.
    Part { dropped: usize },
}

/// The end of the most common short elements at `pos`, as the [`Walker`] would measure them: an
/// integer of at most 18 digits (`:n`, the reply of `INCR`, `LPUSH` and the lease scripts), a
/// one-digit array header (`*n`, n ≥ 1) and `+OK`. Each went through the walker's line search
/// and number parser, which cost several times what these checks do. `None` for anything else,
/// which the walker then measures (and says what is wrong with).
fn short_element(buf: &[u8], pos: usize, limits: &Limits) -> Option<(usize, Element)> {
    let rest = buf.get(pos..)?;
    match *rest.first()? {
        b':' => {
            let sign = usize::from(rest.get(1) == Some(&b'-'));
            let digits = rest[1 + sign..]
                .iter()
                .take(19)
                .take_while(|b| b.is_ascii_digit())
                .count();
            let end = 1 + sign + digits;
            ((1..=18).contains(&digits) && rest.get(end..end + 2)? == b"\r\n")
                .then_some((pos + end + 2, Element::Whole))
        }
        b'*' => match *rest.get(1..4)? {
            [digit @ b'1'..=b'9', b'\r', b'\n']
                if usize::from(digit - b'0') <= limits.max_elements =>
            {
                Some((pos + 4, Element::Open(usize::from(digit - b'0'))))
            }
            _ => None,
        },
        b'+' => (rest.get(..5)? == b"+OK\r\n").then_some((pos + 5, Element::Whole)),
        _ => None,
    }
}

/// The end of a complete and well-formed bulk string (`$<len>\r\n<payload>\r\n`) at `pos`. Most of
/// what Redis sends back is such strings, and measuring one this way is a few times faster than
/// through the [`Walker`]. `None` for anything else (another type, a null, a bad or incomplete
/// string): the walker then measures it and says what is wrong.
fn bulk_end(buf: &[u8], pos: usize, limits: &Limits) -> Option<usize> {
    bulk_payload(buf, pos, limits).map(|(_, end)| end + 2)
}

/// Where the payload of a complete and well-formed bulk string at `pos` lies, as [`bulk_end`]
/// recognises one. Client commands are arrays of such strings.
#[inline]
pub(crate) fn bulk_payload(buf: &[u8], pos: usize, limits: &Limits) -> Option<(usize, usize)> {
    if short_bulks_allowed(limits) {
        if let Some((start, len)) = short_bulk_header(buf, pos) {
            let end = start + len;
            return (buf.get(end..end + 2)? == b"\r\n").then_some((start, end));
        }
    }
    bulk_payload_by_digits(buf, pos, limits)
}

/// [`bulk_payload`]'s general path: any length, digit by digit.
fn bulk_payload_by_digits(buf: &[u8], pos: usize, limits: &Limits) -> Option<(usize, usize)> {
    let header = buf.get(pos..)?.strip_prefix(b"$")?;
    // Digits read and summed in one pass; 18 cannot overflow, and longer lengths are past any
    // limit and go the general way.
    let mut len = 0usize;
    let mut digits = 0;
    while let Some(digit) = header
        .get(digits)
        .map(|b| b.wrapping_sub(b'0'))
        .filter(|&d| d <= 9 && digits < 18)
    {
        len = len * 10 + usize::from(digit);
        digits += 1;
    }
    if digits == 0 || digits > limits.max_inline_bytes || header.get(digits..digits + 2)? != b"\r\n"
    {
        return None;
    }
    if len > limits.max_frame_bytes {
        return None;
    }
    let start = pos + 1 + digits + 2;
    let end = start + len;
    (buf.get(end..end + 2)? == b"\r\n").then_some((start, end))
}

/// The payload's start and length of a bulk string at `pos` whose length has one or two digits
/// (`$3\r\n`, `$42\r\n`: a command's words, and the elements of most multi-string replies), read
/// from the header's first bytes at once rather than digit by digit. In a run of strings each
/// header's position waits on the previous length, so the steps to a length are the scanner's
/// critical path (LRANGE's 100 short strings: a tenth of the daemon's cycles at `-P 16`). `None`
/// for anything else, which the general path then reads: what this accepts, it accepts too, under
/// limits that [`short_bulks_allowed`].
#[inline(always)]
fn short_bulk_header(buf: &[u8], pos: usize) -> Option<(usize, usize)> {
    const ONE_DIGIT: u32 = u32::from_le_bytes([b'$', 0, b'\r', b'\n']);
    const TWO_DIGITS: u32 = u32::from_le_bytes([b'$', 0, 0, b'\r']);
    let head = buf.get(pos..pos + 4)?;
    let word = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let first = head[1].wrapping_sub(b'0');
    if word & 0xFFFF_00FF == ONE_DIGIT && first <= 9 {
        return Some((pos + 4, usize::from(first)));
    }
    let second = head[2].wrapping_sub(b'0');
    (word & 0xFF00_00FF == TWO_DIGITS
        && first <= 9
        && second <= 9
        && buf.get(pos + 4) == Some(&b'\n'))
    .then(|| (pos + 5, usize::from(first) * 10 + usize::from(second)))
}

/// Whether `limits` accept every string [`short_bulk_header`] reads (two digits, 99 bytes), so
/// that it may stand in for the general path.
fn short_bulks_allowed(limits: &Limits) -> bool {
    limits.max_inline_bytes >= 2 && limits.max_frame_bytes >= 99
}

/// Walks one frame: [`Walker::element`] checks and measures one element header for the [`Scanner`];
/// [`Walker::frame`] builds a whole frame from bytes already measured, slicing bulk strings out of
/// the source without copying.
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

    /// One element header (with its payload, for strings); `Ok(None)` if it is not all buffered.
    fn element(&mut self) -> Step<Element> {
        let Some(tag) = self.peek() else {
            return Ok(None);
        };
        self.pos += 1;
        let Some(line) = self.line()? else {
            return Ok(None);
        };
        Ok(Some(match tag {
            b'+' | b'-' | b'(' | b'_' => Element::Whole,
            b':' => {
                self.number(line, "integer")?;
                Element::Whole
            }
            b',' => {
                self.double(line)?;
                Element::Whole
            }
            b'#' => {
                self.boolean(line)?;
                Element::Whole
            }
            b'$' | b'!' | b'=' => match self.string(tag, line)? {
                None => return Ok(None),
                Some(span) => {
                    if tag == b'=' {
                        self.verbatim(span)?;
                    }
                    Element::Whole
                }
            },
            b'*' | b'~' | b'>' | b'%' | b'|' => match self.aggregate(tag, line)? {
                // Attributes annotate the reply that follows; together they are one reply.
                // Saturating: a count Redis could never back with bytes must not overflow.
                Some(count) if tag == b'|' => {
                    Element::Open(count.saturating_mul(2).saturating_add(1))
                }
                None | Some(0) => Element::Whole,
                Some(count) if tag == b'%' => Element::Open(count.saturating_mul(2)),
                Some(count) => Element::Open(count),
            },
            other => return Err(ProtocolError::UnknownType(other)),
        }))
    }

    /// Builds the frame at `pos`, which is nested `depth` aggregates deep; `source` holds the same
    /// bytes as `buf`, shared.
    fn frame(&mut self, source: &Bytes, depth: usize) -> Step<Frame> {
        let Some(tag) = self.peek() else {
            return Ok(None);
        };
        if depth > self.limits.max_depth {
            return Err(ProtocolError::TooDeep {
                limit: self.limits.max_depth,
            });
        }
        self.pos += 1;
        let Some(line) = self.line()? else {
            return Ok(None);
        };
        let text = |line: (usize, usize)| source.slice(line.0..line.1);
        Ok(Some(match tag {
            b'+' => Frame::Simple(text(line)),
            b'-' => Frame::Error(text(line)),
            b'(' => Frame::BigNumber(text(line)),
            b'_' => Frame::Null3,
            b':' => Frame::Integer(self.number(line, "integer")?),
            b',' => Frame::Double(self.double(line)?),
            b'#' => Frame::Boolean(self.boolean(line)?),
            b'$' | b'!' | b'=' => {
                let Some(span) = self.string(tag, line)? else {
                    return Ok(None);
                };
                match (tag, span) {
                    (_, None) => Frame::Null,
                    (b'$', Some(span)) => Frame::Bulk(text(span)),
                    (b'!', Some(span)) => Frame::BulkError(text(span)),
                    (_, Some(span)) => {
                        let format = self.verbatim(Some(span))?;
                        Frame::Verbatim {
                            format,
                            text: source.slice(span.0 + 4..span.1),
                        }
                    }
                }
            }
            b'*' | b'~' | b'>' => {
                let Some(count) = self.aggregate(tag, line)? else {
                    return Ok(Some(Frame::NullArray));
                };
                let mut items = Vec::with_capacity(count.min(1024));
                for _ in 0..count {
                    let Some(item) = self.frame(source, depth + 1)? else {
                        return Ok(None);
                    };
                    items.push(item);
                }
                match tag {
                    b'*' => Frame::Array(items),
                    b'~' => Frame::Set(items),
                    _ => Frame::Push(items),
                }
            }
            b'%' | b'|' => {
                let count = self.aggregate(tag, line)?.unwrap_or_default();
                let mut pairs = Vec::with_capacity(count.min(1024));
                for _ in 0..count {
                    let (Some(key), Some(value)) = (
                        self.frame(source, depth + 1)?,
                        self.frame(source, depth + 1)?,
                    ) else {
                        return Ok(None);
                    };
                    pairs.push((key, value));
                }
                if tag == b'%' {
                    Frame::Map(pairs)
                } else {
                    let Some(value) = self.frame(source, depth + 1)? else {
                        return Ok(None);
                    };
                    Frame::Attribute {
                        attributes: pairs,
                        value: Box::new(value),
                    }
                }
            }
            other => return Err(ProtocolError::UnknownType(other)),
        }))
    }

    /// A `$`, `!` or `=` string: `Ok(Some(None))` for the RESP2 null bulk, `Ok(Some(Some(span)))`
    /// for the payload, `Ok(None)` while incomplete.
    fn string(&mut self, tag: u8, line: (usize, usize)) -> Step<Option<(usize, usize)>> {
        let len = self.length(line)?;
        if len < 0 {
            if tag != b'$' {
                return Err(ProtocolError::InvalidLength(lossy(
                    &self.buf[line.0..line.1],
                )));
            }
            return Ok(Some(None));
        }
        Ok(self.blob(len as usize)?.map(Some))
    }

    /// The element count of an aggregate header, `None` for the RESP2 null array.
    fn aggregate(&self, tag: u8, line: (usize, usize)) -> Result<Option<usize>, ProtocolError> {
        let count = self.length(line)?;
        if count < 0 {
            if tag != b'*' {
                return Err(ProtocolError::InvalidLength(lossy(
                    &self.buf[line.0..line.1],
                )));
            }
            return Ok(None);
        }
        if count as u64 > self.limits.max_elements as u64 {
            return Err(ProtocolError::TooManyElements {
                count,
                limit: self.limits.max_elements,
            });
        }
        Ok(Some(count as usize))
    }

    /// The three-letter format of a verbatim string (`txt:…`).
    fn verbatim(&self, span: Option<(usize, usize)>) -> Result<[u8; 3], ProtocolError> {
        let (start, end) = span.unwrap_or_default();
        let s = &self.buf[start..end];
        if s.len() < 4 || s[3] != b':' {
            return Err(invalid("verbatim string", s));
        }
        Ok([s[0], s[1], s[2]])
    }

    fn boolean(&self, line: (usize, usize)) -> Result<bool, ProtocolError> {
        match &self.buf[line.0..line.1] {
            b"t" => Ok(true),
            b"f" => Ok(false),
            other => Err(invalid("boolean", other)),
        }
    }

    /// The span of the line at `pos` without its CRLF; moves past the CRLF.
    pub(crate) fn line(&mut self) -> Step<(usize, usize)> {
        let rest = &self.buf[self.pos..];
        let window = &rest[..rest.len().min(self.limits.max_inline_bytes + 2)];
        match find_crlf(window) {
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

/// Where the first CRLF of `bytes` starts. Every reply passed through is measured line by line, so
/// this and [`parse_i64`] are the parser's innermost loop.
fn find_crlf(bytes: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = memchr::memchr(b'\r', &bytes[from..]) {
        let at = from + at;
        if bytes.get(at + 1) == Some(&b'\n') {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// A decimal `i64` as `str::parse` reads it (optional sign, digits only, no overflow), without first
/// checking the bytes are UTF-8.
pub fn parse_i64(raw: &[u8]) -> Option<i64> {
    let (negative, digits) = match raw {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, raw),
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: i64 = 0;
    for &byte in digits {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(i64::from(digit))?
        } else {
            value.checked_add(i64::from(digit))?
        };
    }
    Some(value)
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

    #[test]
    fn a_scanner_fed_in_pieces_finds_the_same_frames() {
        let mut wire = BytesMut::new();
        for frame in sample() {
            encode(&frame, &mut wire);
        }
        encode(&Frame::Array(sample()), &mut wire);
        let mut expected = Vec::new();
        let mut at = 0;
        while let Some(len) = frame_len(&wire[at..], &Limits::default()).unwrap() {
            expected.push(len);
            at += len;
        }
        assert_eq!(at, wire.len());
        for piece in [1, 2, 3, 7, 64] {
            let (mut found, mut start, mut end) = (Vec::new(), 0, 0);
            let mut scanner = Scanner::default();
            while end < wire.len() {
                end = (end + piece).min(wire.len());
                while let Some(len) = scanner.scan(&wire[start..end], &Limits::default()).unwrap() {
                    found.push(len);
                    start += len;
                }
            }
            assert_eq!(found, expected, "pieces of {piece} bytes");
        }
    }

    #[test]
    fn runs_of_strings_are_measured_in_pieces_and_over_the_limit_as_element_by_element() {
        // Strings, then an aggregate and a scalar among them, then strings again.
        let mut items: Vec<Frame> = (0..40).map(|n| Frame::Bulk(vec![b'x'; n].into())).collect();
        items.push(Frame::Array(vec![Frame::Bulk("in".into()), Frame::Null]));
        items.push(Frame::Integer(7));
        items.extend((0..20).map(|n| Frame::Bulk(n.to_string().into_bytes().into())));
        let whole = encode_one(&Frame::Array(items));
        let len = whole.len();
        for piece in [1, 2, 3, 7, 64] {
            let mut scanner = Scanner::default();
            let mut end = 0;
            let found = loop {
                end = (end + piece).min(len);
                if let Some(found) = scanner.scan(&whole[..end], &Limits::default()).unwrap() {
                    break found;
                }
                assert!(end < len, "pieces of {piece} bytes");
            };
            assert_eq!((found, end), (len, len), "pieces of {piece} bytes");
        }
        // Over a byte limit, the scanner stops at the first element that ends past it.
        let mut ends = Vec::new();
        let unlimited = Limits::default();
        let mut walker = Walker::new(&whole, &unlimited);
        while walker.pos < len {
            walker.element().unwrap().unwrap();
            ends.push(walker.pos);
        }
        for limit in [5, 60, 300, 820, len - 1] {
            let limits = Limits {
                max_frame_bytes: limit,
                ..Limits::default()
            };
            let mut scanner = Scanner::default();
            let mut wire = BytesMut::from(&whole[..]);
            assert_eq!(
                scanner.scan(&wire, &limits),
                Err(ProtocolError::FrameTooLarge { limit })
            );
            // Up to the end of that element: all of the frame when it is the last.
            let first_past = *ends.iter().find(|&&end| end > limit).unwrap();
            let expected = match first_past == len {
                true => Discarded::Whole,
                false => Discarded::Part {
                    dropped: first_past,
                },
            };
            assert_eq!(scanner.discard(&mut wire), expected, "limit {limit}");
            assert_eq!(wire.len(), len - first_past);
        }
    }

    #[test]
    fn short_elements_are_measured_as_the_walker_measures_them() {
        let inputs: [&[u8]; 22] = [
            b":0\r\n",
            b":-1\r\n",
            b":007\r\n",
            b":123456789012345678\r\n",
            b":-123456789012345678\r\n",
            b":1234567890123456789\r\n",
            b":+7\r\n",
            b":\r\n",
            b":-\r\n",
            b":12a\r\n",
            b":12\r",
            b":12\rx",
            b"*1\r\n",
            b"*9\r\n",
            b"*0\r\n",
            b"*10\r\n",
            b"*-1\r\n",
            b"*5\r",
            b"+OK\r\n",
            b"+OKAY\r\n",
            b"+OK\n",
            b"+O",
        ];
        let narrow = Limits {
            max_elements: 3,
            ..Limits::default()
        };
        let mut taken = 0;
        for (buf, limits) in every_cut(&inputs, &[Limits::default(), narrow]) {
            let Some((end, element)) = short_element(buf, 0, limits) else {
                continue;
            };
            taken += 1;
            let mut walker = Walker::new(buf, limits);
            let walked = walker.element();
            let same = match (&element, walked) {
                (Element::Whole, Ok(Some(Element::Whole))) => true,
                (Element::Open(a), Ok(Some(Element::Open(b)))) => *a == b,
                _ => false,
            };
            assert!(same, "{:?}", lossy(buf));
            assert_eq!(end, walker.pos, "{:?}", lossy(buf));
        }
        // The fast path is taken, and only for whole elements: five integers, two headers and +OK
        // under the default limits; `*9` is past the narrow limit of three.
        assert_eq!(taken, 8 + 7);
    }

    #[test]
    fn short_bulk_headers_are_read_as_the_general_path_reads_them() {
        let inputs: [&[u8]; 14] = [
            b"$0\r\n\r\n",
            b"$3\r\nabc\r\n",
            b"$9\r\n123456789\r\n",
            b"$10\r\n0123456789\r\n",
            b"$03\r\nabc\r\n",
            b"$00\r\n\r\n",
            b"$99\r\n",
            b"$3\r\nabcd\r\n",
            b"$3\r\nab\r\n",
            b"$3\rx\nabc\r\n",
            b"$-1\r\n",
            b"$100\r\n",
            b"$a\r\n",
            b"$5\r\nab\r\n\r\n",
        ];
        let narrow = Limits {
            max_frame_bytes: 4,
            max_inline_bytes: 1,
            ..Limits::default()
        };
        let mut taken = 0;
        for (buf, limits) in every_cut(&inputs, &[Limits::default(), narrow]) {
            if !short_bulks_allowed(limits) || short_bulk_header(buf, 0).is_none() {
                continue;
            }
            taken += 1;
            assert_eq!(
                bulk_payload(buf, 0, limits),
                bulk_payload_by_digits(buf, 0, limits),
                "{:?}",
                lossy(buf)
            );
        }
        // Taken for every cut holding a whole header of one or two digits under the default
        // limits, and never under limits that would refuse some of what it reads.
        assert_eq!(taken, 63);
    }

    /// Every prefix of every input, under each of `limits`.
    fn every_cut<'a>(
        inputs: &'a [&'a [u8]],
        limits: &'a [Limits],
    ) -> impl Iterator<Item = (&'a [u8], &'a Limits)> + 'a {
        limits.iter().flat_map(move |limits| {
            inputs
                .iter()
                .flat_map(move |input| (0..=input.len()).map(move |cut| (&input[..cut], limits)))
        })
    }

    fn encode_one(frame: &Frame) -> BytesMut {
        let mut out = BytesMut::new();
        encode(frame, &mut out);
        out
    }

    /// `depth` arrays, each holding the next, around one integer, then `+next`.
    fn nested(depth: usize) -> Vec<u8> {
        let mut wire = b"*1\r\n".repeat(depth);
        wire.extend_from_slice(b":1\r\n+next\r\n");
        wire
    }

    #[test]
    fn measuring_has_no_depth_limit_and_resumes_at_any_cut() {
        let wire = nested(100_000);
        let len = wire.len() - b"+next\r\n".len();
        assert_eq!(frame_len(&wire, &Limits::default()), Ok(Some(len)));
        let mut scanner = Scanner::default();
        for cut in (0..len).step_by(4099) {
            assert_eq!(scanner.scan(&wire[..cut], &Limits::default()), Ok(None));
        }
        assert_eq!(scanner.scan(&wire, &Limits::default()), Ok(Some(len)));
    }

    #[test]
    fn a_frame_too_deep_to_build_is_consumed_and_what_follows_still_parses() {
        let limits = Limits::default();
        let mut within = BytesMut::from(&nested(limits.max_depth)[..]);
        assert!(matches!(
            parse(&mut within, &limits),
            Ok(Some(Frame::Array(_)))
        ));
        let mut beyond = BytesMut::from(&nested(limits.max_depth + 1)[..]);
        assert_eq!(
            parse(&mut beyond, &limits),
            Err(ProtocolError::TooDeep {
                limit: limits.max_depth
            })
        );
        assert_eq!(
            parse(&mut beyond, &limits),
            Ok(Some(Frame::Simple("next".into())))
        );
    }

    #[test]
    fn discarding_reads_past_a_frame_over_the_byte_limit_but_not_past_one_huge_string() {
        let limits = Limits {
            max_frame_bytes: 16,
            ..Limits::default()
        };
        let mut wire =
            BytesMut::from(&b"*3\r\n$5\r\naaaaa\r\n$5\r\nbbbbb\r\n$5\r\nccccc\r\n+next\r\n"[..]);
        let mut scanner = Scanner::default();
        assert_eq!(
            scanner.scan(&wire, &limits),
            Err(ProtocolError::FrameTooLarge { limit: 16 })
        );
        assert_eq!(scanner.discard(&mut wire), Discarded::Part { dropped: 26 });
        assert_eq!(scanner.scan(&wire, &limits), Ok(Some(11)));
        wire.advance(11);
        assert_eq!(scanner.scan(&wire, &limits), Ok(Some(7)));

        let mut huge = BytesMut::from(&b"$17\r\n"[..]);
        let mut scanner = Scanner::default();
        assert!(scanner.scan(&huge, &limits).is_err());
        assert_eq!(scanner.discard(&mut huge), Discarded::Part { dropped: 0 });
    }

    #[test]
    fn integers_read_as_str_parse_reads_them() {
        for text in [
            "0",
            "7",
            "-1",
            "+5",
            "",
            "-",
            "+",
            "--1",
            "1-",
            " 1",
            "12a",
            "\u{661}",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "00000000000000000000042",
        ] {
            assert_eq!(parse_i64(text.as_bytes()), text.parse().ok(), "{text:?}");
        }
    }

    #[test]
    fn limits_and_garbage_give_typed_errors() {
        let limits = Limits {
            max_frame_bytes: 16,
            max_elements: 2,
            max_depth: 1,
            max_inline_bytes: 8,
        };
        let cases: [(&[u8], ProtocolError); 7] = [
            (b"$100\r\n", ProtocolError::FrameTooLarge { limit: 16 }),
            (
                b"$17\r\n12345678901234567\r\n",
                ProtocolError::FrameTooLarge { limit: 16 },
            ),
            (
                b"*2\r\n$3\r\nabc\r\n$3\r\nabc\r\n",
                ProtocolError::FrameTooLarge { limit: 16 },
            ),
            (
                b"*3\r\n",
                ProtocolError::TooManyElements { count: 3, limit: 2 },
            ),
            (b"+123456789", ProtocolError::LineTooLong { limit: 8 }),
            (b"?x\r\n", ProtocolError::UnknownType(b'?')),
            (b"$1\r\nab\r\n", ProtocolError::MissingCrlf),
        ];
        for (input, expected) in cases {
            assert_eq!(frame_len(input, &limits), Err(expected), "{input:?}");
        }
        let mut deep = BytesMut::from(&b"*1\r\n*1\r\n*1\r\n:1\r\n"[..]);
        assert_eq!(
            parse(&mut deep, &limits),
            Err(ProtocolError::TooDeep { limit: 1 })
        );
        assert!(matches!(
            frame_len(b":12x\r\n", &Limits::default()),
            Err(ProtocolError::InvalidValue {
                what: "integer",
                ..
            })
        ));
    }
}
