//! Decision tables for review: every catalog command × every principal × key samples drawn from
//! the policy's own globs (one that matches and a near miss for each), with the deciding rule.
//! Commands that can name several keys also get, per glob, a decoy at the first key and the
//! glob's match at the others (`~cme:x,acme:x`, `acme:x,shared:x`; the decoy is the near miss or
//! another glob's match): an allow rule needs every key to match and a deny rule any, so these
//! are the rows where the two differ. `diff` keeps only the rows whose
//! decision changed between two tables.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use tollgate_model::Caller;
use tollgate_policy_rules::{glob, Target, LEASE_COMMAND};

use crate::decision::Decision;
use crate::generation::Generation;
use crate::sandbox::bindings;

/// The sample key of a command when the policy has no key globs.
const PLAIN_KEY: &str = "key";

/// Which request a row is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Case {
    pub principal: String,
    pub command: String,
    /// The sample put at every key position; `None` for commands without keys. `decoy,key`: the
    /// decoy at the first key position and the key at every other.
    pub key: Option<String>,
}

/// `allow <rule>` or `deny <rule>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub rule: String,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = if self.allowed { "allow" } else { "deny " };
        write!(f, "{word} {}", self.rule)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Table {
    pub rows: BTreeMap<Case, Verdict>,
}

/// The decision table of the generation's policies and modules.
pub fn table(generation: &Generation) -> Table {
    let (key_globs, lease_globs) = globs(generation);
    let keys = samples(&key_globs);
    let keys = if keys.is_empty() {
        vec![PLAIN_KEY.to_owned()]
    } else {
        keys
    };
    let mixed = decoys(&key_globs);
    let leases = samples(&lease_globs);
    // The form of each command that names several keys, if it has one.
    let several: Vec<Option<bindings::Descriptor>> = generation
        .descriptors()
        .iter()
        .map(|descriptor| several_keys(generation, descriptor))
        .collect();
    let mut rows = BTreeMap::new();
    for principal in generation.principals() {
        let who = Caller {
            principal: principal.name.clone(),
            uid: 0,
            gid: 0,
            pid: 0,
        };
        for (descriptor, several) in generation.descriptors().iter().zip(&several) {
            if let Some(several) = several {
                for (decoy, key) in &mixed {
                    let keys = std::iter::once(decoy)
                        .chain(std::iter::repeat(key))
                        .take(several.keys.len())
                        .map(|k| k.as_bytes().to_vec())
                        .collect();
                    let decision = generation.judge_sample(&who, several, keys);
                    rows.insert(
                        case(
                            &principal.name,
                            &descriptor.name,
                            Some(&format!("{decoy},{key}")),
                        ),
                        verdict(&decision),
                    );
                }
            }
            let samples: Vec<Option<&String>> = if descriptor.keys.is_empty() {
                vec![None]
            } else {
                keys.iter().map(Some).collect()
            };
            for key in samples {
                let at_every_key = descriptor
                    .keys
                    .iter()
                    .map(|_| key.map_or_else(Vec::new, |k| k.as_bytes().to_vec()))
                    .collect();
                let decision = generation.judge_sample(&who, descriptor, at_every_key);
                rows.insert(
                    case(&principal.name, &descriptor.name, key),
                    verdict(&decision),
                );
            }
        }
        for resource in &leases {
            let decision = generation.admit_lease(&who, resource);
            rows.insert(
                case(&principal.name, LEASE_COMMAND, Some(resource)),
                verdict(&decision),
            );
        }
    }
    Table { rows }
}

fn case(principal: &str, command: &str, key: Option<&String>) -> Case {
    Case {
        principal: principal.to_owned(),
        command: command.to_owned(),
        key: key.cloned(),
    }
}

fn verdict(decision: &Decision) -> Verdict {
    match decision {
        Decision::Admitted { rule, .. } => Verdict {
            allowed: true,
            rule: rule.clone(),
        },
        Decision::Denied(denial) => Verdict {
            allowed: false,
            rule: denial.rule.clone(),
        },
    }
}

/// Key globs and lease globs of every rule of every policy file, each once.
fn globs(generation: &Generation) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut keys = BTreeSet::new();
    let mut leases = BTreeSet::new();
    for rule in generation.files().iter().flat_map(|f| &f.policy.rules) {
        match &rule.target {
            Target::Commands {
                keys: Some(globs), ..
            } => keys.extend(globs.iter().cloned()),
            Target::Commands { keys: None, .. } => {}
            Target::Leases { resources } => leases.extend(resources.iter().cloned()),
        }
    }
    (keys, leases)
}

/// For each glob, a text it matches and a near miss (one literal byte changed) that it does not.
pub fn samples(globs: &BTreeSet<String>) -> Vec<String> {
    let mut out = BTreeSet::new();
    for pattern in globs {
        let hit = instance(pattern);
        if let Some(miss) = near_miss(pattern, &hit) {
            out.insert(miss);
        }
        out.insert(hit);
    }
    out.into_iter().collect()
}

