//! The daemon's life: start every part in order (sockets, Redis, policy, listeners), serve, and stop
//! them in reverse on shutdown. `cli serve` and the integration tests drive the same [`Daemon`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use tollgate_lanes::{Lanes, Topology, Vouched};
use tollgate_lease::LeaseService;
use tollgate_policy::Admission;

use crate::config::Config;
use crate::embedded::{self, EmbeddedError, EmbeddedRedis};
use crate::lane_acl::{self, LaneUsers};
use crate::metrics::Metrics;
use crate::principal_gauges::PrincipalGauges;
use crate::quotas::Quotas;
use crate::readiness::Readiness;
use crate::reload::Reloader;
use crate::server::identity::Identities;
use crate::server::limits::ConnectionLimits;
use crate::server::resp::admission_clock::AdmissionClocks;
use crate::server::resp::cached::NearCache;
use crate::server::resp::flights::Flights;
use crate::server::resp::pool::Pool;
use crate::server::resp::{self, FrontDoor};
use crate::server::{http, socket};
use crate::services::Services;
use crate::supervisor::{ChildPid, Restart, Supervisor};
use crate::systemd::{Notifier, Systemd};

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
    #[error(transparent)]
    Reach(#[from] tollgate_lanes::ReachError),
    #[error("policy: {0}")]
    Policy(#[from] tollgate_policy::PolicyError),
    #[error(transparent)]
    RuntimeDir(#[from] crate::runtime_dir::RuntimeDirError),
    #[error("cannot serve on the sockets systemd passed: {0}")]
    Inherited(std::io::Error),
    #[error(transparent)]
    LeaseLayout(#[from] tollgate_lease::LayoutError),
}

/// A running daemon. Dropping it without [`Daemon::shutdown`] still removes its sockets and kills
/// the embedded Redis, but skips the orderly drain.
pub struct Daemon {
    stop: CancellationToken,
    tasks: JoinSet<()>,
    http_socket: socket::SocketFile,
    resp_socket: socket::SocketFile,
    embedded: Option<Supervisor>,
    /// What the listeners were lent; the daemon closes its lanes last.
    services: Arc<Services>,
    lease_lanes: Lanes,
    config: Config,
    notifier: Notifier,
}

impl Daemon {
    /// Starts everything the configuration asks for and returns once the daemon is ready to serve.
    pub async fn start(config: Config) -> Result<Daemon, StartError> {
        Daemon::start_under(config, Systemd::default()).await
    }

    /// [`Daemon::start`] as systemd started it: on the sockets it passed (binding none), telling
    /// it when the daemon is ready, reloading and stopping, and petting its watchdog.
    pub async fn start_under(config: Config, systemd: Systemd) -> Result<Daemon, StartError> {
        let runtime_dir = config.runtime_dir();
        let group = config.listen.group.as_deref();
        crate::runtime_dir::prepare(&runtime_dir, group)?;
        let ((http_listener, http_socket), (resp_listener, resp_socket)) = match systemd.activation
        {
            Some(passed) => (
                socket::SocketFile::inherited(passed.http).map_err(StartError::Inherited)?,
                socket::SocketFile::inherited(passed.resp).map_err(StartError::Inherited)?,
            ),
            None => (
                socket::bind(&config.http_socket(), config.listen.mode.0, group)?,
                socket::bind(&config.resp_socket(), config.listen.mode.0, group)?,
            ),
        };

        let (embedded, admin) = match &config.redis {
            Some(_) => (None, None),
            None => {
                let admin = tollgate_lanes::Admin::embedded(&runtime_dir)?;
                let embedded_config = embedded::with_script_limit(&config.embedded, &config.resp);
                let embedded = EmbeddedRedis::start(&embedded_config, &runtime_dir, &admin).await?;
                (Some(embedded), Some(admin))
            }
        };
        let topology = match (&config.redis, &embedded) {
            (Some(redis), _) => Topology::from(redis),
            (None, Some(embedded)) => Topology::Standalone(embedded.endpoint()),
            (None, None) => unreachable!("no redis section means an embedded server was started"),
        };

        let mut registry = Registry::with_prefix("tollgate");
        let stop = CancellationToken::new();
        // The policy comes first: the lanes' users are cut to what it can admit.
        let admission = Admission::load(&config.policy, &mut registry)?;
        let grants = lane_acl::grants(&admission.current().admissible());
        // The daemon owns an embedded server, so it gives each lane and the lease service its own
        // least-privilege user, and starts the server again (with those users) whenever it exits.
        let (lanes_config, embedded, provisioned) = match embedded {
            Some(embedded) => {
                let admin = admin
                    .clone()
                    .expect("an embedded server has its administrator");
                let endpoint = embedded.endpoint();
                let provisioned = tollgate_lanes::provision(
                    std::slice::from_ref(&endpoint),
                    Some(&admin),
                    &runtime_dir,
                    &config.lanes,
                    &grants,
                )
                .await?;
                let mut lanes_config = provisioned.config;
                // The daemon's own child runs as the daemon's uid; lanes talk to nothing else.
                lanes_config.server_uid = Some(nix::unistd::geteuid().as_raw());
                let restart = Restart {
                    config: embedded::with_script_limit(&config.embedded, &config.resp),
                    dir: runtime_dir.clone(),
                    users: provisioned.users.clone(),
                    admin: admin.clone(),
                };
                let supervisor = Supervisor::start(embedded, restart, stop.clone(), &mut registry);
                (
                    lanes_config,
                    Some(supervisor),
                    Some((provisioned.users, endpoint)),
                )
            }
            None => (config.lanes.clone(), None, None),
        };
        let mut lanes_config = tollgate_lanes::LanesConfig {
            command_timeout: Some(config.resp.command_timeout),
            ..lanes_config
        };
        if let Topology::Cluster { .. } = topology {
            // A cluster has database 0 only; there the reserved prefix alone keeps the lease keys
            // from clients (the lane users' key patterns exclude it, as everywhere).
            lanes_config.leases.database = 0;
        }
        let vouched = match &config.redis {
            Some(redis) => Vouched {
                trusted: redis.trusted_users().to_vec(),
                own: Vec::new(),
            },
            None => Vouched {
                trusted: Vec::new(),
                own: admin.iter().map(|admin| admin.user.clone()).collect(),
            },
        };
        let (lanes, lease_lanes) = open_checked_lanes(
            &topology,
            &lanes_config,
            &vouched,
            tollgate_lanes::CHECK_PATIENCE,
            &mut registry,
        )
        .await?;
        let lane_users = match provisioned {
            Some((users, endpoint)) => LaneUsers::embedded(
                users,
                endpoint,
                embedded::kept_script_limit(&config.embedded, &config.resp),
            ),
            None => {
                lane_acl::check(&lease_lanes, &lanes_config, &grants).await;
                LaneUsers::external(lease_lanes.clone(), lanes_config.clone())
            }
        };
        // Key-constrained principals' scripts run as their scopes' users (`scope_users`).
        lane_users.follow_scopes(&admission.current()).await;
        // A quota's shorter script time limit lowers the embedded server's busy threshold.
        lane_users.follow_script_limits(&admission.current()).await;
        // Leases an earlier daemon took under another key layout would go unseen: refuse to start
        // while any is held (docs/leases.md, "Upgrades").
        if let Err(error) = tollgate_lease::check_layout(&lease_lanes).await {
            // Nothing was served on these lanes: close them at once.
            tokio::join!(
                lanes.close(std::time::Duration::ZERO),
                lease_lanes.close(std::time::Duration::ZERO)
            );
            return Err(error.into());
        }
        let leases = LeaseService::new(&lease_lanes, config.leases.clone(), &mut registry);
        let identities = Identities::new(admission.clone(), &config.identity, &config.admin);
        let quotas = Quotas::new(&admission, &mut registry);
        let reloader = Reloader::new(
            admission.clone(),
            lane_users.clone(),
            quotas.clone(),
            &config.admin,
            systemd.notifier,
            &mut registry,
        );
        // Off by default: then nothing of it exists, and the request path asks one `Option`.
        let cache = match config.cache.enabled() {
            true => {
                let cache = tollgate_lanes::Cache::start(
                    &lanes,
                    config.cache.bounds(),
                    &mut registry,
                    stop.clone(),
                );
                Some(NearCache::new(cache, config.cache.keys.clone()))
            }
            false => None,
        };
        let admission_clocks = AdmissionClocks::new(config.worker_threads());
        admission_clocks.register(&mut registry);
        let principal_gauges = PrincipalGauges::register(&mut registry);
        let shared = Arc::new(Services {
            readiness: Readiness::new(
                lanes.clone(),
                lease_lanes.clone(),
                embedded.as_ref().map(Supervisor::pid),
            ),
            lanes: lanes.clone(),
            lease_lanes: lease_lanes.clone(),
            leases: leases.clone(),
            admission: admission.clone(),
            identities: identities.clone(),
            reloader,
            lane_users: lane_users.clone(),
            redis_mode: redis_mode(&config),
            settings: settings(&config),
            pool: Pool::new(&config.resp.budgets),
            flights: Flights::new(
                config
                    .lanes
                    .settings(tollgate_model::Lane::Regular)
                    .per_principal,
                config
                    .lanes
                    .settings(tollgate_model::Lane::Script)
                    .per_principal,
            ),
            admission_clocks,
            quotas,
            cache,
            principal_gauges,
            namespace: Default::default(),
            metrics: Metrics::new(registry),
        });

        let mut tasks = JoinSet::new();
        let limits = config.limits.clone();
        tasks.spawn({
            let (shared, stop) = (shared.clone(), stop.clone());
            async move { http::serve(http_listener, shared, &limits, stop).await }
        });
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
            shared.clone(),
            config.resp.clone(),
            ConnectionLimits::new(&config.limits, "resp"),
            resp_socket.path.display().to_string(),
            stop.clone(),
        ));
        tasks.spawn(resp::serve(resp_listener, front_door, stop.clone()));

        shared.readiness.mark_started();
        tasks.spawn({
            let (shared, stop) = (shared.clone(), stop.clone());
            async move {
                crate::systemd::attend(&shared.readiness, systemd.notifier, systemd.watchdog, stop)
                    .await
            }
        });
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
            services: shared,
            lease_lanes,
            config,
            notifier: systemd.notifier,
        })
    }

    /// Every part the listeners share: the reloader, the readiness, the lanes.
    pub fn services(&self) -> &Arc<Services> {
        &self.services
    }

    /// The policy in force.
    pub fn admission(&self) -> &Admission {
        &self.services.admission
    }

    /// The lanes' ACL users, kept cut to the policy.
    pub fn lane_users(&self) -> &LaneUsers {
        &self.services.lane_users
    }

    /// The one way to reload the policy (SIGHUP and HTTP alike).
    pub fn reloader(&self) -> &Reloader {
        &self.services.reloader
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
            sockets: [&self.http_socket, &self.resp_socket]
                .into_iter()
                .filter(|socket| socket.owned)
                .map(|socket| socket.path.clone())
                .collect(),
            embedded_pid: self.embedded.as_ref().map(Supervisor::pid),
        }
    }

    /// The pid of the embedded redis-server running now; `None` with an external Redis or while
    /// the embedded one is down.
    pub fn embedded_pid(&self) -> Option<u32> {
        self.embedded
            .as_ref()
            .and_then(|supervisor| supervisor.pid().get())
    }

    /// Graceful stop: refuse new work, let in-flight work finish within the drain timeout, then
    /// close the listeners and stop the embedded Redis last.
    pub async fn shutdown(mut self) {
        tracing::info!("shutting down");
        self.notifier.stopping();
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
        let remaining = drain.saturating_sub(draining_since.elapsed());
        let (lanes, lease_lanes) = tokio::join!(
            self.services.lanes.close(remaining),
            self.lease_lanes.close(remaining)
        );
        tracing::info!(?lanes, ?lease_lanes, "lanes closed");
        if let Some(embedded) = self.embedded.take() {
            embedded.stop().await;
        }
        tracing::info!("stopped");
    }
}

