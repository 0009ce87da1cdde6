//! Invariants: what a policy's `invariants:` section says must never, or always, be admitted,
//! proven over every request class of a generation — the diff's partition, split further by each
//! invariant's selector so that it is constant on every class — not by sampling. A class its
//! selector picks whose decision breaks it is a witness, replayable with `policy explain`.
//! Operator guard modules are opaque to the classes: where they take part, a holding invariant
//! was checked on each class's witness only, and says so. This file holds the report; the proof
//! runs where generations are made ready (`proven.rs`), above both the classes and the
//! generation, which the report's errors are raised from.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use crate::classes::{Verdict, Witness};
use crate::compile::Must;

/// One invariant, checked against one generation.
#[derive(Debug, Clone, Serialize)]
pub struct Checked {
    /// The file that states it.
    pub file: PathBuf,
    pub id: String,
    pub must: Must,
    pub line: usize,
    pub column: usize,
    /// Request classes its selector picks.
    pub classes: usize,
    /// Of those, the classes whose decision breaks it.
    pub violations: usize,
    /// The first class that breaks it: its witness and how it was decided.
    pub witness: Option<Broken>,
    /// Operator modules that took part in the classes it picks: opaque, so their decisions were
    /// seen for the witnesses only.
    pub sampled: Vec<String>,
    /// False when a partition hit its bound: classes may be missing, so holding is not proven.
    pub complete: bool,
    /// `tollgate policy explain --policy FILE...`, to which a witness's flags and request add.
    #[serde(skip)]
    pub(crate) explain: String,
}

/// A request that breaks an invariant, and the decision that does.
#[derive(Debug, Clone, Serialize)]
pub struct Broken {
    pub witness: Witness,
    pub verdict: Verdict,
}

impl Checked {
    pub fn holds(&self) -> bool {
        self.violations == 0
    }

    /// `tollgate policy explain --policy FILE --principal acme -- SET globex:x x`.
    pub fn replay(&self) -> Option<String> {
        self.witness
            .as_ref()
            .map(|broken| format!("{} {}", self.explain, broken.witness.replay()))
    }
}

impl fmt::Display for Checked {
    /// `FILE:LINE:COL: error: invariant ... does not hold: ...` for a broken one (a diagnostic,
    /// at the invariant's own position), `FILE:LINE:COL: invariant ... holds ...` otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = format!("{}:{}:{}", self.file.display(), self.line, self.column);
        let sampled = if self.sampled.is_empty() {
            String::new()
        } else {
            format!(
                " [modules {} took part: sampled only]",
                self.sampled.join(", ")
            )
        };
        match &self.witness {
            Some(broken) => {
                let decided = if broken.verdict.allowed {
                    format!("rule `{}` admits", broken.verdict.rule)
                } else {
                    format!("rule `{}` denies", broken.verdict.rule)
                };
                write!(
                    f,
                    "{at}: error: invariant `{}` does not hold: {decided} `{}` (request classes \
                     breaking it: {} of the {} it speaks of); replay: {}{sampled}",
                    self.id,
                    broken.witness.replay(),
                    self.violations,
                    self.classes,
                    self.replay().unwrap_or_default(),
                )
            }
            None => {
                let what = match self.must {
                    Must::Never => "none admitted",
                    Must::Always => "every one admitted",
                };
                let proven = if !self.complete {
                    " (NOT PROVEN: a partition hit its bound, classes may be missing)"
                } else if self.classes == 0 {
                    " (it speaks of no request at all)"
                } else {
                    ""
                };
                write!(
                    f,
                    "{at}: invariant `{}` holds: {what} of the {} request classes it speaks \
                     of{proven}{sampled}",
                    self.id, self.classes
                )
            }
        }
    }
}
