//! The diff of two generations: every request class whose decision changed, each with a witness
//! to replay, and the plan a reviewer reads: a count line, then the changed classes folded into
//! products of principals × command classes × key conditions that changed alike, grouped by what
//! now decides them, with the classes still denied by default or by the host (another of those
//! deciding now) in a quieter section of their own.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use serde::Serialize;

use super::{Asks, Space, Verdict, Witness};
use crate::generation::Generation;
use crate::quota::QuotaChange;

/// Width past which a row's list of commands is cut short (the full list: `--classes`, `--json`).
const COMMANDS_WIDTH: usize = 36;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    NewlyAllowed,
    NewlyDenied,
    /// The same decision, by another rule.
    OtherRule,
}

impl Change {
    fn of(old: &Verdict, new: &Verdict) -> Option<Change> {
        match (old.allowed, new.allowed) {
            _ if old.same(new) => None,
            (false, true) => Some(Change::NewlyAllowed),
            (true, false) => Some(Change::NewlyDenied),
            _ => Some(Change::OtherRule),
        }
    }

    fn mark(self) -> char {
        match self {
            Change::NewlyAllowed => '+',
            Change::NewlyDenied => '-',
            Change::OtherRule => '~',
        }
    }
}

/// Where the plan shows a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Section {
    /// Under the verdict that now decides.
    Decided,
    /// Denied before and after, each time by default or by the host (`default-deny`,
    /// `reserved`): no rule of either policy decides it.
    StillDenied,
}

impl Section {
    fn of(old: &Verdict, new: &Verdict) -> Section {
        if old.by_default_or_host() && new.by_default_or_host() {
            Section::StillDenied
        } else {
            Section::Decided
        }
    }
}

/// One class whose decision changed.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub change: Change,
    pub principal: String,
    /// The class's commands: its witness command first.
    pub commands: Vec<String>,
    /// A label for the class's keys: the witness keys, `-` for none.
    pub keys: String,
    pub old: Verdict,
    pub new: Verdict,
    pub witness: Witness,
    #[serde(skip)]
    parts: Parts,
}

/// A class's place in the space: its principal class, what it asks and its key condition.
#[derive(Debug, Clone, Copy)]
struct Parts {
    principal: usize,
    asks: Asks,
    condition: usize,
}

/// A peer the plan names: its short name, its label, and the flags that replay it.
#[derive(Debug, Clone, Serialize)]
pub struct Peer {
    pub name: String,
    pub label: String,
    pub replay: String,
}

/// Changed classes folded into one row of the plan: every class of the product of its principal
/// classes, command classes (or leases) and key conditions changed from `old` to `new`. Two
/// products are folded when they differ in one of the three only, so the fold loses nothing.
#[derive(Debug, Clone, Serialize)]
pub struct Fold {
    pub change: Change,
    pub section: Section,
    pub old: Verdict,
    pub new: Verdict,
    /// Short names ([`Peer::name`]).
    pub principals: Vec<String>,
    /// Each command class's first command (`LEASE` for leases).
    pub commands: Vec<String>,
    /// The commands of those classes in all.
    pub command_count: usize,
    /// The witness keys of each key condition (`-`: none).
    pub keys: Vec<String>,
    /// The classes folded, as indices into [`Diff::rows`].
    pub rows: Vec<usize>,
    /// The witness of the first class.
    pub witness: Witness,
}

#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub newly_allowed: usize,
    pub newly_denied: usize,
    pub other_rule: usize,
    /// Classes compared.
    pub classes: usize,
    /// False when some partition hit its bound: the diff may miss classes.
    pub complete: bool,
    /// Every principal class, in the space's order.
    pub peers: Vec<Peer>,
    /// The plan's rows: the changed classes folded.
    pub plan: Vec<Fold>,
    /// Every changed class.
    pub rows: Vec<Row>,
    /// The quotas added, removed or changed: rows of the plan of their own.
    pub quotas: Vec<QuotaChange>,
}

pub fn diff(old: &Generation, new: &Generation) -> Diff {
    let mut diff = of_space(&Space::new(&[old, new]));
    diff.quotas = QuotaChange::between(old.quotas(), new.quotas());
    diff
}

