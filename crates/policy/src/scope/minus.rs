//! Taking keys away from a glob: `glob` minus `away`, written as globs again, since Redis ACL
//! patterns only add keys (there is no negative pattern). Exact where it is written at all:
//!
//! - `away` shares no key with `glob`: `glob` stays as it is;
//! - `away` holds every key of `glob`: nothing stays;
//! - `away` is a fixed run of steps, then `*` or the end (`shared:*`, `tollgate:*`, `a?c`): what
//!   stays is `glob` cut by the complement of `away`, which is a finite union of such runs
//!   (the keys that end inside the run, those that leave it at step `j` with a byte `away` does
//!   not take there, and, without a final `*`, those that go on past its end);
//! - anything else is [`Inexpressible`].

use tollgate_policy_rules::glob::Piece;

use super::bytes::{self, normal, ByteSet, FULL};
use super::relation::relate;

/// At most this many globs come out of one difference (each step of the run to leave can
/// multiply the ways a starry glob enters it).
const MAX_GLOBS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Inexpressible {
    #[error("the keys it shares with `{away}` cannot be taken out by Redis ACL patterns")]
    Overlap { away: String },
    #[error("taking `{away}` out of it needs more than {MAX_GLOBS} patterns")]
    TooMany { away: String },
}

/// What follows a fixed run of steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// Any key goes on (`*`).
    Any,
    /// The key ends there.
    End,
    /// At least one more byte, then anything (`?*`).
    More,
}

/// `glob` minus `away` (both as pieces); `name` is `away` as the author wrote it, for errors.
pub fn minus(glob: &[Piece], away: &[Piece], name: &str) -> Result<Vec<Vec<Piece>>, Inexpressible> {
    if bytes::matches_nothing(glob) {
        return Ok(Vec::new());
    }
    let relation = relate(glob, away).ok_or_else(|| Inexpressible::Overlap {
        away: name.to_owned(),
    })?;
    if !relation.overlap {
        return Ok(vec![glob.to_vec()]);
    }
    if relation.within {
        return Ok(Vec::new());
    }
    let Some((run, star)) = fixed_run(away) else {
        return Err(Inexpressible::Overlap {
            away: name.to_owned(),
        });
    };
    let mut out: Vec<Vec<Piece>> = Vec::new();
    let mut add = |found: Vec<Vec<Piece>>| {
        for pieces in found {
            let pieces = normal(pieces);
            if !out.contains(&pieces) {
                out.push(pieces);
            }
        }
    };
    for j in 0..run.len() {
        // Ends inside the run, after `j` steps.
        add(cut(glob, &run[..j], Tail::End));
        // Leaves it at step `j`.
        let mut leave = run[..j].to_vec();
        leave.push(bytes::not(&run[j]));
        add(cut(glob, &leave, Tail::Any));
    }
    if !star {
        add(cut(glob, &run, Tail::More));
    }
    if out.len() > MAX_GLOBS {
        return Err(Inexpressible::TooMany {
            away: name.to_owned(),
        });
    }
    Ok(out)
}

/// `away` as a run of byte sets and whether a final `*` follows, if it has that shape.
fn fixed_run(away: &[Piece]) -> Option<(Vec<ByteSet>, bool)> {
    let (body, star) = match away.split_last() {
        Some((Piece::Star, body)) => (body, true),
        _ => (away, false),
    };
    let run = body
        .iter()
        .map(|piece| match piece {
            Piece::Byte(set) => Some(*set),
            Piece::Star => None,
        })
        .collect::<Option<Vec<_>>>()?;
    Some((run, star))
}

/// The keys of `glob` that begin with one byte of each set of `run` in turn and then follow
/// `tail`, as globs: each way `glob`'s stars can take the run's bytes is one glob.
fn cut(glob: &[Piece], run: &[ByteSet], tail: Tail) -> Vec<Vec<Piece>> {
    let mut out = Vec::new();
    walk(glob, 0, run, tail, &mut Vec::new(), &mut out);
    out
}

