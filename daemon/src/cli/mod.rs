//! The `tollgate` command line: `serve`, `check-config`, and one module per further subcommand.

mod docs;
mod lease;
mod module;
mod policy;
mod redis_acl;
mod serve;
mod status;

pub use status::render as render_status;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{Config, LogFormat};

/// Tollgate: a local daemon between applications and Redis that admits every command through
/// sandboxed WebAssembly policy, routes it over six connection lanes, and serves leases.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon. Without a config, it starts a private redis-server and uses the default policy.
    Serve {
        /// Configuration file (YAML); all settings have defaults.
        #[arg(long, short, env = "TOLLGATE_CONFIG")]
        config: Option<PathBuf>,
        /// Log format; overrides `logging.format` in the config.
        #[arg(long, value_enum)]
        log_format: Option<LogFormatArg>,
    },
    /// Take, renew, release or inspect a lease, or hold one while a command runs.
    #[command(subcommand)]
    Lease(lease::LeaseCommand),
    /// Create, build, test and benchmark guard modules (Rust, JavaScript, Python).
    #[command(subcommand)]
    Module(module::ModuleCommand),
    /// Compile, review, diff, test, check and explain YAML policies.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Print the Redis ACL users an external Redis needs (or, with --lanes-yaml, the config that
    /// uses them).
    RedisAcl(redis_acl::RedisAclArgs),
    /// Validate a configuration file without starting anything; exits non-zero on error.
    CheckConfig {
        /// The configuration file to check.
        file: PathBuf,
    },
    /// One screen about the running daemon: readiness, Redis, lanes, leases, policy, limits.
    Status(status::StatusArgs),
    /// Print the shell completion script for SHELL (bash, zsh or fish).
    Completions {
        #[arg(value_enum)]
        shell: docs::Shell,
    },
    /// Write the man pages (tollgate.1 and one per subcommand) into DIR.
    Man {
        /// Directory to write the pages into; created if missing.
        dir: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormatArg {
    Human,
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(arg: LogFormatArg) -> Self {
        match arg {
            LogFormatArg::Human => LogFormat::Human,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config, log_format } => serve::run(config, log_format.map(Into::into)),
        Command::Lease(command) => lease::run(command),
        Command::Module(command) => printing(|| module::run(command)),
        Command::Policy(command) => printing(|| policy::run(command)),
        Command::RedisAcl(args) => printing(|| redis_acl::run(args)),
        Command::CheckConfig { file } => printing(|| check_config(&file)),
        Command::Status(args) => printing(|| status::run(args)),
        Command::Completions { shell } => printing(|| docs::completions(shell)),
        Command::Man { dir } => docs::man(&dir),
    }
}

/// Runs a subcommand whose work is printing, such as `policy review | head`: a reader that goes
/// away ends it quietly with the conventional status (killed by SIGPIPE, 141 in a shell) instead
/// of a panic in `println!`. Only here: the daemon and the lease commands, which talk over
/// sockets, keep Rust's default of ignoring SIGPIPE and seeing `EPIPE`.
fn printing(run: impl FnOnce() -> ExitCode) -> ExitCode {
    // SAFETY: called before any thread is started by this subcommand; restoring a signal's default
    // disposition has no other effect on the process's state.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    run()
}

/// The file parses and validates; with an external Redis, the daemon can reach it and its lane
/// users keep clients out of the reserved keyspace.
fn check_config(file: &std::path::Path) -> ExitCode {
    // Warnings (a user accepted only because `redis.trusted_users` names it) go to stderr.
    crate::logging::init(LogFormat::Human, "warn");
    let config = match Config::load(file) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    let checked = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())
        .and_then(|runtime| {
            runtime
                .block_on(crate::runtime::check_external_redis(&config))
                .map_err(|error| error.to_string())
        });
    match checked {
        Ok(external) => {
            let redis = if external {
                " (redis reached; no client lane user, and no other user it was not told to trust, can reach the reserved keyspace)"
            } else {
                ""
            };
            println!("{}: ok{redis}", file.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{}: {error}", file.display());
            ExitCode::FAILURE
        }
    }
}
