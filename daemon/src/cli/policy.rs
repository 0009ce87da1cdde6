//! `tollgate policy compile|review|diff|test|explain`: policy authoring from the shell, with the
//! same compiler, sandbox and modules the daemon uses. Exit status 1 when a policy does not
//! compile, an expectation fails, or a file cannot be read.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use prometheus_client::registry::Registry;
use tollgate_model::Caller;
use tollgate_policy::{review, Admission, Decision, ModuleConfig, PolicyConfig, PolicyError};

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Compile policy files; prints warnings, or every error with file:line:column.
    Compile {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the decision table: every catalog command x every principal x key samples drawn
    /// from the policy's own globs, with the deciding rule.
    Review {
        file: PathBuf,
        /// Guard modules to run after the policy, as the daemon would.
        #[arg(long = "module")]
        modules: Vec<PathBuf>,
    },
    /// Print only the decisions that differ between two policies.
    Diff { old: PathBuf, new: PathBuf },
    /// Run the expectations in each policy's `tests:` section.
    Test {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Show each module's verdict for one command: `explain --principal P -- CMD ARGS...`.
    Explain {
        #[arg(long)]
        principal: String,
        /// Policy files (default: the built-in default policy).
        #[arg(long = "policy")]
        files: Vec<PathBuf>,
        /// Guard modules to run after the policies.
        #[arg(long = "module")]
        modules: Vec<PathBuf>,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
}

pub fn run(command: PolicyCommand) -> ExitCode {
    match execute(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

fn load(files: Vec<PathBuf>, modules: Vec<PathBuf>) -> Result<Admission, PolicyError> {
    let config = PolicyConfig {
        files,
        modules: modules.into_iter().map(ModuleConfig::Path).collect(),
        ..PolicyConfig::default()
    };
    Admission::load(&config, &mut Registry::default())
}

fn execute(command: PolicyCommand) -> Result<(), PolicyError> {
    match command {
        PolicyCommand::Compile { files } | PolicyCommand::Test { files } => {
            for file in files {
                let admission = load(vec![file.clone()], vec![])?;
                let generation = admission.current();
                for warning in &admission.generation().files[0].warnings {
                    eprintln!("{warning}");
                }
                let compiled = &generation.files()[0];
                println!(
                    "{}: ok ({} rules, {} principals, {} expectations passed)",
                    file.display(),
                    compiled.policy.rules.len(),
                    compiled.principals.len(),
                    compiled.tests.len()
                );
            }
        }
        PolicyCommand::Review { file, modules } => {
            print!("{}", review::table(&load(vec![file], modules)?.current()));
        }
        PolicyCommand::Diff { old, new } => {
            let old = review::table(&load(vec![old], vec![])?.current());
            let new = review::table(&load(vec![new], vec![])?.current());
            let diff = review::diff(&old, &new);
            if diff.lines.is_empty() {
                println!("no decision changed");
            } else {
                print!("{diff}");
            }
        }
        PolicyCommand::Explain {
            principal,
            files,
            modules,
            argv,
        } => {
            let admission = load(files, modules)?;
            let caller = Caller {
                principal,
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
                pid: std::process::id(),
            };
            let (decision, steps) = admission.explain(&caller, &argv);
            for step in steps {
                println!(
                    "{:<28} {:<8} {:<20} {}",
                    step.module,
                    step.verdict,
                    step.rule.unwrap_or_default(),
                    step.reason.unwrap_or_default()
                );
            }
            match decision {
                Decision::Admitted {
                    descriptor,
                    lane,
                    rule,
                } => {
                    println!(
                        "=> admitted by {rule} as {} on lane {}",
                        descriptor.name,
                        lane.shout()
                    )
                }
                Decision::Denied(denial) => {
                    println!("=> denied ({}): {denial}", denial.cause.as_str())
                }
            }
        }
    }
    Ok(())
}
