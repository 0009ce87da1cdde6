//! Replay of the decision log against a candidate policy: each logged request is put in its
//! class of the diff's space ([`Space`] of the old and the candidate generation, or of the
//! candidate alone, the old decision then being the logged one), and the class's decisions say
//! what the candidate would have done. Lines are read one at a time; what is kept is bounded by
//! the space (a group per principal class × command class × old and new decision), never by the
//! log's length. The same pass records what decided something, for `policy unused` ([`Usage`]).
//!
//! Keys recorded as classes (`regions`: the logging policy's witness keys) decide exactly where
//! the candidate's globs do not split those classes; given the old policy, a replay counts the
//! requests whose recorded classes the candidate splits ([`Replay::inexact`]).

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::str::FromStr;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tollgate_model::Lane;
use tollgate_policy_rules::{glob, Rule, Target};

use super::atoms::Atoms;
use super::diff::Change;
use super::{Asks, Space, Verdict, Witness};
use crate::decision::{DenyCause, Descriptor};
use crate::generation::Generation;

/// Malformed lines named by number at most; the rest are counted.
const MAX_NAMED: usize = 50;
/// Keys whose region is remembered at most (raw keys are many; witness keys few).
const MAX_CACHED_KEYS: usize = 100_000;

/// One decision-log line, as far as a replay reads it (other fields are ignored).
#[derive(Debug, Deserialize)]
struct Line<'a> {
    ts_ms: u64,
    uid: u32,
    gid: u32,
    #[serde(borrow)]
    command: Cow<'a, str>,
    #[serde(borrow)]
    lane: Option<Cow<'a, str>>,
    #[serde(borrow)]
    keys: Vec<Cow<'a, str>>,
    #[serde(borrow, default)]
    regions: Option<Vec<Cow<'a, str>>>,
    #[serde(default)]
    cut: bool,
    #[serde(borrow)]
    decision: Cow<'a, str>,
    #[serde(borrow)]
    rule: Cow<'a, str>,
    #[serde(borrow, default)]
    module: Cow<'a, str>,
    #[serde(borrow, default)]
    cause: Option<Cow<'a, str>>,
}

/// Requests whose decision changed alike: one principal class, one command class, the same old
/// and new decision.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub change: Change,
    pub principal: String,
    /// The command class: its first command and how many more.
    pub commands: String,
    pub old: Verdict,
    pub new: Verdict,
    pub requests: u64,
    pub first_ms: u64,
    pub last_ms: u64,
    /// The first such request as logged: command and keys (witness keys of their classes under
    /// `keys: digest`).
    pub example: String,
    /// Its class's witness, replayable with `policy explain`.
    pub witness: Witness,
}

/// Where a malformed line is.
#[derive(Debug, Clone, Serialize)]
pub struct Place {
    pub file: String,
    pub line: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Replay {
    /// Lines read, malformed ones included.
    pub lines: u64,
    /// Requests decided again.
    pub requests: u64,
    pub changed: u64,
    pub newly_allowed: u64,
    pub newly_denied: u64,
    pub other_rule: u64,
    /// Requests no class of the space holds (a command the catalogs know on no such lane):
    /// counted, not decided.
    pub unclassified: u64,
    /// Requests whose recorded key classes the candidate splits: decided by their witness keys,
    /// which may not decide as the keys themselves would. Known only given the old policy.
    pub inexact: u64,
    /// Requests logged with more keys than the line holds.
    pub cut: u64,
    /// Given the old policy: requests it decides otherwise than the log recorded (the log was
    /// written under another policy, or by operator modules that answer otherwise).
    pub disagree: u64,
    pub malformed: u64,
    /// The first [`MAX_NAMED`] malformed lines.
    pub malformed_at: Vec<Place>,
    pub first_ms: Option<u64>,
    pub last_ms: Option<u64>,
    /// Whether the old decisions are the old policy's (else the log's).
    pub against_policy: bool,
    /// False when some partition hit its bound: requests may be unclassified.
    pub complete: bool,
    /// Changed requests, grouped; most requests first.
    pub groups: Vec<Group>,
}

/// What decided something in the log, under the candidate: for `policy unused`.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// Rule ids that decided some request (`audit:` prefix dropped).
    rules: BTreeSet<String>,
    principals: BTreeSet<String>,
    /// (rule id, index into its `commands` entries) that matched a request the rule decided.
    entries: BTreeSet<(String, usize)>,
    /// (rule id, glob) that a key of a request the rule decided matched.
    globs: BTreeSet<(String, String)>,
}

