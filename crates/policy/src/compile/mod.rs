//! The YAML policy compiler: reads a policy, checks everything a reviewer could get wrong
//! (unknown principal, command or category, bad glob, a rule that can never match), and produces
//! the [`CompiledPolicy`] the `yaml-guard` module evaluates. Every diagnostic carries
//! file:line:column.

mod check;
mod shadow;
mod source;
pub(crate) mod spans;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use tollgate_policy_rules::{CategorySet, CompiledPolicy, Rule};

use crate::quota::Quota;

pub use source::Expected;

/// The rule id of a denial because no rule allowed (policies are default-deny); tests may name it.
pub const DEFAULT_DENY: &str = "default-deny";

/// What the compiler knows of the catalog: every canonical name and what it is.
#[derive(Debug, Default, Clone)]
pub struct CatalogIndex {
    pub commands: HashMap<String, CatalogCommand>,
}

/// One command as the compiler needs it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CatalogCommand {
    pub categories: CategorySet,
    /// Redis flags it `scripting`: EVAL and FCALL run code, SCRIPT and FUNCTION manage it.
    pub scripting: bool,
    /// Whether it names keys (in its shortest form): a rule with `keys:` can match only these.
    pub keyed: bool,
}

impl CatalogIndex {
    /// Whether `name` is a command, or a parent whose subcommands are (`CLIENT`).
    fn knows(&self, name: &str) -> bool {
        self.commands.contains_key(name)
    }

    fn categories(&self, name: &str) -> CategorySet {
        self.commands
            .get(name)
            .map_or(CategorySet::default(), |c| c.categories)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub severity: Severity,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(
            f,
            "{}:{}:{}: {severity}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

/// A principal with the credentials that map to it (user and group names already resolved).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Principal {
    pub name: String,
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
    pub any: bool,
}

/// One expectation from a policy's `tests:` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Expectation {
    pub principal: String,
    pub argv: Vec<String>,
    pub expect: Expected,
    pub rule: Option<String>,
    pub line: usize,
}

/// What an invariant asks of the requests its selector picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Must {
    /// None of them is admitted.
    Never,
    /// Every one of them is admitted.
    Always,
}

impl Must {
    pub fn as_str(self) -> &'static str {
        match self {
            Must::Never => "never",
            Must::Always => "always",
        }
    }
}

/// One entry of a policy's `invariants:` section, checked over every request class of each
/// generation the file is part of ([`crate::invariants`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invariant {
    pub id: String,
    pub must: Must,
    /// The requests it speaks of, as a rule: `Rule::matches` on a request answers whether the
    /// invariant applies to it. A deny rule for `never` (it applies when any key lies in the
    /// globs), an allow rule for `always` (when every key does).
    pub selector: Rule,
    /// Where the invariant is written (its node, as the YAML parser marks it).
    pub line: usize,
    pub column: usize,
}

/// Where a rule is written, and whether it says `scripts: unconstrained`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RulePlace {
    pub line: usize,
    pub column: usize,
    pub unconstrained: bool,
}

/// A policy file that compiled, possibly with warnings.
#[derive(Debug, Clone)]
pub struct CompiledFile {
    pub path: PathBuf,
    pub policy: CompiledPolicy,
    /// Where each rule of `policy` is written, and what it says of scripts (same order).
    pub places: Vec<RulePlace>,
    pub principals: Vec<Principal>,
    pub tests: Vec<Expectation>,
    pub invariants: Vec<Invariant>,
    pub quotas: Vec<Quota>,
    pub warnings: Vec<Diagnostic>,
}

/// Compiles one policy. `Err` holds every error found (and the warnings), never just the first.
/// Every step is linear in the text, or bounded: nesting by [`spans::MAX_DEPTH`], the
/// shadowed-rule check by its budget, and the rules' checks by `deadline`.
pub fn compile(
    path: &Path,
    text: &str,
    catalog: &CatalogIndex,
    deadline: Instant,
) -> Result<CompiledFile, Vec<Diagnostic>> {
    let error = |line: usize, column: usize, message: String| {
        vec![Diagnostic {
            file: path.to_owned(),
            line,
            column,
            severity: Severity::Error,
            message,
        }]
    };
    // Before serde, whose deserializer recurses on nesting.
    let spans = spans::Spans::of(text).map_err(|deep| {
        error(
            deep.line,
            deep.column,
            format!(
                "nesting deeper than {} levels: a policy is a few levels deep",
                spans::MAX_DEPTH
            ),
        )
    })?;
    let file: source::PolicyFile = serde_yaml::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
        error(line, column, e.to_string())
    })?;
    check::Checker::new(path, &spans, catalog, deadline).run(file)
}
