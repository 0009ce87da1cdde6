//! Whole-keyspace commands on a real local cluster (3 masters, a replica each), through the daemon's
//! one socket: `SCAN` walks every master with one cursor, `DBSIZE` sums them, `KEYS` gathers them,
//! `RANDOMKEY` draws from them and `FLUSHDB` empties each — over the keys the caller may touch.

use std::collections::BTreeSet;

use redis::AsyncCommands;
use tollgate_lanes::{Slot, Splitting};
use tollgate_resp::Frame;
use tollgate_testkit::RedisCluster;

use crate::cluster::{client, cluster, keys_on_every_master};
use crate::session_compat::ALLOW_ALL;
use crate::support::daemon::{tempdir, TestDaemon};
use crate::support::raw::{text, RawClient};

const SCOPED: &str = r#"
principals:
  local: { any: true }
rules:
  - id: whole-keyspace
    commands: [KEYS, SCAN, DBSIZE, RANDOMKEY, FLUSHDB, FLUSHALL]
    allow: whole-keyspace commands, which see only this client's keys
  - id: app-keys
    commands: ["@read", "@write", "@keyspace", "@hash"]
    keys: ["app:*"]
    allow: the app's own keys
"#;

/// The daemon on `cluster` under `policy`; the policy's directory lives as long as the daemon.
async fn daemon_with(cluster: &RedisCluster, policy: &str) -> (TestDaemon, tempfile::TempDir) {
    let dir = tempdir();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, policy).expect("write the policy");
    let daemon = TestDaemon::start_cluster_with(cluster, Splitting::Split, |config| {
        config.policy.files = vec![file]
    })
    .await;
    (daemon, dir)
}

/// Sets each of `keys` to `v` on its slot's master directly, past the daemon.
fn set_directly(cluster: &RedisCluster, keys: &[String]) {
    for key in keys {
        let owner = cluster.master_of(Slot::of(key.as_bytes()).number());
        assert_eq!(cluster.inline(owner, &format!("SET {key} v")), "+OK\r\n");
    }
}

/// A node's own `DBSIZE`.
fn node_size(cluster: &RedisCluster, node: usize) -> usize {
    let reply = cluster.inline(node, "DBSIZE");
    let digits = reply.trim().trim_start_matches(':');
    digits
        .parse()
        .unwrap_or_else(|_| panic!("DBSIZE: {reply:?}"))
}

/// Every key a whole `SCAN 0 <options>` loop returns, in the order returned (repeats kept), and the
/// rounds it took; the cursor is parsed as the u64 clients parse.
async fn scan_all(
    conn: &mut redis::aio::MultiplexedConnection,
    from: u64,
    options: &[&str],
) -> (Vec<String>, usize) {
    let (mut keys, mut rounds, mut cursor) = (Vec::new(), 0, from);
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg(options)
            .query_async(conn)
            .await
            .expect("SCAN answers");
        keys.extend(page);
        rounds += 1;
        cursor = next;
        if cursor == 0 {
            return (keys, rounds);
        }
        assert!(rounds < 10_000, "the scan never ends");
    }
}

