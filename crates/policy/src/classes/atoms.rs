//! The exact partition of the key space by a set of globs: every non-empty region of their Venn
//! diagram (which globs a key matches and which it does not), each with a short witness key.
//! Computed on the product of the globs' automata, read from [`glob::pieces`] so that classes,
//! ranges and escapes mean what the matcher makes of them.

use std::collections::{HashMap, HashSet, VecDeque};

use tollgate_policy_rules::glob::{self, Piece};

/// Product states explored before the partition gives up (a pathological set of globs).
const MAX_STATES: usize = 200_000;

/// Which of the globs a key matches, one bit per glob.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Membership(Vec<u64>);

impl Membership {
    fn empty(globs: usize) -> Membership {
        Membership(vec![0; globs.div_ceil(64)])
    }

    fn set(&mut self, at: usize) {
        self.0[at / 64] |= 1 << (at % 64);
    }

    pub fn has(&self, at: usize) -> bool {
        self.0[at / 64] & (1 << (at % 64)) != 0
    }
}

/// One region of the partition.
#[derive(Debug, Clone)]
pub struct Atom {
    pub membership: Membership,
    pub witness: Vec<u8>,
}

/// The partition of every byte string by `globs`.
#[derive(Debug, Clone)]
pub struct Atoms {
    globs: Vec<Vec<Piece>>,
    pub atoms: Vec<Atom>,
    by_membership: HashMap<Membership, usize>,
    /// False when the product automaton outgrew [`MAX_STATES`]: some regions may be missing.
    pub complete: bool,
}

/// A state of every glob's automaton at once: glob `g`'s positions are bits
/// `offsets[g]..offsets[g+1]`.
type State = Vec<u64>;

struct Product<'a> {
    globs: &'a [Vec<Piece>],
    offsets: Vec<usize>,
    /// For each bit of a state: its glob and position.
    owner: Vec<(usize, usize)>,
}

