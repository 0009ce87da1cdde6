//! Helpers for the policy tests: admission bounded by fuel alone (deterministic whatever the
//! machine's load: the wall-clock backstop is out of reach), callers, argv from a command line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::registry::Registry;
use tollgate_model::Caller;
use tollgate_policy::{Admission, Decision, Denial, ModuleConfig, PolicyConfig, SandboxLimits};

/// Enough for the catalog's `all()` at build time; a spinning module burns it in milliseconds.
pub const FUEL: u64 = 50_000_000;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where the policy snapshots (`snapshots/`) are kept, named without the test module's name.
pub fn snapshot_settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(root().join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings
}

pub fn fuel_limits() -> SandboxLimits {
    SandboxLimits {
        fuel: FUEL,
        deadline: Duration::from_secs(60),
        ..SandboxLimits::default()
    }
}

pub fn config(files: &[&Path], modules: Vec<ModuleConfig>) -> PolicyConfig {
    PolicyConfig {
        files: files.iter().map(|f| f.to_path_buf()).collect(),
        modules,
        limits: fuel_limits(),
        ..PolicyConfig::default()
    }
}

pub fn admission(config: &PolicyConfig) -> Admission {
    Admission::load(config, &mut Registry::default()).unwrap_or_else(|error| panic!("{error}"))
}

pub fn caller(principal: &str) -> Caller {
    Caller {
        principal: principal.to_owned(),
        uid: 1000,
        gid: 1000,
        pid: std::process::id(),
    }
}

pub fn argv(line: &str) -> Vec<Bytes> {
    line.split_whitespace()
        .map(|a| Bytes::from(a.to_owned()))
        .collect()
}

pub fn denial(decision: Decision) -> Denial {
    match decision {
        Decision::Denied(denial) => *denial,
        Decision::Admitted { descriptor, .. } => {
            panic!("expected a denial, {} was admitted", descriptor.name)
        }
    }
}
