//! Admission: catalogs classify a command, guards judge it, all inside the wasmtime sandbox.
//!
//! [`Admission`] is the entry point (`admit`, `admit_lease`, `reload`); [`compile`] turns YAML
//! policies into what the `yaml-guard` module evaluates; [`classes`] partitions requests into
//! exact classes, which [`review`] prints as decision tables and [`classes::diff`] compares.

mod admissible;
mod admission;
pub mod classes;
pub mod compile;
mod config;
mod decision;
mod decision_log;
mod described;
mod error;
mod generation;
mod heard;
pub mod invariants;
mod lease_memo;
mod metrics;
pub mod module_tests;
mod probe;
mod proven;
pub mod quota;
mod reserved;
pub mod review;
mod sandbox;
pub mod scope;
mod verdict_memo;

use std::path::PathBuf;

pub use admissible::{Admissible, AdmissibleCommand, PrincipalReach};
pub use admission::Admission;
pub use config::{
    DecisionLogConfig, Invariants, KeyRendering, ModuleConfig, ModuleLimits, PolicyConfig,
    SandboxLimits, DEFAULT_FUEL,
};
pub use decision::{Decision, Denial, DenyCause, Descriptor, KeyAccess, Traits};
pub use error::PolicyError;
pub use generation::{FileInfo, Generation, GenerationInfo, ModuleInfo, Step, DEFAULT_POLICY};
pub use lease_memo::LeaseMemo;
pub use probe::{CallCost, GuardAnswer, GuardProbe};
pub use sandbox::Allocator;
pub use tollgate_policy_rules::{glob, Category, CategorySet};

/// Where scripts/build-guests.sh put the component `name` (`hostile`, `key-prefix`, ...) when this
/// crate was built: for tests and for configs that load the example guards from the source tree.
pub fn built_component(name: &str) -> PathBuf {
    PathBuf::from(env!("TOLLGATE_COMPONENTS")).join(format!("{name}.wasm"))
}