fn walk(
    glob: &[Piece],
    i: usize,
    run: &[ByteSet],
    tail: Tail,
    taken: &mut Vec<Piece>,
    out: &mut Vec<Vec<Piece>>,
) {
    if out.len() > MAX_GLOBS {
        return;
    }
    let Some((first, rest)) = run.split_first() else {
        let left = &glob[i..];
        match tail {
            Tail::Any => out.push([taken.as_slice(), left].concat()),
            Tail::End => {
                if left.iter().all(|piece| *piece == Piece::Star) {
                    out.push(taken.clone());
                }
            }
            Tail::More => {
                // One more byte of what is left, then the rest: cut by a run of one `?`.
                let mut more = Vec::new();
                walk(left, 0, &[FULL], Tail::Any, &mut Vec::new(), &mut more);
                for found in more {
                    out.push([taken.as_slice(), &found].concat());
                }
            }
        }
        return;
    };
    match glob.get(i) {
        None => {}
        Some(Piece::Byte(set)) => {
            let both = bytes::and(set, first);
            if !bytes::is_empty(&both) {
                taken.push(Piece::Byte(both));
                walk(glob, i + 1, rest, tail, taken, out);
                taken.pop();
            }
        }
        Some(Piece::Star) => {
            // The star takes this byte (and, still there, may take more)...
            taken.push(Piece::Byte(*first));
            walk(glob, i, rest, tail, taken, out);
            taken.pop();
            // ...or matches nothing from here, and the next step takes it.
            walk(glob, i + 1, run, tail, taken, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::bytes::matches;
    use tollgate_policy_rules::glob::pieces;

    /// Every key up to `len` bytes over `alphabet`.
    fn keys(alphabet: &[u8], len: usize) -> Vec<Vec<u8>> {
        let mut all = vec![Vec::new()];
        let mut layer = vec![Vec::new()];
        for _ in 0..len {
            layer = layer
                .iter()
                .flat_map(|key: &Vec<u8>| {
                    alphabet
                        .iter()
                        .map(move |b| [key.as_slice(), &[*b]].concat())
                })
                .collect();
            all.extend(layer.iter().cloned());
        }
        all
    }

    fn check(glob: &str, away: &str, alphabet: &[u8], len: usize) -> Vec<Vec<Piece>> {
        let (g, a) = (pieces(glob.as_bytes()), pieces(away.as_bytes()));
        let rest = minus(&g, &a, away).unwrap();
        for key in keys(alphabet, len) {
            let expected = matches(&g, &key) && !matches(&a, &key);
            let got = rest.iter().any(|pieces| matches(pieces, &key));
            assert_eq!(
                got,
                expected,
                "{glob} minus {away} at {:?}",
                String::from_utf8_lossy(&key)
            );
        }
        rest
    }

    #[test]
    fn a_star_loses_the_reserved_prefix_and_keeps_everything_else() {
        let rest = check("*", "tol:*", b"tolx:", 6);
        // `[^t]*`, `t[^o]*`, `to[^l]*`, `tol[^:]*`, and the keys ``, `t`, `to` and `tol` that
        // end inside the prefix.
        assert_eq!(rest.len(), 8, "{rest:?}");
    }

    #[test]
    fn differences_are_exact_for_every_shape_they_are_written_for() {
        let alphabet = b"tolx:*";
        for (glob, away) in [
            ("t*", "tol:*"),
            ("*:*", "tol:*"),
            ("*o*", "to*"),
            ("t?l*", "tol:*"),
            ("[to]*x", "to*"),
            ("*", "to?"),
            ("*x", "tx"),
            ("x*", "tol:*"),
            ("tol:*", "tol:*"),
            ("tol:x", "tol:*"),
        ] {
            check(glob, away, alphabet, 5);
        }
    }

    #[test]
    fn a_partial_overlap_with_a_starry_glob_is_refused() {
        let error = minus(&pieces(b"a*"), &pieces(b"*b"), "*b").unwrap_err();
        assert_eq!(error, Inexpressible::Overlap { away: "*b".into() });
        // Disjoint or contained, any shape will do.
        assert_eq!(
            minus(&pieces(b"a*"), &pieces(b"*:b*"), "x").unwrap_err(),
            Inexpressible::Overlap { away: "x".into() }
        );
        assert!(minus(&pieces(b"a*c"), &pieces(b"*b"), "*b").unwrap().len() == 1);
        assert!(minus(&pieces(b"a*:b"), &pieces(b"*:b*"), "*:b*")
            .unwrap()
            .is_empty());
    }
}
