//! `tollgate lease acquire|renew|release|inspect|run`: the lease API from the shell, through the
//! lease client. The single calls print the outcome as JSON; `run` holds a lease around a command.
//!
//! `run` acquires with the daemon's watchdog bound to this process, starts CMD with
//! `TOLLGATE_FENCING_TOKEN` and `TOLLGATE_LEASE_RESOURCE`, watches the lease's events, stops CMD
//! (TERM, then KILL after `--grace`) if the lease is lost, releases when CMD exits, and exits with
//! CMD's status — or [`NOT_ACQUIRED`] / [`LOST`] when the lease was never held or went away.
//! SIGTERM and SIGINT are passed on to CMD; if `lease run` itself is killed, CMD gets SIGTERM from
//! the kernel while the daemon, watching this process, releases the lease.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};
use tollgate_lease_client::{
    AcquireRequest, Acquisition, Attempt, Lease, LeaseClient, LeaseEvent, Outcome, OutcomeClass,
    ReleaseRequest, RenewRequest, Resource,
};

use crate::config::Config;

/// `lease run` could not take the lease (contended, conflict, unavailable, refused).
pub const NOT_ACQUIRED: u8 = 75;
/// `lease run` lost the lease while CMD ran; CMD was stopped.
pub const LOST: u8 = 76;
/// The single calls: the daemon answered, but not with the outcome asked for.
const OTHER_OUTCOME: u8 = 1;
/// The daemon refused the request or could not be reached.
const FAILED: u8 = 2;

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Acquire a lease; prints the outcome (with the attempt to use for renew/release).
    Acquire {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
        wait: Duration,
        /// Replicas that must confirm before the lease counts as held.
        #[arg(long, default_value_t = 0)]
        replicas: u32,
    },
    /// Extend a lease this attempt holds.
    Renew {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// Release a lease this attempt holds.
    Release {
        #[command(flatten)]
        target: Target,
    },
    /// Show whether a resource is held (and by this attempt, if one is named).
    Inspect {
        #[command(flatten)]
        target: Target,
    },
    /// Hold a lease while CMD runs.
    Run {
        #[command(flatten)]
        socket: SocketArg,
        #[arg(long)]
        resource: String,
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
        wait: Duration,
        /// Time CMD gets between TERM and KILL once the lease is lost.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
        grace: Duration,
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct SocketArg {
    /// The daemon's HTTP socket; default: the configured one.
    #[arg(long, env = "TOLLGATE_HTTP_SOCKET")]
    socket: Option<PathBuf>,
}

impl SocketArg {
    fn client(&self) -> LeaseClient {
        let socket = self
            .socket
            .clone()
            .unwrap_or_else(|| Config::default().http_socket());
        LeaseClient::new(&socket)
    }
}

#[derive(Debug, Args)]
pub struct Target {
    #[command(flatten)]
    socket: SocketArg,
    #[arg(long)]
    resource: String,
    /// Owner token of the attempt; acquire makes a fresh one when left out.
    #[arg(long)]
    owner: Option<String>,
    /// Operation id of the attempt; acquire makes a fresh one when left out.
    #[arg(long)]
    operation_id: Option<String>,
}

impl Target {
    fn attempt(&self) -> Option<Attempt> {
        Some(Attempt {
            owner: self.owner.clone()?,
            operation_id: self.operation_id.clone()?,
        })
    }

    fn required_attempt(&self) -> Result<Attempt, String> {
        self.attempt()
            .ok_or_else(|| "--owner and --operation-id are required".to_owned())
    }
}

pub fn run(command: LeaseCommand) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tollgate: cannot start the async runtime: {error}");
            return ExitCode::from(FAILED);
        }
    };
    match runtime.block_on(dispatch(command)) {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("tollgate lease: {message}");
            ExitCode::from(FAILED)
        }
    }
}