/// A rule, principal, command entry or glob that decided nothing.
#[derive(Debug, Clone, Serialize)]
pub struct Unused {
    pub file: String,
    /// Rules that decided no request.
    pub rules: Vec<String>,
    pub principals: Vec<String>,
    /// `rule: entry` for each `commands` entry of a rule that decided something, matching none
    /// of the requests it decided.
    pub commands: Vec<String>,
    /// `rule: glob` likewise for key and lease globs.
    pub globs: Vec<String>,
}

#[derive(Debug, Clone, Copy)]
struct Found {
    principal: usize,
    asks: Asks,
    member: usize,
}

pub struct Replayer<'g> {
    space: Space<'g>,
    /// The candidate's index among the space's generations.
    candidate: usize,
    /// Per key region of the logging (old) policy: whether the space splits it. `None` without
    /// the old policy.
    old_atoms: Option<(Atoms, Vec<bool>)>,
    principals: HashMap<(u32, u32), Option<usize>>,
    commands: HashMap<(String, Lane), Option<(Asks, usize)>>,
    key_regions: HashMap<Vec<u8>, Option<usize>>,
    groups: HashMap<(usize, Asks, bool, String, bool, String), usize>,
    pub replay: Replay,
    pub usage: Usage,
}

impl<'g> Replayer<'g> {
    /// A replay against `candidate`; the old decisions are `old`'s when given, else the log's.
    pub fn new(old: Option<&'g Generation>, candidate: &'g Generation) -> Replayer<'g> {
        let generations: Vec<&Generation> = old.into_iter().chain([candidate]).collect();
        let space = Space::new(&generations);
        let old_atoms = old.map(|old| {
            let atoms = Atoms::new(&super::key_globs(
                old.files().iter().map(|f| &f.policy.rules),
            ));
            let mut seen = vec![0usize; atoms.atoms.len()];
            for atom in &space.key_atoms.atoms {
                if let Some(at) = atoms.atom_of(&atom.witness) {
                    seen[at] += 1;
                }
            }
            let split = seen.into_iter().map(|n| n > 1).collect();
            (atoms, split)
        });
        let replay = Replay {
            against_policy: old.is_some(),
            complete: space.complete(),
            ..Replay::default()
        };
        Replayer {
            candidate: generations.len() - 1,
            space,
            old_atoms,
            principals: HashMap::new(),
            commands: HashMap::new(),
            key_regions: HashMap::new(),
            groups: HashMap::new(),
            replay,
            usage: Usage::default(),
        }
    }

    /// Reads every line of `reader` (named `file` in the report), one at a time: memory stays
    /// bounded by the longest line. A line that is not UTF-8 is malformed like any other.
    pub fn read(&mut self, file: &str, mut reader: impl std::io::BufRead) -> std::io::Result<()> {
        let mut buffer = Vec::new();
        let mut number = 0;
        loop {
            buffer.clear();
            if reader.read_until(b'\n', &mut buffer)? == 0 {
                return Ok(());
            }
            number += 1;
            match std::str::from_utf8(&buffer) {
                Ok(text) => self.line(file, number, text),
                Err(_) => self.line(file, number, "\u{0}not UTF-8"),
            }
        }
    }

    /// Reads one line (`number` within `file`, 1-based); a line that is not a decision as the
    /// log writes them is counted and named, never fatal.
    pub fn line(&mut self, file: &str, number: u64, text: &str) {
        self.replay.lines += 1;
        if text.trim().is_empty() {
            return;
        }
        match serde_json::from_str::<Line>(text) {
            Ok(line) if matches!(&*line.decision, "admitted" | "denied") => self.request(&line),
            _ => {
                self.replay.malformed += 1;
                if self.replay.malformed_at.len() < MAX_NAMED {
                    self.replay.malformed_at.push(Place {
                        file: file.to_owned(),
                        line: number,
                    });
                }
            }
        }
    }

    fn request(&mut self, line: &Line) {
        let replay = &mut self.replay;
        replay.requests += 1;
        replay.first_ms = Some(replay.first_ms.map_or(line.ts_ms, |t| t.min(line.ts_ms)));
        replay.last_ms = Some(replay.last_ms.map_or(line.ts_ms, |t| t.max(line.ts_ms)));
        if line.cut {
            replay.cut += 1;
        }
        let logged = Verdict {
            allowed: line.decision == "admitted",
            rule: line.rule.clone().into_owned(),
            module: (line.decision == "denied").then(|| line.module.clone().into_owned()),
            cause: line.cause.as_deref().and_then(cause),
            sampled: Vec::new(),
        };
        // A command no catalog knows is the host's to refuse, whatever the policy.
        let Some(lane) = line.lane.as_deref() else {
            self.usage.rules.insert(logged.rule.clone());
            return;
        };
        let Some(found) = self.find(line, lane) else {
            self.replay.unclassified += 1;
            return;
        };
        let class_keys: Vec<&str> = match &line.regions {
            Some(regions) => regions.iter().map(|r| &**r).collect(),
            None => line.keys.iter().map(|k| &**k).collect(),
        };
        if line.regions.is_some() {
            if let Some((atoms, split)) = &self.old_atoms {
                let splits = class_keys
                    .iter()
                    .any(|k| atoms.atom_of(k.as_bytes()).is_none_or(|at| split[at]));
                if splits {
                    self.replay.inexact += 1;
                }
            }
        }
        let Some(at) = self.class(found, &class_keys) else {
            self.replay.unclassified += 1;
            return;
        };
        let class = &self.space.classes[at];
        let new = class.verdicts[self.candidate].clone();
        let old = if self.replay.against_policy {
            let old = class.verdicts[0].clone();
            if !old.same(&logged) {
                self.replay.disagree += 1;
            }
            old
        } else {
            logged
        };
        self.use_of(found, &new, &class_keys);
        let class = &self.space.classes[at];
        let Some(change) = change(&old, &new) else {
            return;
        };
        let replay = &mut self.replay;
        replay.changed += 1;
        match change {
            Change::NewlyAllowed => replay.newly_allowed += 1,
            Change::NewlyDenied => replay.newly_denied += 1,
            Change::OtherRule => replay.other_rule += 1,
        }
        let key = (
            found.principal,
            found.asks,
            old.allowed,
            old.rule.clone(),
            new.allowed,
            new.rule.clone(),
        );
        match self.groups.get(&key) {
            Some(&at) => {
                let group = &mut replay.groups[at];
                group.requests += 1;
                group.first_ms = group.first_ms.min(line.ts_ms);
                group.last_ms = group.last_ms.max(line.ts_ms);
            }
            None => {
                let example = std::iter::once(&*line.command)
                    .chain(class_keys.iter().copied())
                    .collect::<Vec<_>>()
                    .join(" ");
                self.groups.insert(key, replay.groups.len());
                replay.groups.push(Group {
                    change,
                    principal: self.space.principals[found.principal].label(),
                    commands: self.space.asks_label(found.asks),
                    old,
                    new,
                    requests: 1,
                    first_ms: line.ts_ms,
                    last_ms: line.ts_ms,
                    example,
                    witness: class.witness.clone(),
                });
            }
        }
    }

    /// The principal class and command class (and member) of a logged request.
    fn find(&mut self, line: &Line, lane: &str) -> Option<Found> {
        let space = &self.space;
        let principal = *self
            .principals
            .entry((line.uid, line.gid))
            .or_insert_with(|| {
                let names: Vec<Option<String>> = space
                    .generations
                    .iter()
                    .map(|g| g.principal_for(line.uid, line.gid))
                    .collect();
                space.principals.iter().position(|c| c.names == names)
            });
        let lane = Lane::from_str(lane).ok()?;
        let key = (line.command.clone().into_owned(), lane);
        let command = match self.commands.get(&key) {
            Some(found) => *found,
            None => {
                let found = space.commands.iter().enumerate().find_map(|(c, class)| {
                    let m = class
                        .members
                        .iter()
                        .position(|m| m.name == *line.command && m.lane == lane)?;
                    Some((Asks::Command(c), m))
                });
                self.commands.insert(key, found);
                found
            }
        };
        let (asks, member) = command?;
        Some(Found {
            principal: principal?,
            asks,
            member,
        })
    }

    /// The class (an index into the space's classes) of a request with these keys.
    fn class(&mut self, found: Found, keys: &[&str]) -> Option<usize> {
        let atoms = &self.space.key_atoms;
        let mut regions = Vec::with_capacity(keys.len());
        for key in keys {
            let region = match self.key_regions.get(key.as_bytes()) {
                Some(region) => *region,
                None => {
                    let region = atoms.atom_of(key.as_bytes());
                    if self.key_regions.len() >= MAX_CACHED_KEYS {
                        self.key_regions.clear();
                    }
                    self.key_regions.insert(key.as_bytes().to_vec(), region);
                    region
                }
            };
            regions.push(region?);
        }
        let k = self.space.keys[&(found.principal, found.asks)].class_of(atoms, &regions)?;
        self.space
            .by_parts
            .get(&(found.principal, found.asks, k))
            .copied()
    }

    /// Records what decided a request under the candidate: the rule, its principal, its command
    /// entries and globs that the request matched.
    fn use_of(&mut self, found: Found, new: &Verdict, keys: &[&str]) {
        let rule_id = new.rule.strip_prefix("audit:").unwrap_or(&new.rule);
        self.usage.rules.insert(rule_id.to_owned());
        let principal = self.space.principals[found.principal].principal(self.candidate);
        self.usage.principals.insert(principal);
        let Asks::Command(c) = found.asks else {
            return;
        };
        let variant = &self.space.commands[c].members[found.member];
        let categories = Descriptor::from(&variant.descriptor).categories;
        let generation = self.space.generations[self.candidate];
        let Some(rule) = generation
            .files()
            .iter()
            .flat_map(|f| &f.policy.rules)
            .find(|r| r.id == rule_id)
        else {
            return;
        };
        let Target::Commands {
            any, keys: globs, ..
        } = &rule.target
        else {
            return;
        };
        let parent = variant.name.split('|').next().unwrap_or(&variant.name);
        // Entries as [`entries`] numbers them: names, categories, `*`.
        for (at, entry) in entries(rule).iter().enumerate() {
            let matched = match entry {
                Entry::Any => *any,
                Entry::Category(category) => categories.contains(*category),
                Entry::Name(name) => name == &variant.name || name == parent,
            };
            if matched {
                self.usage.entries.insert((rule.id.clone(), at));
            }
        }
        for glob_text in globs.iter().flatten() {
            if keys
                .iter()
                .any(|k| glob::matches(glob_text.as_bytes(), k.as_bytes()))
            {
                self.usage
                    .globs
                    .insert((rule.id.clone(), glob_text.clone()));
            }
        }
    }

    /// Leases are not logged: a lease rule's resources cannot be judged used or not.
    pub fn finish(mut self) -> (Replay, Usage) {
        self.replay.groups.sort_by(|a, b| {
            b.requests
                .cmp(&a.requests)
                .then(a.first_ms.cmp(&b.first_ms))
        });
        (self.replay, self.usage)
    }
}

