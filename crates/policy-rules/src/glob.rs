//! Redis-style glob patterns over bytes (`*`, `?`, `[a-z]`, `[^x]`, `\` escapes), the syntax
//! operators already know from `KEYS` and ACL key patterns.

/// Why a pattern is not a glob; `offset` is the byte where the problem starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobError {
    pub offset: usize,
    pub message: &'static str,
}

/// Checks that `pattern` is well formed: brackets closed, no trailing escape.
pub fn check(pattern: &[u8]) -> Result<(), GlobError> {
    let mut i = 0;
    while i < pattern.len() {
        match pattern[i] {
            b'\\' if i + 1 == pattern.len() => {
                return Err(GlobError {
                    offset: i,
                    message: "trailing `\\` escapes nothing",
                })
            }
            b'\\' => i += 2,
            b'[' => {
                let start = i;
                i += 1;
                if pattern.get(i) == Some(&b'^') {
                    i += 1;
                }
                let mut empty = true;
                loop {
                    match pattern.get(i) {
                        None => {
                            return Err(GlobError {
                                offset: start,
                                message: "`[` is never closed",
                            })
                        }
                        Some(b']') if !empty => break,
                        Some(b'\\') => i += 2,
                        Some(_) => i += 1,
                    }
                    empty = false;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// Whether `text` matches `pattern`. Assumes [`check`] accepted the pattern; a malformed one
/// matches as best it can and never panics.
pub fn matches(pattern: &[u8], text: &[u8]) -> bool {
    after_literal(pattern, literal_len(pattern), text)
}

/// A pattern kept to be matched many times (the near cache's cacheable keys, asked of every
/// read): its literal prefix found once, not per text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: Box<[u8]>,
    literal: usize,
}

impl Glob {
    pub fn new(pattern: &[u8]) -> Glob {
        Glob {
            literal: literal_len(pattern),
            pattern: pattern.into(),
        }
    }

    /// [`matches`] of this pattern.
    pub fn matches(&self, text: &[u8]) -> bool {
        after_literal(&self.pattern, self.literal, text)
    }
}

/// How long the literal prefix of `pattern` is (`user:` of `user:*`).
fn literal_len(pattern: &[u8]) -> usize {
    (pattern.iter())
        .position(|b| matches!(b, b'*' | b'?' | b'[' | b'\\'))
        .unwrap_or(pattern.len())
}

/// [`matches`], given the length of the pattern's literal prefix. Most patterns are a literal
/// prefix and a `*` (`user:*`): the prefix compared at once, and the byte-by-byte walk only for
/// what follows it.
fn after_literal(pattern: &[u8], literal: usize, text: &[u8]) -> bool {
    let Some(text) = text.strip_prefix(&pattern[..literal]) else {
        return false;
    };
    match &pattern[literal..] {
        b"*" => true,
        rest => walk(rest, text),
    }
}

/// [`matches`] byte by byte.
fn walk(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // The position after the last `*` and the text position it was tried against: on a mismatch,
    // let that star swallow one more byte. Linear backtracking, no recursion.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                star = Some((p + 1, t));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => {
                let (hit, end) = class(pattern, p, text[t]);
                hit.then_some(end)
            }
            Some(b'\\') if p + 1 < pattern.len() => (pattern[p + 1] == text[t]).then_some(p + 2),
            Some(&literal) => (literal == text[t]).then_some(p + 1),
            None => None,
        };
        match (step, star) {
            (Some(next), _) => {
                p = next;
                t += 1;
            }
            (None, Some((after_star, tried))) => {
                p = after_star;
                t = tried + 1;
                star = Some((after_star, tried + 1));
            }
            (None, None) => return false,
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&b| b == b'*')
}

/// Matches one byte against the class starting at `pattern[open] == b'['`: whether it is a
/// member, and the position after the class (the same for every byte).
fn class(pattern: &[u8], open: usize, byte: u8) -> (bool, usize) {
    let mut i = open + 1;
    let negated = pattern.get(i) == Some(&b'^');
    if negated {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    while i < pattern.len() && (first || pattern[i] != b']') {
        first = false;
        let low = if pattern[i] == b'\\' && i + 1 < pattern.len() {
            i += 1;
            pattern[i]
        } else {
            pattern[i]
        };
        if pattern.get(i + 1) == Some(&b'-') && i + 2 < pattern.len() && pattern[i + 2] != b']' {
            let high = pattern[i + 2];
            let (low, high) = if low <= high {
                (low, high)
            } else {
                (high, low)
            };
            hit |= (low..=high).contains(&byte);
            i += 3;
        } else {
            hit |= low == byte;
            i += 1;
        }
    }
    (hit != negated, i + 1)
}

/// One step of a glob as [`matches`] reads it: `*`, or one byte out of a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Star,
    /// Bit `b` of word `b / 64` set: byte `b` matches (`?` sets all 256).
    Byte([u64; 4]),
}

/// The pattern as the sequence of steps [`matches`] takes, so that an analysis can reason about
/// every text a glob matches (intersections, complements) with exactly the matcher's reading of
/// classes, ranges and escapes.
pub fn pieces(pattern: &[u8]) -> Vec<Piece> {
    let one = |byte: u8| {
        let mut set = [0u64; 4];
        set[usize::from(byte / 64)] |= 1 << (byte % 64);
        Piece::Byte(set)
    };
    let mut out = Vec::new();
    let mut p = 0;
    while p < pattern.len() {
        match pattern[p] {
            b'*' => {
                out.push(Piece::Star);
                p += 1;
            }
            b'?' => {
                out.push(Piece::Byte([u64::MAX; 4]));
                p += 1;
            }
            b'[' => {
                let mut set = [0u64; 4];
                let mut end = p + 1;
                for byte in 0..=255u8 {
                    let (hit, after) = class(pattern, p, byte);
                    end = after;
                    if hit {
                        set[usize::from(byte / 64)] |= 1 << (byte % 64);
                    }
                }
                out.push(Piece::Byte(set));
                p = end;
            }
            b'\\' if p + 1 < pattern.len() => {
                out.push(one(pattern[p + 1]));
                p += 2;
            }
            literal => {
                out.push(one(literal));
                p += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every string over `alphabet` up to `max` bytes long.
    fn strings(alphabet: &[u8], max: usize) -> Vec<Vec<u8>> {
        let mut all = vec![Vec::new()];
        let mut last = vec![Vec::new()];
        for _ in 0..max {
            last = (last.iter())
                .flat_map(|s: &Vec<u8>| alphabet.iter().map(move |&b| [&s[..], &[b]].concat()))
                .collect();
            all.extend(last.iter().cloned());
        }
        all
    }

    #[test]
    fn the_literal_prefix_shortcut_and_a_kept_glob_agree_with_the_walk() {
        let texts = strings(b"ab", 4);
        for pattern in strings(b"ab*?", 4)
            .iter()
            .chain([b"a[ab]*".to_vec(), b"a\\**".to_vec()].iter())
        {
            let glob = Glob::new(pattern);
            for text in &texts {
                assert_eq!(glob.matches(text), matches(pattern, text));
                assert_eq!(
                    matches(pattern, text),
                    walk(pattern, text),
                    "{} vs {}",
                    String::from_utf8_lossy(pattern),
                    String::from_utf8_lossy(text)
                );
            }
        }
    }

    #[test]
    fn stars_questions_and_classes() {
        let cases: &[(&str, &str, bool)] = &[
            ("app:*", "app:1", true),
            ("app:*", "app:", true),
            ("app:*", "apq:1", false),
            ("*", "", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("user:?", "user:7", true),
            ("user:?", "user:77", false),
            ("[abc]x", "bx", true),
            ("[^abc]x", "bx", false),
            ("[a-c]x", "cx", true),
            ("[a-c]x", "dx", false),
            ("\\*", "*", true),
            ("\\*", "a", false),
            ("tenant:*:profile", "tenant:acme:profile", true),
            ("tenant:*:profile", "tenant:acme:profiles", false),
        ];
        for &(pattern, text, expected) in cases {
            assert_eq!(
                matches(pattern.as_bytes(), text.as_bytes()),
                expected,
                "{pattern} vs {text}"
            );
        }
    }

    #[test]
    fn malformed_patterns_are_reported_where_they_start() {
        assert_eq!(check(b"app:[ab").unwrap_err().offset, 4);
        assert_eq!(check(b"app:\\").unwrap_err().offset, 4);
        assert!(check(b"[]]").is_ok());
        assert!(check(b"a[\\]]b").is_ok());
    }
}