/// The changed classes of a space of two generations.
pub fn of_space(space: &Space<'_>) -> Diff {
    let mut rows: Vec<Row> = space
        .classes
        .iter()
        .filter_map(|class| {
            let (old, new) = (&class.verdicts[0], &class.verdicts[1]);
            let change = Change::of(old, new)?;
            let keys = if class.witness.keys.is_empty() {
                "-".to_owned()
            } else {
                class.witness.keys.join(",")
            };
            Some(Row {
                change,
                principal: space.principals[class.principal].label(),
                commands: space.members(class.asks),
                keys,
                old: old.clone(),
                new: new.clone(),
                witness: class.witness.clone(),
                parts: Parts {
                    principal: class.principal,
                    asks: class.asks,
                    condition: class.condition,
                },
            })
        })
        .collect();
    // By what now decides (denials first), then other-rule changes before newly denied and
    // newly allowed ones; classes in space order within.
    rows.sort_by(|a, b| {
        (a.new.allowed, &a.new.rule)
            .cmp(&(b.new.allowed, &b.new.rule))
            .then(b.change.cmp(&a.change))
    });
    let count = |change| rows.iter().filter(|r| r.change == change).count();
    let peers = peers(space);
    let plan = fold(&rows, &peers);
    Diff {
        newly_allowed: count(Change::NewlyAllowed),
        newly_denied: count(Change::NewlyDenied),
        other_rule: count(Change::OtherRule),
        classes: space.classes.len(),
        complete: space.complete(),
        peers,
        plan,
        rows,
        quotas: Vec::new(),
    }
}

/// A [`Peer`] for each principal class. Short names are the principals under the new generation;
/// where two classes share one, their labels.
fn peers(space: &Space<'_>) -> Vec<Peer> {
    let names: Vec<String> = space.principals.iter().map(|p| p.name()).collect();
    let unique = names.iter().collect::<BTreeSet<_>>().len() == names.len();
    space
        .principals
        .iter()
        .zip(names)
        .map(|(class, name)| {
            let label = class.label();
            Peer {
                name: if unique { name } else { label.clone() },
                label,
                replay: class.replay(),
            }
        })
        .collect()
}

/// A product being folded: sets of principal classes, of what they ask, of key conditions.
#[derive(Debug, Clone)]
struct Product {
    principals: BTreeSet<usize>,
    asks: BTreeSet<Asks>,
    conditions: BTreeSet<usize>,
    rows: Vec<usize>,
}

/// The dimension a fold pass merges along.
#[derive(Debug, Clone, Copy)]
enum Dimension {
    Commands,
    Principals,
    Keys,
}

/// What two products must share to fold along a dimension: the other two dimensions.
type Shared = (BTreeSet<usize>, BTreeSet<Asks>, BTreeSet<usize>);

fn shared(product: &Product, along: Dimension) -> Shared {
    let (mut principals, mut asks, mut conditions) = (
        product.principals.clone(),
        product.asks.clone(),
        product.conditions.clone(),
    );
    match along {
        Dimension::Commands => asks.clear(),
        Dimension::Principals => principals.clear(),
        Dimension::Keys => conditions.clear(),
    }
    (principals, asks, conditions)
}

/// Merges products that changed alike and share all dimensions but `along`; the first of each
/// keeps its place.
fn merge(products: Vec<Product>, rows: &[Row], along: Dimension) -> Vec<Product> {
    let mut out: Vec<Product> = Vec::new();
    let mut at: HashMap<(&Verdict, &Verdict, Shared), usize> = HashMap::new();
    for product in products {
        let first = &rows[product.rows[0]];
        let key = (&first.old, &first.new, shared(&product, along));
        match at.get(&key) {
            Some(&i) => {
                let into = &mut out[i];
                into.principals.extend(product.principals);
                into.asks.extend(product.asks);
                into.conditions.extend(product.conditions);
                into.rows.extend(product.rows);
            }
            None => {
                at.insert(key, out.len());
                out.push(product);
            }
        }
    }
    out
}

/// The changed classes folded, in the rows' order, until no two products fold; those still denied
/// by default or by the host last.
fn fold(rows: &[Row], peers: &[Peer]) -> Vec<Fold> {
    let mut products: Vec<Product> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| Product {
            principals: BTreeSet::from([row.parts.principal]),
            asks: BTreeSet::from([row.parts.asks]),
            conditions: BTreeSet::from([row.parts.condition]),
            rows: vec![i],
        })
        .collect();
    loop {
        let before = products.len();
        for along in [Dimension::Commands, Dimension::Principals, Dimension::Keys] {
            products = merge(products, rows, along);
        }
        if products.len() == before {
            break;
        }
    }
    let mut plan: Vec<Fold> = products
        .into_iter()
        .map(|product| of_product(product, rows, peers))
        .collect();
    plan.sort_by_key(|fold| fold.section);
    plan
}

