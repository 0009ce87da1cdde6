//! `tollgate module new|build|test|bench`: guard modules from source to a checked component, in
//! Rust, JavaScript or Python. A module is a directory: its source, `wit/` (the guard world),
//! `tests.yaml` (its expectations) and, once built, `build/<name>.wasm`. Exit status 1 when a step
//! fails or an expectation does not hold.

mod bench;
mod build;
mod scaffold;
mod toolchain;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use prometheus_client::registry::Registry;
use tollgate_policy::module_tests::ModuleTests;
use tollgate_policy::{Admission, Generation, GuardProbe, ModuleConfig, PolicyConfig};

#[derive(Debug, Subcommand)]
pub enum ModuleCommand {
    /// Create a guard module: the guard world's WIT, an example guard that denies keys outside
    /// the caller's prefix, tests.yaml and a README.
    New {
        /// The directory to create; its last component names the module.
        dir: PathBuf,
        #[arg(long, value_enum, default_value = "rust")]
        lang: Lang,
    },
    /// Build DIR/build/NAME.wasm with the language's toolchain (installed on first use under
    /// $TOLLGATE_TOOLCHAINS, default ~/.cache/tollgate/toolchains), checked against the guard world.
    Build {
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Run a module's expectations (DIR/tests.yaml) in the daemon's sandbox, limits and packing.
    Test {
        /// A module directory, or a built component.
        #[arg(default_value = ".")]
        module: PathBuf,
        /// The expectations (default: tests.yaml of the module's directory).
        #[arg(long)]
        tests: Option<PathBuf>,
    },
    /// p50/p99 time and fuel per call and per batch on a standard mix of commands, beside the
    /// built-in YAML guard's.
    Bench {
        #[arg(default_value = ".")]
        module: PathBuf,
        /// Rounds of the mix (each: every command alone, then all of them as one batch).
        #[arg(long, default_value_t = 200)]
        rounds: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Js,
    Python,
}

impl Lang {
    pub fn name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Js => "js",
            Lang::Python => "python",
        }
    }

    /// The file whose presence says a directory holds a module of this language.
    fn marker(self) -> &'static str {
        match self {
            Lang::Rust => "Cargo.toml",
            Lang::Js => "guard.js",
            Lang::Python => "guard.py",
        }
    }

    /// The language of the module in `dir`.
    fn of(dir: &Path) -> Result<Lang> {
        [Lang::Rust, Lang::Js, Lang::Python]
            .into_iter()
            .find(|lang| dir.join(lang.marker()).is_file())
            .with_context(|| {
                format!(
                    "{} is not a module directory: no Cargo.toml, guard.js or guard.py (create \
                     one with `tollgate module new DIR --lang rust|js|python`)",
                    dir.display()
                )
            })
    }
}

pub fn run(command: ModuleCommand) -> ExitCode {
    let outcome = match command {
        ModuleCommand::New { dir, lang } => scaffold::create(&dir, lang),
        ModuleCommand::Build { dir } => build::run(&dir),
        ModuleCommand::Test { module, tests } => test(&module, tests.as_deref()),
        ModuleCommand::Bench { module, rounds } => bench::run(&module, rounds),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

/// A module's name: its directory's last component.
fn module_name(dir: &Path) -> Result<String> {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    dir.file_name()
        .and_then(|name| name.to_str())
        .map(str::to_owned)
        .with_context(|| format!("{} has no usable name", dir.display()))
}

/// Where `module build` writes the component of the module in `dir`.
pub fn component_path(dir: &Path) -> Result<PathBuf> {
    Ok(dir
        .join("build")
        .join(format!("{}.wasm", module_name(dir)?)))
}

/// A module to load: its component and, when there are any, its expectations.
pub struct Located {
    pub component: PathBuf,
    pub tests: Option<PathBuf>,
}

/// `DIR` (its built component and DIR/tests.yaml) or `FILE.wasm` (and the tests.yaml of its
/// directory or, for DIR/build/NAME.wasm, of DIR).
pub fn locate(module: &Path, tests: Option<&Path>) -> Result<Located> {
    let (component, dirs) = if module.is_dir() {
        let component = component_path(module)?;
        if !component.is_file() {
            bail!(
                "{} is not built: run `tollgate module build {}` first",
                component.display(),
                module.display()
            );
        }
        (component, vec![module.to_owned()])
    } else if module.is_file() {
        let parent = module.parent().unwrap_or(Path::new(".")).to_owned();
        let grandparent = parent.parent().map(Path::to_owned);
        (
            module.to_owned(),
            std::iter::once(parent).chain(grandparent).collect(),
        )
    } else {
        bail!(
            "{}: no such module directory or component",
            module.display()
        );
    };
    let tests = match tests {
        Some(tests) => Some(tests.to_owned()),
        None => dirs
            .iter()
            .map(|dir| dir.join("tests.yaml"))
            .find(|path| path.is_file()),
    };
    Ok(Located { component, tests })
}

/// A generation of the built-in default policy with `component` as its one operator guard, loaded
/// exactly as the daemon loads `policy.modules` entries; and a probe of that guard.
pub fn load(
    component: &Path,
    tests: Option<&ModuleTests>,
) -> Result<(Arc<Generation>, GuardProbe)> {
    let (config, limits) = tests
        .map(|t| (t.config.clone(), t.limits.clone()))
        .unwrap_or_default();
    let policy = PolicyConfig {
        modules: vec![ModuleConfig::WithConfig {
            path: component.to_owned(),
            config,
            limits,
        }],
        ..PolicyConfig::default()
    };
    let admission = Admission::load(&policy, &mut Registry::default())?;
    let generation = admission.current();
    let name = generation
        .operator_guards()
        .pop()
        .context("the generation has no operator guard")?;
    let probe = GuardProbe::new(generation.clone(), &name).context("the guard is loaded")?;
    Ok((generation, probe))
}

/// `module test`: every expectation through `admit` and `admit-batch`.
fn test(module: &Path, tests: Option<&Path>) -> Result<()> {
    let located = locate(module, tests)?;
    let tests_path = located.tests.with_context(|| {
        format!(
            "no expectations for {}: write tests.yaml beside it or pass --tests FILE",
            located.component.display()
        )
    })?;
    let tests = ModuleTests::read(&tests_path)?;
    run_expectations(&located.component, &tests)
}

/// Loads `component` with the config and limits of `tests`, runs them, prints the outcome.
pub fn run_expectations(component: &Path, tests: &ModuleTests) -> Result<()> {
    let (_, probe) = load(component, Some(tests))?;
    let failures = tests.failures(&probe);
    if !failures.is_empty() {
        bail!(
            "{}\n{}: {} of {} expectations failed",
            failures.join("\n"),
            tests.path.display(),
            failures.len(),
            tests.tests.len()
        );
    }
    println!(
        "{}: ok ({} expectations passed against {})",
        tests.path.display(),
        tests.tests.len(),
        component.display()
    );
    Ok(())
}
