//! Decision tables for review: every class of requests of one generation ([`crate::classes`]:
//! principals × commands × keys on which every rule is constant, computed exactly), with its
//! witness and the deciding rule, then the commands of each command class. A snapshot of a table
//! changes exactly when some class's decision, or the classes themselves, do.

use std::fmt;

use crate::classes::{Asks, Space, Verdict};
use crate::generation::Generation;

/// One class: who, which commands (`C3 SET (+171 more)`), the witness keys (`-`: none), the
/// decision.
#[derive(Debug, Clone)]
pub struct Row {
    pub principal: String,
    pub command: String,
    pub keys: String,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Default)]
pub struct Table {
    pub rows: Vec<Row>,
    /// Each command class's commands, by class label.
    pub commands: Vec<(String, Vec<String>)>,
    /// Each quota: its id, whom it holds, its limits.
    pub quotas: Vec<String>,
    pub complete: bool,
}

/// The decision table of the generation's policies and modules.
pub fn table(generation: &Generation) -> Table {
    let space = Space::new(&[generation]);
    let label = |asks: Asks| match asks {
        Asks::Command(c) => format!("C{c} {}", space.asks_label(asks)),
        Asks::Lease => space.asks_label(asks),
    };
    let rows = space
        .classes
        .iter()
        .map(|class| Row {
            principal: space.principals[class.principal].label(),
            command: label(class.asks),
            keys: if class.witness.keys.is_empty() {
                "-".to_owned()
            } else {
                class.witness.keys.join(",")
            },
            verdict: class.verdicts[0].clone(),
        })
        .collect();
    let commands = (0..space.commands.len())
        .map(|c| {
            let asks = Asks::Command(c);
            (format!("C{c}"), space.members(asks))
        })
        .collect();
    let quotas = generation
        .quotas()
        .map(|quota| format!("{} ({}): {quota}", quota.id, quota.whom()))
        .collect();
    Table {
        rows,
        commands,
        quotas,
        complete: space.complete(),
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.complete {
            writeln!(
                f,
                "INCOMPLETE: a partition hit its bound, classes may be missing"
            )?;
        }
        for row in &self.rows {
            writeln!(
                f,
                "{:<28} {:<32} {:<20} {}",
                row.principal, row.command, row.keys, row.verdict
            )?;
        }
        writeln!(
            f,
            "
command classes:"
        )?;
        for (label, members) in &self.commands {
            writeln!(f, "{label}: {}", members.join(" "))?;
        }
        // Only when there are any: tables of policies without quotas read as before.
        if !self.quotas.is_empty() {
            writeln!(f, "\nquotas (each principal held to its own buckets):")?;
            for quota in &self.quotas {
                writeln!(f, "{quota}")?;
            }
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
