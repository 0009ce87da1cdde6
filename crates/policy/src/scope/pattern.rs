//! A glob, read as the policy's matcher reads it ([`Piece`]s), written as a Redis ACL key pattern
//! that matches exactly the same keys under Redis's own matcher (`stringmatchlen` in Redis 7.0).
//!
//! Writing from the pieces rather than copying the policy's text is what makes it exact: the two
//! matchers read some classes differently (`[]]` is a class of `]` to the policy and an empty
//! class to Redis; `[\a-z]` is a range to the policy and `a`, `-`, `z` to Redis), so every step
//! is written in the one form both agree on: a literal (escaped when special), `?`, `*`, or a
//! class of escaped single bytes and plain ranges. What Redis cannot take is avoided:
//!
//! - ACL patterns must not hold whitespace (`ACL SETUSER` refuses them) nor a NUL byte (the
//!   selector syntax cannot carry one), so such a byte is only ever matched inside a range or a
//!   negated class, never written;
//! - Redis compares range ends as signed `char`s, so a range never crosses from `\x7f` to `\x80`.
//!
//! A step that no form can write without one of those bytes (a key glob with a literal space) is
//! an [`Unwritable`] error naming the glob.

use tollgate_policy_rules::glob::Piece;

use super::bytes::{count, has, not, ByteSet};

/// A glob step no Redis ACL pattern can express.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Redis ACL patterns cannot hold whitespace or a NUL byte, and this glob needs one of \
     {bytes} written out"
)]
pub struct Unwritable {
    /// The bytes that would have to be written, as `\xNN`.
    pub bytes: String,
}

/// The Redis pattern for `pieces`; `Ok(None)` when the glob matches no key at all (a step of an
/// empty set).
pub fn redis_pattern(pieces: &[Piece]) -> Result<Option<Vec<u8>>, Unwritable> {
    let mut out = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Star => {
                if out.last() != Some(&b'*') || out.ends_with(b"\\*") {
                    out.push(b'*');
                }
            }
            Piece::Byte(set) => match count(set) {
                0 => return Ok(None),
                256 => out.push(b'?'),
                1 => {
                    let byte = (0..=255u8).find(|&b| has(set, b)).unwrap_or(0);
                    if unwritable(byte) {
                        out.extend(class(set)?);
                    } else {
                        if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
                            out.push(b'\\');
                        }
                        out.push(byte);
                    }
                }
                _ => out.extend(class(set)?),
            },
        }
    }
    Ok(Some(out))
}

