//! `tollgate serve`: load the config, start the daemon, and turn signals into an orderly stop.
//! SIGTERM or SIGINT starts a graceful shutdown; a second SIGINT exits at once after cleaning up.
//! SIGHUP (and so `systemctl reload`) reloads the policy through the daemon's one [`Reloader`].
//! Under systemd, the sockets it passed and its notification socket and watchdog are taken before
//! the async runtime starts (`crate::systemd`).

use std::path::PathBuf;
use std::process::ExitCode;

use tokio::signal::unix::{signal, SignalKind};

use crate::config::{Config, LimitsConfig, LogFormat};
use crate::logging;
use crate::reload::{Reloader, Trigger};
use crate::runtime::Daemon;
use crate::systemd::Systemd;

/// Exit status after an abort by a second SIGINT (128 + SIGINT, as shells report it).
const ABORTED: u8 = 130;

pub fn run(config_path: Option<PathBuf>, log_format: Option<LogFormat>) -> ExitCode {
    let config = match &config_path {
        Some(path) => match Config::load(path) {
            Ok(config) => config,
            Err(error) => {
                eprintln!("tollgate: {error}");
                return ExitCode::FAILURE;
            }
        },
        None => Config::default(),
    };
    logging::init(
        log_format.unwrap_or(config.logging.format),
        &config.logging.level,
    );
    // Before any thread: reading systemd's variables removes some from the environment.
    let systemd = match Systemd::from_env() {
        Ok(systemd) => systemd,
        Err(error) => {
            eprintln!("tollgate: {error}");
            return ExitCode::FAILURE;
        }
    };
    raise_open_files_limit(&config.limits);
    let runtime = match config.async_runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tollgate: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(config, systemd))
}

async fn serve(config: Config, systemd: Systemd) -> ExitCode {
    let (mut terminate, mut interrupt, mut hangup) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(terminate), Ok(interrupt), Ok(hangup)) => (terminate, interrupt, hangup),
        (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => {
            eprintln!("tollgate: cannot install signal handlers: {error}");
            return ExitCode::FAILURE;
        }
    };
    let daemon = match Daemon::start_under(config, systemd).await {
        Ok(daemon) => daemon,
        Err(error) => {
            eprintln!("tollgate: {error}");
            return ExitCode::FAILURE;
        }
    };
    loop {
        tokio::select! {
            _ = terminate.recv() => break tracing::info!("SIGTERM received"),
            _ = interrupt.recv() => break tracing::info!("SIGINT received; press Ctrl-C again to exit at once"),
            _ = hangup.recv() => reload_policy(daemon.reloader()).await,
        }
    }
    let abort = daemon.abort_cleanup();
    tokio::select! {
        () = daemon.shutdown() => ExitCode::SUCCESS,
        _ = interrupt.recv() => {
            abort.run();
            eprintln!("tollgate: second SIGINT, exiting at once");
            ExitCode::from(ABORTED)
        }
    }
}

/// Descriptors the daemon keeps for itself besides its clients: lanes, Redis, listeners, logs.
const OWN_DESCRIPTORS: u64 = 128;

/// Every client holds a socket; the default soft limit (often 1,024) would cap the daemon far below
/// what the machine allows, so take the hard limit, as servers conventionally do. A limit still
/// too low for `limits:` is said at start: past it connections are shed at accept (even an
/// administrator's) instead of being refused with an error.
fn raise_open_files_limit(limits: &LimitsConfig) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let mut limit = soft;
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => limit = hard,
            Err(error) => tracing::warn!(%error, soft, hard, "cannot raise the open-files limit"),
        }
    }
    let per_uid = u64::try_from(limits.max_clients_per_uid).unwrap_or(u64::MAX);
    if limit < per_uid.saturating_add(OWN_DESCRIPTORS) {
        tracing::warn!(
            open_files_limit = limit,
            max_clients_per_uid = limits.max_clients_per_uid,
            "the open-files limit is too low for limits.max_clients_per_uid: one uid can use up \
             the descriptors before its cap, and connections past them are shed; lower the cap \
             or raise the limit"
        );
    }
}

/// SIGHUP: the reload every trigger shares; it logs its outcome (a throttled or rejected reload
/// keeps the running generation).
async fn reload_policy(reloader: &Reloader) {
    tracing::info!("SIGHUP received; reloading the policy");
    let _ = reloader.reload(Trigger::Signal).await;
}
