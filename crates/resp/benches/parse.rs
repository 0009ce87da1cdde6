//! The RESP parser's hot paths, side by side with redis-rs's parser on the same bytes:
//!
//! - `reply`: measuring one reply as the lanes do for every reply they pass through
//!   ([`Scanner::scan`]), and building it ([`parse`]), against `redis::parse_redis_value`. Replies:
//!   `+OK`, a 100-byte bulk string, and LRANGE's 100 three-byte elements (redis-benchmark's
//!   LRANGE_100).
//! - `command`: reading one client command ([`parse_command`]) against redis-rs parsing the same
//!   array: GET, SET and redis-benchmark's MSET of ten pairs.
//!
//! `cargo bench -p tollgate-resp --bench parse`

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use std::hint::black_box;
use tollgate_resp::{encode_command, parse, parse_command, Limits, Scanner};

fn replies() -> Vec<(&'static str, Vec<u8>)> {
    let mut lrange = b"*100\r\n".to_vec();
    for _ in 0..100 {
        lrange.extend_from_slice(b"$3\r\nxxx\r\n");
    }
    let mut bulk = b"$100\r\n".to_vec();
    bulk.extend_from_slice(&[b'x'; 100]);
    bulk.extend_from_slice(b"\r\n");
    vec![
        ("ok", b"+OK\r\n".to_vec()),
        ("bulk_100", bulk),
        ("lrange_100", lrange),
    ]
}

fn reply(c: &mut Criterion) {
    let limits = Limits::default();
    let mut group = c.benchmark_group("reply");
    for (name, bytes) in replies() {
        group.bench_function(format!("{name}/tollgate_scan"), |b| {
            b.iter(|| Scanner::default().scan(black_box(&bytes), &limits).unwrap())
        });
        group.bench_function(format!("{name}/tollgate_parse"), |b| {
            b.iter_batched(
                || BytesMut::from(&bytes[..]),
                |mut buf| parse(&mut buf, &limits).unwrap(),
                BatchSize::SmallInput,
            )
        });
        group.bench_function(format!("{name}/redis_rs_parse"), |b| {
            b.iter(|| redis::parse_redis_value(black_box(&bytes)).unwrap())
        });
    }
    group.finish();
}

fn command(c: &mut Criterion) {
    let limits = Limits::default();
    let mut group = c.benchmark_group("command");
    let commands: [(&str, &[&str]); 3] = [
        ("get", &["GET", "key:000000000001"]),
        ("set", &["SET", "key:000000000001", "xxx"]),
        // redis-benchmark's MSET: ten pairs.
        (
            "mset",
            &[
                "MSET", "key:1", "xxx", "key:2", "xxx", "key:3", "xxx", "key:4", "xxx", "key:5",
                "xxx", "key:6", "xxx", "key:7", "xxx", "key:8", "xxx", "key:9", "xxx", "key:10",
                "xxx",
            ],
        ),
    ];
    for (name, argv) in commands {
        let mut encoded = BytesMut::new();
        encode_command(argv, &mut encoded);
        group.bench_function(format!("{name}/tollgate"), |b| {
            b.iter_batched(
                || encoded.clone(),
                |mut buf| parse_command(&mut buf, &limits).unwrap(),
                BatchSize::SmallInput,
            )
        });
        group.bench_function(format!("{name}/redis_rs"), |b| {
            b.iter(|| redis::parse_redis_value(black_box(&encoded)).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, reply, command);
criterion_main!(benches);
