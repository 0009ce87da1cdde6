//! Builds the guest modules (scripts/build-guests.sh) so the built-in catalog and the YAML guard
//! can be embedded in the binary; reruns only when guest sources, the WIT or the script change.

use std::path::PathBuf;
use std::process::Command;

const INPUTS: &[&str] = &[
    "wit",
    "scripts/build-guests.sh",
    "tools/componentize/src",
    "crates/policy-rules/src",
    "policies/modules/Cargo.toml",
    "policies/modules/Cargo.lock",
    "policies/modules/kit/src",
    "policies/modules/catalog/src",
    "policies/modules/yaml-guard/src",
    "policies/modules/hostile/src",
    "policies/modules/examples/key-prefix/src",
    "policies/modules/examples/json-catalog/src",
];
const OUTPUTS: &[&str] = &[
    "catalog",
    "yaml-guard",
    "hostile",
    "key-prefix",
    "json-catalog",
];

fn main() {
    // Read when the script runs, not baked in when it is compiled: cargo reuses a compiled build
    // script across checkouts of the workspace at other paths (worktrees, CI clones), and a baked
    // path would name a checkout that may be gone.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = PathBuf::from(manifest).join("../..");
    let root = root.canonicalize().expect("the workspace root exists");
    let components = root.join("policies/modules/target/components");
    for input in INPUTS {
        println!("cargo:rerun-if-changed={}", root.join(input).display());
    }
    // A missing output counts as changed, so deleting the target directory rebuilds the guests.
    for output in OUTPUTS {
        println!(
            "cargo:rerun-if-changed={}",
            components.join(format!("{output}.wasm")).display()
        );
    }
    let status = Command::new("bash")
        .arg(root.join("scripts/build-guests.sh"))
        .status()
        .expect("bash runs scripts/build-guests.sh");
    if !status.success() {
        panic!("scripts/build-guests.sh failed ({status}); its output above says why");
    }
    println!(
        "cargo:rustc-env=TOLLGATE_COMPONENTS={}",
        components.display()
    );
}
