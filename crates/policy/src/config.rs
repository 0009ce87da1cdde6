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
    /// Whether a generation whose invariants do not all hold is refused (the daemon), or built
    /// with them reported (`policy check`, and `explain`/`diff` of a candidate that breaks one).
    #[serde(skip)]
    pub invariants: Invariants,
}

/// What building a generation does with an invariant that does not hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Invariants {
    /// The generation is refused ([`crate::PolicyError::Invariants`]).
    #[default]
    Enforce,
    /// The generation is built; [`crate::Generation::invariants`] says which do not hold.
    Report,
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
            invariants: Invariants::Enforce,
        }
    }
}

impl PolicyConfig {
    /// The limits of every call this config makes: the common ones and each module's own.
    pub fn all_limits(&self) -> impl Iterator<Item = SandboxLimits> + '_ {
        std::iter::once(self.limits.clone()).chain(
            self.modules
                .iter()
                .map(|module| module.limits(&self.limits)),
        )
    }
}

/// An operator's guard module: a path, or a path with the bytes its `config.get` returns and
/// limits of its own.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ModuleConfig {
    Path(PathBuf),
    WithConfig {
        path: PathBuf,
        #[serde(default)]
        config: String,
        /// What this module's calls may spend instead of `policy.limits`, limit by limit.
        #[serde(default)]
        limits: ModuleLimits,
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

    /// The limits this module's calls run under: its own where it sets them, else `common`.
    pub fn limits(&self, common: &SandboxLimits) -> SandboxLimits {
        match self {
            ModuleConfig::Path(_) => common.clone(),
            ModuleConfig::WithConfig { limits, .. } => SandboxLimits {
                deadline: limits.deadline.unwrap_or(common.deadline),
                fuel: limits.fuel.unwrap_or(common.fuel),
                memory_mib: limits.memory_mib.unwrap_or(common.memory_mib),
            },
        }
    }
}

/// Bounds on every module call. A call is stopped by whichever it reaches first.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxLimits {
    /// Units of guest work (wasmtime fuel, about one per WASM instruction) one call may spend: the
    /// bound that counts only the module's own work, so it holds whatever the machine's load, and
    /// a module that loops costs the daemon's worker this much and no more. A decision of the
    /// YAML guard spends a few thousand; a pipeline's batch call spends that per command.
    pub fuel: u64,
    /// How long one call may run, in wall time: the backstop for what fuel does not count (a
    /// descheduled thread, host work). It bounds runaway modules, not slow ones: a thread
    /// descheduled on a loaded machine can lose milliseconds, and a deadline that tight would deny
    /// legitimate commands (fail-closed).
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// Linear memory one instance may grow to, in MiB.
    pub memory_mib: u32,
}

/// One module's overrides of [`SandboxLimits`]; what it leaves out is the common limit.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModuleLimits {
    pub fuel: Option<u64>,
    #[serde(with = "humantime_serde")]
    pub deadline: Option<Duration>,
    pub memory_mib: Option<u32>,
}

/// Fuel per call unless configured: ten thousand times a YAML guard decision's work (a few
/// thousand), a hundred times the built-in catalog's listing at build time (half a million), yet a
/// loop burns it in about 3 ms.
pub const DEFAULT_FUEL: u64 = 50_000_000;

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            fuel: DEFAULT_FUEL,
            deadline: Duration::from_millis(100),
            memory_mib: 16,
        }
    }
}

impl SandboxLimits {
    pub fn memory_bytes(&self) -> usize {
        self.memory_mib as usize * 1024 * 1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_sets_limits_of_its_own_and_takes_the_common_ones_for_the_rest() {
        let config: PolicyConfig = serde_yaml::from_str(
            "modules:\n  - plain.wasm\n  - { path: heavy.wasm, limits: { fuel: 7, deadline: 250ms } }\nlimits: { memory_mib: 8 }\n",
        )
        .unwrap();
        let common = SandboxLimits {
            memory_mib: 8,
            ..SandboxLimits::default()
        };
        assert_eq!(config.limits, common);
        assert_eq!(config.modules[0].limits(&config.limits), common);
        assert_eq!(
            config.modules[1].limits(&config.limits),
            SandboxLimits {
                fuel: 7,
                deadline: Duration::from_millis(250),
                memory_mib: 8,
            }
        );
    }
}
