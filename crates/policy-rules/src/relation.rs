//! How a glob's texts relate to those of a set of globs: whether some text matches both, and
//! whether every text the glob matches is matched by one of the set. Each glob is read as an
//! automaton over its [`Piece`]s and all are walked together, one representative byte for each
//! group of bytes no step tells apart, so the answer is exact (not a comparison glob by glob:
//! `acme:[ab]*` lies within `acme:a*` and `acme:b*` together, though within neither alone).
//!
//! The scope analysis uses it on key globs; admission uses it on a `PSUBSCRIBE` pattern against
//! a rule's channel globs, so it lives here, where the `yaml-guard` guest runs it too.

use std::collections::{HashSet, VecDeque};

use crate::glob::Piece;

/// Pairs of states walked before giving up (globs too alike and too starry to compare).
const MAX_STATES: usize = 50_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relation {
    /// Some text matches both.
    pub overlap: bool,
    /// Every text the first matches, the second matches too.
    pub within: bool,
}

/// How `a` relates to `b`; `None` when the walk outgrew its bound.
pub fn relate(a: &[Piece], b: &[Piece]) -> Option<Relation> {
    relate_union(a, &[b])
}

/// How `a` relates to the union of `union`'s globs; `None` when the walk outgrew its bound.
/// An empty union matches nothing.
pub fn relate_union(a: &[Piece], union: &[&[Piece]]) -> Option<Relation> {
    let mut all: Vec<&[Piece]> = vec![a];
    all.extend_from_slice(union);
    let letters = alphabet(&all);
    let start_b: Vec<Vec<usize>> = union.iter().map(|b| closure(b, vec![0])).collect();
    let start = (closure(a, vec![0]), start_b);
    let mut seen = HashSet::from([start.clone()]);
    let mut queue = VecDeque::from([start]);
    let mut relation = Relation {
        overlap: false,
        within: true,
    };
    while let Some((in_a, in_union)) = queue.pop_front() {
        if in_a.contains(&a.len()) {
            let in_some = union
                .iter()
                .zip(&in_union)
                .any(|(b, at)| at.contains(&b.len()));
            if in_some {
                relation.overlap = true;
            } else {
                relation.within = false;
            }
        }
        if relation.overlap && !relation.within {
            break;
        }
        for &byte in &letters {
            let next_a = step(a, &in_a, byte);
            // Once `a` matches nothing more, nothing of `a` lies further on.
            if next_a.is_empty() {
                continue;
            }
            let next_union: Vec<Vec<usize>> = union
                .iter()
                .zip(&in_union)
                .map(|(b, at)| step(b, at, byte))
                .collect();
            let next = (next_a, next_union);
            if seen.contains(&next) {
                continue;
            }
            if seen.len() >= MAX_STATES {
                return None;
            }
            seen.insert(next.clone());
            queue.push_back(next);
        }
    }
    Some(relation)
}

/// Whether byte `byte` is in the set of a [`Piece::Byte`].
pub fn has(set: &[u64; 4], byte: u8) -> bool {
    set[usize::from(byte / 64)] & (1 << (byte % 64)) != 0
}

/// `positions` with every position reachable by letting a star match nothing.
pub fn closure(pieces: &[Piece], mut positions: Vec<usize>) -> Vec<usize> {
    let mut i = 0;
    while i < positions.len() {
        let p = positions[i];
        if pieces.get(p) == Some(&Piece::Star) && !positions.contains(&(p + 1)) {
            positions.push(p + 1);
        }
        i += 1;
    }
    positions.sort_unstable();
    positions.dedup();
    positions
}

/// The positions after reading `byte` from `positions`.
pub fn step(pieces: &[Piece], positions: &[usize], byte: u8) -> Vec<usize> {
    let mut next = Vec::new();
    for &p in positions {
        match pieces.get(p) {
            Some(Piece::Star) => next.push(p),
            Some(Piece::Byte(set)) if has(set, byte) => next.push(p + 1),
            _ => {}
        }
    }
    closure(pieces, next)
}

/// One byte for each group of bytes that every step of every glob treats alike.
fn alphabet(globs: &[&[Piece]]) -> Vec<u8> {
    let sets: Vec<&[u64; 4]> = globs
        .iter()
        .flat_map(|pieces| pieces.iter())
        .filter_map(|piece| match piece {
            Piece::Byte(set) => Some(set),
            Piece::Star => None,
        })
        .collect();
    let mut seen = HashSet::new();
    (0..=255u8)
        .filter(|&byte| {
            let signature: Vec<bool> = sets.iter().map(|set| has(set, byte)).collect();
            seen.insert(signature)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::glob::pieces;

    fn relation(a: &str, b: &str) -> Relation {
        relate(&pieces(a.as_bytes()), &pieces(b.as_bytes())).unwrap()
    }

    fn union(a: &str, union: &[&str]) -> Relation {
        let globs: Vec<Vec<Piece>> = union.iter().map(|g| pieces(g.as_bytes())).collect();
        let refs: Vec<&[Piece]> = globs.iter().map(Vec::as_slice).collect();
        relate_union(&pieces(a.as_bytes()), &refs).unwrap()
    }

    #[test]
    fn overlap_and_containment_follow_the_keys() {
        let r = relation("acme:*", "shared:*");
        assert_eq!((r.overlap, r.within), (false, false));
        let r = relation("shared:*", "shared:*");
        assert_eq!((r.overlap, r.within), (true, true));
        let r = relation("shared:motd", "shared:*");
        assert_eq!((r.overlap, r.within), (true, true));
        let r = relation("*", "shared:*");
        assert_eq!((r.overlap, r.within), (true, false));
        let r = relation("x:*:y", "*:y");
        assert_eq!((r.overlap, r.within), (true, true));
        let r = relation("[a-c]?", "[^b]*");
        assert_eq!((r.overlap, r.within), (true, false));
        let r = relation("t*", "[^t]*");
        assert_eq!((r.overlap, r.within), (false, false));
    }

    #[test]
    fn a_union_holds_what_no_one_of_its_globs_holds() {
        let r = union("acme:[ab]*", &["acme:a*", "acme:b*"]);
        assert_eq!((r.overlap, r.within), (true, true));
        assert!(!relation("acme:[ab]*", "acme:a*").within);
        assert!(!relation("acme:[ab]*", "acme:b*").within);
        let r = union("acme:[abc]*", &["acme:a*", "acme:b*"]);
        assert_eq!((r.overlap, r.within), (true, false));
        // Every text, split by its first byte being `a` or not.
        let r = union("*", &["a*", "[^a]*", ""]);
        assert!(r.within);
        let r = union("*", &["a*", "[^a]*"]);
        assert!(!r.within, "the empty text is in neither");
        let r = union("x", &[]);
        assert_eq!((r.overlap, r.within), (false, false));
    }
}
