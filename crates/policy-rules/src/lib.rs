//! The compiled form of a YAML policy and its evaluation. The host compiles YAML into
//! [`CompiledPolicy`] and serialises it; the `yaml-guard` guest deserialises it once per instance
//! and runs [`CompiledPolicy::evaluate`] per command. The host's benchmarks run the same function
//! natively, so the sandbox's cost is measured against identical logic.

mod category;
pub mod channels;
pub mod glob;
mod policy;
pub mod relation;

pub use category::{Category, CategorySet};
pub use policy::{Action, Channels, CompiledPolicy, Mode, Outcome, Request, Rule, Subject, Target};

/// The descriptor name of a lease request: guards see `TOLLGATE|LEASE` with the resource as its
/// only key, so one interface judges both commands and leases.
pub const LEASE_COMMAND: &str = "TOLLGATE|LEASE";
