//! Redis Cluster behind the daemon's one socket, against a real local cluster (3 masters, a replica
//! each): cluster-unaware clients (redis-rs without its cluster client, `redis-cli` without `-c`)
//! use it as one server; commands go to their slot's master, multi-key commands are split per
//! slot, and what no one node can serve is refused before anything is sent.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::AsyncCommands;
use tollgate_lanes::{Slot, Splitting};
use tollgate_resp::Frame;
use tollgate_testkit::{Calls, RedisCluster};

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

/// A 3-master cluster with a replica per master, formed off the async runtime.
pub(crate) async fn cluster() -> RedisCluster {
    tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .expect("the cluster starts")
}

pub(crate) async fn client(daemon: &TestDaemon) -> redis::aio::MultiplexedConnection {
    let url = format!("redis+unix://{}", daemon.resp_socket().display());
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the daemon")
}

/// Keys that land on each master of `cluster`, `per_master` of each, named `<prefix>:<n>`.
pub(crate) fn keys_on_every_master(
    cluster: &RedisCluster,
    prefix: &str,
    per_master: usize,
) -> Vec<String> {
    let masters = cluster.masters();
    let mut found: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for n in 0.. {
        let key = format!("{prefix}:{n}");
        let master = cluster.master_of(Slot::of(key.as_bytes()).number());
        let keys = found.entry(master).or_default();
        if keys.len() < per_master {
            keys.push(key);
        }
        if masters
            .iter()
            .all(|m| found.get(m).is_some_and(|k| k.len() == per_master))
        {
            break;
        }
    }
    // Interleaved, so that a split command's parts alternate between nodes.
    let mut keys = Vec::new();
    for i in 0..per_master {
        keys.extend(found.values().map(|k| k[i].clone()));
    }
    keys
}

/// An error's kind as a client sees it: Redis's code (`IOERR`, `TRYAGAIN`), or the client's own
/// kind when the reply was not an error reply.
pub(crate) fn error_kind(error: &redis::RedisError) -> String {
    match error.code() {
        Some(code) => code.to_owned(),
        None => format!("{:?}", error.kind()),
    }
}

