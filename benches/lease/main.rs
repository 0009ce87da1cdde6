//! Lease costs against a real `redis-server`, side by side with the alternatives, in one run:
//!
//! - `acquire_release`: one acquire + release pair through the daemon (lease client → HTTP → lease
//!   service → SCRIPT lane), the same pair as `LEASE ACQUIRE` / `LEASE RELEASE` on the daemon's RESP
//!   socket (redis-rs, one multiplexed connection), the same two Lua scripts run directly with
//!   redis-rs (EVALSHA on a multiplexed connection), the same scripts through twemproxy (a proxy
//!   that only forwards, `support/twemproxy.rs`: what one more process hop costs by itself), and
//!   an etcd lock + unlock pair (its
//!   `concurrency` mutex, see `support/etcd.rs`). Criterion's time per pair gives pairs/s; p50/p99
//!   of single pairs are printed after the group.
//! - `acquire_release_16_clients`: sixteen clients taking pairs at once, each on a resource of its
//!   own, over RESP through the daemon vs directly with redis-rs vs through twemproxy: time per
//!   pair is 1 / throughput; the CPU time per pair of this process (clients, and the daemon when
//!   it is in the path), of redis-server and of twemproxy is printed after the group.
//! - `handoff`: a holder releases while a second caller waits: from the release to the waiter
//!   holding, through the daemon's waiting (release notification; over HTTP and over RESP) vs a
//!   client polling the daemon every 10 ms (the common hand-rolled SET NX loop) vs etcd's mutex,
//!   released 25 ms into the wait as the others are, and 150 ms into it (past etcd's 100 ms watch
//!   sync loop, which a waiter that just started waiting pays).
//!
//! `cargo bench --bench lease` (without an `etcd` or a `nutcracker` binary on
//! PATH that part is skipped, and says so).

#[path = "support/daemon_thread.rs"]
mod daemon_thread;
#[path = "support/etcd.rs"]
mod etcd;
#[path = "support/programs.rs"]
mod programs;
#[path = "support/twemproxy.rs"]
mod twemproxy;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate::config::Config;
use tollgate_lanes::{Endpoint, RedisConfig};
use tollgate_lease::scripts::{ACQUIRE, RELEASE};
use tollgate_lease::LeaseKeys;
use tollgate_lease_client::{
    AcquireOutcome, AcquireRequest, LeaseClient, ReleaseRequest, Resource,
};
use tollgate_testkit::RedisServer;

use crate::daemon_thread::DaemonThread;
use crate::etcd::{Etcd, Gateway};
use crate::twemproxy::Twemproxy;

const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Clients of `acquire_release_16_clients`.
const CLIENTS: u64 = 16;
/// The etcd mutexes' names, base64 as etcd's gateway carries bytes: `bench-pairs`, `bench-handoff`.
const ETCD_PAIRS: &str = "YmVuY2gtcGFpcnM=";
const ETCD_HANDOFF: &str = "YmVuY2gtaGFuZG9mZg==";

fn request(ttl: Duration, wait: Duration) -> AcquireRequest {
    AcquireRequest {
        attempt: LeaseClient::new_attempt(),
        ttl,
        wait,
        watchdog: false,
        replicas: 0,
        value: None,
        permits: None,
        count: None,
        mode: None,
    }
}

fn release_of(request: &AcquireRequest) -> ReleaseRequest {
    ReleaseRequest {
        attempt: request.attempt.clone(),
    }
}

/// Percentiles of the single-call latencies recorded during a benchmark.
fn report(name: &str, samples: &Mutex<Vec<Duration>>) {
    let mut samples = samples.lock().unwrap();
    samples.sort_unstable();
    if samples.is_empty() {
        return;
    }
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    println!(
        "{name}: n={} p50={:?} p99={:?}",
        samples.len(),
        at(0.50),
        at(0.99)
    );
    samples.clear();
}