/// Bytes a pattern must never hold: `ACL SETUSER` refuses whitespace in patterns (its check is
/// C's `isspace`), and a NUL ends a selector's text.
pub fn unwritable(byte: u8) -> bool {
    matches!(byte, 0 | b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// `[…]` or `[^…]`, whichever can be written, the shorter if both.
fn class(set: &ByteSet) -> Result<Vec<u8>, Unwritable> {
    let plain = items(set).map(|items| [b"[".as_slice(), &items, b"]"].concat());
    let negated = items(&not(set)).map(|items| [b"[^".as_slice(), &items, b"]"].concat());
    match (plain, negated) {
        (Ok(a), Ok(b)) => Ok(if b.len() < a.len() { b } else { a }),
        (Ok(a), Err(_)) => Ok(a),
        (Err(_), Ok(b)) => Ok(b),
        (Err(error), Err(_)) => Err(error),
    }
}

/// A class's members: ranges where three or more bytes follow each other, escaped single bytes
/// elsewhere.
fn items(set: &ByteSet) -> Result<Vec<u8>, Unwritable> {
    let mut out = Vec::new();
    let mut byte = 0u16;
    while byte < 256 {
        if !has(set, byte as u8) {
            byte += 1;
            continue;
        }
        let lo = byte as u8;
        // Redis reads range ends as signed chars: a run stops at the sign boundary.
        let mut hi = lo;
        while hi != 0x7f && hi != 0xff && has(set, hi + 1) {
            hi += 1;
        }
        run(&mut out, lo, hi)?;
        byte = u16::from(hi) + 1;
    }
    Ok(out)
}

/// Writes the bytes `lo..=hi` (all members): a range if its ends can be written plainly, with
/// the ends that cannot moved into single bytes.
fn run(out: &mut Vec<u8>, mut lo: u8, mut hi: u8) -> Result<(), Unwritable> {
    loop {
        if hi < lo.saturating_add(2) || hi == lo.saturating_add(1) {
            for byte in lo..=hi {
                one(out, byte)?;
            }
            return Ok(());
        }
        let start_ok = !unwritable(lo) && !matches!(lo, b'\\' | b']' | b'^' | b'-' | b'[');
        let end_ok = !unwritable(hi) && !matches!(hi, b'\\' | b']' | b'-' | b'[');
        if !start_ok {
            one(out, lo)?;
            lo += 1;
        } else if !end_ok {
            one(out, hi)?;
            hi -= 1;
        } else {
            out.extend([lo, b'-', hi]);
            return Ok(());
        }
    }
}

/// One member byte inside a class.
fn one(out: &mut Vec<u8>, byte: u8) -> Result<(), Unwritable> {
    if unwritable(byte) {
        return Err(Unwritable {
            bytes: format!("\\x{byte:02x}"),
        });
    }
    if matches!(byte, b'\\' | b']' | b'^' | b'-' | b'[') {
        out.push(b'\\');
    }
    out.push(byte);
    Ok(())
}

/// Whether `text` matches the Redis `pattern`, as Redis 7.0's `stringmatchlen` (case-sensitive)
/// decides it, signed range ends and all (a line-by-line port): the reference the translation is
/// unit-tested against; the integration suite checks the same against Redis itself.
pub fn redis_matches(pattern: &[u8], text: &[u8]) -> bool {
    let at = |p: usize| pattern.get(p).copied().unwrap_or(0);
    let (mut p, mut s) = (0usize, 0usize);
    while p < pattern.len() && s < text.len() {
        match pattern[p] {
            b'*' => {
                while p < pattern.len() && at(p + 1) == b'*' {
                    p += 1;
                }
                if p + 1 == pattern.len() {
                    return true;
                }
                return (s..text.len()).any(|from| redis_matches(&pattern[p + 1..], &text[from..]));
            }
            b'?' => s += 1,
            b'[' => {
                p += 1;
                let negated = at(p) == b'^';
                if negated {
                    p += 1;
                }
                let mut hit = false;
                let c = i32::from(text[s] as i8);
                loop {
                    let left = pattern.len().saturating_sub(p);
                    if at(p) == b'\\' && left >= 2 {
                        p += 1;
                        hit |= pattern[p] == text[s];
                    } else if at(p) == b']' && left > 0 {
                        break;
                    } else if left == 0 {
                        p -= 1;
                        break;
                    } else if left >= 3 && pattern[p + 1] == b'-' {
                        let mut start = i32::from(pattern[p] as i8);
                        let mut end = i32::from(pattern[p + 2] as i8);
                        if start > end {
                            std::mem::swap(&mut start, &mut end);
                        }
                        p += 2;
                        hit |= c >= start && c <= end;
                    } else {
                        hit |= pattern[p] == text[s];
                    }
                    p += 1;
                }
                if hit == negated {
                    return false;
                }
                s += 1;
            }
            b'\\' if pattern.len() - p >= 2 => {
                p += 1;
                if pattern[p] != text[s] {
                    return false;
                }
                s += 1;
            }
            literal => {
                if literal != text[s] {
                    return false;
                }
                s += 1;
            }
        }
        p += 1;
        if s == text.len() {
            while at(p) == b'*' && p < pattern.len() {
                p += 1;
            }
            break;
        }
    }
    p >= pattern.len() && s == text.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::bytes;
    use tollgate_policy_rules::glob::pieces;

    fn written(glob: &str) -> String {
        let pattern = redis_pattern(&pieces(glob.as_bytes())).unwrap().unwrap();
        String::from_utf8_lossy(&pattern).into_owned()
    }

    #[test]
    fn plain_globs_are_written_as_they_are() {
        assert_eq!(written("acme:*"), "acme:*");
        assert_eq!(written("user:?"), "user:?");
        assert_eq!(written("a\\*b"), "a\\*b");
        assert_eq!(written("[a-z]x"), "[a-z]x");
        assert_eq!(written("[^t]*"), "[^t]*");
        assert_eq!(written("a**b"), "a*b");
    }

    #[test]
    fn classes_redis_reads_otherwise_are_rewritten() {
        // `[]]` is `]` to the policy, an empty class followed by `]` to Redis.
        assert_eq!(written("[]]x"), "\\]x");
        // A range with an escaped end is a range to the policy.
        assert_eq!(written("[\\a-c]"), "[a-c]");
        // A space can only be written, or matched by a negated class that writes a NUL.
        assert!(redis_pattern(&pieces(b"a b")).is_err());
        assert!(redis_pattern(&pieces(b"[^ ]")).is_err());
        // Whitespace inside a range is no trouble.
        assert_eq!(written("[\x08-!]"), "[\x08-!]");
    }

    /// Every pattern written matches, under Redis's reading, exactly the keys the glob matches
    /// under the policy's: over every one- and two-byte key for classes, and sample keys for
    /// stars.
    #[test]
    fn the_redis_reading_of_each_pattern_is_the_policys_reading_of_its_glob() {
        let globs = [
            "[^a]",
            "[a-]",
            "[-a]",
            "[]a]",
            "[^]]",
            "[\\]-a]",
            "[!-~]",
            "[^ ]",
            "[\\x]",
            "?",
            "[^t]",
            "[ -z]",
            "[\u{7f}-\u{80}]",
            "[a-c\\]]",
            "[z-a]",
            "[\\^]",
            "[\\\\]",
        ];
        for glob in globs {
            let glob_pieces = pieces(glob.as_bytes());
            let Ok(Some(pattern)) = redis_pattern(&glob_pieces) else {
                continue;
            };
            for byte in 0..=255u8 {
                let key = [byte];
                assert_eq!(
                    redis_matches(&pattern, &key),
                    bytes::matches(&glob_pieces, &key),
                    "glob {glob:?} pattern {:?} key {byte:#x}",
                    String::from_utf8_lossy(&pattern)
                );
            }
        }
        let keyed = [
            ("a*b", ["ab", "axxb", "a", "ba"]),
            ("\\**", ["*x", "x*", "*", ""]),
            ("t[^o]*", ["tx", "to", "t", "txo"]),
        ];
        for (glob, keys) in keyed {
            let glob_pieces = pieces(glob.as_bytes());
            let pattern = redis_pattern(&glob_pieces).unwrap().unwrap();
            for key in keys {
                assert_eq!(
                    redis_matches(&pattern, key.as_bytes()),
                    bytes::matches(&glob_pieces, key.as_bytes()),
                    "{glob} vs {key}"
                );
            }
        }
    }
}
