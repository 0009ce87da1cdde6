//! Mutations of a valid input: the bytes a fuzzer would try near a format's edges — a flipped,
//! inserted or dropped byte, a digit changed in a length, a cut, a repeat.

use proptest::prelude::*;

#[derive(Debug, Clone)]
pub enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Insert {
        at: usize,
        byte: u8,
    },
    Remove {
        at: usize,
    },
    /// Replaces the byte with one that means something in the format at hand.
    Special {
        at: usize,
        byte: u8,
    },
    Truncate {
        at: usize,
    },
    Repeat {
        at: usize,
        len: usize,
        times: usize,
    },
}

/// Up to `max` mutations; `specials` are the format's meaningful bytes.
pub fn mutations(max: usize, specials: &'static [u8]) -> impl Strategy<Value = Vec<Mutation>> {
    let index = any::<usize>();
    let mutation = prop_oneof![
        (index, 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (index, any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        index.prop_map(|at| Mutation::Remove { at }),
        (index, proptest::sample::select(specials))
            .prop_map(|(at, byte)| Mutation::Special { at, byte }),
        index.prop_map(|at| Mutation::Truncate { at }),
        (index, 1usize..16, 1usize..8).prop_map(|(at, len, times)| Mutation::Repeat {
            at,
            len,
            times
        }),
    ];
    proptest::collection::vec(mutation, 0..=max)
}

/// `input` with `mutations` applied in order; positions wrap around the current length.
pub fn apply(mut input: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let len = input.len();
        let pick = |at: usize| if len == 0 { 0 } else { at % len };
        match *mutation {
            Mutation::Flip { at, bit } if len > 0 => input[pick(at)] ^= 1 << bit,
            Mutation::Insert { at, byte } => input.insert(at % (len + 1), byte),
            Mutation::Remove { at } if len > 0 => {
                input.remove(pick(at));
            }
            Mutation::Special { at, byte } if len > 0 => input[pick(at)] = byte,
            Mutation::Truncate { at } => input.truncate(at % (len + 1)),
            Mutation::Repeat {
                at,
                len: span,
                times,
            } if len > 0 => {
                let start = pick(at);
                let end = (start + span).min(len);
                let piece = input[start..end].to_vec();
                for _ in 0..times {
                    input.splice(end..end, piece.iter().copied());
                }
            }
            _ => {}
        }
    }
    input
}

/// Cut points for feeding `len` bytes in pieces: sorted, within `0..=len`.
pub fn cuts(len: usize, raw: &[usize]) -> Vec<usize> {
    let mut cuts: Vec<usize> = raw.iter().map(|at| at % (len + 1)).collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}
