//! Exact request classes of one or more policy generations: principals × commands × keys
//! partitioned so that every rule of every generation is constant on each class, each class with
//! a witness request and its decision under each generation, computed by the evaluator itself.
//! Review tables ([`crate::review`]) list the classes of one generation, diffs ([`diff`]) those of
//! two whose decisions differ.
//!
//! What is exact: the YAML guards (their rules see only the principal, the command's name,
//! categories and lane, and its keys) and the host's own refusals (unknown commands, the
//! reserved keyspace). Operator guard modules are opaque: they are asked about the witness only,
//! and rows they could decide say so ([`Verdict::sampled`]).

pub mod atoms;
pub mod commands;
pub mod diff;
pub mod generated;
pub mod keys;
pub mod principals;
pub mod replay;
mod verdict;

use std::collections::{BTreeSet, HashMap};

use tollgate_model::reserved::RESERVED_PREFIX;
use tollgate_model::{Caller, Lane};
use tollgate_policy_rules::channels::{self, Kind};
use tollgate_policy_rules::{Action, Channels, Request, Rule, Subject, Target};

use crate::decision::{Decision, Descriptor};
use crate::generation::Generation;
use atoms::Atoms;
use commands::{CommandClass, CommandRules};
use keys::{Condition, KeyClasses, Predicate};
use principals::PrincipalClass;
pub use verdict::{Verdict, Witness};

/// A lease request's witness command, as `tests:` and `policy explain` write it.
pub const LEASE: &str = "LEASE";

/// What a class's requests ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Asks {
    /// A command class, by index.
    Command(usize),
    Lease,
}

#[derive(Debug, Clone)]
pub struct Class {
    pub principal: usize,
    pub asks: Asks,
    pub keys: usize,
    /// The key class's [`keys::Condition`], numbered across the space (leases apart from
    /// commands, whose globs are numbered apart).
    pub condition: usize,
    /// The witness command's place among its class's members (`None` for a lease).
    pub member: Option<usize>,
    /// The witness keys as bytes (the witness's own are text, for reading).
    pub key_bytes: Vec<Vec<u8>>,
    pub witness: Witness,
    /// The decision under each generation.
    pub verdicts: Vec<Verdict>,
}

pub struct Space<'g> {
    generations: Vec<&'g Generation>,
    pub principals: Vec<PrincipalClass>,
    pub commands: Vec<CommandClass>,
    key_atoms: Atoms,
    lease_atoms: Atoms,
    /// Per principal class, per command class, then per principal class for leases.
    keys: HashMap<(usize, Asks), KeyClasses>,
    pub classes: Vec<Class>,
    by_parts: HashMap<(usize, Asks, usize), usize>,
    conditions: HashMap<(bool, Condition), usize>,
}

/// A witness as judged: its command, lane, argv (if one was found) and each generation's decision.
type Judged = (String, Option<Lane>, Option<Vec<Vec<u8>>>, Vec<Decision>);

/// Where each rule of the generations stands: its generation, its file, the rule; or a selector
/// (an invariant's), which splits classes as a rule would but decides nothing.
struct Placed<'g> {
    generation: usize,
    file: usize,
    rule: &'g Rule,
    selector: bool,
}

fn placed<'g>(generations: &[&'g Generation], selectors: &'g [Rule]) -> Vec<Placed<'g>> {
    let mut out = Vec::new();
    for (generation, g) in generations.iter().enumerate() {
        for (file, compiled) in g.files().iter().enumerate() {
            out.extend(compiled.policy.rules.iter().map(|rule| Placed {
                generation,
                file,
                rule,
                selector: false,
            }));
        }
    }
    // Selectors name the principals of the first generation.
    out.extend(selectors.iter().map(|rule| Placed {
        generation: 0,
        file: usize::MAX,
        rule,
        selector: true,
    }));
    out
}

fn verdict(generation: &Generation, decision: &Decision) -> Verdict {
    let opaque = generation.operator_guards();
    match decision {
        Decision::Admitted { rule, .. } => Verdict {
            allowed: true,
            rule: rule.to_string(),
            module: None,
            cause: None,
            sampled: opaque,
        },
        Decision::Denied(denial) => Verdict {
            allowed: false,
            rule: denial.rule.clone(),
            sampled: if opaque.contains(&denial.module) {
                vec![denial.module.clone()]
            } else {
                Vec::new()
            },
            module: Some(denial.module.clone()),
            cause: Some(denial.cause),
        },
    }
}

