//! What a server reads from a client: a RESP array of bulk strings, or an inline command line
//! (`PING\r\n`, as telnet and `redis-cli` in some modes send), both bounded by [`Limits`].

use std::fmt;

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::encode::{command_len, encode_command};
use crate::parse::{bulk_payload, lossy, parse_i64, Walker};
use crate::{Limits, ProtocolError};

/// A command's words, borrowed from it; on the stack for all but long commands (MSET of ten pairs
/// is 21 words).
pub type Argv<'a> = SmallVec<[&'a [u8]; 24]>;

/// One command as a client sent it: its words stay where they arrived, in the client's frame.
///
/// The words are spans into one shared buffer rather than a refcounted slice each: a command is
/// read, admitted and forwarded on every request, and twenty refcount increments and decrements
/// (MSET of ten pairs) cost more than the rest of the parse.
#[derive(Clone)]
pub struct Command {
    /// The client's frame, or for an inline command its words unescaped, one after another.
    bytes: Bytes,
    /// Where each word (the name, then the arguments) lies in `bytes`; never empty. In 32 bits
    /// (a command is at most [`MAX_COMMAND_BYTES`]): a command is moved from stage to stage of
    /// its planning, and wider spans made it a third larger.
    words: SmallVec<[Span; 5]>,
    /// `bytes` is exactly what [`encode_command`] would write for the words.
    canonical: bool,
}

/// Where a word lies in its command's bytes: start and end.
type Span = (u32, u32);

/// The most bytes one command may take, whatever the configured limit: its words' places are
/// kept in 32 bits.
pub const MAX_COMMAND_BYTES: usize = u32::MAX as usize;

fn span_of((start, end): (usize, usize)) -> Span {
    // Both within a command, which is checked against `MAX_COMMAND_BYTES` as it is read.
    (start as u32, end as u32)
}

fn range(&(start, end): &Span) -> std::ops::Range<usize> {
    start as usize..end as usize
}

impl Command {
    /// How many words: the name and its arguments.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// The bytes the client sent for it (for an inline command, its words' bytes).
    pub fn wire_len(&self) -> usize {
        self.bytes.len()
    }

    /// Never true: empty commands are skipped as they are read.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The command's name as the client spelled it.
    pub fn name(&self) -> &[u8] {
        self.word(0).unwrap_or_default()
    }

    /// Word `at`; 0 is the name.
    pub fn word(&self, at: usize) -> Option<&[u8]> {
        self.words.get(at).map(|word| &self.bytes[range(word)])
    }

    /// Every word in order, borrowed.
    pub fn words(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.words.iter().map(|word| &self.bytes[range(word)])
    }

    /// Every word, borrowed, as a slice for callers that take one.
    pub fn argv(&self) -> Argv<'_> {
        self.words().collect()
    }

    /// Word `at` as its own [`Bytes`] sharing the command's buffer: a reference count, not a copy.
    /// What keeps it for long must copy it, or it keeps the whole read buffer alive.
    pub fn shared_word(&self, at: usize) -> Option<Bytes> {
        self.words.get(at).map(|word| self.bytes.slice(range(word)))
    }

    /// Every word as its own [`Bytes`] sharing the command's buffer, for words kept beyond the
    /// command (channel names).
    pub fn shared_argv(&self) -> Vec<Bytes> {
        self.words
            .iter()
            .map(|word| self.bytes.slice(range(word)))
            .collect()
    }

    /// The command as a RESP array of bulk strings, the form every Redis server accepts: the client's
    /// own bytes when they are already that (as from every client library), so forwarding a command
    /// costs no copy; encoded afresh otherwise (inline commands, lengths written as `$05`).
    pub fn encoded(&self) -> Bytes {
        if self.canonical {
            return self.bytes.clone();
        }
        let argv = self.argv();
        let mut out = BytesMut::with_capacity(command_len(argv.iter().map(|word| word.len())));
        encode_command(&argv, &mut out);
        out.freeze()
    }
}

impl PartialEq for Command {
    fn eq(&self, other: &Command) -> bool {
        self.words().eq(other.words())
    }
}

impl Eq for Command {}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.words().map(lossy)).finish()
    }
}

