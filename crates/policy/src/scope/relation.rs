//! How two globs' key sets relate: whether they share a key, and whether one holds every key of
//! the other. Both are read as automata over [`Piece`]s and walked together, one representative
//! byte for each group of bytes no step tells apart, so the answer is exact.

use std::collections::{HashSet, VecDeque};

use tollgate_policy_rules::glob::Piece;

use super::bytes::{closure, has, step};

/// Pairs of states walked before giving up (globs too alike and too starry to compare).
const MAX_STATES: usize = 50_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relation {
    /// Some key matches both.
    pub overlap: bool,
    /// Every key the first matches, the second matches too.
    pub within: bool,
}

/// How `a` relates to `b`; `None` when the walk outgrew its bound.
pub fn relate(a: &[Piece], b: &[Piece]) -> Option<Relation> {
    let letters = alphabet(&[a, b]);
    let start = (closure(a, vec![0]), closure(b, vec![0]));
    let mut seen = HashSet::from([start.clone()]);
    let mut queue = VecDeque::from([start]);
    let mut relation = Relation {
        overlap: false,
        within: true,
    };
    while let Some((in_a, in_b)) = queue.pop_front() {
        if in_a.contains(&a.len()) {
            if in_b.contains(&b.len()) {
                relation.overlap = true;
            } else {
                relation.within = false;
            }
        }
        if relation.overlap && !relation.within {
            break;
        }
        for &byte in &letters {
            let next = (step(a, &in_a, byte), step(b, &in_b, byte));
            // Once `a` matches nothing more, nothing of `a` lies further on.
            if next.0.is_empty() || seen.contains(&next) {
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
    use tollgate_policy_rules::glob::pieces;

    fn relation(a: &str, b: &str) -> Relation {
        relate(&pieces(a.as_bytes()), &pieces(b.as_bytes())).unwrap()
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
}
