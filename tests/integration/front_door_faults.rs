//! The front door under hostile input and hostile replies: numbers no command could mean, replies
//! nested deeper than any parser's recursion should go, and clients that hang up while their
//! session waits on Redis. Each costs at most its own command or its own connection.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::front_door::redis_clients;
use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

fn pong() -> Frame {
    Frame::Simple(Bytes::from_static(b"PONG"))
}

#[tokio::test]
async fn timeouts_no_duration_holds_get_redis_own_error_and_the_connection_stays() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let timeouts = [
        "1e308", "1e300", "-1", "-1e308", "nan", "inf", "-inf", "1e400",
    ];
    for timeout in timeouts {
        let commands: [Vec<&str>; 11] = [
            vec!["BLPOP", "k", timeout],
            vec!["BRPOP", "k", timeout],
            vec!["BZPOPMIN", "z", timeout],
            vec!["BZPOPMAX", "z", timeout],
            vec!["BLMPOP", timeout, "1", "k", "LEFT"],
            vec!["BZMPOP", timeout, "1", "z", "MIN"],
            vec!["BRPOPLPUSH", "a", "b", timeout],
            vec!["BLMOVE", "a", "b", "LEFT", "RIGHT", timeout],
            vec!["XREAD", "BLOCK", timeout, "STREAMS", "s", "0"],
            vec![
                "XREADGROUP",
                "GROUP",
                "g",
                "c",
                "BLOCK",
                timeout,
                "STREAMS",
                "s",
                ">",
            ],
            vec!["WAIT", "0", timeout],
        ];
        for argv in commands {
            let reply = client.call(&argv).await;
            // Redis's own words: "timeout is negative", "timeout is out of range", "… not a float".
            assert!(
                matches!(&reply, Frame::Error(e) if e.starts_with(b"ERR") && text(&reply).contains("timeout")),
                "{argv:?}: {reply:?}"
            );
            assert_eq!(client.call(&["PING"]).await, pong(), "after {argv:?}");
        }
    }
    // A huge timeout that Redis does accept blocks as asked and is answered when data arrives.
    client.send(&["BLPOP", "later", "1e15"]).await;
    let mut producer = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        producer.call(&["RPUSH", "later", "v"]).await,
        Frame::Integer(1)
    );
    assert_eq!(
        client.read().await,
        Frame::Array(vec![
            Frame::Bulk(Bytes::from_static(b"later")),
            Frame::Bulk(Bytes::from_static(b"v"))
        ])
    );
    assert_eq!(client.call(&["PING"]).await, pong());
    daemon.stop().await;
}

/// A Lua table `depth` tables deep around one integer; Redis replies with arrays as deep.
const DEEP_TABLE: &str = "local t = {1} for i = 2, tonumber(ARGV[1]) do t = {t} end return t";

#[tokio::test]
async fn a_deep_script_reply_reaches_its_client_and_spares_the_shared_script_connection() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    // What Redis itself answers, byte for byte.
    let mut direct = RawClient::to_redis(redis.socket()).await;
    direct.send(&["EVAL", DEEP_TABLE, "0", "1000"]).await;
    let expected = direct.read_raw().await;
    assert!(
        expected.starts_with(&b"*1\r\n".repeat(1000)),
        "{expected:?}"
    );

    let mut deep = RawClient::connect(&daemon.resp_socket()).await;
    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    let deep_replies = async {
        for _ in 0..20 {
            deep.send(&["EVAL", DEEP_TABLE, "0", "1000"]).await;
            assert_eq!(deep.read_raw().await, expected);
        }
    };
    // Another client's scripts, pipelined so that they are in flight on the shared SCRIPT
    // connection while the deep replies pass.
    let other_scripts = async {
        for round in 0..20 {
            let arg = round.to_string();
            let batch: Vec<[&str; 4]> = (0..50)
                .map(|_| ["EVAL", "return ARGV[1]", "0", &arg])
                .collect();
            let commands: Vec<&[&str]> = batch.iter().map(|argv| &argv[..]).collect();
            other.pipeline(&commands).await;
            for _ in 0..50 {
                assert_eq!(text(&other.read().await), arg, "round {round}");
            }
        }
    };
    let leases = async {
        for n in 0..10 {
            let reply = daemon
                .post(
                    &format!("/v1/leases/deep-{n}/acquire"),
                    &serde_json::json!({"attempt": {"owner": "o", "operation_id": "op"}, "ttl_ms": 10_000})
                        .to_string(),
                )
                .await;
            assert_eq!(
                (reply.status, reply.json()["outcome"].clone()),
                (200, serde_json::json!("acquired")),
                "{}",
                reply.body
            );
        }
    };
    tokio::join!(deep_replies, other_scripts, leases);
    daemon.stop().await;
}

/// How many of Redis's clients are blocked (`flags=b`: BLPOP and the like).
fn blocked(redis: &RedisServer) -> usize {
    redis_clients(redis)
        .iter()
        .filter(|client| client.contains(" flags=b"))
        .count()
}