fn sorted(keys: &[String]) -> Vec<String> {
    let mut keys = keys.to_vec();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keyspace_scan_visits_every_touchable_key_on_every_master_exactly_once() {
    let cluster = cluster().await;
    let (daemon, _policy) = daemon_with(&cluster, SCOPED).await;
    let mut conn = client(&daemon).await;
    let app = keys_on_every_master(&cluster, "app", 100);
    let pairs: Vec<(&String, &str)> = app.iter().map(|key| (key, "v")).collect();
    let () = conn.mset(&pairs).await.unwrap();
    // Keys the caller may not touch, on every master: never scanned.
    set_directly(&cluster, &keys_on_every_master(&cluster, "other", 10));
    for master in cluster.masters() {
        assert!(
            node_size(&cluster, master) >= 110,
            "every master holds keys"
        );
    }

    let (scanned, rounds) = scan_all(&mut conn, 0, &["COUNT", "10"]).await;
    assert_eq!(
        sorted(&scanned),
        sorted(&app),
        "every app key, each exactly once"
    );
    assert!(
        rounds > 3,
        "COUNT 10 pages through the masters: {rounds} rounds"
    );

    let matching: Vec<String> = app
        .iter()
        .filter(|k| k.starts_with("app:1"))
        .cloned()
        .collect();
    let (scanned, _) = scan_all(&mut conn, 0, &["MATCH", "app:1*", "COUNT", "10"]).await;
    assert_eq!(sorted(&scanned), sorted(&matching), "MATCH on every master");

    // TYPE on every master: hashes whose keys land on each of them.
    let hashes = keys_on_every_master(&cluster, "app:h", 2);
    for key in &hashes {
        let _: usize = conn.hset(key, "f", "v").await.unwrap();
    }
    let (scanned, _) = scan_all(&mut conn, 0, &["TYPE", "hash", "COUNT", "10"]).await;
    assert_eq!(sorted(&scanned), sorted(&hashes), "TYPE on every master");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keyspace_scan_refuses_a_non_numeric_cursor_and_starts_over_from_a_foreign_one() {
    let cluster = cluster().await;
    let (daemon, _policy) = daemon_with(&cluster, ALLOW_ALL).await;
    let keys = keys_on_every_master(&cluster, "k", 20);
    set_directly(&cluster, &keys);
    let mut raw = RawClient::connect(&daemon.resp_socket()).await;
    for cursor in ["abc", "-1", "18446744073709551616", ""] {
        let reply = raw.call(&["SCAN", cursor]).await;
        assert_eq!(
            reply,
            Frame::Error("ERR invalid cursor".into()),
            "SCAN {cursor:?}"
        );
    }

    // A cursor this daemon never handed out scans from the start. Each one names a master index
    // past the three there are (the low 10 bits), so none can be mistaken for a cursor of these
    // masters, whatever fingerprint their addresses fold to (a cursor with index 0 and a stray
    // fingerprint resumes mid-scan one time in 1024: `keyspace/cursor.rs`'s unit tests cover it).
    let mut conn = client(&daemon).await;
    for from in [u64::MAX, (1 << 20) | (0x2aa << 10) | 3, 7] {
        let (scanned, _) = scan_all(&mut conn, from, &["COUNT", "5"]).await;
        assert_eq!(sorted(&scanned), sorted(&keys), "from {from}");
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keyspace_dbsize_keys_randomkey_and_flushdb_cover_every_master() {
    let cluster = cluster().await;
    let (daemon, _policy) = daemon_with(&cluster, ALLOW_ALL).await;
    let mut conn = client(&daemon).await;
    let keys = keys_on_every_master(&cluster, "all", 40);
    let pairs: Vec<(&String, &str)> = keys.iter().map(|key| (key, "v")).collect();
    let () = conn.mset(&pairs).await.unwrap();

    let masters = cluster.masters();
    let sum: usize = masters.iter().map(|&m| node_size(&cluster, m)).sum();
    assert_eq!(sum, keys.len());
    let size: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(size, sum, "DBSIZE is the masters' sum");

    let all: Vec<String> = conn.keys("*").await.unwrap();
    assert_eq!(sorted(&all), sorted(&keys), "KEYS * gathers every master's");
    let some: Vec<String> = conn.keys("all:1*").await.unwrap();
    let expected: Vec<String> = keys
        .iter()
        .filter(|k| k.starts_with("all:1"))
        .cloned()
        .collect();
    assert_eq!(sorted(&some), sorted(&expected));

    let known: BTreeSet<&String> = keys.iter().collect();
    let mut drawn_from = BTreeSet::new();
    for _ in 0..30 {
        let key: String = redis::cmd("RANDOMKEY")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(known.contains(&key), "RANDOMKEY {key} exists");
        drawn_from.insert(cluster.master_of(Slot::of(key.as_bytes()).number()));
    }
    assert!(
        drawn_from.len() > 1,
        "draws reach more than one master: {drawn_from:?}"
    );

    let () = redis::cmd("FLUSHDB").query_async(&mut conn).await.unwrap();
    for &master in &masters {
        assert_eq!(node_size(&cluster, master), 0, "master {master} is empty");
    }
    let size: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(size, 0);
    let none: Option<String> = redis::cmd("RANDOMKEY")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(none, None, "RANDOMKEY on an empty cluster");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keyspace_commands_act_only_on_the_callers_keys_on_every_master() {
    let cluster = cluster().await;
    let (daemon, _policy) = daemon_with(&cluster, SCOPED).await;
    let mut conn = client(&daemon).await;
    let app = keys_on_every_master(&cluster, "app", 15);
    let pairs: Vec<(&String, &str)> = app.iter().map(|key| (key, "v")).collect();
    let () = conn.mset(&pairs).await.unwrap();
    let other = keys_on_every_master(&cluster, "other", 5);
    set_directly(&cluster, &other);

    let size: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(size, app.len(), "DBSIZE counts the caller's keys only");
    let all: Vec<String> = conn.keys("*").await.unwrap();
    assert_eq!(sorted(&all), sorted(&app));
    for _ in 0..10 {
        let key: String = redis::cmd("RANDOMKEY")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(key.starts_with("app:"), "RANDOMKEY {key} is the caller's");
    }

    let mut raw = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&raw.call(&["FLUSHALL", "ASYNC"]).await), "OK");
    let masters = cluster.masters();
    let left: usize = masters.iter().map(|&m| node_size(&cluster, m)).sum();
    assert_eq!(left, other.len(), "only the other keys are left");
    for key in &other {
        let owner = cluster.master_of(Slot::of(key.as_bytes()).number());
        assert_eq!(cluster.inline(owner, &format!("EXISTS {key}")), ":1\r\n");
    }
    let size: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(size, 0);
    daemon.stop().await;
}

/// A failover mid-scan changes the masters: the scan goes on without an error and, across the
/// change, still returns every key (the cursor made for the old masters restarts from the first
/// of the new ones, so some keys come twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keyspace_a_scan_across_a_failover_still_returns_every_key() {
    let cluster = cluster().await;
    let (daemon, _policy) = daemon_with(&cluster, ALLOW_ALL).await;
    let mut conn = client(&daemon).await;
    let keys = keys_on_every_master(&cluster, "f", 30);
    let pairs: Vec<(&String, &str)> = keys.iter().map(|key| (key, "v")).collect();
    let () = conn.mset(&pairs).await.unwrap();
    let (_, rounds) = scan_all(&mut conn, 0, &["COUNT", "5"]).await;

    // Half way through a scan, the first master's replica takes over.
    let (mut seen, mut cursor) = (Vec::new(), 0u64);
    for _ in 0..rounds / 2 {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg(&["COUNT", "5"])
            .query_async(&mut conn)
            .await
            .unwrap();
        seen.extend(page);
        cursor = next;
    }
    assert_ne!(cursor, 0, "the scan is not over");
    let replica = cluster.replicas_of(cluster.masters()[0])[0];
    tokio::task::block_in_place(|| cluster.failover(replica));

    // Until the daemon's slot map names the promoted replica, its scans do not reach it.
    let scans_on = |node: usize| {
        cluster
            .commandstats(node)
            .get("scan")
            .map_or(0, |c| c.calls)
    };
    for attempt in 0.. {
        let _ = scan_all(&mut conn, 0, &["COUNT", "1000"]).await;
        if scans_on(replica) > 0 {
            break;
        }
        assert!(attempt < 120, "the daemon never learned the new master");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }

    let (rest, _) = scan_all(&mut conn, cursor, &["COUNT", "5"]).await;
    seen.extend(rest);
    let seen: BTreeSet<String> = seen.into_iter().collect();
    let keys: BTreeSet<String> = keys.into_iter().collect();
    assert_eq!(seen, keys, "every key, across the failover");
    daemon.stop().await;
}
