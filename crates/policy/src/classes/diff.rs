//! The diff of two generations: every request class whose decision changed, each with a witness
//! to replay, grouped by what now decides it, and a count line in the style of a plan.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::{Space, Verdict, Witness};
use crate::generation::Generation;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
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
    pub rows: Vec<Row>,
}

pub fn diff(old: &Generation, new: &Generation) -> Diff {
    of_space(&Space::new(&[old, new]))
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
    Diff {
        newly_allowed: count(Change::NewlyAllowed),
        newly_denied: count(Change::NewlyDenied),
        other_rule: count(Change::OtherRule),
        classes: space.classes.len(),
        complete: space.complete(),
        rows,
    }
}

fn commands_label(commands: &[String]) -> String {
    match commands {
        [] => String::new(),
        [one] => one.clone(),
        [first, rest @ ..] => format!("{first} (+{})", rest.len()),
    }
}

fn sampled(row: &Row) -> Option<String> {
    let decided = row
        .new
        .module
        .as_ref()
        .filter(|m| row.new.sampled.contains(m));
    if let Some(module) = decided {
        return Some(format!("decided by module {module}: sampled only"));
    }
    let mut modules: Vec<&String> = row.old.sampled.iter().chain(&row.new.sampled).collect();
    modules.sort();
    modules.dedup();
    (!modules.is_empty()).then(|| {
        let names: Vec<&str> = modules.iter().map(|m| m.as_str()).collect();
        format!("modules {} took part: sampled only", names.join(", "))
    })
}

impl Diff {
    pub fn changed(&self) -> bool {
        !self.rows.is_empty()
    }

    /// The count line: `12 classes newly allowed, 3 newly denied, 40 decided by another rule (of
    /// 180 classes)`.
    pub fn summary(&self) -> String {
        format!(
            "{} request classes newly allowed, {} newly denied, {} decided by another rule (of {} classes){}",
            self.newly_allowed,
            self.newly_denied,
            self.other_rule,
            self.classes,
            if self.complete {
                ""
            } else {
                "; INCOMPLETE: a partition hit its bound, classes may be missing"
            }
        )
    }

    /// The plan: the count line, then the changed classes grouped by the verdict that now decides
    /// them and, within, by principal and former verdict, each group with the witness of its
    /// first class (`replay` prefixes it, as `tollgate policy explain --policy OLD --against
    /// NEW`). `every_class`: a line per class instead.
    pub fn render(&self, replay: &str, every_class: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.summary());
        if self.rows.is_empty() {
            return out;
        }
        let _ = writeln!(out, "replay a witness: {replay} <witness>");
        let mut groups: BTreeMap<(bool, &str), Vec<&Row>> = BTreeMap::new();
        for row in &self.rows {
            groups
                .entry((!row.new.allowed, row.new.rule.as_str()))
                .or_default()
                .push(row);
        }
        for rows in groups.values() {
            let _ = writeln!(out, "\nnow {} ({} classes):", rows[0].new, rows.len());
            let mut runs: Vec<Vec<&Row>> = Vec::new();
            for &row in rows {
                let same = |run: &Vec<&Row>| {
                    !every_class
                        && run[0].principal == row.principal
                        && run[0].old.same(&row.old)
                        && run[0].change == row.change
                };
                match runs.iter_mut().find(|run| same(run)) {
                    Some(run) => run.push(row),
                    None => runs.push(vec![row]),
                }
            }
            for run in runs {
                let first = run[0];
                let mark = match first.change {
                    Change::NewlyAllowed => '+',
                    Change::NewlyDenied => '-',
                    Change::OtherRule => '~',
                };
                let commands: usize = run.iter().map(|r| r.commands.len()).sum();
                let what = if run.len() == 1 {
                    format!("{} keys {}", commands_label(&first.commands), first.keys)
                } else {
                    format!("{} classes, {commands} commands", run.len())
                };
                let _ = write!(
                    out,
                    "  {mark} {:<30} was {:<24} {what}",
                    first.principal,
                    first.old.to_string(),
                );
                if let Some(note) = sampled(first) {
                    let _ = write!(out, "  [{note}]");
                }
                let _ = writeln!(out, "\n      e.g. {}", first.witness.replay());
            }
        }
        out
    }
}
