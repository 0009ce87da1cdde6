//! The shadowed-rule check: whether an earlier rule matches every request a later one matches, so
//! the later one can never decide. Comparing every rule with every earlier one is quadratic (a
//! policy of 50,000 rules is over a billion comparisons), so earlier rules are indexed by what
//! they match and a rule is compared only with the candidates that could cover it; a budget of
//! work bounds what indexing cannot (rules alike in everything indexed), after which the check
//! stops with a warning rather than running on.

use std::collections::HashMap;

use tollgate_policy_rules::{Action, Category, Rule, Target};

use super::CatalogIndex;

/// Units of comparison work (roughly, list elements compared) the check may spend on one file.
pub const BUDGET: u64 = 20_000_000;

/// What the check found for one rule.
#[derive(Debug, PartialEq, Eq)]
pub enum Shadow {
    /// No earlier rule covers it (as far as the conservative test can tell).
    Clear,
    /// This earlier rule (an index into the rules added so far) matches everything it does.
    CoveredBy(usize),
    /// The budget ran out on this rule: neither it nor any later rule is checked.
    Exhausted,
}

/// Earlier rules, indexed, and the work left to spend on them.
pub struct Shadows<'a> {
    catalog: &'a CatalogIndex,
    budget: u64,
    exhausted: bool,
    index: Index,
}

/// Earlier rules by every dimension a cover must agree on; lists hold rule numbers in order.
#[derive(Default)]
struct Index {
    /// Rules for every principal, and rules by each principal they name.
    any_principal: Vec<usize>,
    by_principal: HashMap<String, Vec<usize>>,
    /// Command rules for `*`, by name, by category.
    any_command: Vec<usize>,
    by_name: HashMap<String, Vec<usize>>,
    by_category: HashMap<Category, Vec<usize>>,
    /// Command rules without `keys`, with a `*` glob, and by each glob.
    keyless: Vec<usize>,
    every_key: Vec<usize>,
    by_key: HashMap<String, Vec<usize>>,
    /// Lease rules with a `*` glob, and by each glob.
    every_resource: Vec<usize>,
    by_resource: HashMap<String, Vec<usize>>,
}

impl<'a> Shadows<'a> {
    pub fn new(catalog: &'a CatalogIndex) -> Self {
        Shadows {
            catalog,
            budget: BUDGET,
            exhausted: false,
            index: Index::default(),
        }
    }

    /// Checks `rule` against `earlier` (every rule added so far, in order); the earliest cover
    /// wins.
    pub fn check(&mut self, rule: &Rule, earlier: &[Rule]) -> Shadow {
        if self.exhausted {
            return Shadow::Clear;
        }
        let mut best: Option<usize> = None;
        for list in self.index.candidates(rule, self.catalog) {
            for &index in list {
                if best.is_some_and(|b| b <= index) {
                    // Lists are in rule order: nothing later in this one can be earlier.
                    break;
                }
                let cost = cost(&earlier[index], rule);
                if cost > self.budget {
                    self.exhausted = true;
                    return Shadow::Exhausted;
                }
                self.budget -= cost;
                if covers(&earlier[index], rule, self.catalog) {
                    best = Some(index);
                    break;
                }
            }
        }
        best.map_or(Shadow::Clear, Shadow::CoveredBy)
    }

    /// Records `rule` as rule number `index`.
    pub fn add(&mut self, index: usize, rule: &Rule) {
        self.index.add(index, rule);
    }
}

impl Index {
    fn add(&mut self, index: usize, rule: &Rule) {
        match &rule.principals {
            None => self.any_principal.push(index),
            Some(names) => {
                for name in dedup(names) {
                    self.by_principal
                        .entry(name.clone())
                        .or_default()
                        .push(index);
                }
            }
        }
        match &rule.target {
            Target::Commands {
                names,
                categories,
                any,
                keys,
                ..
            } => {
                if *any {
                    self.any_command.push(index);
                }
                for name in dedup(names) {
                    self.by_name.entry(name.clone()).or_default().push(index);
                }
                for category in categories.iter() {
                    self.by_category.entry(category).or_default().push(index);
                }
                match keys {
                    None => self.keyless.push(index),
                    Some(globs) if globs.iter().any(|g| g == "*") => self.every_key.push(index),
                    Some(globs) => {
                        for glob in dedup(globs) {
                            self.by_key.entry(glob.clone()).or_default().push(index);
                        }
                    }
                }
            }
            Target::Leases { resources } => {
                if resources.iter().any(|g| g == "*") {
                    self.every_resource.push(index);
                } else {
                    for glob in dedup(resources) {
                        self.by_resource
                            .entry(glob.clone())
                            .or_default()
                            .push(index);
                    }
                }
            }
        }
    }

