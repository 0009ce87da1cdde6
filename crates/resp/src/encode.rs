//! Frames and commands to bytes.

use bytes::{BufMut, BytesMut};

use crate::Frame;

/// Appends the wire form of `frame` to `out`.
pub fn encode(frame: &Frame, out: &mut BytesMut) {
    match frame {
        Frame::Simple(s) => line(out, b'+', s),
        Frame::Error(s) => line(out, b'-', s),
        Frame::BulkError(s) => blob(out, b'!', s),
        Frame::Integer(n) => header(out, b':', *n),
        Frame::Bulk(b) => blob(out, b'$', b),
        Frame::Null => out.put_slice(b"$-1\r\n"),
        Frame::Null3 => out.put_slice(b"_\r\n"),
        Frame::NullArray => out.put_slice(b"*-1\r\n"),
        Frame::Array(items) => aggregate(out, b'*', items),
        Frame::Set(items) => aggregate(out, b'~', items),
        Frame::Push(items) => aggregate(out, b'>', items),
        Frame::Map(pairs) => pairs_of(out, b'%', pairs),
        Frame::Double(d) => {
            let text = if d.is_nan() {
                "nan".to_owned()
            } else if d.is_infinite() {
                if *d > 0.0 { "inf" } else { "-inf" }.to_owned()
            } else {
                d.to_string()
            };
            line(out, b',', text.as_bytes());
        }
        Frame::Boolean(b) => out.put_slice(if *b { b"#t\r\n" } else { b"#f\r\n" }),
        Frame::BigNumber(n) => line(out, b'(', n),
        Frame::Verbatim { format, text } => {
            header(out, b'=', (text.len() + 4) as i64);
            out.put_slice(format);
            out.put_u8(b':');
            out.put_slice(text);
            out.put_slice(b"\r\n");
        }
        Frame::Attribute { attributes, value } => {
            pairs_of(out, b'|', attributes);
            encode(value, out);
        }
    }
}

/// Appends `argv` as a RESP array of bulk strings, the form every Redis server accepts.
pub fn encode_command<A: AsRef<[u8]>>(argv: &[A], out: &mut BytesMut) {
    // One allocation for the whole command rather than one per argument that does not fit.
    out.reserve(command_len(argv.iter().map(|arg| arg.as_ref().len())));
    header(out, b'*', argv.len() as i64);
    for arg in argv {
        blob(out, b'$', arg.as_ref());
    }
}

/// How many bytes [`encode_command`] writes for arguments of these lengths.
pub(crate) fn command_len(lens: impl ExactSizeIterator<Item = usize>) -> usize {
    // A header; then each argument's bytes and CRLF.
    let count = lens.len();
    lens.fold(header_len(count), |total, len| total + bulk_len(len))
}

/// What [`encode_bulk`] writes for `len` bytes: the header, the bytes and CRLF.
pub fn bulk_len(len: usize) -> usize {
    header_len(len) + len + 2
}

/// Tag, digits and CRLF of the header of a length or count `n` (what [`encode_header`] writes).
pub fn header_len(n: usize) -> usize {
    3 + n.checked_ilog10().unwrap_or(0) as usize + 1
}

fn line(out: &mut BytesMut, tag: u8, text: &[u8]) {
    out.reserve(text.len() + 3);
    out.put_u8(tag);
    out.put_slice(text);
    out.put_slice(b"\r\n");
}

fn header(out: &mut BytesMut, tag: u8, n: i64) {
    // Most lengths and counts have one or two digits: their line has a fixed size, appended as
    // one small store rather than through `memcpy` (which cost more than the digits).
    match n {
        0..=9 => return out.extend_from_slice(&[tag, b'0' + n as u8, b'\r', b'\n']),
        10..=99 => {
            let (tens, ones) = (n / 10, n % 10);
            return out.extend_from_slice(&[
                tag,
                b'0' + tens as u8,
                b'0' + ones as u8,
                b'\r',
                b'\n',
            ]);
        }
        _ => {}
    }
    // Formatted on the stack, tag to CRLF, and appended in one copy: headers are on the hot path
    // of every command and reply (a LEASE call writes thirteen), and three appends, each with
    // its own capacity check and copy, cost twice what the digits do.
    let mut line = [0u8; 24];
    let mut at = line.len() - 2;
    line[at..].copy_from_slice(b"\r\n");
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        line[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        at -= 1;
        line[at] = b'-';
    }
    at -= 1;
    line[at] = tag;
    out.extend_from_slice(&line[at..]);
}

/// Appends `data` as a bulk string (`$<len>\r\n<data>\r\n`), as [`encode`] writes a
/// `Frame::Bulk`, without making a frame of it.
pub fn encode_bulk(data: &[u8], out: &mut BytesMut) {
    blob(out, b'$', data);
}

/// Appends an aggregate's header: `tag` (`*`, `%`, `~`, `>`) and the count; with `:`, a
/// non-negative integer reply, which is its header alone.
pub fn encode_header(tag: u8, count: usize, out: &mut BytesMut) {
    header(out, tag, count as i64);
}

fn blob(out: &mut BytesMut, tag: u8, data: &[u8]) {
    out.reserve(bulk_len(data.len()));
    header(out, tag, data.len() as i64);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

fn aggregate(out: &mut BytesMut, tag: u8, items: &[Frame]) {
    header(out, tag, items.len() as i64);
    for item in items {
        encode(item, out);
    }
}

fn pairs_of(out: &mut BytesMut, tag: u8, pairs: &[(Frame, Frame)]) {
    header(out, tag, pairs.len() as i64);
    for (key, value) in pairs {
        encode(key, out);
        encode(value, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_the_tag_the_decimal_and_crlf() {
        let every_short = -120..=1200;
        let long = [
            12_345,
            99_999,
            100_000,
            i64::MAX,
            i64::MAX - 1,
            i64::MIN,
            i64::MIN + 1,
        ];
        for n in every_short.chain(long) {
            let mut out = BytesMut::from(&b"x"[..]);
            header(&mut out, b':', n);
            assert_eq!(&out[..], format!("x:{n}\r\n").as_bytes());
        }
    }

    #[test]
    fn a_command_is_written_exactly_as_long_as_command_len_says() {
        let argv: [&[u8]; 4] = [b"EVALSHA", &[b'a'; 40], b"", &[b'z'; 1000]];
        let mut out = BytesMut::new();
        encode_command(&argv, &mut out);
        assert_eq!(out.len(), command_len(argv.iter().map(|arg| arg.len())));
        assert!(out.starts_with(b"*4\r\n$7\r\nEVALSHA\r\n$40\r\n"));
        let tail = [&b"$0\r\n\r\n$1000\r\n"[..], &[b'z'; 1000], b"\r\n"].concat();
        assert!(out.ends_with(&tail));
    }
}
