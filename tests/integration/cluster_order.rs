//! A client's order through a slot's moves (issue 34): one slot moves back and forth between two
//! masters (`SETSLOT … IMPORTING/MIGRATING`, `MIGRATE … KEYS` in small batches, `SETSLOT … NODE`)
//! while clients pipeline (1, 50 and 1,000 commands a write) `INCR`s, `SET`/`GET` read-backs and
//! `MSET`/`MGET` read-backs on keys of that slot through the daemon. Afterwards:
//!
//! - no `INCR` reply is lower than an earlier one of the same client for the same key (a client's
//!   own counters go up by exactly one each time), and every counter holds the number of
//!   acknowledged `INCR`s;
//! - every `GET`/`MGET` reads the last value the client's acknowledged `SET`/`MSET` wrote;
//! - `MIGRATE` never met `BUSYKEY` (no key was written on the importing node while the source
//!   still held it), and at the end the slot's keys are on its owner alone (`COUNTKEYSINSLOT` on
//!   every master, and `ASKING` + `EXISTS` of every key on both, the slot importing on the other);
//! - `/metrics` counted the redirects (`cluster_redirects_total`) while the slot moved.
//!
//! The moves: `TOLLGATE_ORDER_MOVES` (default 100).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_lanes::{Slot, Splitting};
use tollgate_resp::{Frame, Limits};
use tollgate_testkit::RedisCluster;

use crate::cluster::cluster;
use crate::support::daemon::TestDaemon;

/// The clients' pipeline depths.
const DEPTHS: [usize; 4] = [1, 50, 1000, 1000];
/// Counters each client increments alone, and counters every client increments.
const OWN: usize = 4;
const SHARED: usize = 2;

fn moves() -> usize {
    std::env::var("TOLLGATE_ORDER_MOVES")
        .ok()
        .and_then(|moves| moves.parse().ok())
        .unwrap_or(100)
}

/// One pipelined command and what its reply is checked against.
enum Op {
    Incr(String),
    Set(String, u64),
    Get(String),
    MSet([String; 2], u64),
    MGet([String; 2]),
}

impl Op {
    fn argv(&self) -> Vec<String> {
        let words = |w: &[&str]| w.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        match self {
            Op::Incr(key) => words(&["INCR", key]),
            Op::Set(key, value) => words(&["SET", key, &value.to_string()]),
            Op::Get(key) => words(&["GET", key]),
            Op::MSet([a, b], value) => {
                let value = value.to_string();
                words(&["MSET", a, &value, b, &value])
            }
            Op::MGet([a, b]) => words(&["MGET", a, b]),
        }
    }
}

/// What one client saw.
#[derive(Debug, Default)]
struct Seen {
    replies: u64,
    /// Acknowledged INCRs per key.
    incrs: BTreeMap<String, i64>,
    /// INCR replies lower than or equal to an earlier one for the same key (for the client's own
    /// keys: not exactly one more).
    out_of_order: u64,
    /// Read-backs that did not read the last acknowledged write.
    stale_reads: u64,
    /// Errors by their first word and command.
    errors: BTreeMap<String, u64>,
    first_problem: Option<String>,
}

impl Seen {
    fn problem(&mut self, what: String) {
        self.first_problem.get_or_insert(what);
    }
}