fn benches(c: &mut Criterion) {
    println!("load average at the start: {}", load_average());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let redis = RedisServer::start();
    // Twemproxy logs in to Redis only as `default` (`redis_auth`), which testkit's servers have off:
    // on this server `default` gets what testkit's admin (the direct rows' user) has, behind a
    // password of its own. Twemproxy first connects to Redis when it forwards a command, after this.
    let twemproxy_password = random_password();
    let twemproxy = Twemproxy::start(redis.socket(), &twemproxy_password);
    if twemproxy.is_some() {
        let reply = redis.inline(&format!(
            "ACL SETUSER default on >{twemproxy_password} ~* &* +@all"
        ));
        assert_eq!(reply, "+OK\r\n", "turn `default` on for twemproxy");
    }
    // So the daemon's start-up proof finds `default` able to reach the reserved keyspace, and
    // accepts it as an operator running twemproxy beside the daemon would: by trusting it.
    let trusted = std::iter::once(tollgate_testkit::ADMIN_USER)
        .chain(twemproxy.is_some().then_some("default"));
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut config = Config {
        runtime_dir: Some(dir.path().to_owned()),
        ..Config::default()
    };
    config.listen.http = Some(dir.path().join("http.sock"));
    config.listen.resp = Some(dir.path().join("resp.sock"));
    // The default policy admits no lease; the benchmark's resources get a rule of their own.
    let policy = dir.path().join("bench-leases.yaml");
    std::fs::write(
        &policy,
        "principals:\n  local: { any: true }\nrules:\n  - id: bench-leases\n    leases: [\"bench:*\"]\n    allow: benchmark resources\n",
    )
    .expect("write the benchmark policy");
    config.policy.files = vec![policy];
    config.redis =
        Some(RedisConfig::standalone(Endpoint::Unix(redis.socket().to_owned())).trusting(trusted));
    let etcd = Etcd::start();
    // The lane and lease users, as an operator of an external Redis sets them up.
    let endpoint = Endpoint::Unix(redis.socket().to_owned());
    let grants = tollgate::lane_acl::grants_for(&config.policy).expect("the policy compiles");
    config.lanes = runtime
        .block_on(tollgate_lanes::provision(
            &[endpoint],
            Some(&tollgate_lanes::Admin {
                user: tollgate_testkit::ADMIN_USER.to_owned(),
                password: tollgate_testkit::admin_password().to_owned(),
            }),
            dir.path(),
            &config.lanes,
            &grants,
        ))
        .expect("create the lane users")
        .config;
    println!(
        "the daemon: {} worker thread(s), apart from the clients' 2",
        config.worker_threads()
    );
    let daemon = DaemonThread::start(config);
    let direct = redis::Client::open(redis.url()).expect("redis-rs client");
    let resp = redis::Client::open(format!("redis+unix://{}", daemon.resp_socket().display()))
        .expect("redis-rs client of the RESP socket");
    let connect = |client: &redis::Client| {
        runtime
            .block_on(client.get_multiplexed_async_connection())
            .expect("redis-rs connection")
    };
    if let Some(etcd) = &etcd {
        println!("etcd {}", runtime.block_on(etcd.ready()));
    }
    let client = LeaseClient::new(daemon.http_socket());
    let resource = Resource::parse("bench:pairs").unwrap();
    let keys = LeaseKeys::of(&resource);
    let scripts = Scripts {
        acquire: redis::Script::new(ACQUIRE.source),
        release: redis::Script::new(RELEASE.source),
    };
    let latencies = Mutex::new(Vec::new());

    let mut group = c.benchmark_group("acquire_release");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(5));
    group.bench_function("daemon", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let (client, resource) = (&client, &resource);
            timed(iters, &latencies, async move || {
                let request = request(Duration::from_secs(10), Duration::ZERO);
                let started = Instant::now();
                let acquired = client.acquire_raw(resource, &request).await.unwrap();
                assert!(matches!(acquired.outcome, AcquireOutcome::Acquired { .. }));
                client
                    .release_raw(resource, &release_of(&request))
                    .await
                    .unwrap();
                started.elapsed()
            })
        })
    });
    report("acquire_release/daemon", &latencies);
    let resp_connection = connect(&resp);
    group.bench_function("resp", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let mut connection = resp_connection.clone();
            timed(iters, &latencies, async move || {
                let started = Instant::now();
                resp_pair(&mut connection, "bench:pairs").await;
                started.elapsed()
            })
        })
    });
    report("acquire_release/resp", &latencies);
    let direct_connection = connect(&direct);
    group.bench_function("redis_rs_direct", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let (keys, scripts) = (&keys, &scripts);
            // One connection per batch, as a redis-rs application would keep it.
            let mut connection = direct_connection.clone();
            timed(iters, &latencies, async move || {
                let started = Instant::now();
                direct_pair(&mut connection, keys, scripts).await;
                started.elapsed()
            })
        })
    });
    report("acquire_release/redis_rs_direct", &latencies);
    let proxied = twemproxy.as_ref().map(|twemproxy| {
        // Twemproxy refuses SCRIPT LOAD: the scripts are loaded on Redis itself.
        let mut direct = direct_connection.clone();
        for script in [&ACQUIRE, &RELEASE] {
            let _: String = runtime
                .block_on(
                    redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(script.source)
                        .query_async(&mut direct),
                )
                .expect("SCRIPT LOAD");
        }
        twemproxy.client()
    });
    if let Some(proxied) = &proxied {
        let proxied_connection = connect(proxied);
        group.bench_function("twemproxy", |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let (keys, scripts) = (&keys, &scripts);
                let mut connection = proxied_connection.clone();
                timed(iters, &latencies, async move || {
                    let started = Instant::now();
                    direct_pair(&mut connection, keys, scripts).await;
                    started.elapsed()
                })
            })
        });
        report("acquire_release/twemproxy", &latencies);
    }
    if let Some(etcd) = &etcd {
        let gateway = runtime.block_on(async {
            let mut gateway = etcd.connect().await.expect("etcd connection");
            let session = gateway.session().await;
            tokio::sync::Mutex::new((gateway, session))
        });
        group.bench_function("etcd", |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let gateway = &gateway;
                timed(iters, &latencies, async move || {
                    let mut held = gateway.lock().await;
                    let (gateway, session) = &mut *held;
                    let started = Instant::now();
                    let key = gateway.lock(ETCD_PAIRS, session).await;
                    gateway.unlock(&key).await;
                    started.elapsed()
                })
            })
        });
        report("acquire_release/etcd", &latencies);
    }
    group.finish();

    let mut group = c.benchmark_group("acquire_release_16_clients");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    let resp_connections: Vec<_> = (0..CLIENTS).map(|_| connect(&resp)).collect();
    let redis_stat = PathBuf::from(format!(
        "/proc/{}/stat",
        redis.pid().expect("the benchmark's redis-server runs")
    ));
    let this_process = || ("this process", PathBuf::from("/proc/self/stat"));
    let mut sources = vec![this_process()];
    sources.extend(
        daemon
            .stat_file()
            .map(|stat| ("of it the daemon's thread", stat)),
    );
    sources.push(("redis-server", redis_stat.clone()));
    let cpu_resp = CpuPerPair::new(sources);
    group.bench_function("resp", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let connections = resp_connections.clone();
            cpu_resp.measure(iters, async move {
                parallel(iters, connections, |n, mut connection| async move {
                    resp_pair(&mut connection, &format!("bench:clients:{n}")).await;
                    connection
                })
                .await
            })
        })
    });
    let direct_connections: Vec<_> = (0..CLIENTS).map(|_| connect(&direct)).collect();
    let shared = std::sync::Arc::new(scripts);
    let cpu_direct = CpuPerPair::new(vec![this_process(), ("redis-server", redis_stat.clone())]);
    group.bench_function("redis_rs_direct", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let connections = direct_connections.clone();
            let scripts = shared.clone();
            cpu_direct.measure(iters, direct_pairs(iters, connections, scripts))
        })
    });
    if let (Some(proxied), Some(twemproxy)) = (&proxied, &twemproxy) {
        let proxied_connections: Vec<_> = (0..CLIENTS).map(|_| connect(proxied)).collect();
        let twemproxy_stat = PathBuf::from(format!("/proc/{}/stat", twemproxy.pid()));
        let cpu_proxied = CpuPerPair::new(vec![
            this_process(),
            ("redis-server", redis_stat.clone()),
            ("twemproxy", twemproxy_stat),
        ]);
        group.bench_function("twemproxy", |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let connections = proxied_connections.clone();
                let scripts = shared.clone();
                cpu_proxied.measure(iters, direct_pairs(iters, connections, scripts))
            })
        });
        cpu_proxied.report("acquire_release_16_clients/twemproxy");
    }
    group.finish();
    cpu_resp.report("acquire_release_16_clients/resp");
    cpu_direct.report("acquire_release_16_clients/redis_rs_direct");

    let contested = Resource::parse("bench:handoff").unwrap();
    let mut group = c.benchmark_group("handoff");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(8));
    for (name, polling) in [("daemon_waiting", false), ("polling_client_10ms", true)] {
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let (client, contested) = (&client, &contested);
                timed(iters, &latencies, async move || {
                    handoff(client, contested, polling).await
                })
            })
        });
        report(&format!("handoff/{name}"), &latencies);
    }
    let (holder, waiter) = (connect(&resp), connect(&resp));
    group.bench_function("resp_waiting", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let (holder, waiter) = (holder.clone(), waiter.clone());
            timed(iters, &latencies, async move || {
                resp_handoff(holder.clone(), waiter.clone()).await
            })
        })
    });
    report("handoff/resp_waiting", &latencies);
    if let Some(etcd) = &etcd {
        let sides = runtime.block_on(async {
            let mut holder = etcd.connect().await.expect("etcd connection");
            let mut waiter = etcd.connect().await.expect("etcd connection");
            let sessions = (holder.session().await, waiter.session().await);
            tokio::sync::Mutex::new(((holder, waiter), sessions))
        });
        // A waiter whose wait began just before the release, like the daemon rows, and one that
        // has waited past etcd's 100 ms watch sync loop.
        for (name, settle) in [("etcd", 25), ("etcd_waiting_150ms", 150)] {
            let settle = Duration::from_millis(settle);
            group.bench_function(name, |b| {
                b.to_async(&runtime).iter_custom(|iters| {
                    let sides = &sides;
                    timed(iters, &latencies, async move || {
                        let mut sides = sides.lock().await;
                        let ((holder, waiter), (held, waits)) = &mut *sides;
                        etcd_handoff(holder, waiter, held, waits, settle).await
                    })
                })
            });
            report(&format!("handoff/{name}"), &latencies);
        }
    }
    group.finish();
    println!("load average at the end: {}", load_average());
    daemon.stop();
}

