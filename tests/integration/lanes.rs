//! Lanes against real `redis-server` processes: shared fixtures. The tests live in the `lanes_*`
//! modules next to this one.

use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use prometheus_client::registry::Registry;
use tollgate_lanes::{Endpoint, Lanes, LanesConfig, Topology};
use tollgate_testkit::RedisServer;

/// A Redis server with the lanes' ACL users provisioned, and lanes open on it.
pub struct Fixture {
    pub redis: RedisServer,
    pub lanes: Lanes,
    pub registry: Registry,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// Starts Redis, creates the lane users and opens the lanes with `adjust`ed settings.
    pub async fn start(adjust: impl FnOnce(&mut LanesConfig)) -> Fixture {
        let redis = RedisServer::start();
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut base = LanesConfig::default();
        adjust(&mut base);
        let endpoint = endpoint(redis.socket());
        let grants = crate::support::daemon::default_grants();
        let provisioned = tollgate_lanes::provision(
            &[endpoint],
            Some(&crate::support::daemon::testkit_admin()),
            dir.path(),
            &base,
            &grants,
        )
        .await
        .expect("provision lane users");
        Fixture::open(redis, dir, &provisioned.config)
    }

    /// Like [`Fixture::start`], but the lane users are part of the server's command line, so they
    /// survive `kill()` / `restart()` the way users in an ACL file would.
    pub async fn start_with_durable_users(adjust: impl FnOnce(&mut LanesConfig)) -> Fixture {
        let dir = tempfile::tempdir().expect("temporary directory");
        let (builder, mut config) = crate::support::daemon::durable_lane_users(dir.path());
        adjust(&mut config);
        Fixture::open(builder.start(), dir, &config)
    }

    /// Opens the lanes on `redis` with `config` (lane users already in place).
    fn open(redis: RedisServer, dir: tempfile::TempDir, config: &LanesConfig) -> Fixture {
        let mut registry = Registry::default();
        let lanes = Lanes::open(
            &Topology::Standalone(endpoint(redis.socket())),
            config,
            &mut registry,
        )
        .expect("open lanes");
        Fixture {
            redis,
            lanes,
            registry,
            _dir: dir,
        }
    }

    /// True once Redis lists no connection of any lane user.
    pub fn no_lane_connections(&self) -> bool {
        client_list(&self.redis)
            .iter()
            .all(|c| !c.user.starts_with("tollgate-"))
    }

    /// Ids of the connections Redis has from `user`, from `CLIENT LIST`.
    /// The lane's own connections as Redis lists them: the lane's user, not SCRIPT's kill
    /// connections (`tollgate-script-kill`), which stand outside its ceiling.
    pub fn client_ids(&self, user: &str) -> Vec<u64> {
        client_list(&self.redis)
            .into_iter()
            .filter(|c| c.user == user && !c.name.ends_with("-kill"))
            .map(|c| c.id)
            .collect()
    }

    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encode metrics");
        out
    }
}

pub fn endpoint(socket: &Path) -> Endpoint {
    Endpoint::Unix(socket.to_owned())
}

/// One encoded command.
pub fn cmd(argv: &[&str]) -> Bytes {
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(argv, &mut out);
    out.freeze()
}

pub struct Client {
    pub id: u64,
    pub user: String,
    /// `CLIENT SETNAME`'s: `tollgate-<lane>`, or `tollgate-script-kill`.
    pub name: String,
}

pub fn client_list(redis: &RedisServer) -> Vec<Client> {
    redis
        .inline("CLIENT LIST")
        .lines()
        .filter(|line| line.starts_with("id="))
        .map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
                    .unwrap_or_default()
                    .to_owned()
            };
            Client {
                id: field("id").parse().expect("numeric client id"),
                user: field("user"),
                name: field("name"),
            }
        })
        .collect()
}

/// Polls `check` until it holds or `within` passes; returns whether it held.
pub async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}
