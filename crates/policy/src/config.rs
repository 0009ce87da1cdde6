//! The `policy:` section of `tollgate.yaml`: which YAML policies and which guard modules are
//! active, and the limits every module call runs under.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub use crate::decision_log::{DecisionLogConfig, KeyRendering};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// YAML policy files, each judged by its own YAML guard, in order. Empty means the embedded
    /// default policy (policies/default.yaml).
    pub files: Vec<PathBuf>,
    /// Extra catalog modules (WASM components), asked after the built-in catalog for commands it
    /// does not know (a Redis module's, say).
    pub catalogs: Vec<PathBuf>,
    /// Extra guard modules (WASM components), run after the YAML guards in the order given.
    pub modules: Vec<ModuleConfig>,
    /// Bounds on every module call.
    pub limits: SandboxLimits,
    /// A JSON-lines log of every decision; none by default.
    pub decision_log: Option<DecisionLogConfig>,
    /// A policy file larger than this is refused before it is parsed.
    pub max_file_bytes: u64,
    /// How long compiling every policy file of one generation may take; past it, the build fails.
    #[serde(with = "humantime_serde")]
    pub compile_deadline: Duration,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            files: Vec::new(),
            catalogs: Vec::new(),
            modules: Vec::new(),
            limits: SandboxLimits::default(),
            decision_log: None,
            max_file_bytes: 1024 * 1024,
            compile_deadline: Duration::from_secs(10),
        }
    }
}

/// An operator's guard module: a path, or a path with the bytes its `config.get` returns.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ModuleConfig {
    Path(PathBuf),
    WithConfig {
        path: PathBuf,
        #[serde(default)]
        config: String,
    },
}

impl ModuleConfig {
    pub fn path(&self) -> &PathBuf {
        match self {
            ModuleConfig::Path(path) | ModuleConfig::WithConfig { path, .. } => path,
        }
    }

    pub fn config(&self) -> &[u8] {
        match self {
            ModuleConfig::Path(_) => b"",
            ModuleConfig::WithConfig { config, .. } => config.as_bytes(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxLimits {
    /// How long one module call may run, in wall time. It bounds runaway modules, not slow ones:
    /// a decision takes microseconds, but a thread descheduled on a loaded machine can lose
    /// milliseconds, and a deadline that tight would deny legitimate commands (fail-closed).
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// Units of work per call instead of a deadline: deterministic whatever the machine's load,
    /// which is what tests want.
    pub fuel: Option<u64>,
    /// Linear memory one instance may grow to, in MiB.
    pub memory_mib: u32,
}

/// What stops a call that runs too long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    Deadline(Duration),
    Fuel(u64),
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            deadline: Duration::from_millis(100),
            fuel: None,
            memory_mib: 16,
        }
    }
}

impl SandboxLimits {
    pub fn budget(&self) -> Budget {
        match self.fuel {
            Some(fuel) => Budget::Fuel(fuel),
            None => Budget::Deadline(self.deadline),
        }
    }

    pub fn memory_bytes(&self) -> usize {
        self.memory_mib as usize * 1024 * 1024
    }
}
