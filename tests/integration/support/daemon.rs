//! The daemon in-process on temporary sockets, pointed at a test's own `redis-server` (or with the
//! embedded one), with a shutdown handle. Dropping it without `stop` still removes its sockets.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tollgate::config::Config;
use tollgate::Daemon;
use tollgate_lanes::{Endpoint, LaneGrants, RedisConfig, Splitting};
use tollgate_policy::PolicyConfig;
use tollgate_testkit::http::{self, HttpReply};
use tollgate_testkit::{RedisCluster, RedisServer, RedisServerBuilder};

pub struct TestDaemon {
    daemon: Option<Daemon>,
    dir: tempfile::TempDir,
}

impl TestDaemon {
    /// A config whose sockets and runtime directory live in a fresh temporary directory.
    pub fn config(dir: &Path) -> Config {
        let mut config = Config {
            runtime_dir: Some(dir.to_owned()),
            ..Config::default()
        };
        config.listen.http = Some(dir.join("http.sock"));
        config.listen.resp = Some(dir.join("resp.sock"));
        config
    }

    /// Starts the daemon against `redis`.
    pub async fn start(redis: &RedisServer) -> TestDaemon {
        Self::start_with(redis, |_| {}).await
    }

    /// Starts the daemon against `redis` after `adjust` edits the config. The lane and lease users
    /// are set up on `redis` first, as an operator of an external Redis does (docs/lanes.md).
    pub async fn start_with(redis: &RedisServer, adjust: impl FnOnce(&mut Config)) -> TestDaemon {
        let dir = tempdir();
        let mut config = Self::config(dir.path());
        config.redis = Some(trusting_testkit(RedisConfig::standalone(endpoint(redis))));
        adjust(&mut config);
        let grants = grants_for(&config.policy);
        config.lanes = provisioned(&[redis], dir.path(), &config.lanes, &grants).await;
        Self::start_config(dir, config).await
    }

    /// Starts the daemon with `redis` as its `redis:` section (a Sentinel group, say), with the
    /// lane and lease users set up on every server in `nodes`.
    pub async fn start_redis(redis: RedisConfig, nodes: &[&RedisServer]) -> TestDaemon {
        Self::start_redis_with(redis, nodes, |_| {}).await
    }

    /// [`TestDaemon::start_redis`] after `adjust` edits the config (not its policy: the lane
    /// users are the default policy's).
    pub async fn start_redis_with(
        redis: RedisConfig,
        nodes: &[&RedisServer],
        adjust: impl FnOnce(&mut Config),
    ) -> TestDaemon {
        let dir = tempdir();
        let mut config = Self::config(dir.path());
        config.redis = Some(trusting_testkit(redis));
        config.lanes = lane_users(nodes, dir.path()).await;
        adjust(&mut config);
        Self::start_config(dir, config).await
    }

    /// Starts the daemon against the cluster `cluster` (every node as a seed), splitting
    /// multi-key commands as `split` says; the lane and lease users are created on every node,
    /// replicas included, so that a promoted replica knows them.
    pub async fn start_cluster(cluster: &RedisCluster, split: Splitting) -> TestDaemon {
        Self::start_cluster_with(cluster, split, |_| {}).await
    }

    /// [`TestDaemon::start_cluster`] after `adjust` edits the config.
    pub async fn start_cluster_with(
        cluster: &RedisCluster,
        split: Splitting,
        adjust: impl FnOnce(&mut Config),
    ) -> TestDaemon {
        let dir = tempdir();
        let mut config = Self::config(dir.path());
        let seeds = (cluster.addresses().iter())
            .map(|address| address.parse().expect("a node address"))
            .collect();
        config.redis = Some(trusting_testkit(RedisConfig::cluster(seeds, split)));
        adjust(&mut config);
        let grants = grants_for(&config.policy);
        let nodes: Vec<Endpoint> = (cluster.nodes().iter())
            .map(|node| Endpoint::Unix(node.socket().to_owned()))
            .collect();
        config.lanes = tollgate_lanes::provision(
            &nodes,
            Some(&testkit_admin()),
            dir.path(),
            &config.lanes,
            &grants,
        )
        .await
        .expect("create the lane users on every node")
        .config;
        Self::start_config(dir, config).await
    }

    /// Starts the daemon with its own embedded redis-server.
    pub async fn start_embedded() -> TestDaemon {
        let dir = tempdir();
        let config = Self::config(dir.path());
        Self::start_config(dir, config).await
    }

    /// Starts the daemon with `config` as it is; `dir` holds its sockets and is removed on drop.
    pub async fn start_config(dir: tempfile::TempDir, config: Config) -> TestDaemon {
        let daemon = Daemon::start(config).await.expect("daemon starts");
        TestDaemon {
            daemon: Some(daemon),
            dir,
        }
    }

