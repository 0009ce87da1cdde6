//! Why a policy generation could not be built. The running generation is never affected.

use std::path::PathBuf;

use crate::compile::Diagnostic;
use crate::invariants::Checked;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{}", render(.0))]
    Compile(Vec<Diagnostic>),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: {size} bytes, more than policy.max_file_bytes ({max}): split the policy or raise \
         the limit"
    )]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("module {name}: {detail}")]
    Module { name: String, detail: String },
    #[error("cannot open the decision log {path}: {source}")]
    DecisionLog {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("policy self-test failed:\n{}", .0.join("\n"))]
    SelfTest(Vec<String>),
    /// Some invariant does not hold: every invariant checked, those broken with a witness.
    #[error("{}", broken(.0))]
    Invariants(Vec<Checked>),
}

fn broken(checked: &[Checked]) -> String {
    checked
        .iter()
        .filter(|c| !c.holds())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

fn render(diagnostics: &[Diagnostic]) -> String {
    diagnostics
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}
