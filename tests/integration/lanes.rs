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
    /// The hop in front of Redis ([`Fixture::start_behind_hop`]).
    pub hop: Option<Hop>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// Starts Redis, creates the lane users and opens the lanes with `adjust`ed settings.
    pub async fn start(adjust: impl FnOnce(&mut LanesConfig)) -> Fixture {
        Fixture::start_behind(None, adjust).await
    }

    /// Like [`Fixture::start`], but the lanes reach Redis through a [`hop`] of `delay` each way: a
    /// Redis a network round trip of twice `delay` away.
    pub async fn start_behind_hop(
        delay: Duration,
        adjust: impl FnOnce(&mut LanesConfig),
    ) -> Fixture {
        Fixture::start_behind(Some(delay), adjust).await
    }

    async fn start_behind(
        hop_delay: Option<Duration>,
        adjust: impl FnOnce(&mut LanesConfig),
    ) -> Fixture {
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
        let hop =
            hop_delay.map(|delay| Hop::start(redis.socket(), &dir.path().join("hop.sock"), delay));
        let socket = hop
            .as_ref()
            .map_or(redis.socket(), |hop| &hop.socket)
            .to_owned();
        let mut fixture = Fixture::open(redis, &socket, dir, &provisioned.config);
        fixture.hop = hop;
        fixture
    }

    /// Like [`Fixture::start`], but the lane users are part of the server's command line, so they
    /// survive `kill()` / `restart()` the way users in an ACL file would.
    pub async fn start_with_durable_users(adjust: impl FnOnce(&mut LanesConfig)) -> Fixture {
        let dir = tempfile::tempdir().expect("temporary directory");
        let (builder, mut config) = crate::support::daemon::durable_lane_users(dir.path());
        adjust(&mut config);
        let redis = builder.start();
        let socket = redis.socket().to_owned();
        Fixture::open(redis, &socket, dir, &config)
    }

    /// Opens the lanes on `redis`, reached at `socket`, with `config` (lane users already in
    /// place).
    fn open(
        redis: RedisServer,
        socket: &Path,
        dir: tempfile::TempDir,
        config: &LanesConfig,
    ) -> Fixture {
        let mut registry = Registry::default();
        let lanes = Lanes::open(
            &Topology::Standalone(endpoint(socket)),
            config,
            &mut registry,
        )
        .expect("open lanes");
        Fixture {
            redis,
            lanes,
            registry,
            hop: None,
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

/// A simulated network hop: a Unix socket relaying each connection to Redis with every chunk
/// delayed by `delay` in each direction (kept in order), for as long as the test's runtime runs;
/// Redis's replies can be held back ([`Hop::hold_replies`]) as a slow network would.
pub struct Hop {
    pub socket: std::path::PathBuf,
    held: tokio::sync::watch::Sender<bool>,
}

impl Hop {
    pub fn start(upstream: &Path, listen: &Path, delay: Duration) -> Hop {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use tokio::net::{UnixListener, UnixStream};
        use tokio::sync::watch;

        async fn pipe(
            mut from: tokio::net::unix::OwnedReadHalf,
            mut to: tokio::net::unix::OwnedWriteHalf,
            delay: Duration,
            mut held: Option<watch::Receiver<bool>>,
        ) {
            let (chunks, mut due) =
                tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
            let writer = tokio::spawn(async move {
                while let Some((at, chunk)) = due.recv().await {
                    tokio::time::sleep_until(at).await;
                    if let Some(held) = held.as_mut() {
                        let _ = held.wait_for(|held| !held).await;
                    }
                    if to.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
            let mut buf = vec![0; 64 * 1024];
            while let Ok(n @ 1..) = from.read(&mut buf).await {
                let _ = chunks.send((tokio::time::Instant::now() + delay, buf[..n].to_vec()));
            }
            drop(chunks);
            let _ = writer.await;
        }

        let listener = UnixListener::bind(listen).expect("bind the hop's socket");
        let upstream = upstream.to_owned();
        let (held, holding) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = UnixStream::connect(&upstream).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pipe(client_read, server_write, delay, None));
                tokio::spawn(pipe(
                    server_read,
                    client_write,
                    delay,
                    Some(holding.clone()),
                ));
            }
        });
        Hop {
            socket: listen.to_owned(),
            held,
        }
    }

    /// Redis's replies stop at the hop until [`Hop::release_replies`].
    pub fn hold_replies(&self) {
        self.held.send_replace(true);
    }

    pub fn release_replies(&self) {
        self.held.send_replace(false);
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
