//! Finding, or installing on first use, what builds a guest: for Rust, rustup's
//! `wasm32-unknown-unknown` target or Debian's `rustc-web` (as scripts/build-guests.sh does); for
//! JavaScript, `componentize-qjs` from npm; for Python, `componentize-py` from PyPI in a private
//! venv. The JS and Python tools go under one directory ($TOLLGATE_TOOLCHAINS, default
//! ~/.cache/tollgate/toolchains), at the versions checked against this daemon's wasmtime.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// componentize-qjs (QuickJS) with `--stub-wasi --sync`: a component that imports nothing but
/// the guard world's `config` (componentize-js, StarlingMonkey, imports WASI interfaces).
pub const COMPONENTIZE_QJS: &str = "componentize-qjs@0.4.5";
pub const COMPONENTIZE_PY: &str = "componentize-py==0.19.3";

/// How a Rust guest is compiled for wasm32.
pub enum RustWasm {
    /// rustup's toolchain has the target.
    Rustup,
    /// Debian's rustc-web, with the standard library built from source.
    DebianWeb,
}

impl RustWasm {
    pub fn find() -> Result<RustWasm> {
        if rustup_has_target() {
            return Ok(RustWasm::Rustup);
        }
        if Path::new("/usr/bin/cargo").is_file()
            && Path::new("/usr/bin/rustc").is_file()
            && Path::new("/usr/lib/rustlib/src/rust/library").is_dir()
            && on_path("wasm-ld")
        {
            return Ok(RustWasm::DebianWeb);
        }
        // rustup can download the target where the network allows.
        if on_path("rustup") {
            eprintln!("module build: installing rustup's wasm32-unknown-unknown target");
            let added = Command::new("rustup")
                .args(["target", "add", "wasm32-unknown-unknown"])
                .status();
            if added.is_ok_and(|status| status.success()) && rustup_has_target() {
                return Ok(RustWasm::Rustup);
            }
        }
        bail!(
            "step `find the Rust wasm toolchain` failed: no toolchain builds wasm32-unknown-unknown. \
             Install either\n  rustup target add wasm32-unknown-unknown\nor (where rustup cannot \
             download targets) Debian's web toolchain:\n  apt-get install rustc-web cargo-web \
             rust-web-src lld   (scripts/setup.sh does this)"
        )
    }

    /// The cargo invocation that builds the crate at `manifest` for wasm32 in release mode.
    pub fn cargo(&self, manifest: &Path) -> Command {
        let mut cargo = match self {
            RustWasm::Rustup => Command::new("cargo"),
            RustWasm::DebianWeb => {
                let mut cargo = Command::new("/usr/bin/cargo");
                // Otherwise Debian's cargo finds rustup's rustc first on PATH.
                cargo
                    .env("RUSTC", "/usr/bin/rustc")
                    .env("RUSTC_BOOTSTRAP", "1")
                    .env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", "wasm-ld");
                cargo
            }
        };
        // An outer cargo (`cargo test`, `cargo run`) exports variables that would point this
        // build at its toolchain and flags; CARGO_HOME and CARGO_TARGET_DIR are the caller's.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            let outer = (name.starts_with("CARGO_") || name.starts_with("RUSTC_"))
                && name != "CARGO_HOME"
                && name != "CARGO_TARGET_DIR"
                || matches!(
                    &*name,
                    "RUSTUP_TOOLCHAIN" | "RUSTC" | "RUSTDOC" | "RUSTFLAGS" | "RUSTDOCFLAGS"
                );
            let ours = matches!(self, RustWasm::DebianWeb)
                && matches!(
                    &*name,
                    "RUSTC" | "RUSTC_BOOTSTRAP" | "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER"
                );
            if outer && !ours {
                cargo.env_remove(&*name);
            }
        }
        cargo.args(["build", "--release", "--target", "wasm32-unknown-unknown"]);
        cargo.arg("--manifest-path").arg(manifest);
        if matches!(self, RustWasm::DebianWeb) {
            cargo.arg("-Zbuild-std=std,panic_abort");
        }
        cargo
    }
}

fn rustup_has_target() -> bool {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == "wasm32-unknown-unknown")
        })
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Where the JS and Python toolchains live.
pub fn home() -> PathBuf {
    if let Some(dir) = std::env::var_os("TOLLGATE_TOOLCHAINS") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("tollgate").join("toolchains")
}

/// `componentize-qjs`, installed with npm on first use.
pub fn componentize_qjs() -> Result<PathBuf> {
    let prefix = home().join("js");
    let tool = prefix.join("node_modules/.bin/componentize-qjs");
    if tool.is_file() {
        return Ok(tool);
    }
    if !on_path("npm") || !on_path("node") {
        bail!(
            "step `install componentize-qjs` failed: npm and node are not on PATH; install \
             Node.js 18 or later with npm (Debian: apt-get install nodejs npm)"
        );
    }
    std::fs::create_dir_all(&prefix).with_context(|| format!("creating {}", prefix.display()))?;
    eprintln!(
        "module build: installing {COMPONENTIZE_QJS} with npm into {}",
        prefix.display()
    );
    run(
        "install componentize-qjs",
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&prefix)
            .arg(COMPONENTIZE_QJS),
        "npm could not install it: check that the npm registry is reachable (npm config get registry)",
    )?;
    if !tool.is_file() {
        bail!(
            "step `install componentize-qjs` failed: npm finished but {} is missing",
            tool.display()
        );
    }
    Ok(tool)
}

/// `componentize-py`, installed with pip into a private venv on first use.
pub fn componentize_py() -> Result<PathBuf> {
    let venv = home().join("python");
    let tool = venv.join("bin/componentize-py");
    if tool.is_file() {
        return Ok(tool);
    }
    if !on_path("python3") {
        bail!(
            "step `install componentize-py` failed: python3 is not on PATH; install Python 3.10 \
             or later with venv (Debian: apt-get install python3 python3-venv)"
        );
    }
    std::fs::create_dir_all(home()).with_context(|| format!("creating {}", home().display()))?;
    eprintln!(
        "module build: installing {COMPONENTIZE_PY} with pip into the venv {}",
        venv.display()
    );
    run(
        "create a Python venv",
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "install the venv module (Debian: apt-get install python3-venv)",
    )?;
    run(
        "install componentize-py",
        Command::new(venv.join("bin/pip")).args(["install", "--quiet", COMPONENTIZE_PY]),
        "pip could not install it: check that PyPI is reachable",
    )?;
    Ok(tool)
}

/// Runs `command`; a failure names `step` and what to do about it.
pub fn run(step: &str, command: &mut Command, hint: &str) -> Result<()> {
    let status = command.status().with_context(|| {
        format!(
            "step `{step}` failed: cannot run {:?}: {hint}",
            command.get_program()
        )
    })?;
    if !status.success() {
        bail!("step `{step}` failed ({status}): {hint}");
    }
    Ok(())
}