/// Every command's calls on every node, summed per command name.
pub(crate) fn calls_everywhere(cluster: &RedisCluster) -> BTreeMap<String, Calls> {
    let mut all: BTreeMap<String, Calls> = BTreeMap::new();
    for node in 0..cluster.nodes().len() {
        for (name, calls) in cluster.commandstats(node) {
            let total = all.entry(name).or_default();
            total.calls += calls.calls;
            total.rejected += calls.rejected;
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_unaware_client_reads_and_writes_keys_on_every_master() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    let mut conn = client(&daemon).await;
    let keys = keys_on_every_master(&cluster, "user", 3);

    for key in &keys {
        let () = conn.set(key, format!("v-{key}")).await.unwrap();
    }
    for key in &keys {
        let value: String = conn.get(key).await.unwrap();
        assert_eq!(value, format!("v-{key}"));
        let owner = cluster.master_of(Slot::of(key.as_bytes()).number());
        assert_eq!(
            cluster.inline(owner, &format!("GET {key}")),
            format!("${}\r\nv-{key}\r\n", key.len() + 2),
            "{key} is stored on its slot's master"
        );
    }

    // MGET across every master: one part per slot, the values back in the client's order.
    let mut asked = keys.clone();
    asked.insert(2, "missing:key".to_owned());
    let values: Vec<Option<String>> = conn.mget(&asked).await.unwrap();
    let expected: Vec<Option<String>> = asked
        .iter()
        .map(|key| (key != "missing:key").then(|| format!("v-{key}")))
        .collect();
    assert_eq!(values, expected);

    // MSET across slots, then EXISTS (a repeated key counts twice, as in Redis) and DEL.
    let pairs: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), "m".to_owned())).collect();
    let () = conn.mset(&pairs).await.unwrap();
    let again: Vec<Option<String>> = conn.mget(&keys).await.unwrap();
    assert!(again.iter().all(|v| v.as_deref() == Some("m")), "{again:?}");
    let mut twice = keys.clone();
    twice.push(keys[0].clone());
    let exists: usize = redis::cmd("EXISTS")
        .arg(&twice)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, keys.len() + 1);
    let deleted: usize = conn.del(&keys).await.unwrap();
    assert_eq!(deleted, keys.len());
    let none: Vec<Option<String>> = conn.mget(&keys).await.unwrap();
    assert!(none.iter().all(Option::is_none), "{none:?}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_across_slots_keeps_its_order() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    let mut conn = client(&daemon).await;
    let keys = keys_on_every_master(&cluster, "pipe", 4);

    let mut pipe = redis::pipe();
    for (n, key) in keys.iter().enumerate() {
        pipe.set(key, n).ignore().incr(key, 1).get(key);
    }
    let got: Vec<usize> = pipe.query_async(&mut conn).await.unwrap();
    let expected: Vec<usize> = (0..keys.len()).flat_map(|n| [n + 1, n + 1]).collect();
    assert_eq!(got, expected);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_slot_requests_are_refused_before_anything_reaches_redis() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    // Learn the slot map and warm the connections, so that what follows is all that is counted.
    assert_eq!(text(&client.call(&["SET", "warm", "1"]).await), "OK");
    let (a, b) = ("{a}x", "{b}x");
    assert_ne!(Slot::of(a.as_bytes()), Slot::of(b.as_bytes()));
    let before = calls_everywhere(&cluster);

    let sunionstore = client.call(&["SUNIONSTORE", a, b]).await;
    let eval = client
        .call(&["EVAL", "return redis.call('GET', KEYS[1])", "2", a, b])
        .await;
    let rename = client.call(&["RENAME", a, b]).await;
    for (what, reply) in [
        ("SUNIONSTORE", &sunionstore),
        ("EVAL", &eval),
        ("RENAME", &rename),
    ] {
        let Frame::Error(error) = reply else {
            panic!("{what} was not refused: {reply:?}")
        };
        let error = String::from_utf8_lossy(error);
        assert!(
            error.starts_with("CROSSSLOT tollgate: keys \"{a}x\" (slot ")
                && error.contains("and \"{b}x\" (slot "),
            "{what}: {error}"
        );
    }

    // A MULTI that queues keys of two slots: the second is refused at queue time, and EXEC fails.
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    assert_eq!(text(&client.call(&["SET", a, "1"]).await), "QUEUED");
    let queued = client.call(&["SET", b, "1"]).await;
    assert!(
        matches!(&queued, Frame::Error(e) if e.starts_with(b"CROSSSLOT tollgate:")),
        "{queued:?}"
    );
    let exec = client.call(&["EXEC"]).await;
    assert!(
        matches!(&exec, Frame::Error(e) if e.starts_with(b"EXECABORT")),
        "{exec:?}"
    );

    let after = calls_everywhere(&cluster);
    for name in ["sunionstore", "eval", "rename", "set"] {
        assert_eq!(
            after.get(name),
            before.get(name),
            "`{name}` reached a node: before {:?}, after {:?}",
            before.get(name),
            after.get(name)
        );
    }
    assert_eq!(
        cluster.inline(
            cluster.master_of(Slot::of(a.as_bytes()).number()),
            "EXISTS {a}x"
        ),
        ":0\r\n",
        "the transaction wrote nothing"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_refused_by_config_is_a_cross_slot_error() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Refuse).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let mget = client.call(&["MGET", "{a}1", "{b}1"]).await;
    assert!(
        matches!(&mget, Frame::Error(e) if e.starts_with(b"CROSSSLOT tollgate:")),
        "{mget:?}"
    );
    // Keys that share a hash tag are one slot, and one command.
    let mset = client.call(&["MSET", "{a}1", "x", "{a}2", "y"]).await;
    assert_eq!(text(&mset), "OK");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_runs_on_its_slot_s_master() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    let mut conn = client(&daemon).await;
    for tag in ["{t1}", "{t2}", "{t3}", "{t4}"] {
        let (first, second) = (format!("{tag}a"), format!("{tag}b"));
        let (set, incr, got): (String, i64, String) = redis::pipe()
            .atomic()
            .set(&first, "1")
            .incr(&second, 5)
            .get(&first)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!((set.as_str(), incr, got.as_str()), ("OK", 5, "1"));
        let owner = cluster.master_of(Slot::of(first.as_bytes()).number());
        assert_eq!(
            cluster.inline(owner, &format!("GET {second}")),
            "$1\r\n5\r\n"
        );
    }
    // WATCH pins the connection too: a watched key changed by another client aborts EXEC.
    let mut watcher = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&watcher.call(&["WATCH", "{t1}a"]).await), "OK");
    let () = conn.set("{t1}a", "changed").await.unwrap();
    assert_eq!(text(&watcher.call(&["MULTI"]).await), "OK");
    assert_eq!(
        text(&watcher.call(&["SET", "{t1}a", "mine"]).await),
        "QUEUED"
    );
    assert_eq!(watcher.call(&["EXEC"]).await, Frame::NullArray);
    let value: String = conn.get("{t1}a").await.unwrap();
    assert_eq!(value, "changed");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_run_on_their_keys_slot_and_are_loaded_on_every_master() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    let mut conn = client(&daemon).await;
    let script = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[1])";
    let sha: String = redis::cmd("SCRIPT")
        .arg(&["LOAD", script])
        .query_async(&mut conn)
        .await
        .unwrap();
    for master in cluster.masters() {
        assert_eq!(
            cluster.inline(master, &format!("SCRIPT EXISTS {sha}")),
            "*1\r\n:1\r\n",
            "SCRIPT LOAD reached master {master}"
        );
    }
    for key in keys_on_every_master(&cluster, "script", 1) {
        let got: String = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg(&key)
            .arg("ran")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(got, "ran");
        let owner = cluster.master_of(Slot::of(key.as_bytes()).number());
        assert_eq!(
            cluster.inline(owner, &format!("GET {key}")),
            "$3\r\nran\r\n"
        );
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_pop_waits_on_its_slot_s_master() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    let mut waiter = client(&daemon).await;
    let mut pusher = client(&daemon).await;
    let keys = keys_on_every_master(&cluster, "queue", 1);
    for key in &keys {
        let popped = tokio::spawn({
            let (mut waiter, key) = (waiter.clone(), key.clone());
            async move {
                let popped: Option<(String, String)> = waiter.blpop(&key, 10.0).await.unwrap();
                popped
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _: usize = pusher.rpush(key, "job").await.unwrap();
        let popped = tokio::time::timeout(Duration::from_secs(10), popped)
            .await
            .expect("the pop returned")
            .unwrap();
        assert_eq!(popped, Some((key.clone(), "job".to_owned())));
    }
    let _: Option<(String, String)> = waiter.blpop(&keys[0], 0.1).await.unwrap();
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_looks_like_one_standalone_server_to_its_clients() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert!(cluster
        .inline(0, "INFO server")
        .contains("redis_mode:cluster"));

    let server = text(&client.call(&["INFO", "server"]).await);
    assert!(server.contains("redis_mode:standalone"), "{server}");
    assert!(!server.contains("redis_mode:cluster"), "{server}");
    let info = text(&client.call(&["INFO", "cluster"]).await);
    assert!(info.contains("cluster_enabled:0"), "{info}");

    // A cluster client's connection state would land on a connection other clients share.
    for words in [&["ASKING"][..], &["READONLY"], &["READWRITE"]] {
        let reply = client.call(words).await;
        assert_eq!(
            reply,
            Frame::Error("ERR This instance has cluster support disabled".into()),
            "{words:?}"
        );
    }
    let before = calls_everywhere(&cluster);
    let refused = client.call(&["CLUSTER", "SLOTS"]).await;
    assert!(
        matches!(&refused, Frame::Error(e) if e.starts_with(b"NOPERM")),
        "{refused:?}"
    );
    let after = calls_everywhere(&cluster);
    assert_eq!(before.get("readonly"), after.get("readonly"));
    assert_eq!(before.get("cluster|slots"), after.get("cluster|slots"));
    daemon.stop().await;
}

/// `redis-cli` without `-c` (it follows no redirect, so any redirect it saw would be an error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_without_cluster_mode_runs_multi_key_commands_across_slots() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    let keys = keys_on_every_master(&cluster, "cli", 2);
    let cli = |args: Vec<String>| {
        let socket = daemon.resp_socket();
        async move {
            let output = tokio::process::Command::new("redis-cli")
                .arg("-s")
                .arg(&socket)
                .args(&args)
                .output()
                .await
                .expect("redis-cli runs");
            String::from_utf8_lossy(&output.stdout).trim().to_owned()
        }
    };
    let mut mset = vec!["MSET".to_owned()];
    for key in &keys {
        mset.extend([key.clone(), format!("cli-{key}")]);
    }
    assert_eq!(cli(mset).await, "OK");
    let mut mget = vec!["MGET".to_owned()];
    mget.extend(keys.iter().cloned());
    let values: Vec<String> = keys.iter().map(|key| format!("cli-{key}")).collect();
    assert_eq!(cli(mget).await, values.join("\n"));
    assert_eq!(cli(vec!["GET".into(), keys[1].clone()]).await, values[1]);
    let mut del = vec!["DEL".to_owned()];
    del.extend(keys.iter().cloned());
    assert_eq!(cli(del).await, keys.len().to_string());
    daemon.stop().await;
}

#[test]
fn a_cluster_section_is_checked_at_its_file_line_and_column() {
    let path = std::path::Path::new("tollgate.yaml");
    let config = tollgate::config::Config::parse(
        path,
        "redis:\n  cluster:\n    addresses: ['127.0.0.1:7000', 'unix:/run/n2.sock']\n    retry_for: 2s\n",
    )
    .unwrap();
    assert_eq!(
        config.redis.as_ref().map(tollgate_lanes::Topology::from),
        Some(tollgate_lanes::Topology::Cluster {
            seeds: vec![
                "127.0.0.1:7000".parse().unwrap(),
                "unix:/run/n2.sock".parse().unwrap()
            ],
            split: Splitting::Split,
            retry_for: Duration::from_secs(2),
        })
    );
    // The section's own errors point at the section; an unknown key at the key.
    for (yaml, at, expected) in [
        (
            "listen: {}\nredis:\n  cluster:\n    addresses: []\n",
            "tollgate.yaml:3:",
            "at least one node",
        ),
        (
            "listen: {}\nredis:\n  address: unix:/r.sock\n  cluster:\n    addresses: ['h:1']\n",
            "tollgate.yaml:3:",
            "not several",
        ),
        (
            "listen: {}\nredis:\n  cluster:\n    addresses: ['h:1']\n    split: no\n",
            "tollgate.yaml:5:5:",
            "unknown field `split`",
        ),
    ] {
        let error = tollgate::config::Config::parse(path, yaml)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with(at), "{error}");
        assert!(error.contains(expected), "{error}");
    }
}
