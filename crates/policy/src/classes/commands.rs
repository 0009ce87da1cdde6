//! Command classes: catalog commands (each subcommand its own) on each lane they can travel on,
//! grouped when every rule of every policy compared matches all of them or none (by name, parent
//! name, category, `*` and lane), they can name as many keys, and the host's own refusals treat
//! them alike. Each member keeps the argv forms found for it, so a witness can be replayed.

use serde::Serialize;
use tollgate_model::Lane;
use tollgate_policy_rules::channels::{self, Kind};
use tollgate_policy_rules::{CategorySet, Channels, Request, Rule, Subject, Target};

use crate::decision::{lane_from_wit, Descriptor};
use crate::generation::Generation;
use crate::reserved::REFUSED_BY_NAME as RESERVED_NAMES;
use crate::sandbox::bindings;

/// Arguments added past a command's shortest form when looking for its forms with more keys.
const EXTRA_ARGS: usize = 6;
/// Placeholders for a command's other arguments: `1` makes a key count (EVAL's numkeys) one.
const PLACEHOLDERS: [&str; 2] = ["x", "1"];

/// How many keys a command can name: none at all (`zero`), and up to `max` (`usize::MAX`: as
/// many as one likes, DEL, MSET).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Shape {
    pub zero: bool,
    pub max: usize,
}

/// An argv the catalog describes as this command on this lane, and where it put the keys.
#[derive(Debug, Clone)]
pub struct Form {
    pub argv: Vec<Vec<u8>>,
    pub keys: Vec<u32>,
}

/// One command on one lane.
#[derive(Debug, Clone)]
pub struct Variant {
    pub name: String,
    pub lane: Lane,
    /// The catalog's descriptor for it, lane set.
    pub descriptor: bindings::Descriptor,
    pub forms: Vec<Form>,
    pub shape: Shape,
}

#[derive(Debug, Clone)]
pub struct CommandClass {
    pub members: Vec<Variant>,
    /// Whether each command rule (in [`CommandRules`] order) matches these commands, and last,
    /// whether the host refuses them by name and whether it refuses every form of them for its
    /// arity.
    pub matches: Vec<bool>,
    pub shape: Shape,
}

impl CommandClass {
    /// `SET (+171 more)` or `XREAD@blocking`.
    pub fn label(&self) -> String {
        let first = &self.members[0];
        let name = if self
            .members
            .iter()
            .any(|m| m.name == first.name && m.lane != first.lane)
        {
            format!("{}@{}", first.name, first.lane.as_str())
        } else {
            first.name.clone()
        };
        match self.members.len() {
            1 => name,
            n => format!("{name} (+{} more)", n - 1),
        }
    }
}

/// Every command rule of the generations compared, reduced to what a command alone decides:
/// principals, keys and channels dropped, so `Rule::matches` — the evaluator's own test — answers for the
/// command only.
pub struct CommandRules {
    pub rules: Vec<Rule>,
}

impl CommandRules {
    pub fn of<'a>(rules: impl Iterator<Item = &'a Rule>) -> CommandRules {
        let rules = rules
            .filter_map(|rule| match &rule.target {
                Target::Commands {
                    names,
                    categories,
                    any,
                    lanes,
                    ..
                } => Some(Rule {
                    principals: None,
                    target: Target::Commands {
                        names: names.clone(),
                        categories: *categories,
                        any: *any,
                        keys: None,
                        channels: None,
                        lanes: *lanes,
                    },
                    ..rule.clone()
                }),
                Target::Leases { .. } => None,
            })
            .collect();
        CommandRules { rules }
    }

    fn matches(&self, name: &str, categories: CategorySet, lane: Lane) -> Vec<bool> {
        let lane = Lane::ALL.iter().position(|l| *l == lane).unwrap_or(0) as u8;
        let none: [&[u8]; 0] = [];
        let request = Request {
            principal: "",
            subject: Subject::Command {
                name,
                categories,
                lane,
                keys: &none,
                channels: Channels::none(),
            },
        };
        self.rules
            .iter()
            .map(|rule| rule.matches(&request))
            .chain([RESERVED_NAMES.contains(&name)])
            .collect()
    }
}