impl<'g> Space<'g> {
    /// The classes of `generations` (one for a review, two for a diff). They are assumed to share
    /// their catalogs; the first generation's describes the commands.
    pub fn new(generations: &[&'g Generation]) -> Space<'g> {
        Space::with_selectors(generations, &[])
    }

    /// The classes of `generations`, split further so that each of `selectors` (rules that decide
    /// nothing: invariants' selectors) is constant on every class too ([`Space::selects`]).
    pub fn with_selectors(generations: &[&'g Generation], selectors: &'g [Rule]) -> Space<'g> {
        let rules = placed(generations, selectors);
        let reserved_glob = reserved_glob();
        let mut lease_globs = BTreeSet::new();
        for placed in &rules {
            if let Target::Leases { resources } = &placed.rule.target {
                lease_globs.extend(resources.iter().cloned());
            }
        }
        let key_globs = key_globs([rules.iter().map(|p| p.rule)]);
        let lease_globs: Vec<String> = lease_globs.into_iter().collect();
        let key_atoms = Atoms::new(&key_globs);
        let lease_atoms = Atoms::new(&lease_globs);
        let index = |globs: &[String], of: &[String]| -> Vec<usize> {
            of.iter()
                .filter_map(|g| globs.iter().position(|known| known == g))
                .collect()
        };
        let command_rules = CommandRules::of(rules.iter().map(|p| p.rule));
        let principals = principals::classes(generations);
        let commands = commands::classes(commands::variants(generations[0]), &command_rules);
        let reserved = Predicate {
            allow: false,
            globs: index(&key_globs, &[reserved_glob]),
        };
        let mut keys = HashMap::new();
        for (p, principal) in principals.iter().enumerate() {
            let applies = |placed: &Placed| {
                let name = principal.principal(placed.generation);
                placed
                    .rule
                    .principals
                    .as_ref()
                    .is_none_or(|names| names.contains(&name))
            };
            for (c, command) in commands.iter().enumerate() {
                let mut predicates = Vec::new();
                // A rule after one that decides without keys never decides.
                let mut closed: BTreeSet<(usize, usize)> = BTreeSet::new();
                let mut k = 0;
                for placed in &rules {
                    let Target::Commands {
                        keys: globs,
                        channels,
                        ..
                    } = &placed.rule.target
                    else {
                        continue;
                    };
                    let matches = command.matches[k];
                    k += 1;
                    if !matches
                        || !applies(placed)
                        || closed.contains(&(placed.generation, placed.file))
                    {
                        continue;
                    }
                    // What the command's classes split: its keys, or its channels (a command
                    // naming plain channels or patterns: `channels:` alone judges them; shard
                    // channels are keys either field vouches for).
                    let shard_globs: Option<Vec<String>>;
                    let globs = match channels::positions(&command.members[0].name, usize::MAX) {
                        Some((Kind::Plain | Kind::Pattern, _)) => match (globs, channels) {
                            (Some(_), None) => continue,
                            (_, channels) => channels,
                        },
                        Some((Kind::Shard, _)) if channels.is_some() => {
                            shard_globs =
                                Some(globs.iter().chain(channels).flatten().cloned().collect());
                            &shard_globs
                        }
                        _ if globs.is_none() && channels.is_some() => continue,
                        _ => globs,
                    };
                    match globs {
                        // A selector closes nothing: it is no rule of the chain.
                        None if placed.selector => {}
                        None => {
                            closed.insert((placed.generation, placed.file));
                        }
                        Some(globs) => predicates.push(Predicate {
                            allow: placed.rule.action == Action::Allow,
                            globs: index(&key_globs, globs),
                        }),
                    }
                }
                predicates.push(reserved.clone());
                let shape = command.shape;
                keys.insert(
                    (p, Asks::Command(c)),
                    KeyClasses::new(predicates, &key_atoms, shape.zero, shape.max),
                );
            }
            let predicates = rules
                .iter()
                .filter(|placed| applies(placed))
                .filter_map(|placed| match &placed.rule.target {
                    Target::Leases { resources } => Some(Predicate {
                        allow: placed.rule.action == Action::Allow,
                        globs: index(&lease_globs, resources),
                    }),
                    Target::Commands { .. } => None,
                })
                .collect();
            keys.insert(
                (p, Asks::Lease),
                KeyClasses::new(predicates, &lease_atoms, false, 1),
            );
        }
        let mut space = Space {
            generations: generations.to_vec(),
            principals,
            commands,
            key_atoms,
            lease_atoms,
            keys,
            classes: Vec::new(),
            by_parts: HashMap::new(),
            conditions: HashMap::new(),
        };
        space.decide();
        space
    }

    /// A witness and the decisions under every generation for each class.
    fn decide(&mut self) {
        let mut parts: Vec<(usize, Asks, usize)> = self
            .keys
            .iter()
            .flat_map(|(&(p, asks), classes)| (0..classes.classes.len()).map(move |k| (p, asks, k)))
            .collect();
        parts.sort_by_key(|&(p, asks, k)| {
            let asks = match asks {
                Asks::Command(c) => c,
                Asks::Lease => usize::MAX,
            };
            (p, asks, k)
        });
        for (p, asks, k) in parts {
            let condition = self.keys[&(p, asks)].condition(k);
            let next = self.conditions.len();
            let condition = *self
                .conditions
                .entry((asks == Asks::Lease, condition))
                .or_insert(next);
            let class = self.class(p, asks, k, condition);
            self.by_parts.insert((p, asks, k), self.classes.len());
            self.classes.push(class);
        }
    }

    fn class(&self, p: usize, asks: Asks, k: usize, condition: usize) -> Class {
        let principal = &self.principals[p];
        let atoms = match asks {
            Asks::Command(_) => &self.key_atoms,
            Asks::Lease => &self.lease_atoms,
        };
        let regions = &self.keys[&(p, asks)].classes[k].regions;
        let keys: Vec<Vec<u8>> = regions
            .iter()
            .map(|&r| atoms.atoms[r].witness.clone())
            .collect();
        let callers: Vec<Caller> = (0..self.generations.len())
            .map(|at| Caller {
                principal: principal.principal(at),
                uid: principal.uid,
                gid: principal.gid,
                pid: 0,
            })
            .collect();
        let text = |bytes: &Vec<u8>| String::from_utf8_lossy(bytes).into_owned();
        let mut member = None;
        let (command, lane, argv, decisions): Judged = match asks {
            Asks::Lease => {
                let resource = keys.first().map(text).unwrap_or_default();
                let decisions = self
                    .generations
                    .iter()
                    .zip(&callers)
                    .map(|(g, caller)| g.admit_lease(caller, &resource))
                    .collect();
                let argv = vec![LEASE.as_bytes().to_vec(), resource.into_bytes()];
                (LEASE.to_owned(), None, Some(argv), decisions)
            }
            Asks::Command(c) => {
                // The first member with a form that holds these keys, else the first.
                let members = &self.commands[c].members;
                let (at, argv) = members
                    .iter()
                    .enumerate()
                    .find_map(|(at, m)| Some((at, m.argv(self.generations[0], &keys)?)))
                    .map_or((0, None), |(at, argv)| (at, Some(argv)));
                let variant = &members[at];
                member = Some(at);
                let decisions = self
                    .generations
                    .iter()
                    .zip(&callers)
                    .map(|(g, caller)| match &argv {
                        Some(argv) => g.admit(caller, argv),
                        None => g.judge_sample(caller, &variant.descriptor, keys.clone()),
                    })
                    .collect();
                (variant.name.clone(), Some(variant.lane), argv, decisions)
            }
        };
        let verdicts = self
            .generations
            .iter()
            .zip(&decisions)
            .map(|(g, d)| verdict(g, d))
            .collect();
        Class {
            principal: p,
            asks,
            keys: k,
            condition,
            member,
            key_bytes: keys.clone(),
            witness: Witness {
                uid: principal.uid,
                gid: principal.gid,
                principals: callers.into_iter().map(|c| c.principal).collect(),
                command,
                lane: lane.map(Lane::as_str),
                keys: keys.iter().map(text).collect(),
                argv: argv.map(|argv| argv.iter().map(text).collect()),
            },
            verdicts,
        }
    }

    /// Whether `selector` (a rule, read as its action reads keys) matches the requests of `class`,
    /// under the principal generation `at` gives them. Exact when the space was built
    /// [`Space::with_selectors`] with it: the witness stands for every request of its class.
    pub fn selects(&self, class: &Class, selector: &Rule, at: usize) -> bool {
        let principal = self.principals[class.principal].principal(at);
        match class.asks {
            Asks::Lease => {
                let resource = class.key_bytes.first().map_or(&[][..], Vec::as_slice);
                selector.matches(&Request::<&[u8]> {
                    principal: &principal,
                    subject: Subject::Lease { resource },
                })
            }
            Asks::Command(c) => {
                let variant = &self.commands[c].members[class.member.unwrap_or(0)];
                let native = Descriptor::from(&variant.descriptor);
                let lane = Lane::ALL
                    .iter()
                    .position(|l| *l == variant.lane)
                    .unwrap_or(0) as u8;
                let none: &[Vec<u8>] = &[];
                let (keys, named) = match channels::positions(&variant.name, usize::MAX) {
                    Some((kind @ (Kind::Plain | Kind::Pattern), _)) => (
                        none,
                        Channels {
                            kind,
                            names: class.key_bytes.as_slice(),
                        },
                    ),
                    Some((Kind::Shard, _)) => (
                        class.key_bytes.as_slice(),
                        Channels {
                            kind: Kind::Shard,
                            names: class.key_bytes.as_slice(),
                        },
                    ),
                    None => (class.key_bytes.as_slice(), Channels::none()),
                };
                selector.matches(&Request {
                    principal: &principal,
                    subject: Subject::Command {
                        name: &variant.name,
                        categories: native.categories,
                        lane,
                        keys,
                        channels: named,
                    },
                })
            }
        }
    }

    /// The generations compared.
    pub fn generations(&self) -> &[&'g Generation] {
        &self.generations
    }

    /// Whether every partition was computed in full (no search hit its bound).
    pub fn complete(&self) -> bool {
        self.key_atoms.complete
            && self.lease_atoms.complete
            && self.keys.values().all(|k| k.complete)
    }

    /// The class of a request: a peer, a command as the catalog described it (name and lane) or
    /// a lease (`command` [`LEASE`]), and its keys. `None` for a command no catalog knows, or
    /// when a partition is incomplete.
    pub fn class_of(
        &self,
        uid: u32,
        gid: u32,
        command: &str,
        lane: Lane,
        keys: &[&[u8]],
    ) -> Option<&Class> {
        let names: Vec<Option<String>> = self
            .generations
            .iter()
            .map(|g| g.principal_for(uid, gid))
            .collect();
        let p = self.principals.iter().position(|c| c.names == names)?;
        let (asks, atoms) = if command == LEASE {
            (Asks::Lease, &self.lease_atoms)
        } else {
            let c = self.commands.iter().position(|class| {
                class
                    .members
                    .iter()
                    .any(|m| m.name == command && m.lane == lane)
            })?;
            (Asks::Command(c), &self.key_atoms)
        };
        let regions: Option<Vec<usize>> = keys.iter().map(|k| atoms.atom_of(k)).collect();
        let k = self.keys[&(p, asks)].class_of(atoms, &regions?)?;
        Some(&self.classes[self.by_parts[&(p, asks, k)]])
    }

    /// `SET (+171 more)`, or `LEASE`.
    pub fn asks_label(&self, asks: Asks) -> String {
        match asks {
            Asks::Command(c) => self.commands[c].label(),
            Asks::Lease => LEASE.to_owned(),
        }
    }

    /// The commands of a class, by name (a command on several lanes once per lane).
    pub fn members(&self, asks: Asks) -> Vec<String> {
        match asks {
            Asks::Command(c) => self.commands[c]
                .members
                .iter()
                .map(|m| {
                    let default = self
                        .commands
                        .iter()
                        .flat_map(|c| &c.members)
                        .find(|o| o.name == m.name);
                    match default {
                        Some(first) if first.lane != m.lane => {
                            format!("{}@{}", m.name, m.lane.as_str())
                        }
                        _ => m.name.clone(),
                    }
                })
                .collect(),
            Asks::Lease => vec![LEASE.to_owned()],
        }
    }
}

/// The glob of the reserved keyspace.
fn reserved_glob() -> String {
    format!("{}*", glob_escape(RESERVED_PREFIX))
}

/// The key globs that partition keys (and channels) for `rules` (each set a policy file's, say):
/// the reserved keyspace's and every command rule's key and channel globs, sorted, each once.
pub fn key_globs<'r, R: IntoIterator<Item = &'r Rule>>(
    rules: impl IntoIterator<Item = R>,
) -> Vec<String> {
    let mut globs = BTreeSet::from([reserved_glob()]);
    for rule in rules.into_iter().flatten() {
        if let Target::Commands { keys, channels, .. } = &rule.target {
            globs.extend(keys.iter().chain(channels).flatten().cloned());
        }
    }
    globs.into_iter().collect()
}

/// `text` as a glob that matches it literally.
fn glob_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}

#[cfg(test)]
mod tests;