fn value_of(frame: &Frame) -> Option<u64> {
    match frame {
        Frame::Bulk(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

/// One client: pipelines of `depth` commands, each written at once and its replies read in
/// order, until `stop`.
async fn client(
    socket: std::path::PathBuf,
    id: usize,
    depth: usize,
    stop: Arc<AtomicBool>,
) -> Seen {
    let mut stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let own: Vec<String> = (0..OWN).map(|n| format!("{{order}}:c{id}:{n}")).collect();
    let shared: Vec<String> = (0..SHARED)
        .map(|n| format!("{{order}}:shared:{n}"))
        .collect();
    let read_key = format!("{{order}}:r{id}");
    let pair = [format!("{{order}}:m{id}:a"), format!("{{order}}:m{id}:b")];
    let mut seen = Seen::default();
    let mut last_incr: BTreeMap<String, i64> = BTreeMap::new();
    let (mut last_set, mut last_mset): (Option<u64>, Option<u64>) = (None, None);
    let mut step = 0u64;
    let mut buf = BytesMut::new();
    while !stop.load(Ordering::Relaxed) {
        let mut ops = Vec::with_capacity(depth);
        let mut out = BytesMut::new();
        for _ in 0..depth {
            step += 1;
            let op = match step % 10 {
                0..=3 => Op::Incr(own[(step as usize / 10) % OWN].clone()),
                4 | 5 => Op::Incr(shared[(step as usize / 10) % SHARED].clone()),
                6 => Op::Set(read_key.clone(), step),
                7 => Op::Get(read_key.clone()),
                8 => Op::MSet(pair.clone(), step),
                _ => Op::MGet(pair.clone()),
            };
            tollgate_resp::encode_command(&op.argv(), &mut out);
            ops.push(op);
        }
        stream.write_all(&out).await.unwrap();
        for op in ops {
            let frame = loop {
                if let Some(frame) = tollgate_resp::parse(&mut buf, &Limits::default()).unwrap() {
                    break frame;
                }
                assert!(
                    stream.read_buf(&mut buf).await.unwrap() > 0,
                    "the daemon hung up"
                );
            };
            seen.replies += 1;
            if let Frame::Error(text) = &frame {
                let text = String::from_utf8_lossy(text);
                let word = text.split(' ').next().unwrap_or_default().to_owned();
                let name = op.argv()[0].clone();
                *seen.errors.entry(format!("{name} {word}")).or_default() += 1;
                seen.problem(format!("{name}: {text}"));
                continue;
            }
            match op {
                Op::Incr(key) => {
                    let Frame::Integer(value) = frame else {
                        panic!("INCR {key}: {frame:?}");
                    };
                    *seen.incrs.entry(key.clone()).or_default() += 1;
                    let before = last_incr.insert(key.clone(), value).unwrap_or(0);
                    let own_key = own.contains(&key);
                    if (own_key && value != before + 1) || value <= before {
                        seen.out_of_order += 1;
                        seen.problem(format!("INCR {key}: {value} after {before}"));
                    }
                }
                Op::Set(_, value) => {
                    assert!(matches!(frame, Frame::Simple(_)), "SET: {frame:?}");
                    last_set = Some(value);
                }
                Op::Get(key) => {
                    if value_of(&frame) != last_set {
                        seen.stale_reads += 1;
                        seen.problem(format!("GET {key}: {frame:?}, wrote {last_set:?}"));
                    }
                }
                Op::MSet(_, value) => {
                    assert!(matches!(frame, Frame::Simple(_)), "MSET: {frame:?}");
                    last_mset = Some(value);
                }
                Op::MGet(keys) => {
                    let Frame::Array(values) = &frame else {
                        panic!("MGET: {frame:?}");
                    };
                    if values.iter().any(|v| value_of(v) != last_mset) {
                        seen.stale_reads += 1;
                        seen.problem(format!("MGET {keys:?}: {frame:?}, wrote {last_mset:?}"));
                    }
                }
            }
        }
    }
    seen
}

/// What moving the slot met.
#[derive(Debug, Default)]
struct Moves {
    moves: usize,
    keys_moved: usize,
    busykey: usize,
}

/// `MIGRATE … KEYS` of every key of `slot` on `from`, in batches of 10 with a pause between, so
/// that the clients meet the slot half moved (ASK for the moved keys, TRYAGAIN for MGET/MSET).
/// A `BUSYKEY` (the key already on `to`) is counted, and the key migrated with `REPLACE`.
fn migrate(cluster: &RedisCluster, slot: u16, from: usize, to: usize, seen: &mut Moves) {
    let slot = slot.to_string();
    let port = cluster.node(to).port().to_string();
    loop {
        let keys = match cluster.call(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "10"]) {
            Frame::Array(keys) => keys,
            other => panic!("GETKEYSINSLOT: {other:?}"),
        };
        if keys.is_empty() {
            return;
        }
        let keys: Vec<String> = keys
            .iter()
            .map(|k| match k {
                Frame::Bulk(k) => String::from_utf8_lossy(k).into_owned(),
                other => panic!("a key: {other:?}"),
            })
            .collect();
        // The target's `default` user is off (testkit): MIGRATE logs in as testkit's admin.
        let auth = [
            "AUTH2",
            tollgate_testkit::ADMIN_USER,
            tollgate_testkit::admin_password(),
        ];
        let mut argv = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000"];
        argv.extend(auth);
        argv.push("KEYS");
        argv.extend(keys.iter().map(String::as_str));
        match cluster.call(from, &argv) {
            Frame::Simple(_) => seen.keys_moved += keys.len(),
            // Redis passes the target's refusal on: `ERR Target instance replied with error:
            // BUSYKEY …`.
            Frame::Error(text) if text.windows(7).any(|w| w == b"BUSYKEY") => {
                seen.busykey += 1;
                let mut argv = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "REPLACE"];
                argv.extend(auth);
                argv.push("KEYS");
                argv.extend(keys.iter().map(String::as_str));
                assert!(matches!(cluster.call(from, &argv), Frame::Simple(_)));
            }
            other => panic!("MIGRATE: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Moves `slot` between masters `a` and `b`, `moves` times.
fn reshard(cluster: &RedisCluster, slot: u16, (a, b): (usize, usize), moves: usize) -> Moves {
    let mut seen = Moves::default();
    for _ in 0..moves {
        let from = cluster.master_of(slot);
        let to = if from == a { b } else { a };
        cluster.begin_migration(slot, from, to);
        std::thread::sleep(Duration::from_millis(5));
        migrate(cluster, slot, from, to, &mut seen);
        cluster.finish_migration(slot, to);
        seen.moves += 1;
        // A pause between moves. Back to back (a move every few milliseconds on loopback), two
        // whole moves fit inside one of the daemon's round trips on a loaded machine, the one
        // window Redis's ASK leaves (docs/cluster.md, "What is left").
        std::thread::sleep(Duration::from_millis(20));
    }
    seen
}

/// Whether `key` exists on `node` when asked after `ASKING` (so an importing node answers too).
fn exists_asking(cluster: &RedisCluster, node: usize, key: &str) -> Frame {
    let mut stream = std::os::unix::net::UnixStream::connect(cluster.node(node).socket()).unwrap();
    tollgate_testkit::login(&mut stream);
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(&["ASKING"], &mut out);
    tollgate_resp::encode_command(&["EXISTS", key], &mut out);
    stream.write_all(&out).unwrap();
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut chunk = [0u8; 4096];
    while frames.len() < 2 {
        match tollgate_resp::parse(&mut buf, &Limits::default()).unwrap() {
            Some(frame) => frames.push(frame),
            None => {
                let n = stream.read(&mut chunk).unwrap();
                assert!(n > 0);
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
    frames.pop().unwrap()
}

/// The value of `cluster_redirects_total` summed over the lines whose labels contain `filter`.
fn redirects(metrics: &str, filter: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("tollgate_cluster_redirects_total{") && line.contains(filter)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_clients_keep_their_order_while_their_slot_moves_back_and_forth() {
    let cluster = Arc::new(cluster().await);
    // Room for every client's whole pipeline in flight: the lane's ceiling is not under test.
    let daemon = TestDaemon::start_cluster_with(&cluster, Splitting::Split, |config| {
        config.lanes.regular.in_flight = Some(8192);
    })
    .await;
    let slot = Slot::of(b"{order}").number();
    let first = cluster.master_of(slot);
    let masters = cluster.masters();
    let other = *masters.iter().find(|&&m| m != first).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = DEPTHS
        .iter()
        .enumerate()
        .map(|(id, &depth)| tokio::spawn(client(daemon.resp_socket(), id, depth, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let moves = moves();
    let mover = tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || reshard(&cluster, slot, (first, other), moves)
    });
    // /metrics while the slot moves: the redirects are counted as they happen.
    let during = Arc::new(Mutex::new(0u64));
    while !mover.is_finished() {
        let metrics = daemon.get("/metrics").await.body;
        *during.lock().unwrap() = redirects(&metrics, "kind=\"ask\"");
        if *during.lock().unwrap() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let moved = mover.await.expect("the slot moved");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);

    let mut total = Seen::default();
    let mut problems = Vec::new();
    for (depth, client) in DEPTHS.iter().zip(clients) {
        let seen = client.await.unwrap();
        eprintln!(
            "depth {depth}: {} replies, {} INCRs, {} out of order, {} stale reads, errors {:?}",
            seen.replies,
            seen.incrs.values().sum::<i64>(),
            seen.out_of_order,
            seen.stale_reads,
            seen.errors
        );
        total.replies += seen.replies;
        total.out_of_order += seen.out_of_order;
        total.stale_reads += seen.stale_reads;
        for (key, n) in seen.incrs {
            *total.incrs.entry(key).or_default() += n;
        }
        for (kind, n) in seen.errors {
            *total.errors.entry(kind).or_default() += n;
        }
        problems.extend(seen.first_problem);
    }
    let metrics = daemon.get("/metrics").await.body;
    let by_kind: Vec<(&str, u64)> = ["moved", "ask", "tryagain", "clusterdown", "resent"]
        .into_iter()
        .map(|kind| (kind, redirects(&metrics, &format!("kind=\"{kind}\""))))
        .collect();
    eprintln!(
        "{moved:?}; {} replies; redirects {by_kind:?} (ask seen during the moves: {}); \
         first problems {problems:?}",
        total.replies,
        during.lock().unwrap()
    );
    assert_eq!(moved.moves, moves);
    assert!(total.replies > 10_000, "the load ran: {}", total.replies);
    assert_eq!(
        total.out_of_order, 0,
        "INCR replies out of order: {problems:?}"
    );
    assert_eq!(total.stale_reads, 0, "stale read-backs: {problems:?}");
    assert_eq!(
        moved.busykey, 0,
        "MIGRATE met BUSYKEY: a key was on both nodes"
    );
    // Only TRYAGAIN may reach a client, for which nothing ran: Redis's own for a multi-key
    // command on a slot half moved (rule 3), or the daemon's after MAX_REDIRECTS.
    for kind in total.errors.keys() {
        assert!(
            kind.ends_with(" TRYAGAIN"),
            "errors: {:?}, {problems:?}",
            total.errors
        );
    }
    assert!(
        *during.lock().unwrap() > 0,
        "no ASK counted during the moves"
    );

    // Every counter holds the acknowledged INCRs, on the slot's owner alone.
    let owner = cluster.master_of(slot);
    let elsewhere = if owner == first { other } else { first };
    for (key, acked) in &total.incrs {
        let stored = cluster.call(owner, &["GET", key]);
        assert_eq!(value_of(&stored), Some(*acked as u64), "{key}");
    }
    let keys = total.incrs.len() + 3 * DEPTHS.len();
    for master in masters {
        let count = cluster.inline(master, &format!("CLUSTER COUNTKEYSINSLOT {slot}"));
        let expected = if master == owner { keys } else { 0 };
        assert_eq!(
            count,
            format!(":{expected}\r\n"),
            "keys of the slot on node {master}"
        );
    }
    // And asked as a migration would: with the slot importing on the other node, `ASKING` +
    // `EXISTS` finds none of the keys there.
    cluster.begin_migration(slot, owner, elsewhere);
    for key in total.incrs.keys() {
        assert_eq!(
            exists_asking(&cluster, elsewhere, key),
            Frame::Integer(0),
            "{key}"
        );
        assert_eq!(
            exists_asking(&cluster, owner, key),
            Frame::Integer(1),
            "{key}"
        );
    }
    daemon.stop().await;
}