/// A command entry of a rule, as the compiler reads `commands:`.
enum Entry {
    Name(String),
    Category(tollgate_policy_rules::Category),
    Any,
}

/// The entries of a command rule: its names, categories and `*`, each once.
fn entries(rule: &Rule) -> Vec<Entry> {
    let Target::Commands {
        names,
        categories,
        any,
        ..
    } = &rule.target
    else {
        return Vec::new();
    };
    names
        .iter()
        .map(|n| Entry::Name(n.clone()))
        .chain(categories.iter().map(Entry::Category))
        .chain(any.then_some(Entry::Any))
        .collect()
}

fn entry_text(entry: &Entry) -> String {
    match entry {
        Entry::Name(name) => name.replace('|', " "),
        Entry::Category(category) => format!("@{}", category.as_str()),
        Entry::Any => "*".to_owned(),
    }
}

fn change(old: &Verdict, new: &Verdict) -> Option<Change> {
    match (old.allowed, new.allowed) {
        _ if old.same(new) => None,
        (false, true) => Some(Change::NewlyAllowed),
        (true, false) => Some(Change::NewlyDenied),
        _ => Some(Change::OtherRule),
    }
}

fn cause(text: &str) -> Option<DenyCause> {
    DenyCause::ALL.into_iter().find(|c| c.as_str() == text)
}

