//! The embedded default: a private `redis-server` child on a Unix socket in the runtime directory,
//! without persistence unless configured, started before the daemon serves and stopped after it
//! (`supervisor` restarts it when it exits in between).
//! Its log and socket are checked before use (`runtime_dir`): redis-server would append to a linked
//! log's target, and the daemon sends the lanes' passwords to whatever listens on the socket.
//!
//! Redis's `default` user is off there: the server reads, on its standard input (never its command
//! line, which every local user can read in `/proc`), `user default off` and an administrator the
//! daemon alone knows the password of ([`Admin`]), with which it creates the lane users. So no
//! connection to the socket gets anything without a password, and the start-up check finds no
//! open user.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_lanes::{Admin, Endpoint};
use tollgate_policy::quota::Quota;

use crate::config::{EmbeddedConfig, RespConfig};
use crate::runtime_dir::{self, EntryError, Kind};

/// How long a fresh `redis-server` gets to answer before start-up fails.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one readiness PING may take while the server starts.
const PING_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a stopping `redis-server` gets after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("`{binary}` not found: install Redis (`apt-get install redis-server`) or set `embedded.binary`")]
    NotInstalled { binary: PathBuf },
    #[error("cannot start `{binary}`: {source}")]
    Spawn {
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("embedded redis-server exited before it was ready ({status}); its log: {log}")]
    Exited { status: String, log: PathBuf },
    #[error("embedded redis-server did not answer within {READY_TIMEOUT:?}; its log: {log}")]
    NotReady { log: PathBuf },
    #[error("embedded redis-server: {0}")]
    Unsafe(#[from] EntryError),
}

/// `config` with Redis's `busy-reply-threshold` at `resp.script_time_limit` (when one is set):
/// Redis reads nothing, the daemon's kill included, until a script has run that long, and a
/// threshold below the limit would have Redis answer others `BUSY` before the script is stopped.
/// First, so that the operator's own `args` still have the last word.
pub fn with_script_limit(config: &EmbeddedConfig, resp: &RespConfig) -> EmbeddedConfig {
    let limit = resp.script_time_limit;
    if limit.is_zero() {
        return config.clone();
    }
    let threshold = [
        "--busy-reply-threshold".to_owned(),
        limit.as_millis().to_string(),
    ];
    EmbeddedConfig {
        args: threshold
            .into_iter()
            .chain(config.args.iter().cloned())
            .collect(),
        ..config.clone()
    }
}

/// The script time limit the daemon keeps its own server's `busy-reply-threshold` at:
/// `resp.script_time_limit`, unless it is off or the operator's `embedded.args` set the threshold
/// (or its old name, `lua-time-limit`) themselves, which then has the last word.
pub fn kept_script_limit(config: &EmbeddedConfig, resp: &RespConfig) -> Option<Duration> {
    let operators = config.args.iter().any(|arg| {
        let name = arg.trim_start_matches('-').to_ascii_lowercase();
        name == "busy-reply-threshold" || name == "lua-time-limit"
    });
    (!resp.script_time_limit.is_zero() && !operators).then_some(resp.script_time_limit)
}

/// The `busy-reply-threshold` for `kept` (`kept_script_limit`) under `quotas`: lowered to the
/// shortest quota's `script_time_limit`, so that Redis reads the daemon's kill when that
/// principal's script is due to be stopped. `None`: the daemon keeps none.
pub fn busy_threshold<'a>(
    kept: Option<Duration>,
    quotas: impl IntoIterator<Item = &'a Quota>,
) -> Option<Duration> {
    let kept = kept?;
    let shortest = quotas
        .into_iter()
        .filter_map(|quota| quota.script_time_limit)
        .min();
    Some(shortest.map_or(kept, |shortest| shortest.min(kept)))
}

pub struct EmbeddedRedis {
    child: tokio::process::Child,
    socket: PathBuf,
}

