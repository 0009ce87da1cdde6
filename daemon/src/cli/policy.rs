//! `tollgate policy compile|review|diff|test|check|explain`: policy authoring from the shell, with
//! the same compiler, sandbox and modules the daemon uses. Exit status 1 when a policy does not
//! compile, an expectation fails, or a file cannot be read; `diff` exits 2 when a decision changed
//! (as `terraform plan -detailed-exitcode`), `check` when an invariant does not hold.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use prometheus_client::registry::Registry;
use tollgate_model::Caller;
use tollgate_policy::classes::replay::{Replayer, Unused};
use tollgate_policy::classes::{diff, LEASE};
use tollgate_policy::{
    review, Admission, Decision, Invariants, ModuleConfig, PolicyConfig, PolicyError,
};

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Compile policy files; prints warnings, or every error with file:line:column.
    Compile {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the decision table: every class of requests (principals x commands x keys on which
    /// every rule is constant), with a witness and the deciding rule.
    Review {
        file: PathBuf,
        /// Guard modules to run after the policy, as the daemon would: components, or module
        /// directories (their built component; their tests.yaml is run first).
        #[arg(long = "module")]
        modules: Vec<PathBuf>,
    },
    /// Every request class whose decision differs between two policies, folded where classes
    /// changed alike and grouped by what now decides them, with a witness each; exit status 2
    /// when any did.
    Diff {
        old: PathBuf,
        new: PathBuf,
        /// Guard modules to run after either policy (opaque: their rows are sampled only).
        #[arg(long = "module")]
        modules: Vec<PathBuf>,
        /// The same, as JSON: every changed class, and the plan's folds of them, with witnesses.
        #[arg(long)]
        json: bool,
        /// A row per changed class, instead of the plan's folds of those that changed alike.
        #[arg(long)]
        classes: bool,
    },
    /// Run the expectations in each policy's `tests:` section, and each `--module`'s own.
    Test {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Guard modules (directories or components) whose tests.yaml to run beside the policies'.
        #[arg(long = "module")]
        modules: Vec<PathBuf>,
    },
    /// Prove every invariant of the policy files (loaded together, as `policy.files` loads them)
    /// over every request class; exit status 2 when one does not hold, with a witness each.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Guard modules to run after the policies (opaque: what they decide is sampled only).
        #[arg(long = "module")]
        modules: Vec<PathBuf>,
    },
    /// Decide every request of decision logs again under a candidate policy and print what would
    /// change, grouped by principal, command class and the rule that would now decide, with an
    /// example and a witness each; exit status 2 when some decision changes.
    Replay {
        /// Decision logs (JSON lines, as `policy.decision_log` writes them), read in order.
        #[arg(long = "log", required = true)]
        logs: Vec<PathBuf>,
        /// The candidate policy files.
        #[arg(long = "against", required = true)]
        against: Vec<PathBuf>,
        /// The policy the logs were written under: the old decisions are then its, and requests
        /// whose recorded key classes the candidate splits are counted. Without it, the old
        /// decisions are the logged ones.
        #[arg(long = "policy")]
        policy: Vec<PathBuf>,
        /// Guard modules to run after either policy (opaque: what they decide is sampled only).
        #[arg(long = "module")]
        modules: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The rules, principals, command entries and key globs of a policy that decided nothing in
    /// the decision logs, and the period the logs cover.
    Unused {
        #[arg(long = "log", required = true)]
        logs: Vec<PathBuf>,
        /// The policy files (default: the built-in default policy).
        files: Vec<PathBuf>,
        #[arg(long = "module")]
        modules: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The scopes of the policy files (loaded together): for each key-constrained principal whose
    /// scripts Redis holds to its key grants, the Redis ACL user the daemon makes for them.
    Scopes {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Show each module's verdict for one command: `explain --principal P -- CMD ARGS...`
    /// (`-- LEASE RESOURCE` for a lease); with `--against`, under a second policy too.
    Explain {
        /// The principal; without it, the one the policy maps `--uid`/`--gid` to.
        #[arg(long, required_unless_present = "uid")]
        principal: Option<String>,
        #[arg(long)]
        uid: Option<u32>,
        #[arg(long)]
        gid: Option<u32>,
        /// Policy files (default: the built-in default policy).
        #[arg(long = "policy")]
        files: Vec<PathBuf>,
        /// Policy files to explain the command under as well (a diff's new side).
        #[arg(long = "against")]
        against: Vec<PathBuf>,
        /// Guard modules to run after the policies.
        #[arg(long = "module")]
        modules: Vec<PathBuf>,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
}

pub fn run(command: PolicyCommand) -> ExitCode {
    let command = match module_expectations(command) {
        Ok(command) => command,
        Err(error) => {
            eprintln!("{error:#}");
            return ExitCode::FAILURE;
        }
    };
    match execute(command) {
        Ok(Changed::No) => ExitCode::SUCCESS,
        Ok(Changed::Yes) => ExitCode::from(2),
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the expectations of every module `test` and `review` name, and turns module directories
/// into their built components.
fn module_expectations(command: PolicyCommand) -> anyhow::Result<PolicyCommand> {
    let modules = match &command {
        PolicyCommand::Test { modules, .. } | PolicyCommand::Review { modules, .. } => modules,
        _ => return Ok(command),
    };
    let mut components = Vec::with_capacity(modules.len());
    for module in modules {
        let located = super::module::locate(module, None)?;
        if let Some(tests) = &located.tests {
            let tests = tollgate_policy::module_tests::ModuleTests::read(tests)?;
            super::module::run_expectations(&located.component, &tests)?;
        } else if matches!(command, PolicyCommand::Test { .. }) {
            anyhow::bail!("{}: no tests.yaml to run", module.display());
        }
        components.push(located.component);
    }
    Ok(match command {
        PolicyCommand::Test { files, .. } => PolicyCommand::Test {
            files,
            modules: Vec::new(),
        },
        PolicyCommand::Review { file, .. } => PolicyCommand::Review {
            file,
            modules: components,
        },
        other => other,
    })
}

/// The policy files and modules as the daemon would load them: a generation whose invariants do
/// not all hold is an error.
fn load(files: Vec<PathBuf>, modules: Vec<PathBuf>) -> Result<Admission, PolicyError> {
    load_as(files, modules, Invariants::Enforce)
}

/// The same, with invariants that do not hold reported instead: to review, diff, explain or
/// check a candidate that breaks one.
fn load_reporting(files: Vec<PathBuf>, modules: Vec<PathBuf>) -> Result<Admission, PolicyError> {
    load_as(files, modules, Invariants::Report)
}

fn load_as(
    files: Vec<PathBuf>,
    modules: Vec<PathBuf>,
    invariants: Invariants,
) -> Result<Admission, PolicyError> {
    let config = PolicyConfig {
        files,
        modules: modules.into_iter().map(ModuleConfig::Path).collect(),
        invariants,
        ..PolicyConfig::default()
    };
    Admission::load(&config, &mut Registry::default())
}

/// Whether a diff found a changed decision.
enum Changed {
    No,
    Yes,
}

fn execute(command: PolicyCommand) -> Result<Changed, PolicyError> {
    match command {
        PolicyCommand::Compile { files } | PolicyCommand::Test { files, .. } => {
            for file in files {
                let admission = load(vec![file.clone()], vec![])?;
                let generation = admission.current();
                for warning in &admission.generation().files[0].warnings {
                    eprintln!("{warning}");
                }
                let compiled = &generation.files()[0];
                println!(
                    "{}: ok ({} rules, {} principals, {} expectations passed, {} invariants hold)",
                    file.display(),
                    compiled.policy.rules.len(),
                    compiled.principals.len(),
                    compiled.tests.len(),
                    generation.invariants().len()
                );
            }
        }
        PolicyCommand::Scopes { files } => {
            let generation = load_reporting(files, vec![])?.current();
            print!("{}", crate::scope_users::render(&generation));
        }
        PolicyCommand::Check { files, modules } => {
            let checked = load_reporting(files, modules)?
                .current()
                .invariants()
                .to_vec();
            for invariant in &checked {
                println!("{invariant}");
            }
            let broken = checked.iter().filter(|c| !c.holds()).count();
            println!(
                "{} invariants: {} hold, {broken} do not",
                checked.len(),
                checked.len() - broken
            );
            return Ok(if broken > 0 {
                Changed::Yes
            } else {
                Changed::No
            });
        }
        PolicyCommand::Replay {
            logs,
            against,
            policy,
            modules,
            json,
        } => {
            let flags = |flag: &str, files: &[PathBuf]| -> String {
                files
                    .iter()
                    .map(|f| format!(" --{flag} {}", f.display()))
                    .collect()
            };
            let explain = format!(
                "tollgate policy explain{}{}{}",
                flags("policy", &policy),
                flags("against", &against),
                flags("module", &modules)
            );
            let old = if policy.is_empty() {
                None
            } else {
                Some(load_reporting(policy, modules.clone())?.current())
            };
            let new = load_reporting(against, modules)?.current();
            let mut replayer = Replayer::new(old.as_deref(), &new);
            read_logs(&mut replayer, &logs)?;
            let (replay, _) = replayer.finish();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&replay).expect("a replay serialises")
                );
            } else {
                print!("{}", replay.render(&explain));
            }
            return Ok(if replay.changed() {
                Changed::Yes
            } else {
                Changed::No
            });
        }
        PolicyCommand::Unused {
            logs,
            files,
            modules,
            json,
        } => {
            let generation = load_reporting(files, modules)?.current();
            let mut replayer = Replayer::new(None, &generation);
            read_logs(&mut replayer, &logs)?;
            let (replay, usage) = replayer.finish();
            let unused = usage.unused(&generation);
            if json {
                let value = serde_json::json!({
                    "requests": replay.requests,
                    "lines": replay.lines,
                    "malformed": replay.malformed,
                    "first_ms": replay.first_ms,
                    "last_ms": replay.last_ms,
                    "files": unused,
                });
                println!(
                    "{}",
                    serde_json::to_string_pretty(&value).expect("a report serialises")
                );
            } else {
                print!("{}", Unused::render(&unused, &replay));
            }
        }
        PolicyCommand::Review { file, modules } => {
            print!(
                "{}",
                review::table(&load_reporting(vec![file], modules)?.current())
            );
        }
        PolicyCommand::Diff {
            old,
            new,
            modules,
            json,
            classes,
        } => {
            let module_args: String = modules
                .iter()
                .map(|m| format!(" --module {}", m.display()))
                .collect();
            let replay = format!(
                "tollgate policy explain --policy {} --against {}{module_args}",
                old.display(),
                new.display()
            );
            let old = load_reporting(vec![old], modules.clone())?.current();
            let new = load_reporting(vec![new], modules)?.current();
            let diff = diff::diff(&old, &new);
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&diff).expect("a diff serialises")
                );
            } else {
                print!("{}", diff.render(&replay, classes));
            }
            return Ok(if diff.changed() {
                Changed::Yes
            } else {
                Changed::No
            });
        }
        PolicyCommand::Explain {
            principal,
            uid,
            gid,
            files,
            against,
            modules,
            argv,
        } => {
            let uid = uid.unwrap_or_else(|| nix::unistd::getuid().as_raw());
            let gid = gid.unwrap_or_else(|| nix::unistd::getgid().as_raw());
            let sides: Vec<Vec<PathBuf>> = if against.is_empty() {
                vec![files]
            } else {
                vec![files, against]
            };
            let several = sides.len() > 1;
            for side in sides {
                let label = side
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" ");
                let admission = load_reporting(side, modules.clone())?;
                let principal = principal.clone().unwrap_or_else(|| {
                    admission
                        .principal_for(uid, gid)
                        .unwrap_or_else(|| format!("uid:{uid}"))
                });
                let caller = Caller {
                    principal,
                    uid,
                    gid,
                    pid: std::process::id(),
                };
                if several {
                    println!("under {label} (principal {}):", caller.principal);
                }
                explain(&admission, &caller, &argv);
            }
        }
    }
    Ok(Changed::No)
}