impl Product<'_> {
    fn new(globs: &[Vec<Piece>]) -> Product<'_> {
        let mut offsets = vec![0];
        let mut owner = Vec::new();
        for (g, pieces) in globs.iter().enumerate() {
            offsets.push(offsets.last().copied().unwrap_or(0) + pieces.len() + 1);
            owner.extend((0..=pieces.len()).map(|at| (g, at)));
        }
        Product {
            globs,
            offsets,
            owner,
        }
    }

    fn words(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0).div_ceil(64)
    }

    fn has(state: &State, bit: usize) -> bool {
        state[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// Adds position `at` of glob `g`, and every position a run of stars after it reaches.
    fn add(&self, state: &mut State, g: usize, mut at: usize) {
        loop {
            let bit = self.offsets[g] + at;
            state[bit / 64] |= 1 << (bit % 64);
            match self.globs[g].get(at) {
                Some(Piece::Star) => at += 1,
                _ => return,
            }
        }
    }

    fn start(&self) -> State {
        let mut state = vec![0; self.words()];
        for g in 0..self.globs.len() {
            self.add(&mut state, g, 0);
        }
        state
    }

    fn step(&self, state: &State, byte: u8) -> State {
        let mut next = vec![0; self.words()];
        for (word, &bits) in state.iter().enumerate() {
            let mut bits = bits;
            while bits != 0 {
                let bit = word * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let (g, at) = self.owner[bit];
                match self.globs[g].get(at) {
                    Some(Piece::Star) => self.add(&mut next, g, at),
                    Some(Piece::Byte(set))
                        if set[usize::from(byte / 64)] & (1 << (byte % 64)) != 0 =>
                    {
                        self.add(&mut next, g, at + 1)
                    }
                    _ => {}
                }
            }
        }
        next
    }

    fn membership(&self, state: &State) -> Membership {
        let mut out = Membership::empty(self.globs.len());
        for (g, pieces) in self.globs.iter().enumerate() {
            if Self::has(state, self.offsets[g] + pieces.len()) {
                out.set(g);
            }
        }
        out
    }
}

/// The order in which bytes stand for their class in a witness: readable ones first.
fn rank(byte: u8) -> u16 {
    match byte {
        b'x' => 0,
        b'a'..=b'z' => 1 + u16::from(byte),
        b'0'..=b'9' | b':' | b'_' | b'-' | b'.' => 300 + u16::from(byte),
        b'A'..=b'Z' => 600 + u16::from(byte),
        0x21..=0x7e => 900 + u16::from(byte),
        _ => 1200 + u16::from(byte),
    }
}

/// Bytes that no glob tells apart, each class as its most readable member.
fn alphabet(globs: &[Vec<Piece>]) -> Vec<u8> {
    let sets: Vec<&[u64; 4]> = globs
        .iter()
        .flatten()
        .filter_map(|piece| match piece {
            Piece::Byte(set) => Some(set),
            Piece::Star => None,
        })
        .collect();
    let mut classes: HashMap<Vec<bool>, u8> = HashMap::new();
    for byte in 0..=255u8 {
        let signature: Vec<bool> = sets
            .iter()
            .map(|set| set[usize::from(byte / 64)] & (1 << (byte % 64)) != 0)
            .collect();
        let best = classes.entry(signature).or_insert(byte);
        if rank(byte) < rank(*best) {
            *best = byte;
        }
    }
    let mut out: Vec<u8> = classes.into_values().collect();
    out.sort_by_key(|&b| rank(b));
    out
}

impl Atoms {
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Atoms {
        let globs: Vec<Vec<Piece>> = patterns
            .iter()
            .map(|p| glob::pieces(p.as_ref().as_bytes()))
            .collect();
        let product = Product::new(&globs);
        let letters = alphabet(&globs);
        let start = product.start();
        let mut seen: HashSet<State> = HashSet::new();
        let mut queue = VecDeque::new();
        let mut atoms: Vec<Atom> = Vec::new();
        let mut by_membership = HashMap::new();
        seen.insert(start.clone());
        queue.push_back((start, Vec::new()));
        let mut complete = true;
        while let Some((state, path)) = queue.pop_front() {
            let membership = product.membership(&state);
            if !by_membership.contains_key(&membership) {
                by_membership.insert(membership.clone(), atoms.len());
                atoms.push(Atom {
                    membership,
                    witness: path.clone(),
                });
            }
            for &byte in &letters {
                let next = product.step(&state, byte);
                if seen.contains(&next) {
                    continue;
                }
                if seen.len() >= MAX_STATES {
                    complete = false;
                    continue;
                }
                seen.insert(next.clone());
                let mut longer = path.clone();
                longer.push(byte);
                queue.push_back((next, longer));
            }
        }
        let mut partition = Atoms {
            globs,
            atoms,
            by_membership,
            complete,
        };
        partition.readable_witnesses();
        partition.atoms.sort_by(|a, b| a.witness.cmp(&b.witness));
        partition.by_membership = partition
            .atoms
            .iter()
            .enumerate()
            .map(|(at, atom)| (atom.membership.clone(), at))
            .collect();
        partition
    }

    /// `acme:x` rather than `acme:` for `acme:*`, `x` rather than the empty key: a visible
    /// witness where one of the same region exists.
    fn readable_witnesses(&mut self) {
        let readable: Vec<Option<Vec<u8>>> = self
            .atoms
            .iter()
            .map(|atom| {
                let mut longer = atom.witness.clone();
                longer.push(b'x');
                (self.membership_of(&longer) == atom.membership).then_some(longer)
            })
            .collect();
        for (atom, readable) in self.atoms.iter_mut().zip(readable) {
            if let Some(witness) = readable {
                atom.witness = witness;
            }
        }
    }

    fn membership_of(&self, key: &[u8]) -> Membership {
        let product = Product::new(&self.globs);
        let mut state = product.start();
        for &byte in key {
            state = product.step(&state, byte);
        }
        product.membership(&state)
    }

    /// The region `key` lies in; `None` only when the partition is incomplete.
    pub fn atom_of(&self, key: &[u8]) -> Option<usize> {
        self.by_membership.get(&self.membership_of(key)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regions(patterns: &[&str]) -> Vec<(String, Vec<bool>)> {
        let atoms = Atoms::new(patterns);
        assert!(atoms.complete);
        atoms
            .atoms
            .iter()
            .map(|atom| {
                let witness = String::from_utf8_lossy(&atom.witness).into_owned();
                let bits = (0..patterns.len())
                    .map(|g| atom.membership.has(g))
                    .collect();
                (witness, bits)
            })
            .collect()
    }

    #[test]
    fn overlapping_prefixes_give_every_region_of_the_venn_diagram() {
        assert_eq!(
            regions(&["acme:*", "acme:admin:*"]),
            [
                ("acme:admin:x".to_owned(), vec![true, true]),
                ("acme:x".to_owned(), vec![true, false]),
                ("x".to_owned(), vec![false, false]),
            ]
        );
    }

    #[test]
    fn disjoint_and_empty_regions_are_left_out() {
        // No key matches both, and `a?` and `[a]?` match the same keys.
        assert_eq!(regions(&["a*", "b*"]).len(), 3);
        assert_eq!(regions(&["a?", "[a]?"]).len(), 2);
        // The empty key is a region of its own when a glob tells it apart.
        let with_empty = regions(&["?*"]);
        assert!(with_empty.contains(&(String::new(), vec![false])));
    }

    #[test]
    fn each_witness_lies_in_its_region_by_the_matcher_itself() {
        let patterns = [
            "user:[a-c]?",
            "user:[^b]*",
            "*:profile",
            "\\*lit",
            "[]x]y",
            "h?llo",
            "*",
        ];
        let atoms = Atoms::new(&patterns);
        assert!(atoms.complete);
        for atom in &atoms.atoms {
            for (g, pattern) in patterns.iter().enumerate() {
                assert_eq!(
                    glob::matches(pattern.as_bytes(), &atom.witness),
                    atom.membership.has(g),
                    "{pattern} vs {:?}",
                    String::from_utf8_lossy(&atom.witness)
                );
            }
        }
        // Every key falls in some region, the one its matches say.
        for key in [
            "user:ax",
            "user:bx",
            "user:b",
            "a:profile",
            "*lit",
            "]y",
            "hello",
            "",
        ] {
            let at = atoms.atom_of(key.as_bytes()).expect("a region");
            for (g, pattern) in patterns.iter().enumerate() {
                assert_eq!(
                    glob::matches(pattern.as_bytes(), key.as_bytes()),
                    atoms.atoms[at].membership.has(g)
                );
            }
        }
    }
}