/// Where a described command of `argc` arguments names what classes split: its keys, or for a
/// command naming plain channels or patterns ([`channels::positions`]), those. Shard channels are
/// keys already.
fn named_positions(described: &bindings::Descriptor, argc: usize) -> Vec<u32> {
    match channels::positions(&described.name, argc) {
        Some((Kind::Plain | Kind::Pattern, at)) => at.map(|i| i as u32).collect(),
        _ => described.keys.iter().map(|k| k.position).collect(),
    }
}

/// The fewest arguments the command takes, its name and subcommand included.
fn shortest(descriptor: &bindings::Descriptor) -> usize {
    let parts = descriptor.name.split('|').count();
    (descriptor.arity.unsigned_abs() as usize).max(parts)
}

/// Runs of arguments that forms of placeholders never hold but some commands need before they
/// name keys: XREAD's and XREADGROUP's keys follow STREAMS, and they block only with BLOCK.
/// Tried at every position, and only for a command whose descriptor names keys that no form of
/// placeholders reached.
const KEYWORD_RUNS: [&[&str]; 2] = [&["STREAMS"], &["BLOCK", "0", "STREAMS"]];

/// The forms of `descriptor`'s command the catalog describes as it: its name and placeholders,
/// from its shortest form to [`EXTRA_ARGS`] more (with a [`KEYWORD_RUNS`] run where it needs one).
fn forms(generation: &Generation, descriptor: &bindings::Descriptor) -> Vec<(Lane, usize, Form)> {
    let parts: Vec<&str> = descriptor.name.split('|').collect();
    let shortest = shortest(descriptor);
    let longest = if descriptor.arity < 0 {
        shortest + EXTRA_ARGS
    } else {
        shortest
    };
    let mut out = Vec::new();
    let probe = |argv: Vec<Vec<u8>>, out: &mut Vec<(Lane, usize, Form)>| {
        let Some(described) = generation.describe_any_arity(&argv) else {
            return;
        };
        if described.name == descriptor.name {
            let keys = named_positions(&described, argv.len());
            out.push((
                lane_from_wit(described.lane),
                argv.len(),
                Form { argv, keys },
            ));
        }
    };
    let filled = |argc: usize, placeholder: &str| {
        let mut argv: Vec<Vec<u8>> = parts.iter().map(|p| p.as_bytes().to_vec()).collect();
        argv.resize(argc, placeholder.as_bytes().to_vec());
        argv
    };
    for argc in shortest..=longest {
        for placeholder in PLACEHOLDERS {
            probe(filled(argc, placeholder), &mut out);
        }
    }
    if out.is_empty() && parts.len() < shortest {
        // A command of subcommands named alone (ACL, CLIENT): the host refuses it for its arity,
        // and the catalog knows none of it with another argument. That refusal is its class.
        probe(filled(parts.len(), PLACEHOLDERS[0]), &mut out);
    }
    if descriptor.keys.is_empty() || out.iter().any(|(_, _, form)| !form.keys.is_empty()) {
        return out;
    }
    for run in KEYWORD_RUNS {
        for argc in shortest..=longest {
            for at in parts.len()..=argc.saturating_sub(run.len() + 1) {
                for placeholder in PLACEHOLDERS {
                    let mut argv = filled(argc, placeholder);
                    for (i, word) in run.iter().enumerate() {
                        argv[at + i] = word.as_bytes().to_vec();
                    }
                    probe(argv, &mut out);
                }
            }
        }
    }
    out
}

fn wit_lane(lane: Lane) -> bindings::Lane {
    match lane {
        Lane::Regular => bindings::Lane::Regular,
        Lane::Blocking => bindings::Lane::Blocking,
        Lane::Transaction => bindings::Lane::Transaction,
        Lane::Script => bindings::Lane::Script,
        Lane::Pubsub => bindings::Lane::Pubsub,
        Lane::Admin => bindings::Lane::Admin,
    }
}