/// Streams every log into `replayer`, file by file.
fn read_logs(replayer: &mut Replayer<'_>, logs: &[PathBuf]) -> Result<(), PolicyError> {
    for log in logs {
        let read_error = |source| PolicyError::Read {
            path: log.clone(),
            source,
        };
        let file = std::fs::File::open(log).map_err(read_error)?;
        let reader = std::io::BufReader::with_capacity(1 << 16, file);
        replayer
            .read(&log.display().to_string(), reader)
            .map_err(read_error)?;
    }
    Ok(())
}

/// Prints each module's verdict on `argv` (`LEASE RESOURCE`: a lease request) and the decision.
fn explain(admission: &Admission, caller: &Caller, argv: &[String]) {
    let (decision, steps) = match argv {
        [lease, resource] if lease.eq_ignore_ascii_case(LEASE) => (
            admission.current().admit_lease(caller, resource),
            Vec::new(),
        ),
        argv => admission.explain(caller, argv),
    };
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
    // Admitted or not, the quotas its principal answers to (an administrator is spared those
    // that name no principal).
    for quota in admission.current().quotas() {
        let whom = match &quota.principals {
            Some(names) if names.contains(&caller.principal) => "",
            Some(_) => continue,
            None => " unless an administrator of the daemon",
        };
        println!("=> quota {}: {quota}{whom}", quota.id);
    }
}