    /// The embedded redis-server's pid while it runs.
    pub fn embedded_pid(&self) -> Option<u32> {
        self.daemon.as_ref().and_then(Daemon::embedded_pid)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn http_socket(&self) -> PathBuf {
        self.dir.path().join("http.sock")
    }

    pub fn resp_socket(&self) -> PathBuf {
        self.dir.path().join("resp.sock")
    }

    pub async fn get(&self, path: &str) -> HttpReply {
        http::get(&self.http_socket(), path)
            .await
            .expect("HTTP request")
    }

    pub async fn post(&self, path: &str, body: &str) -> HttpReply {
        http::post(&self.http_socket(), path, body)
            .await
            .expect("HTTP request")
    }

    /// Graceful shutdown, as SIGTERM does it.
    pub async fn stop(mut self) {
        if let Some(daemon) = self.daemon.take() {
            daemon.shutdown().await;
        }
    }
}

pub fn endpoint(redis: &RedisServer) -> Endpoint {
    Endpoint::Unix(redis.socket().to_owned())
}

/// The daemon's lane and lease users under the default policy, created on each of `nodes` with
/// their passwords in `dir`.
pub async fn lane_users(nodes: &[&RedisServer], dir: &Path) -> tollgate_lanes::LanesConfig {
    provisioned(nodes, dir, &Default::default(), &default_grants()).await
}

/// `base` with the lane and lease users cut to `grants` created on each of `nodes`.
async fn provisioned(
    nodes: &[&RedisServer],
    dir: &Path,
    base: &tollgate_lanes::LanesConfig,
    grants: &LaneGrants,
) -> tollgate_lanes::LanesConfig {
    let endpoints: Vec<Endpoint> = nodes.iter().map(|node| endpoint(node)).collect();
    tollgate_lanes::provision(&endpoints, Some(&testkit_admin()), dir, base, grants)
        .await
        .expect("create the lane users")
        .config
}

/// `config` with every lane and the lease connections logged in as testkit's admin, for tests
/// that open lanes on a server without the daemon's users.
pub fn as_testkit_admin(
    redis: &RedisServer,
    mut config: tollgate_lanes::LanesConfig,
) -> tollgate_lanes::LanesConfig {
    let file = redis.admin_password_file();
    for lane in tollgate_lanes::Lane::ALL {
        let overrides = config.overrides_mut(lane);
        overrides.user = Some(tollgate_testkit::ADMIN_USER.to_owned());
        overrides.password_file = Some(file.clone());
    }
    config.leases.user = Some(tollgate_testkit::ADMIN_USER.to_owned());
    config.leases.password_file = Some(file);
    config
}

/// A raw connection to the embedded server of `daemon`, logged in as its administrator
/// (`tollgate-root`, password in the runtime directory): `default` is off there.
pub async fn embedded_admin(dir: &Path) -> crate::support::raw::RawClient {
    let mut redis = crate::support::raw::RawClient::connect(&dir.join("redis.sock")).await;
    let password = std::fs::read_to_string(dir.join("admin.password")).expect("admin password");
    let reply = redis
        .call(&["AUTH", tollgate_lanes::EMBEDDED_ADMIN, password.trim_end()])
        .await;
    assert_eq!(
        reply,
        tollgate_resp::Frame::Simple("OK".into()),
        "embedded admin's AUTH"
    );
    redis
}

/// testkit's administrator (every server a test starts has it; `default` is off there).
pub fn testkit_admin() -> tollgate_lanes::Admin {
    tollgate_lanes::Admin {
        user: tollgate_testkit::ADMIN_USER.to_owned(),
        password: tollgate_testkit::admin_password().to_owned(),
    }
}

/// `redis` accepting testkit's administrator, which can reach every key (as an operator's admin
/// named in `redis.trusted_users` does).
pub fn trusting_testkit(redis: RedisConfig) -> RedisConfig {
    redis.trusting([tollgate_testkit::ADMIN_USER])
}

/// The lane users' grants under the default policy (compiled once per test run).
pub fn default_grants() -> LaneGrants {
    static DEFAULT: OnceLock<LaneGrants> = OnceLock::new();
    DEFAULT
        .get_or_init(|| {
            tollgate::lane_acl::grants_for(&PolicyConfig::default()).expect("default policy")
        })
        .clone()
}

/// The lane users' grants under `policy`.
pub fn grants_for(policy: &PolicyConfig) -> LaneGrants {
    if *policy == PolicyConfig::default() {
        return default_grants();
    }
    tollgate::lane_acl::grants_for(policy).expect("the test's policy compiles")
}

/// A Redis server whose command line carries the daemon's lane and lease users, so they survive
/// `kill()` / `restart()` the way users in an ACL file would, and the lanes config that uses them
/// (passwords in `dir`).
pub fn durable_lane_users(dir: &Path) -> (RedisServerBuilder, tollgate_lanes::LanesConfig) {
    let users = tollgate_lanes::daemon_users(dir, &default_grants());
    let mut builder = RedisServer::builder();
    for user in &users {
        let password = format!("secret-{}", user.name);
        std::fs::write(&user.password_file, &password).expect("write password file");
        builder = builder
            .arg("--user")
            .arg(user.name.clone())
            .arg("on")
            .arg(format!(">{password}"));
        for rule in &user.rules {
            builder = builder.arg(rule.clone());
        }
    }
    let config = tollgate_lanes::configured(&Default::default(), &users);
    (builder, config)
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tollgate-test-")
        .tempdir()
        .expect("temporary directory")
}