/// Polls `done` until it holds, for at most 10 s.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn clients_that_hang_up_blocked_inside_watch_leave_no_blocked_connection() {
    let redis = RedisServer::start();
    // One principal may fill the lane here (by default it may hold three quarters of it).
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.lanes.transaction.per_principal = Some(16);
    })
    .await;
    // As many as the TRANSACTION lane has connections: before, this saturated it for good.
    let mut abandoned = Vec::new();
    for _ in 0..16 {
        let mut client = RawClient::connect(&daemon.resp_socket()).await;
        assert_eq!(text(&client.call(&["WATCH", "w"]).await), "OK");
        client.send(&["BLPOP", "never", "0"]).await;
        abandoned.push(client);
    }
    eventually("16 sessions blocked in Redis", || blocked(&redis) == 16).await;
    drop(abandoned);
    eventually("no blocked connection left", || blocked(&redis) == 0).await;

    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    other
        .pipeline(&[&["MULTI"], &["SET", "after", "1"], &["EXEC"]])
        .await;
    assert_eq!(text(&other.read().await), "OK");
    assert_eq!(text(&other.read().await), "QUEUED");
    assert_eq!(
        other.read().await,
        Frame::Array(vec![Frame::Simple(Bytes::from_static(b"OK"))])
    );
    // A job pushed now is not popped by a dead session: it stays for the living.
    assert_eq!(
        other.call(&["LPUSH", "never", "job"]).await,
        Frame::Integer(1)
    );
    assert_eq!(other.call(&["LLEN", "never"]).await, Frame::Integer(1));
    daemon.stop().await;
}

/// The machine's users may run `DEBUG` and `INFO` (both on the ADMIN lane) and connection commands.
const ADMIN_POLICY: &str = r#"
principals:
  local: { any: true }
rules:
  - id: admin-for-tests
    commands: [DEBUG, INFO]
    allow: the deadline tests
  - id: connection
    commands: ["@connection"]
    allow: connection housekeeping
"#;

async fn admin_daemon(
    redis: &RedisServer,
    adjust: impl FnOnce(&mut tollgate::config::Config),
) -> TestDaemon {
    let policy = redis.dir().join("admin.yaml");
    std::fs::write(&policy, ADMIN_POLICY).expect("write the test policy");
    TestDaemon::start_with(redis, |config| {
        config.policy.files = vec![policy];
        adjust(config);
    })
    .await
}

#[tokio::test]
async fn an_admin_command_that_says_how_long_it_takes_is_not_cut_short() {
    let redis = RedisServer::builder()
        .arg("--enable-debug-command")
        .arg("yes")
        .start();
    // An ordinary deadline shorter than the sleep: the sleep's own argument decides.
    // The ADMIN lane's user may run DEBUG because the policy lets clients run it.
    let daemon = admin_daemon(&redis, |config| {
        config.resp.command_timeout = Duration::from_secs(1);
    })
    .await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["DEBUG", "SLEEP", "3"]).await), "OK");
    assert_eq!(client.call(&["PING"]).await, pong());
    daemon.stop().await;
}

#[tokio::test]
async fn an_admin_command_unanswered_past_the_command_timeout_gets_ioerr() {
    let redis = RedisServer::start();
    let daemon = admin_daemon(&redis, |config| {
        config.resp.command_timeout = Duration::from_millis(500);
    })
    .await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    // The ADMIN connection exists before Redis stops answering.
    assert!(text(&client.call(&["INFO", "server"]).await).contains("redis_version"));
    redis.inline("CLIENT PAUSE 2000 ALL");
    let reply = client.call(&["INFO", "server"]).await;
    assert!(
        matches!(&reply, Frame::Error(e) if e.starts_with(b"IOERR") && text(&reply).contains("no reply within 500ms")),
        "{reply:?}"
    );
    // The session goes on (PING asks Redis: a typed error while it is paused, or PONG once it
    // answers), and once Redis answers again so does the lane.
    let ping = client.call(&["PING"]).await;
    assert!(
        ping == pong()
            || matches!(&ping, Frame::Error(e) if e.starts_with(b"IOERR") || e.starts_with(b"UNAVAILABLE")),
        "{ping:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = client.call(&["INFO", "server"]).await;
        if text(&reply).contains("redis_version") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ADMIN lane never recovered: {reply:?}"
        );
    }
    daemon.stop().await;
}

#[tokio::test]
async fn lease_bodies_with_numbers_no_duration_holds_get_400_and_the_daemon_serves_on() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let attempt = r#""attempt": {"owner": "o", "operation_id": "op"}"#;
    let ttls = [
        r#""ttl_ms": 1e308"#,
        r#""ttl_ms": -1"#,
        r#""ttl_ms": 18446744073709551615"#,
        r#""ttl_ms": 18446744073709551616"#,
    ];
    let acquire_only = [
        r#""ttl_ms": 10000, "wait_ms": 18446744073709551615"#,
        r#""ttl_ms": 10000, "replicas": 4294967296"#,
    ];
    let calls = ttls
        .iter()
        .flat_map(|numbers| [("acquire", *numbers), ("renew", *numbers)])
        .chain(acquire_only.iter().map(|numbers| ("acquire", *numbers)));
    for (action, numbers) in calls {
        let body = format!("{{{attempt}, {numbers}}}");
        let reply = daemon
            .post(&format!("/v1/leases/numbers/{action}"), &body)
            .await;
        assert_eq!(reply.status, 400, "{action} {body}: {}", reply.body);
    }
    assert_eq!(daemon.get("/healthz").await.status, 200);
    daemon.stop().await;
}
