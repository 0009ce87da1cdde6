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
        config.redis = Some(RedisConfig::standalone(endpoint(redis)));
        adjust(&mut config);
        let grants = grants_for(&config.policy);
        config.lanes = provisioned(&[redis], dir.path(), &config.lanes, &grants).await;
        Self::start_config(dir, config).await
    }

    /// Starts the daemon with `redis` as its `redis:` section (a Sentinel group, say), with the
    /// lane and lease users set up on every server in `nodes`.
    pub async fn start_redis(redis: RedisConfig, nodes: &[&RedisServer]) -> TestDaemon {
        let dir = tempdir();
        let mut config = Self::config(dir.path());
        config.redis = Some(redis);
        config.lanes = lane_users(nodes, dir.path()).await;
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
        config.redis = Some(RedisConfig::cluster(seeds, split));
        adjust(&mut config);
        let grants = grants_for(&config.policy);
        let nodes: Vec<Endpoint> = (cluster.nodes().iter())
            .map(|node| Endpoint::Unix(node.socket().to_owned()))
            .collect();
        config.lanes = tollgate_lanes::provision(&nodes, dir.path(), &config.lanes, &grants)
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
    tollgate_lanes::provision(&endpoints, dir, base, grants)
        .await
        .expect("create the lane users")
        .config
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