    /// The lists holding every earlier rule that could cover `rule`, from the most selective
    /// dimension. A cover must, in each dimension, include what `rule` matches, so it is found in
    /// each dimension's lists for any one of `rule`'s values; the shortest such union is searched.
    fn candidates<'s>(&'s self, rule: &Rule, catalog: &CatalogIndex) -> Vec<&'s [usize]> {
        let none: &[usize] = &[];
        let get = |map: &'s HashMap<String, Vec<usize>>, key: &str| -> &'s [usize] {
            map.get(key).map_or(none, Vec::as_slice)
        };
        let mut dimensions: Vec<Vec<&'s [usize]>> = Vec::new();
        match &rule.principals {
            None => dimensions.push(vec![&self.any_principal]),
            Some(names) => {
                if let Some(first) = names.first() {
                    dimensions.push(vec![&self.any_principal, get(&self.by_principal, first)]);
                }
            }
        }
        match &rule.target {
            Target::Commands {
                names,
                categories,
                any,
                keys,
                ..
            } => {
                let mut commands: Vec<&'s [usize]> = vec![&self.any_command];
                if *any {
                    dimensions.push(commands);
                } else if let Some(name) = names.first() {
                    // A cover names it, or its parent, or a category it belongs to.
                    commands.push(get(&self.by_name, name));
                    if let Some((parent, _)) = name.split_once('|') {
                        commands.push(get(&self.by_name, parent));
                    }
                    for category in catalog.categories(name).iter() {
                        commands.push(self.by_category.get(&category).map_or(none, Vec::as_slice));
                    }
                    dimensions.push(commands);
                } else if let Some(category) = categories.iter().next() {
                    commands.push(self.by_category.get(&category).map_or(none, Vec::as_slice));
                    dimensions.push(commands);
                }
                match keys {
                    None => dimensions.push(vec![&self.keyless]),
                    Some(globs) => {
                        if let Some(first) = globs.first() {
                            dimensions.push(vec![
                                &self.keyless,
                                &self.every_key,
                                get(&self.by_key, first),
                            ]);
                        }
                    }
                }
            }
            Target::Leases { resources } => {
                if let Some(first) = resources.first() {
                    dimensions.push(vec![&self.every_resource, get(&self.by_resource, first)]);
                }
            }
        }
        dimensions
            .into_iter()
            .min_by_key(|lists| lists.iter().map(|l| l.len()).sum::<usize>())
            // Every dimension has a value for a compiled rule; an empty one narrows nothing.
            .unwrap_or_default()
    }
}

fn dedup(items: &[String]) -> impl Iterator<Item = &String> {
    let mut seen = std::collections::HashSet::new();
    items.iter().filter(move |item| seen.insert(item.as_str()))
}

/// The work [`covers`] may do on this pair: the products of the lists it compares.
fn cost(earlier: &Rule, later: &Rule) -> u64 {
    let len = |list: Option<&Vec<String>>| list.map_or(0, Vec::len) as u64;
    let principals = len(earlier.principals.as_ref()) * len(later.principals.as_ref());
    let targets = match (&earlier.target, &later.target) {
        (
            Target::Commands {
                names: en,
                keys: ek,
                ..
            },
            Target::Commands {
                names: ln,
                keys: lk,
                ..
            },
        ) => en.len() as u64 * ln.len() as u64 + len(ek.as_ref()) * len(lk.as_ref()),
        (Target::Leases { resources: e }, Target::Leases { resources: l }) => {
            e.len() as u64 * l.len() as u64
        }
        _ => 0,
    };
    1 + principals + targets
}

/// Whether `earlier` matches every request `later` matches (a conservative test: `false` when
/// unsure, so warnings are never wrong).
fn covers(earlier: &Rule, later: &Rule, catalog: &CatalogIndex) -> bool {
    let principals = match (&earlier.principals, &later.principals) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(e), Some(l)) => l.iter().all(|p| e.contains(p)),
    };
    principals
        && match (&earlier.target, &later.target) {
            (
                Target::Commands {
                    names: en,
                    categories: ec,
                    any: eany,
                    keys: ek,
                    channels: echan,
                    lanes: el,
                },
                Target::Commands {
                    names: ln,
                    categories: lc,
                    any: lany,
                    keys: lk,
                    channels: lchan,
                    lanes: ll,
                },
            ) => {
                let commands = *eany
                    || (!*lany
                        && lc.0 & !ec.0 == 0
                        && ln.iter().all(|name| {
                            let parent = name.split_once('|').map_or(name.as_str(), |(p, _)| p);
                            en.iter().any(|e| e == name || e == parent)
                                || catalog.categories(name).intersects(*ec)
                        }));
                let keys = match (ek, lk) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some(e), Some(l)) => keys_cover(earlier.action, e, later.action, l),
                };
                // With channels, a missing field no longer means "whatever": a rule with only
                // `channels:` matches no keyed command. Covered only field for field.
                let keys = match (echan, lchan) {
                    (None, None) => keys,
                    (Some(e), Some(l)) => {
                        ek.is_some() == lk.is_some()
                            && keys
                            && keys_cover(earlier.action, e, later.action, l)
                    }
                    _ => false,
                };
                let lanes = match (el, ll) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some(e), Some(l)) => l & !e == 0,
                };
                commands && keys && lanes
            }
            (Target::Leases { resources: e }, Target::Leases { resources: l }) => {
                e.iter().any(|g| g == "*") || l.iter().all(|g| e.contains(g))
            }
            _ => false,
        }
}