fn of_product(mut product: Product, rows: &[Row], peers: &[Peer]) -> Fold {
    product.rows.sort_unstable();
    let first = &rows[product.rows[0]];
    // Each part once, in the order its first class comes.
    let mut principals = Vec::new();
    let mut commands: Vec<(Asks, &Row)> = Vec::new();
    let mut keys: Vec<(usize, &str)> = Vec::new();
    for &i in &product.rows {
        let row = &rows[i];
        let peer = &peers[row.parts.principal].name;
        if !principals.contains(peer) {
            principals.push(peer.clone());
        }
        if !commands.iter().any(|(asks, _)| *asks == row.parts.asks) {
            commands.push((row.parts.asks, row));
        }
        if !keys.iter().any(|(c, _)| *c == row.parts.condition) {
            keys.push((row.parts.condition, &row.keys));
        }
    }
    Fold {
        change: first.change,
        section: Section::of(&first.old, &first.new),
        old: first.old.clone(),
        new: first.new.clone(),
        principals,
        command_count: commands.iter().map(|(_, r)| r.commands.len()).sum(),
        commands: commands
            .iter()
            .map(|(_, r)| r.commands[0].clone())
            .collect(),
        keys: keys.iter().map(|(_, k)| (*k).to_owned()).collect(),
        rows: product.rows,
        witness: first.witness.clone(),
    }
}

fn sampled(old: &Verdict, new: &Verdict) -> Option<String> {
    let decided = new.module.as_ref().filter(|m| new.sampled.contains(m));
    if let Some(module) = decided {
        return Some(format!("decided by module {module}: sampled only"));
    }
    let mut modules: Vec<&String> = old.sampled.iter().chain(&new.sampled).collect();
    modules.sort();
    modules.dedup();
    (!modules.is_empty()).then(|| {
        let names: Vec<&str> = modules.iter().map(|m| m.as_str()).collect();
        format!("modules {} took part: sampled only", names.join(", "))
    })
}

/// `APPEND (+63)` for one class; `APPEND, BITOP, … (218 in 14 classes)` for several, cut at
/// [`COMMANDS_WIDTH`].
fn commands_text(fold: &Fold) -> String {
    match fold.commands.as_slice() {
        [one] if fold.command_count == 1 => one.clone(),
        [one] => format!("{one} (+{})", fold.command_count - 1),
        several => {
            let count = format!(" ({} in {} classes)", fold.command_count, several.len());
            let mut names = String::new();
            for (i, name) in several.iter().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                let room = COMMANDS_WIDTH.saturating_sub(count.len() + ", …".len());
                if i > 0 && names.len() + sep.len() + name.len() > room {
                    names.push_str(", …");
                    break;
                }
                names.push_str(sep);
                names.push_str(name);
            }
            names + &count
        }
    }
}

impl Diff {
    pub fn changed(&self) -> bool {
        !self.rows.is_empty() || !self.quotas.is_empty()
    }

    /// The count line: `12 request classes newly allowed, 3 newly denied, 40 decided by another
    /// rule (of 180 classes)`.
    pub fn summary(&self) -> String {
        format!(
            "{} request classes newly allowed, {} newly denied, {} decided by another rule (of {} classes){}{}",
            self.newly_allowed,
            self.newly_denied,
            self.other_rule,
            self.classes,
            match self.quotas.len() {
                0 => String::new(),
                1 => "; 1 quota changed".to_owned(),
                n => format!("; {n} quotas changed"),
            },
            if self.complete {
                ""
            } else {
                "; INCOMPLETE: a partition hit its bound, classes may be missing"
            }
        )
    }