async fn dispatch(command: LeaseCommand) -> Result<u8, String> {
    match command {
        LeaseCommand::Acquire {
            target,
            ttl,
            wait,
            replicas,
        } => {
            let attempt = target.attempt().unwrap_or_else(LeaseClient::new_attempt);
            let request = AcquireRequest {
                attempt: attempt.clone(),
                ttl,
                wait,
                watchdog: false,
                replicas,
                value: None,
                permits: None,
                count: None,
                mode: None,
            };
            let answer = target
                .socket
                .client()
                .acquire_raw(&resource(&target.resource)?, &request)
                .await
                .map_err(|error| error.to_string())?;
            let mut shown = serde_json::to_value(&answer.outcome).expect("outcomes serialise");
            shown["attempt"] = serde_json::to_value(&attempt).expect("attempts serialise");
            print(&shown, &answer.outcome)
        }
        LeaseCommand::Renew { target, ttl } => {
            let request = RenewRequest {
                attempt: target.required_attempt()?,
                ttl,
            };
            let answer = target
                .socket
                .client()
                .renew_raw(&resource(&target.resource)?, &request)
                .await
                .map_err(|error| error.to_string())?;
            let shown = serde_json::to_value(&answer.outcome).expect("outcomes serialise");
            print(&shown, &answer.outcome)
        }
        LeaseCommand::Release { target } => {
            let request = ReleaseRequest {
                attempt: target.required_attempt()?,
            };
            let answer = target
                .socket
                .client()
                .release_raw(&resource(&target.resource)?, &request)
                .await
                .map_err(|error| error.to_string())?;
            let shown = serde_json::to_value(&answer.outcome).expect("outcomes serialise");
            print(&shown, &answer.outcome)
        }
        LeaseCommand::Inspect { target } => {
            let outcome = target
                .socket
                .client()
                .inspect(&resource(&target.resource)?, target.attempt().as_ref())
                .await
                .map_err(|error| error.to_string())?;
            let shown = serde_json::to_value(&outcome).expect("outcomes serialise");
            print(&shown, &outcome)
        }
        LeaseCommand::Run {
            socket,
            resource: name,
            ttl,
            wait,
            grace,
            command,
        } => {
            let request = AcquireRequest {
                attempt: LeaseClient::new_attempt(),
                ttl,
                wait,
                watchdog: true,
                replicas: 0,
                value: None,
                permits: None,
                count: None,
                mode: None,
            };
            hold_while_running(
                socket.client(),
                &resource(&name)?,
                &request,
                grace,
                &command,
            )
            .await
        }
    }
}

fn resource(name: &str) -> Result<Resource, String> {
    Resource::parse(name).map_err(|error| format!("--resource: {error}"))
}

/// Prints the outcome as JSON; the exit status says whether the call did what was asked.
fn print(shown: &serde_json::Value, outcome: &impl Outcome) -> Result<u8, String> {
    println!("{shown}");
    Ok(match outcome.class() {
        OutcomeClass::Done => 0,
        _ => OTHER_OUTCOME,
    })
}

async fn hold_while_running(
    client: LeaseClient,
    resource: &Resource,
    request: &AcquireRequest,
    grace: Duration,
    command: &[String],
) -> Result<u8, String> {
    // Handlers first: a TERM or INT that arrives while the lease is being taken is kept and passed
    // on to CMD once it runs, instead of ending this process with the lease still held.
    let mut terminate = signal(SignalKind::terminate()).map_err(|error| error.to_string())?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|error| error.to_string())?;
    let mut lease = match client.acquire(resource, request).await {
        Ok(Acquisition::Held(lease)) => lease,
        Ok(Acquisition::NotHeld(outcome)) => {
            eprintln!("tollgate lease run: not acquired: {outcome:?}");
            return Ok(NOT_ACQUIRED);
        }
        Err(error) => {
            eprintln!("tollgate lease run: not acquired: {error}");
            return Ok(NOT_ACQUIRED);
        }
    };
    let mut events = match lease.events().await {
        Ok(events) => events,
        Err(error) => {
            eprintln!("tollgate lease run: cannot watch the lease ({error}); giving it up");
            let _ = lease.release().await;
            return Ok(LOST);
        }
    };
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("TOLLGATE_FENCING_TOKEN", lease.fence().to_string())
        .env("TOLLGATE_LEASE_RESOURCE", resource.as_str());
    // If this process dies without a chance to stop CMD (SIGKILL), the daemon releases the lease at
    // once, so CMD must not outlive it: the kernel sends it TERM. The signal follows the thread
    // that spawned CMD, which is the one running `block_on` until this process exits.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(error) => {
            let _ = lease.release().await;
            return Err(format!("cannot start {}: {error}", command[0]));
        }
    };
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|error| format!("waiting for {}: {error}", command[0]))?;
                release(&mut lease).await;
                return Ok(exit_code(status));
            }
            // Asked to stop: CMD decides how, and the lease is released once it has exited.
            _ = terminate.recv() => forward(&child, Signal::SIGTERM),
            _ = interrupt.recv() => forward(&child, Signal::SIGINT),
            event = events.next() => match event {
                Some(Ok(LeaseEvent::Renewed { .. } | LeaseEvent::Uncertain { .. })) => continue,
                // Lost, max hold reached, or the stream ended (daemon gone): the lease can no
                // longer be vouched for, so CMD must stop.
                other => {
                    eprintln!("tollgate lease run: lease on {resource} lost ({other:?}); stopping the command");
                    lease.mark_lost();
                    stop(&mut child, grace).await;
                    return Ok(LOST);
                }
            },
        }
    }
}

async fn release(lease: &mut Lease) {
    match lease.release().await {
        Ok(outcome) => tracing::debug!(?outcome, "lease released"),
        Err(error) => {
            eprintln!("tollgate lease run: release failed ({error}); the lease runs out by its TTL")
        }
    }
}

fn forward(child: &tokio::process::Child, signal: Signal) {
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// TERM, then KILL if CMD outlives the grace period.
async fn stop(child: &mut tokio::process::Child, grace: Duration) {
    forward(child, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// CMD's exit status as a shell reports it: its code, or 128 + the signal that ended it.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(signal)) => (128 + signal).min(255) as u8,
        (None, None) => FAILED,
    }
}
