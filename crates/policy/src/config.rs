//! The `policy:` section of `tollgate.yaml`: which YAML policies and which guard modules are active.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// YAML policy files, compiled in order. Empty means the embedded default policy.
    pub files: Vec<PathBuf>,
    /// Extra guard modules (WASM components), run after the YAML guard in the order given.
    pub modules: Vec<PathBuf>,
}
