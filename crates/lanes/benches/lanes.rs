//! Lane costs against a real `redis-server` on a Unix socket, side by side with the alternative:
//!
//! - `borrow_release`: borrowing and returning a pooled exclusive connection (no Redis round trip),
//!   and picking a multiplexed channel.
//! - `round_trip`: one PING, waited for, through the REGULAR lane and through a redis-rs
//!   `MultiplexedConnection`.
//! - `regular_throughput`: 1000 concurrent GETs through the REGULAR lane (4 connections, and 1
//!   connection) and through one redis-rs `MultiplexedConnection`.
//!
//! `cargo bench -p tollgate-lanes --bench lanes`

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::future::join_all;
use prometheus_client::registry::Registry;
use tollgate_lanes::{Endpoint, Exclusive, Lanes, LanesConfig, Multiplexed, Topology};
use tollgate_testkit::RedisServer;

const BATCH: usize = 1000;

fn encoded(argv: &[&str]) -> Bytes {
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(argv, &mut out);
    out.freeze()
}

fn open_lanes(redis: &RedisServer, regular_connections: usize) -> Lanes {
    let mut config = LanesConfig::default();
    // `default` is off on testkit's servers: the lanes log in as its admin.
    config.regular.user = Some(tollgate_testkit::ADMIN_USER.to_owned());
    config.regular.password_file = Some(redis.admin_password_file());
    config.regular.connections = Some(regular_connections);
    config.regular.in_flight = Some(BATCH * 2);
    // As the daemon runs them: every command with a deadline.
    config.command_timeout = Some(std::time::Duration::from_secs(10));
    Lanes::open(
        &Topology::Standalone(Endpoint::Unix(redis.socket().to_owned())),
        &config,
        &mut Registry::default(),
    )
    .expect("open lanes")
}

fn benches(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let redis = RedisServer::start();
    redis.inline("SET k value");
    let (lanes4, lanes1, redis_rs) = runtime.block_on(async {
        let client = redis::Client::open(redis.url()).expect("redis-rs client");
        let redis_rs = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis-rs multiplexed connection");
        (open_lanes(&redis, 4), open_lanes(&redis, 1), redis_rs)
    });
    let ping = encoded(&["PING"]);
    let get = encoded(&["GET", "k"]);

    let mut group = c.benchmark_group("borrow_release");
    group.bench_function("exclusive_blocking_lane", |b| {
        b.to_async(&runtime).iter(|| async {
            lanes4
                .borrow(Exclusive::Blocking)
                .await
                .expect("borrow")
                .release()
                .await;
        })
    });
    group.bench_function("multiplexed_channel_pick", |b| {
        b.iter(|| lanes4.multiplexed(Multiplexed::Regular).expect("channel"))
    });
    group.finish();

    let mut group = c.benchmark_group("round_trip");
    group.bench_function("lanes_regular_ping", |b| {
        let channel = lanes4.multiplexed(Multiplexed::Regular).expect("channel");
        b.to_async(&runtime)
            .iter(|| async { channel.send(ping.clone()).await.expect("PONG") })
    });
    group.bench_function("redis_rs_multiplexed_ping", |b| {
        b.to_async(&runtime).iter(|| async {
            let mut connection = redis_rs.clone();
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await
                .expect("PONG")
        })
    });
    group.finish();

    let mut group = c.benchmark_group("regular_throughput");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.measurement_time(Duration::from_secs(8));
    for (name, lanes) in [
        ("lanes_regular_4_connections", &lanes4),
        ("lanes_regular_1_connection", &lanes1),
    ] {
        group.bench_function(BenchmarkId::new(name, BATCH), |b| {
            b.to_async(&runtime).iter(|| async {
                let sends = (0..BATCH).map(|_| {
                    let channel = lanes.multiplexed(Multiplexed::Regular).expect("channel");
                    channel.send(get.clone())
                });
                for reply in join_all(sends).await {
                    reply.expect("GET answered");
                }
            })
        });
    }
    group.bench_function(
        BenchmarkId::new("redis_rs_multiplexed_1_connection", BATCH),
        |b| {
            b.to_async(&runtime).iter(|| async {
                let gets = (0..BATCH).map(|_| {
                    let mut connection = redis_rs.clone();
                    async move {
                        redis::cmd("GET")
                            .arg("k")
                            .query_async::<Option<String>>(&mut connection)
                            .await
                    }
                });
                for reply in join_all(gets).await {
                    reply.expect("GET answered");
                }
            })
        },
    );
    group.finish();

    runtime.block_on(async {
        lanes4.close(Duration::from_secs(1)).await;
        lanes1.close(Duration::from_secs(1)).await;
    });
}

criterion_group!(lane_benches, benches);
criterion_main!(lane_benches);
