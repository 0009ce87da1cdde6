//! `tollgate module build [DIR]`: the language's toolchain makes a component, which is loaded in
//! the daemon's sandbox as a guard (linked against the guard world: every import satisfied by the
//! host, every export of the right type) and asked once, before it is written to
//! DIR/build/NAME.wasm. A component that fails the check is never written.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use tollgate_policy::module_tests::ModuleTests;
use wit_component::ComponentEncoder;

use super::toolchain::{self, RustWasm};
use super::{component_path, load, module_name, Lang};

pub fn run(dir: &Path) -> Result<()> {
    let lang = Lang::of(dir)?;
    let name = module_name(dir)?;
    let out = component_path(dir)?;
    let staging = dir.join("build").join(format!(".{name}.wasm.new"));
    std::fs::create_dir_all(dir.join("build"))
        .with_context(|| format!("creating {}", dir.join("build").display()))?;
    match lang {
        Lang::Rust => rust(dir, &staging)?,
        Lang::Js => js(dir, &staging)?,
        Lang::Python => python(dir, &staging)?,
    }
    let tests = dir.join("tests.yaml");
    let tests = if tests.is_file() {
        Some(ModuleTests::read(&tests)?)
    } else {
        None
    };
    if let Err(error) = check(&staging, tests.as_ref()) {
        let _ = std::fs::remove_file(&staging);
        return Err(error);
    }
    std::fs::rename(&staging, &out).with_context(|| format!("writing {}", out.display()))?;
    let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    println!(
        "{}: a {} guard component of {} KiB, checked against the guard world",
        out.display(),
        lang.name(),
        size / 1024
    );
    Ok(())
}

/// Loads `component` as the daemon would load it as a guard (with the config and limits of its
/// tests), which instantiates it and asks it one command.
pub fn check(component: &Path, tests: Option<&ModuleTests>) -> Result<()> {
    load(component, tests).map(drop).context(
        "step `check the component against the guard world` failed (it must export \
         tollgate:policy/guard@0.4.0 and import nothing but tollgate:policy/config: no WASI)",
    )
}

fn rust(dir: &Path, out: &Path) -> Result<()> {
    let toolchain = RustWasm::find()?;
    let manifest = dir.join("Cargo.toml");
    toolchain::run(
        "cargo build --target wasm32-unknown-unknown",
        &mut toolchain.cargo(&manifest),
        "see cargo's errors above",
    )?;
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(target) => PathBuf::from(target),
        None => dir.join("target"),
    };
    let core = target.join("wasm32-unknown-unknown/release/guard.wasm");
    let module = std::fs::read(&core)
        .with_context(|| format!("step `cargo build` left no {}", core.display()))?;
    let component = ComponentEncoder::default()
        .module(&module)
        .context(
            "step `componentize` failed: the core module carries no component type (build it \
             with wit-bindgen's generate! on wit/policy.wit)",
        )?
        .validate(true)
        .encode()
        .context("step `componentize` failed")?;
    std::fs::write(out, component).with_context(|| format!("writing {}", out.display()))
}

fn js(dir: &Path, out: &Path) -> Result<()> {
    let tool = toolchain::componentize_qjs()?;
    toolchain::run(
        "componentize-qjs",
        Command::new(&tool)
            .arg("--wit")
            .arg(dir.join("wit"))
            .arg("--js")
            .arg(dir.join("guard.js"))
            .args([
                "--world",
                "guard-module",
                "--stub-wasi",
                "--sync",
                "--output",
            ])
            .arg(out)
            .stdout(std::process::Stdio::null()),
        "see its errors above (guard.js must export `guard` with admit and admitBatch)",
    )
}

fn python(dir: &Path, out: &Path) -> Result<()> {
    let tool = toolchain::componentize_py()?;
    if !dir.join("wit").is_dir() {
        bail!("{} has no wit/ directory", dir.display());
    }
    toolchain::run(
        "componentize-py",
        Command::new(&tool)
            .arg("--wit-path")
            .arg(dir.join("wit"))
            .args(["--world", "guard-module", "componentize", "--stub-wasi"])
            .arg("--python-path")
            .arg(dir)
            .arg("--output")
            .arg(out)
            .arg("guard")
            .env_remove("VIRTUAL_ENV")
            .stdout(std::process::Stdio::null()),
        "see its errors above (guard.py must define class Guard(exports.Guard))",
    )
}