/// Every command of the catalog on every lane it can take.
pub fn variants(generation: &Generation) -> Vec<Variant> {
    let mut out = Vec::new();
    for descriptor in generation.descriptors() {
        let native = Descriptor::from(descriptor);
        let found = forms(generation, descriptor);
        let mut lanes: Vec<Lane> = vec![native.lane];
        // A command flagged blocking may block only with a keyword (XREAD BLOCK): that lane too.
        if native.traits.blocking {
            lanes.push(Lane::Blocking);
        }
        lanes.extend(found.iter().map(|(lane, _, _)| *lane));
        lanes.sort_by_key(|lane| Lane::ALL.iter().position(|l| l == lane));
        lanes.dedup();
        for lane in lanes {
            let mine: Vec<&(Lane, usize, Form)> =
                found.iter().filter(|(l, _, _)| *l == lane).collect();
            let mut counts: Vec<usize> = mine.iter().map(|(_, _, f)| f.keys.len()).collect();
            if lane == native.lane {
                counts.push(native.keys.len());
            }
            // Of a variadic command, more keys in the longest forms than in those two arguments
            // shorter: unbounded.
            let longest = mine.iter().map(|(_, argc, _)| *argc).max().unwrap_or(0);
            let keys_at = |argc: usize| {
                mine.iter()
                    .filter(|(_, a, _)| *a == argc)
                    .map(|(_, _, f)| f.keys.len())
                    .max()
            };
            let unbounded = descriptor.arity < 0
                && longest >= 2
                && match (keys_at(longest), keys_at(longest - 2)) {
                    (Some(more), Some(fewer)) => more > fewer,
                    _ => false,
                };
            let shape = Shape {
                zero: counts.contains(&0),
                max: if unbounded {
                    usize::MAX
                } else {
                    counts.iter().copied().max().unwrap_or(0)
                },
            };
            out.push(Variant {
                name: descriptor.name.clone(),
                lane,
                descriptor: bindings::Descriptor {
                    lane: wit_lane(lane),
                    ..descriptor.clone()
                },
                forms: mine.into_iter().map(|(_, _, f)| f.clone()).collect(),
                shape,
            });
        }
    }
    out
}

/// Groups `variants` into classes on which every rule of `rules` is constant.
pub fn classes(variants: Vec<Variant>, rules: &CommandRules) -> Vec<CommandClass> {
    let mut out: Vec<CommandClass> = Vec::new();
    for variant in variants {
        let native = Descriptor::from(&variant.descriptor);
        let mut matches = rules.matches(&variant.name, native.categories, variant.lane);
        matches.push(variant.refused_for_arity());
        match out
            .iter_mut()
            .find(|c| c.matches == matches && c.shape == variant.shape)
        {
            Some(class) => class.members.push(variant),
            None => out.push(CommandClass {
                shape: variant.shape,
                matches,
                members: vec![variant],
            }),
        }
    }
    // A member whose witness can be replayed first.
    for class in &mut out {
        if let Some(at) = class.members.iter().position(|m| !m.forms.is_empty()) {
            class.members.swap(0, at);
        }
    }
    out
}

impl Variant {
    /// Whether every form of it is one the host refuses for its arity (a command of subcommands
    /// named alone).
    pub fn refused_for_arity(&self) -> bool {
        !self.forms.is_empty()
            && self
                .forms
                .iter()
                .all(|form| form.argv.len() < shortest(&self.descriptor))
    }

    /// An argv of this command on this lane with `keys` at its key positions (the last repeated
    /// where there are more positions), as the catalog describes it; `None` when no form found
    /// fits (the request is then judged from the descriptor, as review does).
    pub fn argv(&self, generation: &Generation, keys: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
        self.forms.iter().find_map(|form| {
            let fits = if keys.is_empty() {
                form.keys.is_empty()
            } else {
                form.keys.len() >= keys.len()
            };
            if !fits {
                return None;
            }
            let mut argv = form.argv.clone();
            for (at, position) in form.keys.iter().enumerate() {
                argv[*position as usize] = keys[at.min(keys.len() - 1)].clone();
            }
            let described = generation.describe_any_arity(&argv)?;
            let positions = named_positions(&described, argv.len());
            (described.name == self.name
                && lane_from_wit(described.lane) == self.lane
                && positions == form.keys)
                .then_some(argv)
        })
    }
}
