//! The YAML policy compiler: reads a policy, checks everything a reviewer could get wrong
//! (unknown principal, command or category, bad glob, a rule that can never match), and produces
//! the [`CompiledPolicy`] the `yaml-guard` module evaluates. Every diagnostic carries
//! file:line:column.

mod check;
mod source;
mod spans;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use tollgate_policy_rules::{CategorySet, CompiledPolicy};

pub use source::Expected;

/// The rule id of a denial because no rule allowed (policies are default-deny); tests may name it.
pub const DEFAULT_DENY: &str = "default-deny";

/// What the compiler knows of the catalog: every canonical name and its categories.
#[derive(Debug, Default, Clone)]
pub struct CatalogIndex {
    pub commands: HashMap<String, CategorySet>,
}

impl CatalogIndex {
    /// Whether `name` is a command, or a parent whose subcommands are (`CLIENT`).
    fn knows(&self, name: &str) -> bool {
        self.commands.contains_key(name)
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

/// A policy file that compiled, possibly with warnings.
#[derive(Debug, Clone)]
pub struct CompiledFile {
    pub path: PathBuf,
    pub policy: CompiledPolicy,
    pub principals: Vec<Principal>,
    pub tests: Vec<Expectation>,
    pub warnings: Vec<Diagnostic>,
}

/// Compiles one policy. `Err` holds every error found (and the warnings), never just the first.
pub fn compile(
    path: &Path,
    text: &str,
    catalog: &CatalogIndex,
) -> Result<CompiledFile, Vec<Diagnostic>> {
    let file: source::PolicyFile = match serde_yaml::from_str(text) {
        Ok(file) => file,
        Err(error) => {
            let (line, column) = error.location().map_or((1, 1), |l| (l.line(), l.column()));
            return Err(vec![Diagnostic {
                file: path.to_owned(),
                line,
                column,
                severity: Severity::Error,
                message: error.to_string(),
            }]);
        }
    };
    let spans = spans::Spans::of(text);
    check::Checker::new(path, &spans, catalog).run(file)
}