/// Parses and consumes one command; empty lines and empty arrays are skipped as Redis does.
pub fn parse_command(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<Command>, ProtocolError> {
    loop {
        let Some(&first) = buf.first() else {
            return Ok(None);
        };
        let parsed = if first == b'*' {
            multibulk(buf, limits)?
        } else {
            inline(buf, limits)?
        };
        match parsed {
            None => return Ok(None),
            Some(command) if command.is_empty() => continue,
            Some(command) => return Ok(Some(command)),
        }
    }
}

fn multibulk(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Command>, ProtocolError> {
    let mut walker = Walker::new(buf, limits);
    // Nearly every header is `*N\r\n` with one digit: read in place, without looking for the end
    // of the line.
    let count = match buf.get(1..4) {
        Some(&[digit @ b'0'..=b'9', b'\r', b'\n']) => {
            walker.pos = 4;
            Some(i64::from(digit - b'0'))
        }
        _ => {
            walker.pos = 1;
            let Some(line) = walker.line()? else {
                return Ok(None);
            };
            parse_i64(&buf[line.0..line.1])
        }
    };
    // Read as Redis reads it: not a number, or more arguments than are taken (Redis's own cap is
    // `INT_MAX`), is an invalid multibulk length; zero or less is an empty command, skipped.
    let count = match count {
        Some(count) if count <= limits.max_elements.min(i32::MAX as usize) as i64 => count,
        _ => return Err(ProtocolError::InvalidMultibulkLength),
    };
    // Sized from the header, but not trusting it beyond a typical command: the count is the
    // client's claim, not yet backed by bytes.
    let mut words = SmallVec::with_capacity(count.clamp(0, 64) as usize);
    // Lengths have one shortest spelling (no sign, no leading zero), so a frame whose every
    // length is spelled so is byte for byte its encoding. Known as the words are measured, while
    // every header is the usual one; otherwise counted at the end.
    let mut shortest = walker.pos == 4;
    for _ in 0..count.max(0) {
        // Nearly every argument is a well-formed bulk string: measured directly. Anything else
        // (incomplete, malformed) goes the general way, which says what is wrong.
        let span = match bulk_payload(buf, walker.pos, limits) {
            Some(span) => {
                // `$`, the digits, CRLF: a leading zero is the only longer spelling left.
                let digits = span.0 - walker.pos - 3;
                shortest &= digits == 1 || buf[walker.pos + 1] != b'0';
                walker.pos = span.1 + 2;
                span
            }
            None => match argument(&mut walker)? {
                Some(span) => {
                    shortest = false;
                    span
                }
                None => return Ok(None),
            },
        };
        let limit = limits.max_frame_bytes.min(MAX_COMMAND_BYTES);
        if walker.pos > limit {
            return Err(ProtocolError::FrameTooLarge { limit });
        }
        words.push(span_of(span));
    }
    let consumed = walker.pos;
    let canonical = shortest || consumed == command_len(words.iter().map(|word| range(word).len()));
    Ok(Some(Command {
        bytes: buf.split_to(consumed).freeze(),
        words,
        canonical,
    }))
}

/// One argument through the [`Walker`]: its span, `None` while incomplete, or what is wrong.
fn argument(walker: &mut Walker) -> Result<Option<(usize, usize)>, ProtocolError> {
    let Some(tag) = walker.peek() else {
        return Ok(None);
    };
    if tag != b'$' {
        return Err(ProtocolError::ExpectedBulk(tag));
    }
    walker.pos += 1;
    let Some(line) = walker.line()? else {
        return Ok(None);
    };
    // A length past the limit is Redis's "invalid bulk length" too (its `proto-max-bulk-len`).
    match walker.length(line) {
        Ok(len) if len >= 0 => walker.blob(len as usize).map_err(|error| match error {
            ProtocolError::FrameTooLarge { .. } => ProtocolError::InvalidBulkLength,
            error => error,
        }),
        _ => Err(ProtocolError::InvalidBulkLength),
    }
}

fn inline(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Command>, ProtocolError> {
    let limit = limits.max_inline_bytes.min(MAX_COMMAND_BYTES - 1);
    let window = &buf[..buf.len().min(limit + 1)];
    let Some(newline) = window.iter().position(|&b| b == b'\n') else {
        if window.len() > limit {
            return Err(ProtocolError::LineTooLong { limit });
        }
        return Ok(None);
    };
    let line = &buf[..newline];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let command = split_inline(line)?;
    buf.advance(newline + 1);
    Ok(Some(command))
}

/// Splits on whitespace; double quotes (with `\"`, `\\`, `\n`, `\r`, `\t` escapes) and single quotes
/// group words, as `redis-cli` and telnet users expect.
fn split_inline(line: &[u8]) -> Result<Command, ProtocolError> {
    let mut bytes = Vec::with_capacity(line.len());
    let mut words = SmallVec::new();
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == line.len() {
            break;
        }
        let start = bytes.len();
        let word = &mut bytes;
        match line[i] {
            quote @ (b'"' | b'\'') => {
                i += 1;
                loop {
                    let Some(&b) = line.get(i) else {
                        return Err(ProtocolError::UnbalancedQuotes);
                    };
                    i += 1;
                    if b == quote {
                        break;
                    }
                    if b == b'\\' && quote == b'"' {
                        let Some(&escaped) = line.get(i) else {
                            return Err(ProtocolError::UnbalancedQuotes);
                        };
                        i += 1;
                        word.push(match escaped {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            other => other,
                        });
                    } else {
                        word.push(b);
                    }
                }
                if line.get(i).is_some_and(|b| !b.is_ascii_whitespace()) {
                    return Err(ProtocolError::UnbalancedQuotes);
                }
            }
            _ => {
                while i < line.len() && !line[i].is_ascii_whitespace() {
                    word.push(line[i]);
                    i += 1;
                }
            }
        }
        words.push(span_of((start, bytes.len())));
    }
    Ok(Command {
        bytes: Bytes::from(bytes),
        words,
        canonical: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8]) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(command) = parse_command(&mut buf, &Limits::default())? {
            let mut again = BytesMut::new();
            encode_command(&command.argv(), &mut again);
            assert_eq!(
                &command.encoded()[..],
                &again[..],
                "encoded() is the canonical encoding"
            );
            out.push(command.shared_argv());
        }
        assert!(buf.is_empty(), "left over: {buf:?}");
        Ok(out)
    }

    #[test]
    fn reads_multibulk_and_inline_commands_and_skips_empty_ones() {
        let got =
            all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n\r\nPING\r\n*0\r\nset k \"a b\\n\" 'c'\n").unwrap();
        assert_eq!(
            got,
            vec![
                vec![Bytes::from("GET"), Bytes::from("k")],
                vec![Bytes::from("PING")],
                vec![
                    Bytes::from("set"),
                    Bytes::from("k"),
                    Bytes::from("a b\n"),
                    Bytes::from("c")
                ],
            ]
        );
    }

    #[test]
    fn a_count_of_zero_or_less_is_an_empty_command_skipped_as_redis_skips_it() {
        let got = all(b"*-10\r\n*-1\r\n*0\r\n*1\r\n$4\r\nPING\r\n").unwrap();
        assert_eq!(got, vec![vec![Bytes::from("PING")]]);
    }

    #[test]
    fn waits_for_the_rest_of_a_split_command() {
        let whole = b"*2\r\n$3\r\nGET\r\n$5\r\nhello\r\n";
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(
                parse_command(&mut buf, &Limits::default()).unwrap(),
                None,
                "cut at {cut}"
            );
            assert_eq!(buf.len(), cut, "nothing consumed at {cut}");
        }
    }

    #[test]
    fn rejects_non_bulk_elements_long_lines_and_bad_quotes() {
        let limits = Limits {
            max_inline_bytes: 8,
            ..Limits::default()
        };
        let mut buf = BytesMut::from(&b"*1\r\n:1\r\n"[..]);
        assert_eq!(
            parse_command(&mut buf, &limits),
            Err(ProtocolError::ExpectedBulk(b':'))
        );
        let mut buf = BytesMut::from(&b"PING PING PING"[..]);
        assert_eq!(
            parse_command(&mut buf, &limits),
            Err(ProtocolError::LineTooLong { limit: 8 })
        );
        let mut buf = BytesMut::from(&b"GET \"k\r\n"[..]);
        assert_eq!(
            parse_command(&mut buf, &Limits::default()),
            Err(ProtocolError::UnbalancedQuotes)
        );
        // Redis's words for lengths it will not take.
        let mut buf = BytesMut::from(&b"*1\r\n$99999999999\r\n"[..]);
        assert_eq!(
            parse_command(&mut buf, &Limits::default()),
            Err(ProtocolError::InvalidBulkLength)
        );
        let mut buf = BytesMut::from(&b"*3\r\n"[..]);
        let small = Limits {
            max_elements: 2,
            ..Limits::default()
        };
        assert_eq!(
            parse_command(&mut buf, &small),
            Err(ProtocolError::InvalidMultibulkLength)
        );
        let mut buf = BytesMut::from(&b"*3000000000\r\n"[..]);
        assert_eq!(
            parse_command(&mut buf, &Limits::default()),
            Err(ProtocolError::InvalidMultibulkLength)
        );
    }

    #[test]
    fn forwards_the_clients_own_bytes_only_when_they_are_canonical() {
        let canonical = b"*2\r\n$3\r\nGET\r\n$10\r\n0123456789\r\n";
        let mut buf = BytesMut::from(&canonical[..]);
        let before = buf.as_ptr();
        let command = parse_command(&mut buf, &Limits::default())
            .unwrap()
            .unwrap();
        let encoded = command.encoded();
        assert_eq!(&encoded[..], &canonical[..]);
        assert_eq!(encoded.as_ptr(), before, "the client's bytes, not a copy");

        // Redis rejects `$03`, so a non-canonical spelling is re-encoded rather than forwarded.
        let mut buf = BytesMut::from(&b"*2\r\n$03\r\nGET\r\n$+1\r\nk\r\n"[..]);
        let command = parse_command(&mut buf, &Limits::default())
            .unwrap()
            .unwrap();
        assert_eq!(&command.encoded()[..], b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }

    #[test]
    fn a_command_stays_small_enough_to_move_cheaply() {
        // It is moved through every stage of a request's planning: the spans are kept in 32 bits
        // so that it is 96 bytes rather than 128.
        assert!(std::mem::size_of::<Command>() <= 96);
        let mut buf = BytesMut::from(
            &b"*6\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nd\r\n$1\r\ne\r\n$1\r\nf\r\n"[..],
        );
        let command = parse_command(&mut buf, &Limits::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            command.words().collect::<Vec<_>>(),
            [b"a", b"b", b"c", b"d", b"e", b"f"]
        );
        assert_eq!(command.shared_word(5).unwrap(), &b"f"[..]);
    }

    #[test]
    fn a_command_is_canonical_exactly_when_its_bytes_are_its_encoding() {
        let spellings: [&[u8]; 10] = [
            b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n",
            b"*2\r\n$3\r\nGET\r\n$00\r\n\r\n",
            b"*2\r\n$3\r\nGET\r\n$01\r\nk\r\n",
            b"*2\r\n$03\r\nGET\r\n$1\r\nk\r\n",
            b"*2\r\n$3\r\nGET\r\n$+1\r\nk\r\n",
            b"*02\r\n$3\r\nGET\r\n$1\r\nk\r\n",
            b"*+2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
            b"*12\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nd\r\n$1\r\ne\r\n$1\r\nf\r\n$1\r\ng\r\n$1\r\nh\r\n$1\r\ni\r\n$1\r\nj\r\n$1\r\nk\r\n$10\r\n0123456789\r\n",
            b"*1\r\n$10\r\n0123456789\r\n",
            b"*1\r\n$010\r\n0123456789\r\n",
        ];
        for spelling in spellings {
            let mut buf = BytesMut::from(spelling);
            let command = parse_command(&mut buf, &Limits::default())
                .unwrap()
                .unwrap();
            let mut encoded = BytesMut::new();
            encode_command(&command.words().collect::<Vec<_>>(), &mut encoded);
            assert_eq!(
                command.canonical,
                encoded[..] == spelling[..],
                "{}",
                String::from_utf8_lossy(spelling)
            );
            assert_eq!(command.encoded()[..], encoded[..]);
        }
    }
}