    /// The plan: the count line, how to replay a witness (`replay` prefixes it, as `tollgate
    /// policy explain --policy OLD --against NEW`) and the flags of each peer, then a row per
    /// fold ([`Diff::plan`]) grouped by the verdict that now decides, and last the classes still
    /// denied by default or by the host. `every_class`: a row per changed class instead.
    pub fn render(&self, replay: &str, every_class: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.summary());
        if !self.quotas.is_empty() {
            let _ = writeln!(out, "\nquotas:");
            for change in &self.quotas {
                let _ = writeln!(out, "  {change}");
            }
        }
        if self.rows.is_empty() {
            return out;
        }
        let _ = writeln!(out, "replay: {replay} FLAGS -- REQUEST");
        // The peers of changed classes only.
        let named: BTreeSet<usize> = self.rows.iter().map(|r| r.parts.principal).collect();
        let shown: Vec<&Peer> = named.iter().map(|&p| &self.peers[p]).collect();
        let name_width = shown.iter().map(|p| p.name.len()).max().unwrap_or(0);
        let label_width = shown.iter().map(|p| p.label.len()).max().unwrap_or(0);
        for (i, peer) in shown.into_iter().enumerate() {
            let _ = writeln!(
                out,
                "{:<8}{:<name_width$}  {:<label_width$}  FLAGS {}",
                if i == 0 { "peers:" } else { "" },
                peer.name,
                peer.label,
                peer.replay
            );
        }
        let plan: Vec<Fold> = if every_class {
            self.singles()
        } else {
            self.plan.clone()
        };
        let every_peer = self.peers.len();
        let who = |fold: &Fold| {
            if fold.principals.len() == every_peer && every_peer > 1 {
                "every peer".to_owned()
            } else {
                fold.principals.join(", ")
            }
        };
        let was = |fold: &Fold| match fold.section {
            Section::Decided => format!("was {}", fold.old),
            Section::StillDenied => format!("{} -> {}", fold.old.rule, fold.new.rule),
        };
        let who_width = plan.iter().map(|f| who(f).len()).max().unwrap_or(0);
        let was_width = plan.iter().map(|f| was(f).len()).max().unwrap_or(0);
        let what_width = plan
            .iter()
            .map(|f| commands_text(f).chars().count())
            .max()
            .unwrap_or(0);
        // What heads the rows: the section, and in the first the verdict that now decides.
        fn heads(fold: &Fold) -> Option<(bool, &str)> {
            match fold.section {
                Section::Decided => Some((fold.new.allowed, fold.new.rule.as_str())),
                Section::StillDenied => None,
            }
        }
        let mut heading: Option<Option<(bool, &str)>> = None;
        for fold in &plan {
            let this = heads(fold);
            let starts = heading != Some(this);
            if starts {
                let classes: usize = plan
                    .iter()
                    .filter(|f| heads(f) == this)
                    .map(|f| f.rows.len())
                    .sum();
                let _ = match fold.section {
                    Section::Decided => {
                        writeln!(out, "\nnow {} ({classes} classes):", fold.new)
                    }
                    Section::StillDenied => writeln!(
                        out,
                        "\nstill denied by default or by the host ({classes} classes):"
                    ),
                };
                heading = Some(this);
            }
            // The witness's peer, where the row names several.
            let peer = match fold.principals.as_slice() {
                [_, _, ..] => format!("{}: ", fold.principals[0]),
                _ => String::new(),
            };
            let what = commands_text(fold);
            let pad = what_width - what.chars().count();
            let _ = write!(
                out,
                "  {} {:<who_width$}  {:<was_width$}  {what}{:pad$}  e.g. {peer}{}",
                fold.change.mark(),
                who(fold),
                was(fold),
                "",
                fold.witness.request(),
            );
            // Of several key conditions, the witness shows the first: the others' keys.
            if fold.keys.len() > 1 {
                let _ = write!(out, "  [also keys {}]", fold.keys[1..].join(" or "));
            }
            if let Some(note) = sampled(&fold.old, &fold.new) {
                let _ = write!(out, "  [{note}]");
            }
            out.push('\n');
        }
        out
    }

    /// A fold per changed class, in the plan's order.
    fn singles(&self) -> Vec<Fold> {
        self.plan
            .iter()
            .flat_map(|f| f.rows.iter().copied())
            .map(|i| {
                let row = &self.rows[i];
                let peer = self.peers[row.parts.principal].name.clone();
                Fold {
                    change: row.change,
                    section: Section::of(&row.old, &row.new),
                    old: row.old.clone(),
                    new: row.new.clone(),
                    principals: vec![peer],
                    commands: vec![row.commands[0].clone()],
                    command_count: row.commands.len(),
                    keys: vec![row.keys.clone()],
                    rows: vec![i],
                    witness: row.witness.clone(),
                }
            })
            .collect()
    }
}