/// A short text `pattern` matches: `x` for `*` and `?` (visible in a table, unlike an empty
/// match), a class's first member (`~` for a negated class).
fn instance(pattern: &str) -> String {
    let bytes = pattern.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'*' | b'?' => out.push(b'x'),
            b'\\' if i + 1 < bytes.len() => {
                i += 1;
                out.push(bytes[i]);
            }
            b'[' => {
                let close = bytes[i + 1..]
                    .iter()
                    .skip(1)
                    .position(|&b| b == b']')
                    .map(|p| i + 2 + p);
                let first = i + 1 + usize::from(bytes.get(i + 1) == Some(&b'^'));
                let member = if bytes.get(i + 1) == Some(&b'^') {
                    b'~'
                } else {
                    bytes[first]
                };
                out.push(member);
                i = close.unwrap_or(bytes.len());
            }
            literal => out.push(literal),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// For each glob, decoys beside the text it matches: its near miss, and what each other glob
/// matches (`acme:x` beside `shared:x`: one rule grants the decoy, another protects the key).
fn decoys(globs: &BTreeSet<String>) -> Vec<(String, String)> {
    let hits: Vec<String> = globs.iter().map(|pattern| instance(pattern)).collect();
    let mut out = BTreeSet::new();
    for (pattern, hit) in globs.iter().zip(&hits) {
        if let Some(miss) = near_miss(pattern, hit) {
            out.insert((miss, hit.clone()));
        }
        for other in &hits {
            if !glob::matches(pattern.as_bytes(), other.as_bytes()) {
                out.insert((other.clone(), hit.clone()));
            }
        }
    }
    out.into_iter().collect()
}

/// The form of `descriptor`'s command that names two keys or more: its shortest form when that
/// does (RENAME, SMOVE), else, for a command of variable arity, what the catalog says of it with
/// two more arguments than its shortest form (`DEL x x x`, `MSET x x x x`). `None` when neither
/// does: one key only (GET), or keys that follow a keyword or a count (XREAD, EVAL), which
/// placeholders do not reach.
fn several_keys(
    generation: &Generation,
    descriptor: &bindings::Descriptor,
) -> Option<bindings::Descriptor> {
    if descriptor.keys.len() >= 2 {
        return Some(descriptor.clone());
    }
    if descriptor.keys.is_empty() || descriptor.arity >= 0 {
        return None;
    }
    let mut argv: Vec<&str> = descriptor.name.split('|').collect();
    let argc = descriptor.arity.unsigned_abs() as usize + 2;
    argv.resize(argc.max(argv.len()), "x");
    let described = generation.describe_argv(&argv)?;
    (described.name == descriptor.name && described.keys.len() >= 2).then_some(described)
}

/// `hit` with its first character changed so that `pattern` no longer matches, if there is one.
fn near_miss(pattern: &str, hit: &str) -> Option<String> {
    (0..hit.len()).find_map(|at| {
        let mut bytes = hit.as_bytes().to_vec();
        bytes[at] = if bytes[at] == b'~' { b'!' } else { b'~' };
        let miss = String::from_utf8(bytes).ok()?;
        (!glob::matches(pattern.as_bytes(), miss.as_bytes())).then_some(miss)
    })
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (case, verdict) in &self.rows {
            writeln!(f, "{} {verdict}", render(case))?;
        }
        Ok(())
    }
}

fn render(case: &Case) -> String {
    format!(
        "{:<12} {:<28} {:<20}",
        case.principal,
        case.command,
        case.key.as_deref().unwrap_or("-")
    )
}

/// The rows of `new` whose decision differs from `old`'s, and rows only one side has.
pub struct Diff {
    pub lines: Vec<String>,
}

pub fn diff(old: &Table, new: &Table) -> Diff {
    let cases: BTreeSet<&Case> = old.rows.keys().chain(new.rows.keys()).collect();
    let lines = cases
        .into_iter()
        .filter_map(|case| match (old.rows.get(case), new.rows.get(case)) {
            (Some(a), Some(b)) if a == b => None,
            (a, b) => Some(format!(
                "{} {} -> {}",
                render(case),
                a.map_or("(absent)".to_owned(), ToString::to_string),
                b.map_or("(absent)".to_owned(), ToString::to_string)
            )),
        })
        .collect();
    Diff { lines }
}

impl fmt::Display for Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// The catalog, one command a line: name, lane, arity, key positions (r/w), traits, categories.
pub fn catalog(generation: &Generation) -> String {
    let mut out = String::new();
    for d in generation.catalog() {
        let keys: Vec<String> = d
            .keys
            .iter()
            .map(|k| {
                format!(
                    "{}{}{}",
                    k.position,
                    if k.read { "r" } else { "" },
                    if k.write { "w" } else { "" }
                )
            })
            .collect();
        let traits = serde_json::to_value(d.traits).unwrap_or_default();
        let traits: Vec<&str> = traits
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, on)| on.as_bool() == Some(true))
            .map(|(name, _)| name.as_str())
            .collect();
        let categories: Vec<String> = d
            .categories
            .iter()
            .map(|c| format!("@{}", c.as_str()))
            .collect();
        out.push_str(&format!(
            "{:<28} {:<11} {:>3} keys[{}] {} {}\n",
            d.name,
            d.lane.as_str(),
            d.arity,
            keys.join(","),
            traits.join(","),
            categories.join(" ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_hit_and_nearly_miss_each_glob() {
        let globs: BTreeSet<String> = ["acme:*", "user:[ab]?", "*"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let samples = samples(&globs);
        assert_eq!(samples, ["acme:x", "user:ax", "x", "~cme:x", "~ser:ax"]);
        for pattern in &globs {
            assert!(samples
                .iter()
                .any(|s| glob::matches(pattern.as_bytes(), s.as_bytes())));
        }
    }
}
