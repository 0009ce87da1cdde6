//! The near cache (issue 29, docs/cache.md) against a real `redis-server`: hits are served without
//! Redis, a direct client's write is seen once Redis's invalidation arrives, a write through the
//! daemon is seen at once, `FLUSHALL` and a killed tracking connection empty the cache (which then
//! fills again), admission runs before every hit, `max_bytes` holds, and a reader never sees a
//! value older than one it saw while a direct writer hammers the key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::config::CacheConfig;
use tollgate_model::ByteSize;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::identity::{daemon_for_all, os_user, redis_cli, USER_B};
use crate::support::daemon::TestDaemon;
use crate::support::raw::RawClient;

/// How long Redis's invalidation, or a reconnect, may take to reach the daemon here.
const PATIENCE: Duration = Duration::from_secs(10);

/// Root is `app` and may do anything; `other` may not read `secret:*`.
fn policy(other_uid: u32) -> String {
    format!(
        r#"
principals:
  app: {{ uids: [0] }}
  other: {{ uids: [{other_uid}] }}
rules:
  - id: no-secrets
    principals: [other]
    commands: ["@read"]
    keys: ["secret:*"]
    deny: secrets are app's
  - id: everything
    commands: ["*"]
    allow: the cache tests judge the cache, not commands
"#
    )
}

fn cache(max_bytes: usize, max_entry_bytes: usize) -> CacheConfig {
    CacheConfig {
        keys: vec![
            "user:*".into(),
            "secret:*".into(),
            "big:*".into(),
            "hot:*".into(),
        ],
        max_bytes: ByteSize(max_bytes),
        max_entry_bytes: ByteSize(max_entry_bytes),
        max_staleness: Duration::from_secs(60),
    }
}

async fn cache_daemon(redis: &RedisServer, other_uid: u32, cache: CacheConfig) -> TestDaemon {
    let path = redis.dir().join("cache-policy.yaml");
    std::fs::write(&path, policy(other_uid)).expect("write the policy");
    daemon_for_all(redis, |config| {
        config.policy.files = vec![path];
        config.cache = cache;
    })
    .await
}

/// An unused uid for `other` where no second user is needed.
const NOBODY: u32 = 65533;

fn bulk(text: &str) -> Frame {
    Frame::Bulk(bytes::Bytes::copy_from_slice(text.as_bytes()))
}