/// The client lanes and the lease service's lanes, once Redis has shown (within `patience`) that no
/// client lane's user can reach the reserved keyspace, whoever set the users up.
async fn open_checked_lanes(
    topology: &Topology,
    config: &tollgate_lanes::LanesConfig,
    vouched: &Vouched,
    patience: std::time::Duration,
    registry: &mut Registry,
) -> Result<(Lanes, Lanes), StartError> {
    let lanes = Lanes::open(topology, config, registry)?;
    let lease_lanes = Lanes::open_leases(topology, config, registry)?;
    let checked =
        tollgate_lanes::check_reserved_unreachable(&lease_lanes, config, vouched, patience).await;
    if let Err(error) = checked {
        // Nothing is served on these lanes: close them at once.
        tokio::join!(
            lanes.close(std::time::Duration::ZERO),
            lease_lanes.close(std::time::Duration::ZERO)
        );
        return Err(error.into());
    }
    Ok((lanes, lease_lanes))
}

/// `check-config` for an external Redis: can the daemon reach it, and are its lane users such that
/// no client can reach the reserved keyspace? `Ok(false)` when the config names no external Redis.
pub async fn check_external_redis(config: &Config) -> Result<bool, StartError> {
    let Some(redis) = &config.redis else {
        return Ok(false);
    };
    let mut registry = Registry::default();
    let patience = std::time::Duration::from_secs(3);
    let vouched = Vouched {
        trusted: redis.trusted_users().to_vec(),
        own: Vec::new(),
    };
    let topology = Topology::from(redis);
    let mut lanes_config = config.lanes.clone();
    if let Topology::Cluster { .. } = topology {
        // As `Daemon::start` does: a cluster has database 0 only.
        lanes_config.leases.database = 0;
    }
    let (lanes, lease_lanes) =
        open_checked_lanes(&topology, &lanes_config, &vouched, patience, &mut registry).await?;
    tokio::join!(
        lanes.close(std::time::Duration::ZERO),
        lease_lanes.close(std::time::Duration::ZERO)
    );
    Ok(true)
}