/// Whether every key set `later`'s globs match is one `earlier`'s match, given how each rule's
/// action reads its globs (allow: every key; deny: any key). A `*` glob matches every non-empty
/// key set whatever the action. Otherwise `later`'s globs must be among `earlier`'s, and an
/// allow rule cannot cover a deny rule: the deny rule matches `protected:1 other`, which an
/// allow rule on `protected:*` does not.
fn keys_cover(earlier: Action, e: &[String], later: Action, l: &[String]) -> bool {
    e.iter().any(|g| g == "*")
        || (!(earlier == Action::Allow && later == Action::Deny) && l.iter().all(|g| e.contains(g)))
}

#[cfg(test)]
mod tests {
    use tollgate_policy_rules::CategorySet;

    use super::*;

    fn rule(id: &str, action: Action, names: &[&str], keys: Option<&[&str]>) -> Rule {
        Rule {
            id: id.into(),
            principals: None,
            target: Target::Commands {
                names: names.iter().map(|s| s.to_string()).collect(),
                categories: CategorySet::default(),
                any: false,
                keys: keys.map(|k| k.iter().map(|s| s.to_string()).collect()),
                channels: None,
                lanes: None,
            },
            action,
            reason: String::new(),
        }
    }

    fn check(rules: &[Rule]) -> Vec<Shadow> {
        let catalog = CatalogIndex::default();
        let mut shadows = Shadows::new(&catalog);
        rules
            .iter()
            .enumerate()
            .map(|(index, rule)| {
                let found = shadows.check(rule, &rules[..index]);
                shadows.add(index, rule);
                found
            })
            .collect()
    }

    #[test]
    fn an_allow_rule_does_not_cover_a_deny_rule_on_the_same_globs() {
        let p = Some(&["p:*"][..]);
        let found = check(&[
            rule("allow", Action::Allow, &["DEL"], p),
            rule("deny", Action::Deny, &["DEL"], p),
            rule("allow-again", Action::Allow, &["DEL"], p),
        ]);
        assert_eq!(found, [Shadow::Clear, Shadow::Clear, Shadow::CoveredBy(0)]);
        let found = check(&[
            rule("deny", Action::Deny, &["DEL"], p),
            rule("allow", Action::Allow, &["DEL"], p),
            rule("all", Action::Allow, &["DEL"], Some(&["*"])),
            rule("deny-more", Action::Deny, &["DEL"], p),
        ]);
        assert_eq!(
            found,
            [
                Shadow::Clear,
                Shadow::CoveredBy(0),
                Shadow::Clear,
                Shadow::CoveredBy(0)
            ]
        );
    }

    #[test]
    fn the_earliest_cover_is_reported_whichever_index_finds_it() {
        let found = check(&[
            rule("keyless", Action::Allow, &["GET"], None),
            rule("star", Action::Allow, &["GET"], Some(&["*"])),
            rule("get", Action::Allow, &["GET"], Some(&["a:*"])),
        ]);
        assert_eq!(found[2], Shadow::CoveredBy(0));
    }

    #[test]
    fn distinct_rules_are_not_compared_and_alike_ones_exhaust_the_budget() {
        // 50,000 rules on distinct keys: each one's key index holds no candidate.
        let rules: Vec<Rule> = (0..50_000)
            .map(|i| {
                let glob = format!("k:{i}:*");
                rule(
                    &format!("r{i}"),
                    Action::Allow,
                    &["GET"],
                    Some(&[glob.as_str()]),
                )
            })
            .collect();
        assert!(check(&rules).iter().all(|s| *s == Shadow::Clear));
        // Rules alike in every indexed dimension, none covering another (each key list is a
        // superset of the next's): compared pairwise until the budget runs out.
        let globs: Vec<String> = (0..64).map(|i| format!("g{i}")).collect();
        let rules: Vec<Rule> = (0..2_000)
            .map(|i| Rule {
                principals: Some(vec!["p".into(), format!("q{i}")]),
                ..rule(&format!("r{i}"), Action::Allow, &["GET"], Some(&[]))
            })
            .map(|mut r| {
                if let Target::Commands { keys, .. } = &mut r.target {
                    *keys = Some(globs.clone());
                }
                r
            })
            .collect();
        let found = check(&rules);
        assert!(found.contains(&Shadow::Exhausted), "never ran out");
        assert!(!found.iter().any(|s| matches!(s, Shadow::CoveredBy(_))));
    }
}
