//! Keeps the embedded redis-server running: a task that owns the child, reaps it the moment it
//! exits, and starts it again after an exponentially growing pause, on the same socket and with the
//! same checks as the first start, then gives it back the daemon's ACL users with the passwords the
//! lanes hold (the lanes reconnect by themselves). Once the daemon begins to shut down it restarts
//! nothing; the child is stopped when [`Supervisor::stop`] is called, last, and only then.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_lanes::ProvisionedUsers;

use crate::config::EmbeddedConfig;
use crate::embedded::{EmbeddedError, EmbeddedRedis};

/// The pause before the first restart; it doubles per restart up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(5);
/// A child that stayed up this long was healthy: its exit starts the pauses over.
const STABLE_AFTER: Duration = Duration::from_secs(30);

/// The pid of the child running now, or none while it is down; shared with the abort path, which
/// must not signal the pid of a child reaped long ago (it may belong to another process by then).
#[derive(Clone, Default)]
pub struct ChildPid(Arc<AtomicU32>);

impl ChildPid {
    pub fn get(&self) -> Option<u32> {
        Some(self.0.load(Ordering::Acquire)).filter(|pid| *pid != 0)
    }

    fn set(&self, pid: Option<u32>) {
        self.0.store(pid.unwrap_or(0), Ordering::Release);
    }
}

/// What a restart needs: how the first child was started, and the users to give it.
pub struct Restart {
    pub config: EmbeddedConfig,
    pub dir: PathBuf,
    pub users: ProvisionedUsers,
    /// The server's administrator, the same on every start (the users are set as it).
    pub admin: tollgate_lanes::Admin,
}

#[derive(Debug, thiserror::Error)]
enum RestartError {
    #[error(transparent)]
    Start(#[from] EmbeddedError),
    #[error("cannot create the daemon's users again: {0}")]
    Users(#[from] tollgate_lanes::AclError),
}

pub struct Supervisor {
    halt: CancellationToken,
    task: JoinHandle<()>,
    pid: ChildPid,
}

impl Supervisor {
    /// Takes over `first` and supervises it until [`Supervisor::stop`]; restarts stop once
    /// `shutting_down` is cancelled. Registers `embedded_redis_restarts` in `registry`.
    pub fn start(
        first: EmbeddedRedis,
        restart: Restart,
        shutting_down: CancellationToken,
        registry: &mut Registry,
    ) -> Supervisor {
        let restarts = Counter::default();
        registry.register(
            "embedded_redis_restarts",
            "Times the embedded redis-server was started again after it exited",
            restarts.clone(),
        );
        let pid = ChildPid::default();
        pid.set(first.pid());
        let halt = CancellationToken::new();
        let task = tokio::spawn(
            Watch {
                restart,
                restarts,
                pid: pid.clone(),
                shutting_down,
                halt: halt.clone(),
            }
            .run(first),
        );
        Supervisor { halt, task, pid }
    }

    /// The pid of the child running now, shared with whoever must kill it without awaiting.
    pub fn pid(&self) -> ChildPid {
        self.pid.clone()
    }

    /// Stops the child (SIGTERM, then SIGKILL after a grace period) and removes its socket.
    pub async fn stop(mut self) {
        self.halt.cancel();
        if let Err(error) = (&mut self.task).await {
            tracing::error!(%error, "embedded redis-server supervisor failed");
        }
    }
}

impl Drop for Supervisor {
    /// A daemon dropped without an orderly stop still kills the child: the task owns it, and
    /// dropping the task drops the child, which is killed on drop.
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Watch {
    restart: Restart,
    restarts: Counter,
    pid: ChildPid,
    shutting_down: CancellationToken,
    halt: CancellationToken,
}

impl Watch {
    async fn run(self, first: EmbeddedRedis) {
        let socket = first.socket().to_owned();
        let mut running = Some(first);
        let mut pause = FIRST_PAUSE;
        loop {
            if let Some(mut redis) = running.take() {
                let up_since = Instant::now();
                tokio::select! {
                    status = redis.exited() => {
                        self.pid.set(None);
                        let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                        if up_since.elapsed() >= STABLE_AFTER {
                            pause = FIRST_PAUSE;
                        }
                        tracing::error!(%status, ?pause, "embedded redis-server exited; restarting it");
                    }
                    () = self.halt.cancelled() => {
                        redis.stop().await;
                        self.pid.set(None);
                        return;
                    }
                }
            }
            // Down: wait out the pause, unless shutdown began (then restart nothing).
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = self.shutting_down.cancelled() => {}
            }
            if self.shutting_down.is_cancelled() {
                tracing::info!("shutting down: the embedded redis-server is not restarted");
                self.halt.cancelled().await;
                let _ = std::fs::remove_file(&socket);
                return;
            }
            pause = (pause * 2).min(MAX_PAUSE);
            match self.start_again().await {
                Ok(redis) => {
                    self.restarts.inc();
                    self.pid.set(redis.pid());
                    tracing::info!("embedded redis-server restarted with the daemon's users");
                    running = Some(redis);
                }
                Err(error) => {
                    tracing::error!(%error, ?pause, "embedded redis-server did not restart; trying again")
                }
            }
        }
    }

    async fn start_again(&self) -> Result<EmbeddedRedis, RestartError> {
        // This runs on a runtime thread, which lives as long as the runtime: the child's
        // PR_SET_PDEATHSIG (embedded.rs) fires when the thread that forked it ends, not the process.
        let redis =
            EmbeddedRedis::start(&self.restart.config, &self.restart.dir, &self.restart.admin)
                .await?;
        if let Err(error) = self.restart.users.apply(&redis.endpoint()).await {
            redis.stop().await;
            return Err(error.into());
        }
        Ok(redis)
    }
}