/// What must be undone when the process exits without an orderly shutdown.
pub struct AbortCleanup {
    sockets: Vec<PathBuf>,
    embedded_pid: Option<ChildPid>,
}

impl AbortCleanup {
    pub fn run(&self) {
        for socket in &self.sockets {
            let _ = std::fs::remove_file(socket);
        }
        if let Some(pid) = self.embedded_pid.as_ref().and_then(ChildPid::get) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// How the daemon reaches Redis, as `tollgate status` names it.
fn redis_mode(config: &Config) -> &'static str {
    match config.redis.as_ref().map(Topology::from) {
        None => "embedded",
        Some(Topology::Standalone(_)) => "standalone",
        Some(Topology::Sentinel { .. }) => "sentinel",
        Some(Topology::Cluster { .. }) => "cluster",
    }
}

/// The budgets and limits in force, for `/v1/status`.
fn settings(config: &Config) -> serde_json::Value {
    let duration = |d: std::time::Duration| humantime::format_duration(d).to_string();
    let budgets = &config.resp.budgets;
    serde_json::json!({
        "max_clients": config.limits.max_clients,
        "max_clients_per_uid": config.limits.max_clients_per_uid,
        "http_header_timeout": duration(config.limits.http_header_timeout),
        "http_idle_timeout": duration(config.limits.http_idle_timeout),
        "command_timeout": duration(config.resp.command_timeout),
        "script_time_limit": duration(config.resp.script_time_limit),
        "script_cooldown": duration(config.resp.script_cooldown),
        "max_pipeline": config.resp.max_pipeline,
        "max_subscriptions": config.resp.max_subscriptions,
        "max_subscriptions_per_uid": config.resp.max_subscriptions_per_uid,
        "budget_total_bytes": budgets.total.0,
        "budget_per_uid_bytes": budgets.per_uid().0,
        "budget_client_output_bytes": budgets.normal.output.hard.0,
        "budget_subscriber_output_bytes": budgets.pubsub.output.hard.0,
        "lease_max_ttl": duration(config.leases.max_ttl),
        "lease_max_wait": duration(config.leases.max_wait),
    })
}