/// `2026-12-02T16:45:32.120Z`.
pub fn time(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

impl Usage {
    /// What in `generation`'s files decided nothing, file by file (lease rules included: leases
    /// are not logged, so a lease rule never shows as used).
    pub fn unused(&self, generation: &Generation) -> Vec<Unused> {
        let used_principals = &self.principals;
        generation
            .files()
            .iter()
            .map(|file| {
                let mut out = Unused {
                    file: file.path.display().to_string(),
                    rules: Vec::new(),
                    principals: file
                        .principals
                        .iter()
                        .map(|p| p.name.clone())
                        .filter(|name| !used_principals.contains(name))
                        .collect(),
                    commands: Vec::new(),
                    globs: Vec::new(),
                };
                for rule in &file.policy.rules {
                    if !self.rules.contains(&rule.id) {
                        out.rules.push(rule.id.clone());
                        continue;
                    }
                    for (at, entry) in entries(rule).iter().enumerate() {
                        if !self.entries.contains(&(rule.id.clone(), at)) {
                            out.commands
                                .push(format!("{}: {}", rule.id, entry_text(entry)));
                        }
                    }
                    if let Target::Commands {
                        keys: Some(globs), ..
                    } = &rule.target
                    {
                        for glob_text in globs {
                            if !self.globs.contains(&(rule.id.clone(), glob_text.clone())) {
                                out.globs.push(format!("{}: {glob_text}", rule.id));
                            }
                        }
                    }
                }
                out
            })
            .collect()
    }
}

impl Replay {
    pub fn changed(&self) -> bool {
        self.changed > 0
    }

    /// The plan-style summary: a count line, the period, what is inexact or malformed, then a row
    /// per group under the decision that now decides it.
    pub fn render(&self, replay: &str) -> String {
        let mut out = String::new();
        let period = match (self.first_ms, self.last_ms) {
            (Some(first), Some(last)) => format!(" from {} to {}", time(first), time(last)),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{} requests replayed{period} ({} lines): {} decisions change ({} newly allowed, {} newly denied, {} by another rule){}",
            self.requests,
            self.lines,
            self.changed,
            self.newly_allowed,
            self.newly_denied,
            self.other_rule,
            if self.complete {
                ""
            } else {
                "; INCOMPLETE: a partition hit its bound"
            }
        );
        let _ = writeln!(
            out,
            "old decisions: {}",
            if self.against_policy {
                format!(
                    "the old policy's ({} requests logged otherwise)",
                    self.disagree
                )
            } else {
                "as logged".to_owned()
            }
        );
        if self.inexact > 0 {
            let _ = writeln!(
                out,
                "inexact: {} requests logged with key classes the candidate splits (decided by their witness keys; log with `keys: raw` to replay them exactly)",
                self.inexact
            );
        }
        if self.unclassified > 0 {
            let _ = writeln!(
                out,
                "unclassified: {} requests (a command on a lane no catalog puts it on)",
                self.unclassified
            );
        }
        if self.cut > 0 {
            let _ = writeln!(
                out,
                "cut: {} requests logged with only their first keys",
                self.cut
            );
        }
        if self.malformed > 0 {
            let named: Vec<String> = self
                .malformed_at
                .iter()
                .map(|p| format!("{}:{}", p.file, p.line))
                .collect();
            let more = self.malformed - self.malformed_at.len() as u64;
            let _ = writeln!(
                out,
                "malformed: {} lines skipped: {}{}",
                self.malformed,
                named.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
        }
        if self.groups.is_empty() {
            return out;
        }
        let _ = writeln!(out, "replay a witness: {replay} FLAGS -- REQUEST");
        let mut heads: Vec<(bool, &str)> = self
            .groups
            .iter()
            .map(|g| (g.new.allowed, g.new.rule.as_str()))
            .collect();
        heads.sort();
        heads.dedup();
        let who_width = self
            .groups
            .iter()
            .map(|g| g.principal.len())
            .max()
            .unwrap_or(0);
        let what_width = self
            .groups
            .iter()
            .map(|g| g.commands.len())
            .max()
            .unwrap_or(0);
        let was_width = self
            .groups
            .iter()
            .map(|g| g.old.to_string().len() + 4)
            .max()
            .unwrap_or(0);
        for head in heads {
            let mine: Vec<&Group> = self
                .groups
                .iter()
                .filter(|g| (g.new.allowed, g.new.rule.as_str()) == head)
                .collect();
            let requests: u64 = mine.iter().map(|g| g.requests).sum();
            let _ = writeln!(out, "\nnow {} ({requests} requests):", mine[0].new);
            for group in mine {
                let _ = writeln!(
                    out,
                    "  {} {:<who_width$}  {:<was_width$}  {:<what_width$}  {:>6} requests  {} .. {}  e.g. {}  [{}]",
                    match group.change {
                        Change::NewlyAllowed => '+',
                        Change::NewlyDenied => '-',
                        Change::OtherRule => '~',
                    },
                    group.principal,
                    format!("was {}", group.old),
                    group.commands,
                    group.requests,
                    time(group.first_ms),
                    time(group.last_ms),
                    group.example,
                    group.witness.replay(),
                );
            }
        }
        out
    }
}

impl Unused {
    /// `FILE: 3 rules, 1 principal, ...` then one line each.
    pub fn render(list: &[Unused], replay: &Replay) -> String {
        let mut out = String::new();
        let period = match (replay.first_ms, replay.last_ms) {
            (Some(first), Some(last)) => format!("from {} to {}", time(first), time(last)),
            _ => "(no requests)".to_owned(),
        };
        let _ = writeln!(
            out,
            "{} requests logged {period} ({} lines, {} malformed)",
            replay.requests, replay.lines, replay.malformed
        );
        let _ = writeln!(
            out,
            "(leases are not logged: a lease rule shows as deciding nothing whatever it decided)"
        );
        for unused in list {
            let _ = writeln!(out, "\n{}:", unused.file);
            let section = |out: &mut String, what: &str, items: &[String]| {
                let _ = writeln!(out, "  {what} ({}):", items.len());
                for item in items {
                    let _ = writeln!(out, "    {item}");
                }
            };
            section(&mut out, "rules that decided nothing", &unused.rules);
            section(
                &mut out,
                "principals that decided nothing",
                &unused.principals,
            );
            section(
                &mut out,
                "command entries no request their rule decided matched",
                &unused.commands,
            );
            section(
                &mut out,
                "key globs no key of a request their rule decided matched",
                &unused.globs,
            );
        }
        out
    }
}