/// The value of the metric line named exactly `name` (labels included), 0 when absent.
async fn metric(daemon: &TestDaemon, name: &str) -> f64 {
    let body = daemon.get("/metrics").await.body;
    body.lines()
        .find_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            (key == name).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// How many GETs Redis has run (`INFO commandstats`).
async fn redis_gets(direct: &mut RawClient) -> u64 {
    redis_calls(direct, "get").await
}

/// How many times Redis has run `command` (lower case, as `INFO commandstats` names it).
async fn redis_calls(direct: &mut RawClient, command: &str) -> u64 {
    let info = direct.call(&["INFO", "commandstats"]).await;
    let info = crate::support::raw::text(&info);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a count"))
}

/// Reads `key` through the daemon until it is `want`, within [`PATIENCE`].
async fn until_seen(client: &mut RawClient, key: &str, want: &Frame) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let got = client.call(&["GET", key]).await;
        if &got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "GET {key} is still {got:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls the metric `name` until `ok` holds of it, within [`PATIENCE`].
async fn until_metric(daemon: &TestDaemon, name: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let value = metric(daemon, name).await;
        if ok(value) {
            return value;
        }
        assert!(Instant::now() < deadline, "{name} stayed at {value}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads `key` until a read is a hit (the tracking connection opens in the background).
async fn until_hit(daemon: &TestDaemon, client: &mut RawClient, key: &str, want: &Frame) {
    until_read_hits(daemon, client, &["GET", key], want).await;
}

/// Sends the read `argv`, answered `want` each time, until one is a hit.
async fn until_read_hits(daemon: &TestDaemon, client: &mut RawClient, argv: &[&str], want: &Frame) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let hits = metric(daemon, "tollgate_cache_hits_total").await;
        assert_eq!(&client.call(argv).await, want);
        if metric(daemon, "tollgate_cache_hits_total").await > hits {
            return;
        }
        assert!(Instant::now() < deadline, "{argv:?} never hit the cache");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_hit_is_served_without_redis_and_a_direct_write_is_seen_once_its_invalidation_arrives() {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    direct.call(&["SET", "user:1", "first"]).await;
    until_hit(&daemon, &mut client, "user:1", &bulk("first")).await;

    // Hits do not reach Redis.
    let before = redis_gets(&mut direct).await;
    for _ in 0..20 {
        assert_eq!(client.call(&["GET", "user:1"]).await, bulk("first"));
    }
    assert_eq!(
        redis_gets(&mut direct).await,
        before,
        "hits ran GET on Redis"
    );

    // A missing key is cached as missing, and a RESP3 client gets RESP3's null.
    until_hit(&daemon, &mut client, "user:none", &Frame::Null).await;
    let mut resp3 = RawClient::connect(&daemon.resp_socket()).await;
    assert!(matches!(resp3.call(&["HELLO", "3"]).await, Frame::Map(_)));
    let raw = {
        resp3.send(&["GET", "user:none"]).await;
        resp3.read_raw().await
    };
    assert_eq!(&raw[..], b"_\r\n");

    // Another client's write, straight to Redis: seen once its invalidation arrives.
    direct.call(&["SET", "user:1", "second"]).await;
    until_seen(&mut client, "user:1", &bulk("second")).await;
    direct.call(&["SET", "user:none", "now"]).await;
    until_seen(&mut client, "user:none", &bulk("now")).await;
    assert!(
        metric(
            &daemon,
            "tollgate_cache_invalidations_total{cause=\"redis\"}"
        )
        .await
            >= 1.0
    );
    // A wrong type is Redis's error, passed on and never kept.
    direct.call(&["LPUSH", "user:list", "x"]).await;
    for _ in 0..2 {
        let reply = client.call(&["GET", "user:list"]).await;
        assert!(
            crate::support::raw::text(&reply).starts_with("WRONGTYPE"),
            "{reply:?}"
        );
    }
    daemon.stop().await;
}

/// `STRLEN` and `EXISTS` of cacheable keys are answered from the entries `GET`s filled, without
/// Redis; a key without an entry goes to Redis and fills nothing; a direct write is seen once its
/// invalidation arrives.
#[tokio::test]
async fn strlen_and_exists_are_answered_from_the_entries_gets_filled() {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    direct.call(&["SET", "user:1", "hello"]).await;
    direct.call(&["SET", "user:2", "never read by GET"]).await;
    until_hit(&daemon, &mut client, "user:1", &bulk("hello")).await;
    until_hit(&daemon, &mut client, "user:none", &Frame::Null).await;

    let hits = metric(&daemon, "tollgate_cache_hits_total").await;
    assert_eq!(client.call(&["STRLEN", "user:1"]).await, Frame::Integer(5));
    assert_eq!(
        client.call(&["STRLEN", "user:none"]).await,
        Frame::Integer(0)
    );
    assert_eq!(
        client
            .call(&["EXISTS", "user:1", "user:none", "user:1"])
            .await,
        Frame::Integer(2),
        "each key counted as often as it is named"
    );
    assert_eq!(
        redis_calls(&mut direct, "strlen").await,
        0,
        "hits ran STRLEN"
    );
    assert_eq!(
        redis_calls(&mut direct, "exists").await,
        0,
        "hits ran EXISTS"
    );
    assert_eq!(
        metric(&daemon, "tollgate_cache_hits_total").await,
        hits + 5.0
    );

    // A key without an entry: Redis answers, every time (nothing is filled for it).
    for round in 1..=2 {
        assert_eq!(client.call(&["STRLEN", "user:2"]).await, Frame::Integer(17));
        assert_eq!(
            client.call(&["EXISTS", "user:1", "user:2"]).await,
            Frame::Integer(2)
        );
        assert_eq!(redis_calls(&mut direct, "strlen").await, round);
        assert_eq!(redis_calls(&mut direct, "exists").await, round);
    }

    // Another client's write and delete, straight to Redis: never answered from the old entry
    // once its invalidation arrived.
    direct.call(&["SET", "user:1", "hi"]).await;
    let deadline = Instant::now() + PATIENCE;
    while client.call(&["STRLEN", "user:1"]).await != Frame::Integer(2) {
        assert!(Instant::now() < deadline, "STRLEN user:1 stayed stale");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    direct.call(&["DEL", "user:1"]).await;
    let deadline = Instant::now() + PATIENCE;
    while client.call(&["EXISTS", "user:1"]).await != Frame::Integer(0) {
        assert!(Instant::now() < deadline, "EXISTS user:1 stayed stale");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    daemon.stop().await;
}

/// `MGET` of cacheable keys is answered key by key: hits from the cache, misses filled; a key of
/// another type is null, as in Redis.
#[tokio::test]
async fn mget_is_answered_key_by_key() {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    direct.call(&["SET", "user:a", "1"]).await;
    direct.call(&["SET", "user:b", "2"]).await;
    direct.call(&["LPUSH", "user:l", "x"]).await;
    until_hit(&daemon, &mut client, "user:a", &bulk("1")).await;
    let mget = ["MGET", "user:a", "user:b", "user:none", "user:l"];
    let want = |b: &str| Frame::Array(vec![bulk("1"), bulk(b), Frame::Null, Frame::Null]);
    assert_eq!(client.call(&mget).await, want("2"));
    // Now user:a, user:b and user:none are kept: only user:l (never kept) is read from Redis.
    let hits = metric(&daemon, "tollgate_cache_hits_total").await;
    let gets = redis_gets(&mut direct).await;
    assert_eq!(client.call(&mget).await, want("2"));
    assert_eq!(
        metric(&daemon, "tollgate_cache_hits_total").await,
        hits + 3.0
    );
    assert_eq!(redis_gets(&mut direct).await, gets + 1);
    // Every key a hit: answered without Redis, in RESP3 too.
    let mut resp3 = RawClient::connect(&daemon.resp_socket()).await;
    assert!(matches!(resp3.call(&["HELLO", "3"]).await, Frame::Map(_)));
    let gets = redis_gets(&mut direct).await;
    resp3.send(&["MGET", "user:a", "user:none"]).await;
    assert_eq!(&resp3.read_raw().await[..], b"*2\r\n$1\r\n1\r\n_\r\n");
    assert_eq!(redis_gets(&mut direct).await, gets);
    // A direct write is seen once its invalidation arrives; a key outside cache.keys is read
    // from Redis as before.
    direct.call(&["SET", "user:b", "3"]).await;
    let deadline = Instant::now() + PATIENCE;
    while client.call(&mget).await != want("3") {
        assert!(Instant::now() < deadline, "MGET still shows the old user:b");
    }
    direct.call(&["SET", "plain", "p"]).await;
    assert_eq!(
        client.call(&["MGET", "user:a", "plain"]).await,
        Frame::Array(vec![bulk("1"), bulk("p")])
    );
    daemon.stop().await;
}

/// `HGET`, `HMGET` and `HGETALL` of a cacheable key: a miss reads the fields asked for (or the
/// whole hash) and keeps them with what the entry knew, so later reads of any of them are hits
/// that Redis never sees; a field never read is read from Redis; a direct `HSET` is seen once its
/// invalidation arrives, an `HSET` through the daemon at once; a missing key answers every hash
/// read from its entry; a string key gets Redis's `WRONGTYPE`; RESP3 gets a map.
#[tokio::test]
async fn hash_reads_are_answered_from_the_fields_kept() {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    direct.call(&["HSET", "user:h", "a", "1", "b", "2"]).await;
    until_read_hits(&daemon, &mut client, &["HGET", "user:h", "a"], &bulk("1")).await;
    let hmgets = redis_calls(&mut direct, "hmget").await;
    // `b` and `zz` are not known yet: one HMGET of the fields asked, then all are hits.
    let asked = ["HMGET", "user:h", "a", "b", "zz"];
    let want = Frame::Array(vec![bulk("1"), bulk("2"), Frame::Null]);
    assert_eq!(client.call(&asked).await, want);
    assert_eq!(redis_calls(&mut direct, "hmget").await, hmgets + 1);
    let hits = metric(&daemon, "tollgate_cache_hits_total").await;
    for _ in 0..5 {
        assert_eq!(client.call(&asked).await, want);
        assert_eq!(client.call(&["HGET", "user:h", "zz"]).await, Frame::Null);
    }
    assert_eq!(
        redis_calls(&mut direct, "hmget").await,
        hmgets + 1,
        "hits reached Redis"
    );
    assert_eq!(
        metric(&daemon, "tollgate_cache_hits_total").await,
        hits + 10.0
    );
    // HGETALL is not known from some fields: read once, then answered, in Redis's order.
    let all = Frame::Array(vec![bulk("a"), bulk("1"), bulk("b"), bulk("2")]);
    assert_eq!(client.call(&["HGETALL", "user:h"]).await, all);
    let hgetalls = redis_calls(&mut direct, "hgetall").await;
    assert_eq!(hgetalls, 1);
    assert_eq!(client.call(&["HGETALL", "user:h"]).await, all);
    assert_eq!(client.call(&["HGET", "user:h", "never"]).await, Frame::Null);
    assert_eq!(
        redis_calls(&mut direct, "hgetall").await,
        1,
        "the whole hash is kept"
    );
    let mut resp3 = RawClient::connect(&daemon.resp_socket()).await;
    assert!(matches!(resp3.call(&["HELLO", "3"]).await, Frame::Map(_)));
    resp3.send(&["HGETALL", "user:h"]).await;
    assert_eq!(
        &resp3.read_raw().await[..],
        b"%2\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$1\r\n2\r\n"
    );

    // A direct write is seen once its invalidation arrives; one through the daemon at once.
    direct.call(&["HSET", "user:h", "a", "10"]).await;
    let deadline = Instant::now() + PATIENCE;
    while client.call(&["HGET", "user:h", "a"]).await != bulk("10") {
        assert!(Instant::now() < deadline, "HGET user:h a stayed stale");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(client.call(&["HGET", "user:h", "b"]).await, bulk("2"));
    let mut neighbour = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(neighbour.call(&["HGET", "user:h", "b"]).await, bulk("2"));
    assert_eq!(
        client.call(&["HSET", "user:h", "b", "20"]).await,
        Frame::Integer(0)
    );
    assert_eq!(neighbour.call(&["HGET", "user:h", "b"]).await, bulk("20"));
    assert_eq!(
        neighbour.call(&["HDEL", "user:h", "a", "b"]).await,
        Frame::Integer(2)
    );
    assert_eq!(
        client.call(&["HGETALL", "user:h"]).await,
        Frame::Array(vec![])
    );

    // A missing key's entry answers every hash read; a string is Redis's to refuse.
    assert_eq!(
        client.call(&["HGETALL", "user:gone"]).await,
        Frame::Array(vec![])
    );
    let hits = metric(&daemon, "tollgate_cache_hits_total").await;
    assert_eq!(client.call(&["HGET", "user:gone", "x"]).await, Frame::Null);
    assert_eq!(client.call(&["GET", "user:gone"]).await, Frame::Null);
    assert_eq!(
        metric(&daemon, "tollgate_cache_hits_total").await,
        hits + 2.0
    );
    direct.call(&["SET", "user:s", "text"]).await;
    for _ in 0..2 {
        let reply = client.call(&["HGET", "user:s", "f"]).await;
        assert!(
            crate::support::raw::text(&reply).starts_with("WRONGTYPE"),
            "{reply:?}"
        );
    }
    assert_eq!(client.call(&["GET", "user:s"]).await, bulk("text"));
    let reply = client.call(&["HGETALL", "user:s"]).await;
    assert!(
        crate::support::raw::text(&reply).starts_with("WRONGTYPE"),
        "{reply:?}"
    );
    // And a hash's entry does not answer a string read.
    let reply = client.call(&["GET", "user:h2"]).await;
    assert_eq!(reply, Frame::Null);
    direct.call(&["HSET", "user:h3", "f", "v"]).await;
    assert_eq!(client.call(&["HGET", "user:h3", "f"]).await, bulk("v"));
    let reply = client.call(&["GET", "user:h3"]).await;
    assert!(
        crate::support::raw::text(&reply).starts_with("WRONGTYPE"),
        "{reply:?}"
    );
    assert_eq!(client.call(&["EXISTS", "user:h3"]).await, Frame::Integer(1));
    daemon.stop().await;
}

#[tokio::test]
async fn a_write_through_the_daemon_is_seen_at_once_by_every_local_client() {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut reader = RawClient::connect(&daemon.resp_socket()).await;
    let mut writer = RawClient::connect(&daemon.resp_socket()).await;
    writer.call(&["SET", "user:2", "v0"]).await;
    until_hit(&daemon, &mut reader, "user:2", &bulk("v0")).await;
    for round in 1..=200 {
        let value = format!("v{round}");
        // Each kind of write drops the entry before its reply.
        match round % 4 {
            0 => writer.call(&["SET", "user:2", &value]).await,
            1 => writer.call(&["MSET", "user:2", &value, "other", "x"]).await,
            2 => {
                writer.call(&["MULTI"]).await;
                writer.call(&["SET", "user:2", &value]).await;
                writer.call(&["EXEC"]).await
            }
            _ => {
                let script = "return redis.call('SET', KEYS[1], ARGV[1])";
                writer.call(&["EVAL", script, "1", "user:2", &value]).await
            }
        };
        // Read twice: the first may fill, the second may hit; neither is ever the old value.
        for _ in 0..2 {
            assert_eq!(
                reader.call(&["GET", "user:2"]).await,
                bulk(&value),
                "round {round}"
            );
        }
    }
    assert!(metric(&daemon, "tollgate_cache_hits_total").await >= 100.0);
    // The writer's own pipelined SET then GET: the GET is not served ahead of the SET.
    writer
        .pipeline(&[&["SET", "user:2", "mine"], &["GET", "user:2"]])
        .await;
    assert_eq!(writer.read().await, Frame::Simple("OK".into()));
    assert_eq!(writer.read().await, bulk("mine"));
    // A hit answered as it is planned, then a write and a read in the same pipeline: the write
    // is in flight when the second read comes, which goes to Redis behind it.
    until_hit(&daemon, &mut writer, "user:2", &bulk("mine")).await;
    writer
        .pipeline(&[
            &["GET", "user:2"],
            &["SET", "user:2", "after"],
            &["GET", "user:2"],
        ])
        .await;
    assert_eq!(writer.read().await, bulk("mine"));
    assert_eq!(writer.read().await, Frame::Simple("OK".into()));
    assert_eq!(writer.read().await, bulk("after"));
    daemon.stop().await;
}

/// A client tracking its reads (`CLIENT TRACKING`) whose read is a hit of the near cache is told
/// when the key changes, as for a read that reached Redis: the hit is looked up only once the
/// daemon tracks the read.
#[tokio::test]
async fn a_hit_read_by_a_tracking_client_is_invalidated_when_the_key_changes() {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert!(matches!(client.call(&["HELLO", "3"]).await, Frame::Map(_)));
    let on = client.call(&["CLIENT", "TRACKING", "ON"]).await;
    assert_eq!(on, Frame::Simple("OK".into()));
    direct.call(&["SET", "user:7", "v1"]).await;
    until_hit(&daemon, &mut client, "user:7", &bulk("v1")).await;
    let hits = metric(&daemon, "tollgate_cache_hits_total").await;
    // Pipelined reads, the first of them a hit with nothing in flight.
    client
        .pipeline(&[&["GET", "user:7"], &["GET", "user:7"]])
        .await;
    assert_eq!(client.read().await, bulk("v1"));
    assert_eq!(client.read().await, bulk("v1"));
    assert!(metric(&daemon, "tollgate_cache_hits_total").await > hits);
    direct.call(&["SET", "user:7", "v2"]).await;
    let told = client.read_within(PATIENCE).await;
    let invalidate = Frame::Push(vec![bulk("invalidate"), Frame::Array(vec![bulk("user:7")])]);
    assert_eq!(told, Ok(Some(invalidate)));
    until_seen(&mut client, "user:7", &bulk("v2")).await;
    daemon.stop().await;
}

/// Redis's invalidation of a write through the daemon may come well after the write's reply
/// (here it waits behind a large reply on the tracking connection): the entry is dropped all the
/// same before the writer, or anyone, is answered.
#[tokio::test]
async fn a_write_through_the_daemon_does_not_wait_for_redis_s_invalidation() {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut reader = RawClient::connect(&daemon.resp_socket()).await;
    let mut writer = RawClient::connect(&daemon.resp_socket()).await;
    let mut lagger = RawClient::connect(&daemon.resp_socket()).await;
    let huge = "h".repeat(32 << 20);
    direct.call(&["SET", "big:lag", &huge]).await;
    writer.call(&["SET", "user:3", "v0"]).await;
    until_hit(&daemon, &mut reader, "user:3", &bulk("v0")).await;
    for round in 1..=10 {
        // A large fill ahead of the write's invalidation on the tracking connection.
        lagger.send(&["GET", "big:lag"]).await;
        let value = format!("v{round}");
        writer.call(&["SET", "user:3", &value]).await;
        assert_eq!(
            reader.call(&["GET", "user:3"]).await,
            bulk(&value),
            "round {round}"
        );
        assert_eq!(lagger.read().await, bulk(&huge));
        // Kept again for the next round.
        until_hit(&daemon, &mut reader, "user:3", &bulk(&value)).await;
    }
    daemon.stop().await;
}

/// A read that reaches Redis past the cache (here a cacheable GET forwarded because the client
/// has a command in flight) may see a value newer than the entry while Redis's invalidation is
/// still on its way (here held behind a large reply): its reply drops the entry, so that the
/// client never reads the older value after it.
#[tokio::test]
async fn a_client_never_reads_an_older_value_after_a_read_past_the_cache() {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let mut lagger = RawClient::connect(&daemon.resp_socket()).await;
    let huge = "h".repeat(32 << 20);
    direct.call(&["SET", "big:lag", &huge]).await;
    direct.call(&["SET", "user:m", "v0"]).await;
    until_hit(&daemon, &mut client, "user:m", &bulk("v0")).await;
    for round in 1..=10 {
        // A large fill ahead of the write's invalidation on the tracking connection.
        let misses = metric(&daemon, "tollgate_cache_misses_total").await;
        lagger.send(&["GET", "big:lag"]).await;
        until_metric(&daemon, "tollgate_cache_misses_total", |now| now > misses).await;
        let value = format!("v{round}");
        direct.call(&["SET", "user:m", &value]).await;
        // With a command in flight, the GET goes to Redis and sees the new value…
        client
            .pipeline(&[&["SET", "plain", "x"], &["GET", "user:m"]])
            .await;
        assert_eq!(client.read().await, Frame::Simple("OK".into()));
        assert_eq!(client.read().await, bulk(&value), "round {round}");
        // … and the next GET, alone, is not the entry's older one.
        assert_eq!(
            client.call(&["GET", "user:m"]).await,
            bulk(&value),
            "round {round}"
        );
        assert_eq!(lagger.read().await, bulk(&huge));
        until_hit(&daemon, &mut client, "user:m", &bulk(&value)).await;
    }
    assert!(
        metric(
            &daemon,
            "tollgate_cache_invalidations_total{cause=\"read\"}"
        )
        .await
            >= 1.0
    );
    daemon.stop().await;
}

#[tokio::test]
async fn flushall_by_a_direct_client_empties_the_cache() {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    for n in 0..10 {
        direct.call(&["SET", &format!("user:{n}"), "kept"]).await;
    }
    until_hit(&daemon, &mut client, "user:0", &bulk("kept")).await;
    for n in 1..10 {
        client.call(&["GET", &format!("user:{n}")]).await;
    }
    assert_eq!(metric(&daemon, "tollgate_cache_entries").await, 10.0);
    direct.call(&["FLUSHALL"]).await;
    until_metric(&daemon, "tollgate_cache_entries", |entries| entries == 0.0).await;
    for n in 0..10 {
        assert_eq!(
            client.call(&["GET", &format!("user:{n}")]).await,
            Frame::Null
        );
    }
    assert!(
        metric(
            &daemon,
            "tollgate_cache_invalidations_total{cause=\"flush\"}"
        )
        .await
            >= 10.0
    );
    daemon.stop().await;
}

#[tokio::test]
async fn a_killed_tracking_connection_empties_the_cache_which_then_fills_again() {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    direct.call(&["SET", "user:k", "before"]).await;
    until_hit(&daemon, &mut client, "user:k", &bulk("before")).await;

    let list = crate::support::raw::text(&direct.call(&["CLIENT", "LIST"]).await);
    let id = list
        .lines()
        .find(|line| line.contains(" name=tollgate-cache "))
        .and_then(|line| line.strip_prefix("id="))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("no tracking connection in {list}"))
        .to_owned();
    assert_eq!(
        direct.call(&["CLIENT", "KILL", "ID", &id]).await,
        Frame::Integer(1)
    );
    // Written while no connection tracks the key: its invalidation went nowhere.
    direct.call(&["SET", "user:k", "after"]).await;
    until_seen(&mut client, "user:k", &bulk("after")).await;
    assert!(
        metric(
            &daemon,
            "tollgate_cache_invalidations_total{cause=\"connection\"}"
        )
        .await
            >= 1.0
    );
    // A new tracking connection, and the cache serves again, kept correct by it.
    until_hit(&daemon, &mut client, "user:k", &bulk("after")).await;
    direct.call(&["SET", "user:k", "again"]).await;
    until_seen(&mut client, "user:k", &bulk("again")).await;
    daemon.stop().await;
}

#[tokio::test]
async fn a_principal_refused_a_key_is_refused_on_a_hit_too() {
    let Some(other) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, other.uid, cache(1 << 20, 64 << 10)).await;
    let mut app = RawClient::connect(&daemon.resp_socket()).await;
    app.call(&["SET", "secret:x", "hidden"]).await;
    app.call(&["SET", "user:x", "open"]).await;
    until_hit(&daemon, &mut app, "secret:x", &bulk("hidden")).await;
    until_hit(&daemon, &mut app, "user:x", &bulk("open")).await;

    let hits = metric(&daemon, "tollgate_cache_hits_total").await;
    let refused = redis_cli(&other, &daemon, &["GET", "secret:x"]).await;
    assert!(refused.contains("NOPERM"), "{refused}");
    assert!(!refused.contains("hidden"), "{refused}");
    // Its siblings answered from the same entry: refused too, and they tell nothing of it.
    let hget = ["HGET", "secret:x", "f"];
    for read in [&["STRLEN", "secret:x"][..], &["EXISTS", "secret:x"], &hget] {
        let refused = redis_cli(&other, &daemon, read).await;
        assert!(refused.contains("NOPERM"), "{read:?}: {refused}");
    }
    // The same principal reads what it may, from the cache.
    let open = redis_cli(&other, &daemon, &["GET", "user:x"]).await;
    assert_eq!(open.trim(), "open");
    assert_eq!(
        metric(&daemon, "tollgate_cache_hits_total").await,
        hits + 1.0
    );
    daemon.stop().await;
}

#[tokio::test]
async fn max_bytes_holds_under_a_flood_of_distinct_large_values() {
    let redis = RedisServer::start();
    let max_bytes = 256 << 10;
    let daemon = cache_daemon(&redis, NOBODY, cache(max_bytes, 32 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let value = "v".repeat(10 << 10);
    direct.call(&["SET", "big:warm", "x"]).await;
    until_hit(&daemon, &mut client, "big:warm", &bulk("x")).await;
    for n in 0..200 {
        let key = format!("big:{n}");
        direct.call(&["SET", &key, &value]).await;
        assert_eq!(client.call(&["GET", &key]).await, bulk(&value));
        let bytes = metric(&daemon, "tollgate_cache_bytes").await;
        assert!(bytes <= max_bytes as f64, "{bytes} bytes held");
    }
    assert!(metric(&daemon, "tollgate_cache_evictions_total").await >= 150.0);
    // `/v1/cache` agrees, and lists the largest entries.
    let state = daemon.get("/v1/cache").await.json();
    assert_eq!(state["enabled"], true, "{state}");
    assert_eq!(state["cache"]["tracking"], true, "{state}");
    assert_eq!(state["cache"]["max_bytes"], max_bytes, "{state}");
    let held = state["cache"]["bytes"].as_u64().expect("bytes");
    assert!(held <= max_bytes as u64, "{state}");
    let largest = state["cache"]["largest"].as_array().expect("largest");
    assert!(!largest.is_empty() && largest.len() <= 10, "{state}");
    assert!(largest[0]["bytes"].as_u64() > Some(10 << 10), "{state}");
    let entries = metric(&daemon, "tollgate_cache_entries").await;
    assert!((20.0..=25.0).contains(&entries), "{entries} entries");
    // Larger than max_entry_bytes: served, never kept.
    let huge = "h".repeat(64 << 10);
    direct.call(&["SET", "big:huge", &huge]).await;
    for _ in 0..2 {
        assert_eq!(client.call(&["GET", "big:huge"]).await, bulk(&huge));
    }
    assert!(metric(&daemon, "tollgate_cache_fills_total{outcome=\"too_large\"}").await >= 2.0);
    daemon.stop().await;
}

#[tokio::test]
async fn an_entry_is_never_served_older_than_max_staleness() {
    let redis = RedisServer::start();
    let max_staleness = Duration::from_secs(2);
    let config = CacheConfig {
        max_staleness,
        ..cache(1 << 20, 64 << 10)
    };
    let daemon = cache_daemon(&redis, NOBODY, config).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    direct.call(&["SET", "user:aged", "v"]).await;
    until_hit(&daemon, &mut client, "user:aged", &bulk("v")).await;
    // Time passes (that is what is tested): past max_staleness, the entry is not served, though
    // no invalidation came; the read goes to Redis and fills again.
    tokio::time::sleep(max_staleness + Duration::from_millis(100)).await;
    let before = redis_gets(&mut direct).await;
    assert_eq!(client.call(&["GET", "user:aged"]).await, bulk("v"));
    assert_eq!(redis_gets(&mut direct).await, before + 1);
    assert_eq!(client.call(&["GET", "user:aged"]).await, bulk("v"));
    assert_eq!(redis_gets(&mut direct).await, before + 1, "filled again");
    daemon.stop().await;
}

/// Redis sends an expired key's invalidation only when it deletes the key, which its active
/// expiry may do late (here: never, it is turned off); the daemon does not serve the entry past
/// the expiry `PTTL` gave it when it filled.
#[tokio::test]
async fn an_entry_is_not_served_past_its_key_s_expiry() {
    let redis = RedisServer::builder()
        .args_of("--enable-debug-command yes")
        .start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let reply = direct.call(&["DEBUG", "SET-ACTIVE-EXPIRE", "0"]).await;
    assert_eq!(reply, Frame::Simple("OK".into()));
    let ttl = Duration::from_millis(1500);
    let set = Instant::now();
    direct
        .call(&["SET", "user:ttl", "short", "PX", "1500"])
        .await;
    until_hit(&daemon, &mut client, "user:ttl", &bulk("short")).await;
    assert!(
        set.elapsed() < ttl,
        "too slow to test within the key's life"
    );
    // Time passes (that is what is tested), past the key's expiry.
    tokio::time::sleep_until(set + ttl + Duration::from_millis(50)).await;
    assert_eq!(client.call(&["GET", "user:ttl"]).await, Frame::Null);
    // A key without expiry is kept as before.
    direct.call(&["SET", "user:forever", "v"]).await;
    until_hit(&daemon, &mut client, "user:forever", &bulk("v")).await;
    daemon.stop().await;
}

/// A fill unanswered past the command timeout (Redis paused) replaces the tracking connection, as
/// a lane's would be, emptying the cache; once Redis answers again the cache serves again.
#[tokio::test]
async fn a_fill_past_the_command_timeout_replaces_the_tracking_connection() {
    let redis = RedisServer::start();
    let path = redis.dir().join("cache-policy.yaml");
    std::fs::write(&path, policy(NOBODY)).expect("write the policy");
    let daemon = daemon_for_all(&redis, |config| {
        config.policy.files = vec![path];
        config.cache = cache(1 << 20, 64 << 10);
        config.resp.command_timeout = Duration::from_millis(300);
    })
    .await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    direct.call(&["SET", "user:p", "v"]).await;
    until_hit(&daemon, &mut client, "user:p", &bulk("v")).await;
    let before = metric(
        &daemon,
        "tollgate_cache_invalidations_total{cause=\"connection\"}",
    )
    .await;
    let paused = Instant::now();
    assert_eq!(
        direct.call(&["CLIENT", "PAUSE", "1500", "ALL"]).await,
        Frame::Simple("OK".into())
    );
    // A miss waits on the paused server past its deadline.
    let reply = client.call(&["GET", "user:other"]).await;
    let text = crate::support::raw::text(&reply);
    assert!(text.starts_with("IOERR tollgate: no reply"), "{reply:?}");
    until_metric(
        &daemon,
        "tollgate_cache_invalidations_total{cause=\"connection\"}",
        |now| now > before,
    )
    .await;
    // Once the pause is over (its end is known), the cache fills and serves again.
    tokio::time::sleep_until(paused + Duration::from_millis(1600)).await;
    until_hit(&daemon, &mut client, "user:p", &bulk("v")).await;
    daemon.stop().await;
}

/// With the daemon's own embedded Redis (the default deployment), whose users the daemon creates.
#[tokio::test]
async fn the_cache_serves_with_the_embedded_redis() {
    let dir = crate::support::daemon::tempdir();
    let mut config = TestDaemon::config(dir.path());
    config.cache = cache(1 << 20, 64 << 10);
    let daemon = TestDaemon::start_config(dir, config).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        client.call(&["SET", "user:e", "embedded"]).await,
        Frame::Simple("OK".into())
    );
    until_hit(&daemon, &mut client, "user:e", &bulk("embedded")).await;
    let mut admin = crate::support::daemon::embedded_admin(daemon.dir()).await;
    admin.call(&["SET", "user:e", "changed"]).await;
    until_seen(&mut client, "user:e", &bulk("changed")).await;
    daemon.stop().await;
}

#[tokio::test]
async fn the_cache_is_off_by_default_and_says_so() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let state = daemon.get("/v1/cache").await.json();
    assert_eq!(state["enabled"], false, "{state}");
    let metrics = daemon.get("/metrics").await.body;
    assert!(!metrics.contains("tollgate_cache_"), "{metrics}");
    // No connection to Redis tracks keys.
    let list = redis.inline("CLIENT LIST");
    assert!(!list.contains("tollgate-cache"), "{list}");
    daemon.stop().await;
}

/// A direct writer INCRs one key while readers read it through the daemon: no reader ever sees a
/// value older than one it saw before, and once the writer stops every reader converges.
#[tokio::test]
async fn readers_never_go_back_in_time_while_a_direct_writer_hammers_a_key() {
    hammered(
        &["SET", "hot:n", "0"],
        &["INCR", "hot:n"],
        &["GET", "hot:n"],
    )
    .await;
}

/// The same with a hash's field (`HINCRBY` against `HGET`), whose fills join the fields already
/// kept: a merge must never bring back a value an invalidation dropped.
#[tokio::test]
async fn readers_of_a_hash_field_never_go_back_in_time_while_a_direct_writer_hammers_it() {
    hammered(
        &["HSET", "hot:h", "n", "0", "other", "x"],
        &["HINCRBY", "hot:h", "n", "1"],
        &["HGET", "hot:h", "n"],
    )
    .await;
}

/// `set` straight to Redis, then `write` (which adds one to a counter) hammered for 2 s straight to
/// Redis while four readers send `read` (of that counter) through the daemon.
async fn hammered(set: &[&str], write: &[&str], read: &[&str]) {
    let redis = RedisServer::start();
    let daemon = cache_daemon(&redis, NOBODY, cache(1 << 20, 64 << 10)).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    direct.call(set).await;
    let mut warm = RawClient::connect(&daemon.resp_socket()).await;
    until_read_hits(&daemon, &mut warm, read, &bulk("0")).await;

    let stop = Arc::new(AtomicBool::new(false));
    let read: Vec<String> = read.iter().map(|word| word.to_string()).collect();
    let mut readers = Vec::new();
    for _ in 0..4 {
        let socket = daemon.resp_socket();
        let (stop, read) = (stop.clone(), read.clone());
        readers.push(tokio::spawn(async move {
            let read: Vec<&str> = read.iter().map(String::as_str).collect();
            let mut client = RawClient::connect(&socket).await;
            let (mut last, mut reads) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let got = client.call(&read).await;
                let seen: u64 = crate::support::raw::text(&got).parse().expect("a number");
                assert!(seen >= last, "{read:?}: read {seen} after {last}");
                last = seen;
                reads += 1;
            }
            (client, last, reads)
        }));
    }
    let started = Instant::now();
    let mut writes = 0u64;
    while started.elapsed() < Duration::from_secs(2) {
        direct.call(write).await;
        writes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let hits = metric(&daemon, "tollgate_cache_hits_total").await;
    let read: Vec<&str> = read.iter().map(String::as_str).collect();
    for reader in readers {
        let (mut client, last, reads) = reader.await.expect("a reader");
        assert!(last <= writes && reads > 0);
        // Converges within the invalidation delay.
        let want = bulk(&writes.to_string());
        let deadline = Instant::now() + PATIENCE;
        while client.call(&read).await != want {
            assert!(Instant::now() < deadline, "{read:?} never reached {writes}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert!(hits > 0.0, "the readers were never served from the cache");
    assert!(metric(&daemon, "tollgate_cache_fills_total{outcome=\"kept\"}").await > 1.0);
    daemon.stop().await;
}

fn sentinel_node(replica_of: Option<u16>) -> (RedisServer, u16) {
    let port = tollgate_testkit::loopback_port();
    let mut builder = RedisServer::builder()
        .arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1");
    if let Some(master) = replica_of {
        builder = builder
            .arg("--replicaof")
            .arg("127.0.0.1")
            .arg(master.to_string());
    }
    (builder.start(), port)
}

/// A master on a loopback port, its replica (replicating), and a Sentinel (quorum 1) that knows
/// both, as `mymaster`.
pub(crate) fn sentinel_group() -> (RedisServer, RedisServer, crate::lanes_sentinel::Sentinel) {
    use crate::lanes_sentinel::{wait_until, Sentinel};
    let (master, master_port) = sentinel_node(None);
    let (replica, _) = sentinel_node(Some(master_port));
    assert!(wait_until(Duration::from_secs(10), || replica
        .inline("INFO replication")
        .contains("master_link_status:up")));
    let sentinel = Sentinel::start_with_quorum(master_port, 1, None);
    assert!(
        wait_until(Duration::from_secs(20), || sentinel
            .ask("SENTINEL MASTER mymaster")
            .is_some_and(|r| r.contains("num-slaves\r\n$1\r\n1\r\n"))),
        "the sentinel never learnt of the replica"
    );
    (master, replica, sentinel)
}

/// Whether `server`'s `CLIENT LIST` shows the daemon's tracking connection.
fn tracks_on(server: &RedisServer) -> bool {
    server
        .inline("CLIENT LIST")
        .contains(" name=tollgate-cache ")
}

/// A Sentinel switch: the tracking connection leaves the demoted master for the new one, the
/// cache is emptied, and it serves (and is kept correct) from the new master.
#[tokio::test]
async fn a_sentinel_switch_moves_the_tracking_connection_and_empties_the_cache() {
    use crate::lanes_sentinel::wait_until;
    let (master, replica, sentinel) = sentinel_group();
    let daemon = TestDaemon::start_redis_with(
        tollgate_lanes::RedisConfig::sentinel("mymaster", vec![sentinel.endpoint()]),
        &[&master, &replica],
        |config| config.cache = cache(1 << 20, 64 << 10),
    )
    .await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        client.call(&["SET", "user:f", "v1"]).await,
        Frame::Simple("OK".into())
    );
    until_hit(&daemon, &mut client, "user:f", &bulk("v1")).await;
    assert!(tracks_on(&master) && !tracks_on(&replica));

    assert_eq!(
        sentinel.ask("SENTINEL FAILOVER mymaster").as_deref(),
        Some("+OK\r\n")
    );
    let role = |server: &RedisServer, role: &str| {
        server
            .inline("ROLE")
            .contains(&format!("${}\r\n{role}\r\n", role.len()))
    };
    assert!(
        wait_until(Duration::from_secs(30), || role(&replica, "master")
            && role(&master, "slave")),
        "the failover never completed"
    );
    // The daemon follows; so does its tracking connection, and what it kept is gone.
    let deadline = Instant::now() + PATIENCE;
    while !tracks_on(&replica) || tracks_on(&master) {
        assert!(
            Instant::now() < deadline,
            "the tracking connection stayed on the old master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        metric(
            &daemon,
            "tollgate_cache_invalidations_total{cause=\"connection\"}"
        )
        .await
            >= 1.0
    );
    // Writes through the daemon reach the new master and are read at once, from the cache too.
    let deadline = Instant::now() + PATIENCE;
    while client.call(&["SET", "user:f", "v2"]).await != Frame::Simple("OK".into()) {
        assert!(Instant::now() < deadline, "writes never resumed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_hit(&daemon, &mut client, "user:f", &bulk("v2")).await;
    assert_eq!(
        client.call(&["SET", "user:f", "v3"]).await,
        Frame::Simple("OK".into())
    );
    assert_eq!(client.call(&["GET", "user:f"]).await, bulk("v3"));
    daemon.stop().await;
}

/// On a Redis Cluster: a tracking connection per master, each key filled from and invalidated by
/// its own master; a write split across slots drops every key it wrote before its reply; a key
/// whose slot moved is read right (the fill its old master refuses with MOVED is read as if
/// uncached) and cached again from the new master; a failover empties the cache and it serves
/// again from the promoted master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_master_fills_and_invalidates_its_own_keys() {
    let mut cluster = crate::cluster::cluster().await;
    let daemon =
        TestDaemon::start_cluster_with(&cluster, tollgate_lanes::Splitting::Split, |config| {
            config.cache = cache(1 << 20, 64 << 10)
        })
        .await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let keys = crate::cluster::keys_on_every_master(&cluster, "user:cl", 1);
    let master_of = |cluster: &tollgate_testkit::RedisCluster, key: &str| {
        cluster.master_of(tollgate_lanes::Slot::of(key.as_bytes()).number())
    };
    for key in &keys {
        assert_eq!(
            client.call(&["SET", key, "v1"]).await,
            Frame::Simple("OK".into())
        );
        until_hit(&daemon, &mut client, key, &bulk("v1")).await;
        // Written straight to its master: seen once that master's invalidation arrives.
        let master = master_of(&cluster, key);
        assert_eq!(
            cluster.call(master, &["SET", key, "v2"]),
            Frame::Simple("OK".into())
        );
        let deadline = Instant::now() + PATIENCE;
        while client.call(&["GET", key]).await != bulk("v2") {
            assert!(
                Instant::now() < deadline,
                "{key} never read v2 from master {master}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        until_hit(&daemon, &mut client, key, &bulk("v2")).await;
    }
    // One MSET over the three masters (split per slot): every key read at once, new.
    let mut mset = vec!["MSET"];
    for key in &keys {
        mset.extend([key.as_str(), "v3"]);
    }
    assert_eq!(client.call(&mset).await, Frame::Simple("OK".into()));
    for key in &keys {
        assert_eq!(client.call(&["GET", key]).await, bulk("v3"), "{key}");
    }

    // The first key's slot moves to the second key's master.
    let key = keys[0].as_str();
    until_hit(&daemon, &mut client, key, &bulk("v3")).await;
    let slot = tollgate_lanes::Slot::of(key.as_bytes()).number();
    let (from, to) = (master_of(&cluster, key), master_of(&cluster, &keys[1]));
    cluster.begin_migration(slot, from, to);
    cluster.migrate_keys(slot, from, to);
    cluster.finish_migration(slot, to);
    assert_eq!(
        cluster.call(to, &["SET", key, "v4"]),
        Frame::Simple("OK".into())
    );
    let deadline = Instant::now() + PATIENCE;
    while client.call(&["GET", key]).await != bulk("v4") {
        assert!(
            Instant::now() < deadline,
            "{key} never read v4 after its move"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    until_hit(&daemon, &mut client, key, &bulk("v4")).await;

    // A failover of the third key's master.
    let key = keys[2].as_str();
    until_hit(&daemon, &mut client, key, &bulk("v3")).await;
    let master = master_of(&cluster, key);
    let replica = cluster.replicas_of(master)[0];
    let emptied = metric(
        &daemon,
        "tollgate_cache_invalidations_total{cause=\"connection\"}",
    )
    .await;
    cluster.failover(replica);
    cluster.kill(master);
    let deadline = Instant::now() + PATIENCE * 3;
    while metric(
        &daemon,
        "tollgate_cache_invalidations_total{cause=\"connection\"}",
    )
    .await
        <= emptied
    {
        assert!(
            Instant::now() < deadline,
            "the failover never emptied the cache"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = Instant::now() + PATIENCE * 3;
    while client.call(&["SET", key, "v5"]).await != Frame::Simple("OK".into()) {
        assert!(
            Instant::now() < deadline,
            "writes never resumed after the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until_hit(&daemon, &mut client, key, &bulk("v5")).await;
    daemon.stop().await;
}
