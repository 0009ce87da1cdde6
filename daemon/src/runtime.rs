//! The daemon's life: start every part in order (sockets, Redis, policy, listeners), serve, and stop
//! them in reverse on shutdown. `cli serve` and the integration tests drive the same [`Daemon`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use tollgate_lanes::{Lanes, Topology};
use tollgate_lease::LeaseService;
use tollgate_policy::Admission;

use crate::config::Config;
use crate::embedded::{EmbeddedError, EmbeddedRedis};
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::server::resp::{self, FrontDoor};
use crate::server::{http, socket};

/// What every listener shares.
pub struct Shared {
    pub readiness: Readiness,
    pub metrics: Metrics,
    /// The only way to Redis (DESIGN.md, "Lanes").
    pub lanes: Lanes,
    /// Leases on the SCRIPT and PUBSUB lanes (DESIGN.md, "Leases").
    pub leases: LeaseService,
    /// The policy every command and lease passes.
    pub admission: Admission,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Bind(#[from] socket::BindError),
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
    #[error(transparent)]
    LaneUsers(#[from] tollgate_lanes::AclError),
    #[error(transparent)]
    Lanes(#[from] tollgate_lanes::OpenError),
    #[error("policy: {0}")]
    Policy(#[from] tollgate_policy::PolicyError),
    #[error(transparent)]
    RuntimeDir(#[from] crate::runtime_dir::RuntimeDirError),
}

/// A running daemon. Dropping it without [`Daemon::shutdown`] still removes its sockets and kills
/// the embedded Redis, but skips the orderly drain.
pub struct Daemon {
    stop: CancellationToken,
    tasks: JoinSet<()>,
    http_socket: socket::SocketFile,
    resp_socket: socket::SocketFile,
    embedded: Option<EmbeddedRedis>,
    lanes: Lanes,
    admission: Admission,
    config: Config,
}

impl Daemon {
    /// Starts everything the configuration asks for and returns once the daemon is ready to serve.
    pub async fn start(config: Config) -> Result<Daemon, StartError> {
        let runtime_dir = config.runtime_dir();
        let group = config.listen.group.as_deref();
        crate::runtime_dir::prepare(&runtime_dir, group)?;
        let (http_listener, http_socket) =
            socket::bind(&config.http_socket(), config.listen.mode.0, group)?;
        let (resp_listener, resp_socket) =
            socket::bind(&config.resp_socket(), config.listen.mode.0, group)?;

        let embedded = match &config.redis {
            Some(_) => None,
            None => Some(EmbeddedRedis::start(&config.embedded, &runtime_dir).await?),
        };
        let topology = match (&config.redis, &embedded) {
            (Some(redis), _) => Topology::from(redis),
            (None, Some(embedded)) => Topology::Standalone(embedded.endpoint()),
            (None, None) => unreachable!("no redis section means an embedded server was started"),
        };

        let mut registry = Registry::with_prefix("tollgate");
        // The daemon owns an embedded server, so it gives each lane its own least-privilege user.
        let lanes_config = match &embedded {
            Some(embedded) => {
                let mut provisioned =
                    tollgate_lanes::provision(&embedded.endpoint(), &runtime_dir, &config.lanes)
                        .await?
                        .config;
                // The daemon's own child runs as the daemon's uid; lanes talk to nothing else.
                provisioned.server_uid = Some(nix::unistd::geteuid().as_raw());
                provisioned
            }
            None => config.lanes.clone(),
        };
        let lanes = Lanes::open(&topology, &lanes_config, &mut registry)?;
        let admission = Admission::load(&config.policy, &mut registry)?;
        let leases = LeaseService::new(&lanes, config.leases.clone(), &mut registry);
        let shared = Arc::new(Shared {
            readiness: Readiness::new(lanes.clone()),
            lanes: lanes.clone(),
            leases: leases.clone(),
            admission: admission.clone(),
            metrics: Metrics::new(registry),
        });

        let stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        tasks.spawn(http::serve(http_listener, shared.clone(), stop.clone()));
        // Watchdogs stop with the daemon (their leases run out by TTL), which also ends the events
        // streams that graceful HTTP shutdown would otherwise wait for.
        tasks.spawn({
            let stop = stop.clone();
            async move {
                stop.cancelled().await;
                leases.close();
            }
        });
        let front_door = Arc::new(FrontDoor::new(
            admission.clone(),
            lanes.clone(),
            config.resp.clone(),
        ));
        tasks.spawn(resp::serve(resp_listener, front_door, stop.clone()));

        shared.readiness.mark_started();
        tracing::info!(
            resp = %resp_socket.path.display(),
            http = %http_socket.path.display(),
            "tollgate serving"
        );
        Ok(Daemon {
            stop,
            tasks,
            http_socket,
            resp_socket,
            embedded,
            lanes,
            admission,
            config,
        })
    }

    /// The policy in force; `reload` on SIGHUP swaps its generation.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    pub fn http_socket(&self) -> &Path {
        &self.http_socket.path
    }

    pub fn resp_socket(&self) -> &Path {
        &self.resp_socket.path
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A synchronous last resort for the second SIGINT: remove the socket files, kill the embedded Redis.
    pub fn abort_cleanup(&self) -> AbortCleanup {
        AbortCleanup {
            sockets: vec![self.http_socket.path.clone(), self.resp_socket.path.clone()],
            embedded_pid: self.embedded.as_ref().and_then(EmbeddedRedis::pid),
        }
    }

    /// Graceful stop: refuse new work, let in-flight work finish within the drain timeout, then
    /// close the listeners and stop the embedded Redis last.
    pub async fn shutdown(mut self) {
        tracing::info!("shutting down");
        self.stop.cancel();
        let drain = self.config.shutdown.drain_timeout;
        let draining_since = tokio::time::Instant::now();
        let drained = tokio::time::timeout(drain, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                ?drain,
                "in-flight work did not finish within the drain timeout"
            );
            self.tasks.shutdown().await;
        }
        // Lanes close after the listeners (their sessions hold lanes) and before the embedded Redis.
        let lanes = self
            .lanes
            .close(drain.saturating_sub(draining_since.elapsed()))
            .await;
        tracing::info!(?lanes, "lanes closed");
        if let Some(embedded) = self.embedded.take() {
            embedded.stop().await;
        }
        tracing::info!("stopped");
    }
}

/// What must be undone when the process exits without an orderly shutdown.
pub struct AbortCleanup {
    sockets: Vec<PathBuf>,
    embedded_pid: Option<u32>,
}

impl AbortCleanup {
    pub fn run(&self) {
        for socket in &self.sockets {
            let _ = std::fs::remove_file(socket);
        }
        if let Some(pid) = self.embedded_pid {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
