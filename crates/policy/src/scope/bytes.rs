//! Sets of bytes as a glob's steps hold them ([`Piece::Byte`]), and the few operations the scope
//! analysis needs on them and on whole globs read as [`Piece`]s.

use tollgate_policy_rules::glob::Piece;

/// Bit `b` of word `b / 64`: byte `b` is in the set.
pub type ByteSet = [u64; 4];

pub const FULL: ByteSet = [u64::MAX; 4];

pub use tollgate_policy_rules::relation::has;
#[cfg(test)]
use tollgate_policy_rules::relation::{closure, step};

pub fn count(set: &ByteSet) -> u32 {
    set.iter().map(|word| word.count_ones()).sum()
}

pub fn is_empty(set: &ByteSet) -> bool {
    set.iter().all(|word| *word == 0)
}

pub fn and(a: &ByteSet, b: &ByteSet) -> ByteSet {
    [a[0] & b[0], a[1] & b[1], a[2] & b[2], a[3] & b[3]]
}

pub fn not(a: &ByteSet) -> ByteSet {
    [!a[0], !a[1], !a[2], !a[3]]
}

/// `pieces` with runs of stars made one (`a**b` is `a*b`): the same keys, one way to write them.
pub fn normal(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        if piece == Piece::Star && out.last() == Some(&Piece::Star) {
            continue;
        }
        out.push(piece);
    }
    out
}

/// Whether some step of `pieces` matches no byte at all, so that the glob matches no key.
pub fn matches_nothing(pieces: &[Piece]) -> bool {
    pieces
        .iter()
        .any(|piece| matches!(piece, Piece::Byte(set) if is_empty(set)))
}

#[cfg(test)]
/// Whether `pieces` matches `text`, read step by step (the reference the other readings of
/// pieces are tested against).
pub fn matches(pieces: &[Piece], text: &[u8]) -> bool {
    let mut at = closure(pieces, vec![0]);
    for &byte in text {
        at = step(pieces, &at, byte);
        if at.is_empty() {
            return false;
        }
    }
    at.contains(&pieces.len())
}