impl EmbeddedRedis {
    /// Starts `redis-server` with its socket, log and (optional) data in `dir`, `default` off and
    /// `admin` its administrator, and waits until it answers.
    pub async fn start(
        config: &EmbeddedConfig,
        dir: &Path,
        admin: &Admin,
    ) -> Result<Self, EmbeddedError> {
        // Absolute: redis-server changes into `--dir` before it opens `--logfile`, so a relative
        // runtime directory (the default `.tollgate`) would send it looking for
        // `.tollgate/.tollgate/redis.log`, and it would exit.
        let dir = &std::path::absolute(dir).map_err(|source| EmbeddedError::Spawn {
            binary: config.binary.clone(),
            source,
        })?;
        let socket = dir.join("redis.sock");
        let log = dir.join("redis.log");
        runtime_dir::remove_stale(&socket, Kind::Socket)?;
        runtime_dir::inspect(&log, Kind::File)?;
        let mut command = tokio::process::Command::new(&config.binary);
        // `-` first: the rest of the config comes from standard input (see the module's header).
        command
            .arg("-")
            .arg("--port")
            .arg("0")
            .arg("--unixsocket")
            .arg(&socket)
            .arg("--unixsocketperm")
            .arg("700")
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log);
        if !config.persistence {
            command.args(["--save", "", "--appendonly", "no"]);
        }
        // The service manager's protocols are the daemon's: a redis-server that saw NOTIFY_SOCKET
        // (`supervised auto`) would say READY=1 for a daemon that is not ready yet.
        for variable in crate::systemd::protocol::PROTOCOL_VARIABLES {
            command.env_remove(variable);
        }
        command
            .args(&config.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        // The child must not outlive the daemon, even when the daemon is killed outright.
        // SAFETY: prctl is async-signal-safe and touches only the calling (child) process.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                EmbeddedError::NotInstalled {
                    binary: config.binary.clone(),
                }
            } else {
                EmbeddedError::Spawn {
                    binary: config.binary.clone(),
                    source,
                }
            }
        })?;
        let users = format!(
            "user default off\nuser {} on >{} {}\n",
            admin.user,
            admin.password,
            Admin::acl_rules()
        );
        if let Some(mut stdin) = child.stdin.take() {
            // Redis reads its standard input to the end before it starts; a write that fails
            // means it already exited, which `wait_ready` reports with its log.
            let _ = stdin.write_all(users.as_bytes()).await;
        }
        let mut embedded = EmbeddedRedis { child, socket };
        embedded.wait_ready(&log).await?;
        // Only the daemon's uid can put a socket there, but the passwords go out next: be sure.
        runtime_dir::check_own(&embedded.socket, Kind::Socket)?;
        tracing::info!(socket = %embedded.socket.display(), "embedded redis-server ready");
        Ok(embedded)
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.socket.clone())
    }

    /// The child's pid while it has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Resolves when the child exits, reaping it (no zombie is left). Cancel-safe.
    pub async fn exited(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }

    /// The socket it listens on (left behind when it dies; the next start checks and replaces it).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// SIGTERM, then SIGKILL after a grace period; the socket file is removed either way.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            if tokio::time::timeout(STOP_TIMEOUT, self.child.wait())
                .await
                .is_err()
            {
                tracing::warn!("embedded redis-server ignored SIGTERM; killing it");
                let _ = self.child.kill().await;
            }
        }
        let _ = std::fs::remove_file(&self.socket);
        tracing::info!("embedded redis-server stopped");
    }

    async fn wait_ready(&mut self, log: &Path) -> Result<(), EmbeddedError> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(EmbeddedError::Exited {
                    status: status.to_string(),
                    log: log.to_owned(),
                });
            }
            if answers_ping(&self.socket).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(EmbeddedError::NotReady {
            log: log.to_owned(),
        })
    }
}

/// Whether a server on `socket` answers one PING within [`PING_TIMEOUT`]: the raw probe used while
/// the server starts, before any lane exists. Its `default` user is off, so it answers `-NOAUTH`.
async fn answers_ping(socket: &Path) -> bool {
    let probe = async {
        let mut stream = tokio::net::UnixStream::connect(socket).await?;
        stream.write_all(b"PING\r\n").await?;
        let mut reply = [0u8; 8];
        let read = stream.read(&mut reply).await?;
        let reply = &reply[..read];
        Ok::<_, std::io::Error>(reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH"))
    };
    matches!(
        tokio::time::timeout(PING_TIMEOUT, probe).await,
        Ok(Ok(true))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_threshold_follows_the_script_time_limit_unless_the_operator_says_otherwise() {
        let config = EmbeddedConfig {
            args: vec!["--busy-reply-threshold".into(), "3000".into()],
            ..EmbeddedConfig::default()
        };
        let mut resp = RespConfig::default();
        assert_eq!(
            with_script_limit(&config, &resp).args,
            [
                "--busy-reply-threshold",
                "1000",
                "--busy-reply-threshold",
                "3000"
            ]
        );
        resp.script_time_limit = Duration::ZERO;
        assert_eq!(with_script_limit(&config, &resp), config);
    }

    #[test]
    fn the_kept_threshold_is_the_shortest_limit_unless_the_operator_set_one() {
        let resp = RespConfig::default();
        let plain = EmbeddedConfig::default();
        assert_eq!(
            kept_script_limit(&plain, &resp),
            Some(Duration::from_secs(1))
        );
        for operators in [
            "--busy-reply-threshold",
            "--lua-time-limit",
            "busy-reply-threshold",
        ] {
            let config = EmbeddedConfig {
                args: vec![operators.into(), "3000".into()],
                ..EmbeddedConfig::default()
            };
            assert_eq!(kept_script_limit(&config, &resp), None, "{operators}");
        }
        let off = RespConfig {
            script_time_limit: Duration::ZERO,
            ..RespConfig::default()
        };
        assert_eq!(kept_script_limit(&plain, &off), None);

        let quota = |limit: Option<u64>| Quota {
            id: "q".into(),
            principals: None,
            commands: None,
            bytes: None,
            leases: Some(1),
            script_time_limit: limit.map(Duration::from_millis),
            line: 1,
        };
        let second = Some(Duration::from_secs(1));
        let quotas = [
            quota(None),
            quota(Some(300)),
            quota(Some(5000)),
            quota(Some(200)),
        ];
        assert_eq!(
            busy_threshold(second, &quotas),
            Some(Duration::from_millis(200))
        );
        assert_eq!(busy_threshold(second, &quotas[..1]), second);
        assert_eq!(
            busy_threshold(second, &quotas[2..3]),
            second,
            "never raised"
        );
        assert_eq!(busy_threshold(None, &quotas), None);
    }
}
