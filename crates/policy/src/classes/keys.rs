//! Key classes of one principal class and one command class: sets of keys on which every rule
//! that can apply there decides alike. An allow rule with `keys:` holds when every key lies in
//! its globs and a deny rule when any does (docs/policy.md), so a request's keys matter only
//! through the set of regions ([`super::atoms`]) they fall in; the classes are the values of
//! those predicates that some set of at most the command's number of keys reaches, found by
//! joining regions one at a time.

use std::collections::HashMap;

use super::atoms::Atoms;

/// Classes explored for one principal and command class before giving up.
const MAX_KEY_CLASSES: usize = 4096;

/// A keyed rule that can decide: its action and its globs (indices into the partition's globs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Predicate {
    pub allow: bool,
    pub globs: Vec<usize>,
}

/// One key class: the predicates' values, and the regions of a witness (empty: no key at all).
#[derive(Debug, Clone)]
pub struct KeyClass {
    pub values: Vec<bool>,
    pub regions: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct KeyClasses {
    pub classes: Vec<KeyClass>,
    by_values: HashMap<Vec<bool>, usize>,
    predicates: Vec<Predicate>,
    /// False when [`MAX_KEY_CLASSES`] cut the search short.
    pub complete: bool,
}

/// What a key class asks of a request's keys, comparable across principal and command classes:
/// the value of each distinct predicate there. Two classes with one condition hold the same key
/// sets (as many keys as each command names), so a diff can fold them into one row exactly.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Condition(Vec<(Predicate, bool)>);

fn values_of(predicates: &[Predicate], atoms: &Atoms, region: usize) -> Vec<bool> {
    let membership = &atoms.atoms[region].membership;
    predicates
        .iter()
        .map(|p| p.globs.iter().any(|&g| membership.has(g)))
        .collect()
}

/// The predicates' values for the union of two key sets: an allow rule needs both, a deny rule
/// either.
fn join(predicates: &[Predicate], a: &[bool], b: &[bool]) -> Vec<bool> {
    predicates
        .iter()
        .zip(a.iter().zip(b))
        .map(|(p, (&x, &y))| if p.allow { x && y } else { x || y })
        .collect()
}

impl KeyClasses {
    /// The classes for a command that names no key when `zero`, and up to `max` keys.
    pub fn new(predicates: Vec<Predicate>, atoms: &Atoms, zero: bool, max: usize) -> KeyClasses {
        let mut out = KeyClasses {
            classes: Vec::new(),
            by_values: HashMap::new(),
            predicates,
            complete: true,
        };
        if zero {
            out.insert(vec![false; out.predicates.len()], Vec::new());
        }
        if max == 0 {
            return out;
        }
        let singles: Vec<(Vec<bool>, usize)> = {
            let mut seen = HashMap::new();
            for region in 0..atoms.atoms.len() {
                seen.entry(values_of(&out.predicates, atoms, region))
                    .or_insert(region);
            }
            let mut singles: Vec<(Vec<bool>, usize)> = seen.into_iter().collect();
            singles.sort_by_key(|(_, region)| *region);
            singles
        };
        let mut frontier = Vec::new();
        for (values, region) in &singles {
            if out.insert(values.clone(), vec![*region]) {
                frontier.push(out.classes.len() - 1);
            }
        }
        let mut size = 1;
        while !frontier.is_empty() && size < max {
            size += 1;
            let mut next = Vec::new();
            for &at in &frontier {
                for (values, region) in &singles {
                    if out.classes.len() >= MAX_KEY_CLASSES {
                        out.complete = false;
                        return out;
                    }
                    let joined = join(&out.predicates, &out.classes[at].values, values);
                    let mut regions = out.classes[at].regions.clone();
                    regions.push(*region);
                    if out.insert(joined, regions) {
                        next.push(out.classes.len() - 1);
                    }
                }
            }
            frontier = next;
        }
        out
    }

    fn insert(&mut self, values: Vec<bool>, regions: Vec<usize>) -> bool {
        if self.by_values.contains_key(&values) {
            return false;
        }
        self.by_values.insert(values.clone(), self.classes.len());
        self.classes.push(KeyClass { values, regions });
        true
    }

    /// The condition of class `k`: a conjunction of its predicates' values, so their order and
    /// repeats do not matter.
    pub fn condition(&self, k: usize) -> Condition {
        let mut literals: Vec<(Predicate, bool)> = self
            .predicates
            .iter()
            .zip(&self.classes[k].values)
            .map(|(p, &value)| {
                let mut globs = p.globs.clone();
                globs.sort_unstable();
                globs.dedup();
                (
                    Predicate {
                        allow: p.allow,
                        globs,
                    },
                    value,
                )
            })
            .collect();
        literals.sort();
        literals.dedup();
        Condition(literals)
    }

    /// The class of a request whose keys lie in `regions` (empty: no key).
    pub fn class_of(&self, atoms: &Atoms, regions: &[usize]) -> Option<usize> {
        let values = regions
            .iter()
            .map(|&r| values_of(&self.predicates, atoms, r))
            .reduce(|a, b| join(&self.predicates, &a, &b))
            .unwrap_or_else(|| vec![false; self.predicates.len()]);
        self.by_values.get(&values).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoy_beside_a_protected_key_is_a_class_of_its_own() {
        // deny @write on shared:*, allow acme:* and shared:*.
        let atoms = Atoms::new(&["shared:*", "acme:*"]);
        let predicates = vec![
            Predicate {
                allow: false,
                globs: vec![0],
            },
            Predicate {
                allow: true,
                globs: vec![0, 1],
            },
        ];
        let single = KeyClasses::new(predicates.clone(), &atoms, false, 1);
        // acme:x (allowed), shared:x (denied), x (neither).
        assert_eq!(single.classes.len(), 3);
        let several = KeyClasses::new(predicates, &atoms, true, usize::MAX);
        // Plus x beside shared:x (denied, not allowed). No key at all is `x` alone to every
        // rule, and so is x beside acme:x: neither is a class of its own.
        assert_eq!(several.classes.len(), 4);
        assert!(several.classes[0].regions.is_empty());
        let region = |key: &str| atoms.atom_of(key.as_bytes()).unwrap();
        let mixed = several
            .class_of(&atoms, &[region("x"), region("shared:1")])
            .unwrap();
        assert_eq!(several.classes[mixed].values, [true, false]);
        let mine = several
            .class_of(&atoms, &[region("acme:1"), region("shared:1")])
            .unwrap();
        assert_eq!(several.classes[mine].values, [true, true]);
    }
}
