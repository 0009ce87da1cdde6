//! Lease costs against a real `redis-server`, side by side with the alternative, in one run:
//!
//! - `acquire_release`: one acquire + release pair through the daemon (lease client → HTTP → lease
//!   service → SCRIPT lane), the same pair as `LEASE ACQUIRE` / `LEASE RELEASE` on the daemon's RESP
//!   socket (redis-rs, one multiplexed connection), and the same two Lua scripts run directly with
//!   redis-rs (EVALSHA on a multiplexed connection). Criterion's time per pair gives pairs/s; p50/p99 of single pairs are
//!   printed after the group.
//! - `handoff`: a holder releases while a second caller waits: from the release to the waiter
//!   holding, through the daemon's waiting (release notification) vs a client polling the daemon
//!   every 10 ms (the common hand-rolled SET NX loop).
//!
//! `cargo bench -p tollgate-lease --bench lease`

use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate::config::Config;
use tollgate::Daemon;
use tollgate_lanes::{Endpoint, RedisConfig};
use tollgate_lease::scripts::{ACQUIRE, RELEASE};
use tollgate_lease_client::{
    AcquireOutcome, AcquireRequest, LeaseClient, ReleaseRequest, Resource,
};
use tollgate_testkit::RedisServer;

const POLL_INTERVAL: Duration = Duration::from_millis(10);

fn request(ttl: Duration, wait: Duration) -> AcquireRequest {
    AcquireRequest {
        attempt: LeaseClient::new_attempt(),
        ttl,
        wait,
        watchdog: false,
        replicas: 0,
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let redis = RedisServer::start();
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
    config.redis = Some(RedisConfig::standalone(Endpoint::Unix(
        redis.socket().to_owned(),
    )));
    let (daemon, direct, resp) = runtime.block_on(async {
        // The lane and lease users, as an operator of an external Redis sets them up.
        let endpoint = Endpoint::Unix(redis.socket().to_owned());
        let grants = tollgate::lane_acl::grants_for(&config.policy).expect("the policy compiles");
        config.lanes = tollgate_lanes::provision(&[endpoint], dir.path(), &config.lanes, &grants)
            .await
            .expect("create the lane users")
            .config;
        let daemon = Daemon::start(config).await.expect("daemon starts");
        let client = redis::Client::open(redis.url()).expect("redis-rs client");
        let direct = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis-rs connection");
        let resp = redis::Client::open(format!("redis+unix://{}", daemon.resp_socket().display()))
            .expect("redis-rs client of the RESP socket")
            .get_multiplexed_async_connection()
            .await
            .expect("redis-rs connection to the daemon");
        (daemon, direct, resp)
    });
    let client = LeaseClient::new(daemon.http_socket());
    let resource = Resource::parse("bench:pairs").unwrap();
    let keys = resource.keys();
    let acquire_script = redis::Script::new(ACQUIRE.source);
    let release_script = redis::Script::new(RELEASE.source);
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
    group.bench_function("resp", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let mut connection = resp.clone();
            timed(iters, &latencies, async move || {
                let attempt = LeaseClient::new_attempt();
                let (owner, op) = (attempt.owner.as_str(), attempt.operation_id.as_str());
                let started = Instant::now();
                let acquired: Vec<redis::Value> = redis::cmd("LEASE")
                    .arg(&["ACQUIRE", "bench:pairs", "10000", "OWNER", owner, "OP", op])
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                assert_eq!(
                    acquired.get(1),
                    Some(&redis::Value::BulkString(b"acquired".to_vec()))
                );
                let _: redis::Value = redis::cmd("LEASE")
                    .arg(&["RELEASE", "bench:pairs", "OWNER", owner, "OP", op])
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                started.elapsed()
            })
        })
    });
    report("acquire_release/resp", &latencies);
    group.bench_function("redis_rs_direct", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let (direct, keys, acquire_script, release_script) =
                (&direct, &keys, &acquire_script, &release_script);
            // One connection per batch, as a redis-rs application would keep it.
            let mut connection = direct.clone();
            timed(iters, &latencies, async move || {
                let attempt = LeaseClient::new_attempt();
                let started = Instant::now();
                let reply: Vec<i64> = acquire_script
                    .key(&keys.lease)
                    .key(&keys.fence)
                    .arg(&attempt.owner)
                    .arg(&attempt.operation_id)
                    .arg(10_000)
                    .invoke_async(&mut connection)
                    .await
                    .unwrap();
                assert_eq!(reply[0], 1);
                let _: i64 = release_script
                    .key(&keys.lease)
                    .key(&keys.channel)
                    .arg(&attempt.owner)
                    .arg(&attempt.operation_id)
                    .invoke_async(&mut connection)
                    .await
                    .unwrap();
                started.elapsed()
            })
        })
    });
    report("acquire_release/redis_rs_direct", &latencies);
    group.finish();

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
    group.finish();
    runtime.block_on(daemon.shutdown());
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

criterion_group!(lease_benches, benches);
criterion_main!(lease_benches);