/// The CPU time spent per pair while a benchmark ran, by the processes (or threads) in its path,
/// each read from its `/proc/…/stat` (10 ms ticks), so only meaningful over whole benchmarks of
/// many pairs.
struct CpuPerPair {
    /// What each source is called in the report, and its stat file.
    sources: Vec<(&'static str, PathBuf)>,
    sums: Mutex<(u64, Vec<Duration>)>,
}

impl CpuPerPair {
    fn new(sources: Vec<(&'static str, PathBuf)>) -> CpuPerPair {
        let zeros = vec![Duration::ZERO; sources.len()];
        CpuPerPair {
            sources,
            sums: Mutex::new((0, zeros)),
        }
    }

    async fn measure(&self, pairs: u64, run: impl Future<Output = Duration>) -> Duration {
        let before: Vec<Duration> = self.sources.iter().map(|(_, at)| cpu_time(at)).collect();
        let took = run.await;
        let mut sums = self.sums.lock().unwrap();
        sums.0 += pairs;
        for ((sum, (_, at)), before) in sums.1.iter_mut().zip(&self.sources).zip(before) {
            *sum += cpu_time(at).saturating_sub(before);
        }
        took
    }

    fn report(&self, name: &str) {
        let (pairs, sums) = &*self.sums.lock().unwrap();
        if *pairs == 0 {
            return;
        }
        let each: Vec<String> = self
            .sources
            .iter()
            .zip(sums)
            .map(|((source, _), cpu)| {
                format!("{:.1} us {source}", cpu.as_secs_f64() * 1e6 / *pairs as f64)
            })
            .collect();
        println!(
            "{name}: CPU per pair over {pairs} pairs: {}",
            each.join(", ")
        );
    }
}

/// User plus system CPU time from a `/proc/…/stat` file; zero where it cannot be read.
fn cpu_time(stat: &Path) -> Duration {
    let stat = std::fs::read_to_string(stat).unwrap_or_default();
    // The fields after the command name's closing parenthesis; utime and stime are the 12th and
    // 13th of them, in clock ticks (100 per second on Linux).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |at: usize| {
        fields
            .get(at)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// A password of this run's own (twemproxy's, for Redis's `default`): 128 random bits in hex.
fn random_password() -> String {
    use std::hash::{BuildHasher, Hasher};
    let random = || {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    format!("{:016x}{:016x}", random(), random())
}

/// The machine's one-minute load average, for the report.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Runs `one` `iters` times; each call measures itself. Records every sample for [`report`].
async fn timed(
    iters: u64,
    latencies: &Mutex<Vec<Duration>>,
    mut one: impl AsyncFnMut() -> Duration,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let took = one().await;
        latencies.lock().unwrap().push(took);
        total += took;
    }
    total
}

/// About `iters` pairs shared out among the clients, each on its own connection, all at once;
/// returns the time `iters` pairs took at the throughput reached.
async fn parallel<C, F, Fut>(iters: u64, connections: Vec<C>, one: F) -> Duration
where
    C: Send + 'static,
    F: Fn(u64, C) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = C> + Send,
{
    let each = iters.div_ceil(CLIENTS);
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .zip(connections)
        .map(|(n, mut connection)| {
            let one = one.clone();
            tokio::spawn(async move {
                for _ in 0..each {
                    connection = one(n, connection).await;
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("a benchmark client");
    }
    started
        .elapsed()
        .mul_f64(iters as f64 / (each * CLIENTS) as f64)
}

/// About `iters` pairs of the two scripts run directly (or through a proxy that forwards them),
/// shared out among the clients as [`parallel`] does.
async fn direct_pairs(
    iters: u64,
    connections: Vec<redis::aio::MultiplexedConnection>,
    scripts: std::sync::Arc<Scripts>,
) -> Duration {
    parallel(iters, connections, move |n, mut connection| {
        let scripts = scripts.clone();
        async move {
            let keys = LeaseKeys::of(&Resource::parse(&format!("bench:clients:{n}")).unwrap());
            direct_pair(&mut connection, &keys, &scripts).await;
            connection
        }
    })
    .await
}

/// The two lease scripts as a redis-rs application would hold them.
struct Scripts {
    acquire: redis::Script,
    release: redis::Script,
}

/// `LEASE ACQUIRE` + `LEASE RELEASE` on the daemon's RESP socket.
async fn resp_pair(connection: &mut redis::aio::MultiplexedConnection, resource: &str) {
    let attempt = LeaseClient::new_attempt();
    let (owner, op) = (attempt.owner.as_str(), attempt.operation_id.as_str());
    let acquired: Vec<redis::Value> = redis::cmd("LEASE")
        .arg(&["ACQUIRE", resource, "10000", "OWNER", owner, "OP", op])
        .query_async(connection)
        .await
        .unwrap();
    assert_eq!(
        acquired.get(1),
        Some(&redis::Value::BulkString(b"acquired".to_vec()))
    );
    let _: redis::Value = redis::cmd("LEASE")
        .arg(&["RELEASE", resource, "OWNER", owner, "OP", op])
        .query_async(connection)
        .await
        .unwrap();
}

/// The same two scripts, run directly on Redis.
async fn direct_pair(
    connection: &mut redis::aio::MultiplexedConnection,
    keys: &LeaseKeys,
    scripts: &Scripts,
) {
    let attempt = LeaseClient::new_attempt();
    let reply: Vec<i64> = scripts
        .acquire
        .key(&keys.lease)
        .key(&keys.fence)
        .key(&keys.channel)
        .arg(&attempt.owner)
        .arg(&attempt.operation_id)
        .arg(10_000)
        .invoke_async(connection)
        .await
        .unwrap();
    assert_eq!(reply[0], 1);
    let _: i64 = scripts
        .release
        .key(&keys.lease)
        .key(&keys.channel)
        .arg(&attempt.owner)
        .arg(&attempt.operation_id)
        .invoke_async(connection)
        .await
        .unwrap();
}

/// One hand-off: a holder releases while a waiter waits; returns release → waiter holds.
async fn handoff(client: &LeaseClient, resource: &Resource, polling: bool) -> Duration {
    let holder = request(Duration::from_secs(10), Duration::ZERO);
    let acquired = client.acquire_raw(resource, &holder).await.unwrap();
    assert!(matches!(acquired.outcome, AcquireOutcome::Acquired { .. }));
    let waiter = request(Duration::from_secs(10), Duration::from_secs(5));
    let waiting = {
        let (client, resource, waiter) = (client.clone(), resource.clone(), waiter.clone());
        tokio::spawn(async move {
            loop {
                let request = match polling {
                    true => AcquireRequest {
                        wait: Duration::ZERO,
                        ..waiter.clone()
                    },
                    false => waiter.clone(),
                };
                let answer = client.acquire_raw(&resource, &request).await.unwrap();
                match answer.outcome {
                    AcquireOutcome::Acquired { .. } => return Instant::now(),
                    AcquireOutcome::Contended { .. } if polling => {
                        tokio::time::sleep(POLL_INTERVAL).await
                    }
                    other => panic!("waiter: {other:?}"),
                }
            }
        })
    };
    // Let the waiter settle into waiting (or its polling rhythm) before the release.
    tokio::time::sleep(Duration::from_millis(25)).await;
    let released = Instant::now();
    client
        .release_raw(resource, &release_of(&holder))
        .await
        .unwrap();
    let holds = waiting.await.unwrap();
    client
        .release_raw(resource, &release_of(&waiter))
        .await
        .unwrap();
    holds.duration_since(released)
}

/// One hand-off over RESP: the waiter's `LEASE ACQUIRE … WAIT` blocks its own connection while the
/// holder releases on another; returns release → waiter holds.
async fn resp_handoff(
    mut holder: redis::aio::MultiplexedConnection,
    mut waiter: redis::aio::MultiplexedConnection,
) -> Duration {
    let lease = |words: Vec<&str>| {
        let mut command = redis::cmd("LEASE");
        command.arg(words);
        command
    };
    let (first, second) = (LeaseClient::new_attempt(), LeaseClient::new_attempt());
    let acquire = |attempt: &tollgate_lease_client::Attempt, wait: &'static str| {
        lease(vec![
            "ACQUIRE",
            "bench:handoff",
            "10000",
            "WAIT",
            wait,
            "OWNER",
            attempt.owner.as_str(),
            "OP",
            attempt.operation_id.as_str(),
        ])
    };
    let release = |attempt: &tollgate_lease_client::Attempt| {
        lease(vec![
            "RELEASE",
            "bench:handoff",
            "OWNER",
            attempt.owner.as_str(),
            "OP",
            attempt.operation_id.as_str(),
        ])
    };
    let held: Vec<redis::Value> = acquire(&first, "0").query_async(&mut holder).await.unwrap();
    assert_eq!(
        held.get(1),
        Some(&redis::Value::BulkString(b"acquired".to_vec()))
    );
    let waiting = {
        let command = acquire(&second, "5000");
        tokio::spawn(async move {
            let got: Vec<redis::Value> = command.query_async(&mut waiter).await.unwrap();
            assert_eq!(
                got.get(1),
                Some(&redis::Value::BulkString(b"acquired".to_vec()))
            );
            Instant::now()
        })
    };
    tokio::time::sleep(Duration::from_millis(25)).await;
    let released = Instant::now();
    let _: redis::Value = release(&first).query_async(&mut holder).await.unwrap();
    let holds = waiting.await.unwrap();
    let _: redis::Value = release(&second).query_async(&mut holder).await.unwrap();
    holds.duration_since(released)
}

/// One hand-off of etcd's mutex: the waiter's lock blocks in etcd until the holder unlocks,
/// `settle` after the waiter started waiting.
async fn etcd_handoff(
    holder: &mut Gateway,
    waiter: &mut Gateway,
    held: &etcd::Session,
    waits: &etcd::Session,
    settle: Duration,
) -> Duration {
    let key = holder.lock(ETCD_HANDOFF, held).await;
    let (unlocked, holds, waiter_key) = {
        let waiting = async {
            let key = waiter.lock(ETCD_HANDOFF, waits).await;
            (Instant::now(), key)
        };
        let releasing = async {
            tokio::time::sleep(settle).await;
            let unlocked = Instant::now();
            holder.unlock(&key).await;
            unlocked
        };
        let ((holds, waiter_key), unlocked) = tokio::join!(waiting, releasing);
        (unlocked, holds, waiter_key)
    };
    waiter.unlock(&waiter_key).await;
    holds.duration_since(unlocked)
}

criterion_group!(lease_benches, benches);
criterion_main!(lease_benches);
