//! `LEASE …` on the RESP socket against the daemon in-process and a real `redis-server`: every
//! outcome over RESP2 and RESP3 (a raw client, `redis-cli` and redis-rs), the same outcome objects
//! as the HTTP API, policy admission, waiting that holds up only its own connection, leases bound
//! to a connection, and `COMMAND DOCS LEASE`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::lease_http::{lease_daemon, lease_daemon_with};
use crate::support::command_docs;
use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

/// A reply's fields by name, from a RESP3 map or a RESP2 flat array; panics on anything else
/// (an error reply, say), showing it.
pub(crate) fn fields(frame: &Frame) -> BTreeMap<String, Frame> {
    let pairs: Vec<(Frame, Frame)> = match frame {
        Frame::Map(pairs) => pairs.clone(),
        Frame::Array(items) if items.len() % 2 == 0 => items
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect(),
        other => panic!("not a map reply: {other:?}"),
    };
    pairs
        .into_iter()
        .map(|(name, value)| (text(&name), value))
        .collect()
}

pub(crate) fn outcome(frame: &Frame) -> String {
    text(&fields(frame)["outcome"])
}

pub(crate) fn integer(frame: &Frame, field: &str) -> i64 {
    match fields(frame).get(field) {
        Some(Frame::Integer(n)) => *n,
        other => panic!("{field} is not an integer: {other:?} in {frame:?}"),
    }
}

/// A client on the daemon's RESP socket speaking `protocol` (2 or 3).
pub(crate) async fn client(daemon: &TestDaemon, protocol: &str) -> RawClient {
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    if protocol == "3" {
        let hello = client.call(&["HELLO", "3"]).await;
        assert!(matches!(hello, Frame::Map(_)), "{hello:?}");
    }
    client
}

/// Every outcome of every call, in both protocols: maps in RESP3, flat arrays in RESP2.
#[tokio::test]
async fn lease_commands_answer_every_outcome_in_resp2_and_resp3() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    for protocol in ["2", "3"] {
        let resource = format!("orders:resp{protocol}");
        let r = resource.as_str();
        let mut c = client(&daemon, protocol).await;
        let acquired = c
            .call(&[
                "LEASE", "ACQUIRE", r, "10000", "OWNER", "alice", "OP", "op-1",
            ])
            .await;
        match protocol {
            "3" => assert!(matches!(acquired, Frame::Map(_)), "{acquired:?}"),
            _ => assert!(matches!(acquired, Frame::Array(_)), "{acquired:?}"),
        }
        assert_eq!(outcome(&acquired), "acquired");
        let fence = integer(&acquired, "fence");
        assert!(fence >= 1);
        assert!(integer(&acquired, "valid_for_ms") > 9000);
        assert_eq!(text(&fields(&acquired)["owner"]), "alice");

        let replayed = c
            .call(&[
                "LEASE", "ACQUIRE", r, "10000", "OWNER", "alice", "OP", "op-1",
            ])
            .await;
        assert_eq!(
            (outcome(&replayed), integer(&replayed, "fence")),
            ("replayed".to_owned(), fence)
        );
        let conflict = c
            .call(&[
                "LEASE", "ACQUIRE", r, "10000", "OWNER", "alice", "OP", "op-2",
            ])
            .await;
        assert_eq!(outcome(&conflict), "conflict");
        // No attempt named: the daemon makes one, and it is not alice's.
        let contended = c.call(&["LEASE", "ACQUIRE", r, "10000"]).await;
        assert_eq!(outcome(&contended), "contended");
        assert!(integer(&contended, "retry_after_ms") > 0);

        let inspect = c
            .call(&["LEASE", "INSPECT", r, "OWNER", "alice", "OP", "op-1"])
            .await;
        assert_eq!(outcome(&inspect), "held");
        assert_eq!(integer(&inspect, "fence"), fence);
        let yours = fields(&inspect)["yours"].clone();
        match protocol {
            "3" => assert_eq!(yours, Frame::Boolean(true)),
            _ => assert_eq!(yours, Frame::Integer(1)),
        }

        let renewed = c
            .call(&["LEASE", "RENEW", r, "20000", "OWNER", "alice", "OP", "op-1"])
            .await;
        assert_eq!(outcome(&renewed), "renewed");
        assert!(integer(&renewed, "valid_for_ms") > 10_000);
        let not_owner = c
            .call(&["LEASE", "RELEASE", r, "OWNER", "bob", "OP", "op-1"])
            .await;
        assert_eq!(outcome(&not_owner), "not_owner");
        let released = c
            .call(&["lease", "release", r, "owner", "alice", "op", "op-1"])
            .await;
        assert_eq!(outcome(&released), "released");
        let absent = c
            .call(&["LEASE", "RELEASE", r, "OWNER", "alice", "OP", "op-1"])
            .await;
        assert_eq!(outcome(&absent), "already_absent");
        let lost = c
            .call(&["LEASE", "RENEW", r, "1000", "OWNER", "alice", "OP", "op-1"])
            .await;
        assert_eq!(outcome(&lost), "lost");
        assert_eq!(text(&fields(&lost)["reason"]), "absent");
        assert_eq!(outcome(&c.call(&["LEASE", "INSPECT", r]).await), "free");

        // The next holder's fence is larger.
        let next = c.call(&["LEASE", "ACQUIRE", r, "10000"]).await;
        assert!(integer(&next, "fence") > fence);
    }
    daemon.stop().await;
}

/// The HTTP API and the RESP commands answer with the same outcome objects.
#[tokio::test]
async fn resp_outcomes_carry_the_same_fields_as_http() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let http = daemon
        .post(
            "/v1/leases/orders:http/acquire",
            &json!({"attempt": {"owner": "o", "operation_id": "p"}, "ttl_ms": 5000}).to_string(),
        )
        .await;
    let mut c = client(&daemon, "3").await;
    let resp = c
        .call(&[
            "LEASE",
            "ACQUIRE",
            "orders:http",
            "5000",
            "OWNER",
            "o",
            "OP",
            "p",
        ])
        .await;
    // Same principal, uid and attempt: RESP replays what HTTP acquired.
    assert_eq!(outcome(&resp), "replayed");
    assert_eq!(
        integer(&resp, "fence"),
        http.json()["fence"].as_i64().unwrap()
    );
    let resp_fields: Vec<String> = fields(&resp)
        .into_keys()
        .filter(|name| name != "owner" && name != "operation_id")
        .collect();
    let mut http_fields: Vec<String> = http.json().as_object().unwrap().keys().cloned().collect();
    http_fields.sort();
    assert_eq!(resp_fields, http_fields);
    daemon.stop().await;
}

/// Leases on `orders:*` and plain data commands, transactions among them.
const LEASES_AND_DATA: &str = r#"
principals:
  local: { any: true }
rules:
  - id: test-leases
    leases: ["orders:*"]
    allow: the lease tests' resources
  - id: data
    commands: ["@read", "@write", "@transaction", "@connection"]
    allow: data
"#;

/// Bad input is an error reply naming what is wrong, and nothing is taken; the policy's `leases:`
/// rules admit per resource, as over HTTP.
#[tokio::test]
async fn lease_commands_refuse_bad_input_and_what_the_policy_denies() {
    let redis = RedisServer::start();
    let policy = redis.dir().join("leases-and-data.yaml");
    std::fs::write(&policy, LEASES_AND_DATA).unwrap();
    let daemon = lease_daemon_with(&redis, |config| config.policy.files = vec![policy]).await;
    let mut c = client(&daemon, "2").await;
    let denied = text(&c.call(&["LEASE", "ACQUIRE", "payroll", "10000"]).await);
    assert!(denied.starts_with("NOPERM tollgate: rule"), "{denied}");
    let short = text(&c.call(&["LEASE", "ACQUIRE", "orders:x", "1"]).await);
    assert!(short.starts_with("ERR tollgate: ttl_ms"), "{short}");
    let owner = text(
        &c.call(&[
            "LEASE", "ACQUIRE", "orders:x", "1000", "OWNER", "a b", "OP", "p",
        ])
        .await,
    );
    assert!(owner.contains("attempt.owner"), "{owner}");
    let unknown = text(
        &c.call(&["LEASE", "ACQUIRE", "orders:x", "1000", "FOREVER"])
            .await,
    );
    assert!(unknown.contains("unknown option"), "{unknown}");
    let no_attempt = text(&c.call(&["LEASE", "RELEASE", "orders:x"]).await);
    assert!(no_attempt.contains("required"), "{no_attempt}");
    assert_eq!(
        outcome(&c.call(&["LEASE", "INSPECT", "orders:x"]).await),
        "free"
    );
    // Inside MULTI it would have to run on Redis at EXEC: refused.
    assert_eq!(text(&c.call(&["MULTI"]).await), "OK");
    let queued = text(&c.call(&["LEASE", "ACQUIRE", "orders:x", "1000"]).await);
    assert!(queued.contains("MULTI"), "{queued}");
    c.call(&["DISCARD"]).await;
    // Pipelined with ordinary commands, LEASE still runs in order.
    c.pipeline(&[
        &["SET", "k", "v"],
        &["LEASE", "ACQUIRE", "orders:x", "1000"],
        &["GET", "k"],
    ])
    .await;
    assert_eq!(text(&c.read().await), "OK");
    assert_eq!(outcome(&c.read().await), "acquired");
    assert_eq!(text(&c.read().await), "v");
    daemon.stop().await;
}

/// What the policy admits after [`LEASES_AND_DATA`] is reloaded away: other resources.
const LEASES_MOVED: &str = r#"
principals:
  local: { any: true }
rules:
  - id: moved-leases
    leases: ["invoices:*"]
    allow: the resources after the reload
"#;

/// A connection remembers the resources the policy admitted it to, under the generation that
/// admitted them only: after a reload that takes the rule away, the same connection's next calls
/// on a resource it held a moment ago are denied, and the new rule's resources are admitted.
#[tokio::test]
async fn a_reload_decides_afresh_what_a_connection_was_admitted_to() {
    let redis = RedisServer::start();
    let policy = redis.dir().join("leases-reloaded.yaml");
    std::fs::write(&policy, LEASES_AND_DATA).unwrap();
    let daemon = lease_daemon_with(&redis, |config| {
        config.policy.files = vec![policy.clone()];
        config.admin.reload_interval = Duration::from_millis(1);
    })
    .await;
    let mut c = client(&daemon, "3").await;
    let acquire = |resource| {
        [
            "LEASE", "ACQUIRE", resource, "10000", "OWNER", "me", "OP", "op-1",
        ]
    };
    let release = |resource| ["LEASE", "RELEASE", resource, "OWNER", "me", "OP", "op-1"];
    for _ in 0..3 {
        assert_eq!(outcome(&c.call(&acquire("orders:x")).await), "acquired");
        assert_eq!(outcome(&c.call(&release("orders:x")).await), "released");
    }
    assert_eq!(outcome(&c.call(&acquire("orders:x")).await), "acquired");

    std::fs::write(&policy, LEASES_MOVED).unwrap();
    let reloaded = daemon.post("/v1/policy/reload", "").await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.body);
    for call in [
        &acquire("orders:x")[..],
        &release("orders:x")[..],
        &["LEASE", "INSPECT", "orders:x"][..],
    ] {
        let denied = text(&c.call(call).await);
        assert!(
            denied.starts_with("NOPERM tollgate: rule"),
            "{call:?}: {denied}"
        );
    }
    assert_eq!(outcome(&c.call(&acquire("invoices:1")).await), "acquired");
    daemon.stop().await;
}

/// `redis-cli`, in both protocols, takes and releases a lease with one command each.
#[tokio::test]
async fn redis_cli_takes_and_releases_a_lease() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let socket = daemon.resp_socket();
    // Run from the runtime's point of view asynchronously: the daemon answers on this same runtime.
    let cli = |args: &'static [&'static str]| {
        let socket = socket.clone();
        async move {
            let output = tokio::process::Command::new("redis-cli")
                .arg("-s")
                .arg(&socket)
                .args(args)
                .output()
                .await
                .expect("redis-cli");
            assert!(output.status.success(), "{output:?}");
            String::from_utf8_lossy(&output.stdout).into_owned()
        }
    };
    for protocol in ["-2", "-3"] {
        let acquire = [
            "LEASE",
            "ACQUIRE",
            "orders:cli",
            "10000",
            "OWNER",
            "cron",
            "OP",
            "nightly",
        ];
        let release = [
            "LEASE",
            "RELEASE",
            "orders:cli",
            "OWNER",
            "cron",
            "OP",
            "nightly",
        ];
        let with = |words: &[&'static str]| -> &'static [&'static str] {
            Box::leak(
                std::iter::once(protocol)
                    .chain(words.iter().copied())
                    .collect(),
            )
        };
        let acquired = cli(with(&acquire)).await;
        assert!(acquired.contains("acquired"), "{acquired}");
        assert!(acquired.contains("fence"), "{acquired}");
        let released = cli(with(&release)).await;
        assert!(released.contains("released"), "{released}");
    }
    daemon.stop().await;
}

/// redis-rs, in both protocols, through `redis::cmd`: the reply is a map value in RESP3 and a flat
/// array in RESP2.
#[tokio::test]
async fn redis_rs_takes_renews_and_releases_a_lease() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    for (query, resource) in [("", "orders:rs2"), ("?protocol=resp3", "orders:rs3")] {
        let url = format!("redis+unix://{}{query}", daemon.resp_socket().display());
        let client = redis::Client::open(url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let acquired: redis::Value = redis::cmd("LEASE")
            .arg(&["ACQUIRE", resource, "10000"])
            .query_async(&mut conn)
            .await
            .unwrap();
        let map = pairs(&acquired);
        assert_eq!(map["outcome"], "acquired", "{acquired:?}");
        let (owner, op) = (map["owner"].clone(), map["operation_id"].clone());
        let renewed: redis::Value = redis::cmd("LEASE")
            .arg(&["RENEW", resource, "10000", "OWNER", &owner, "OP", &op])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(pairs(&renewed)["outcome"], "renewed");
        let released: redis::Value = redis::cmd("LEASE")
            .arg(&["RELEASE", resource, "OWNER", &owner, "OP", &op])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(pairs(&released)["outcome"], "released");
    }
    daemon.stop().await;
}

/// A redis-rs reply's string and integer fields as text.
fn pairs(value: &redis::Value) -> BTreeMap<String, String> {
    let items: Vec<(redis::Value, redis::Value)> = match value {
        redis::Value::Map(pairs) => pairs.clone(),
        redis::Value::Array(items) => items
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect(),
        other => panic!("not a map reply: {other:?}"),
    };
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    };
    items.iter().map(|(k, v)| (text(k), text(v))).collect()
}

/// A waiting acquire holds up its own connection only: others are answered meanwhile, and the
/// waiter gets the lease once the holder releases.
#[tokio::test]
async fn waiting_blocks_only_the_waiting_connection() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let mut holder = client(&daemon, "3").await;
    let mut waiter = client(&daemon, "3").await;
    let mut other = client(&daemon, "2").await;
    let held = holder
        .call(&[
            "LEASE", "ACQUIRE", "orders:w", "30000", "OWNER", "h", "OP", "1",
        ])
        .await;
    assert_eq!(outcome(&held), "acquired");
    waiter
        .send(&["LEASE", "ACQUIRE", "orders:w", "30000", "WAIT", "20000"])
        .await;
    assert!(
        waiter
            .read_within(Duration::from_millis(300))
            .await
            .is_err(),
        "the waiter waits"
    );
    assert_eq!(text(&other.call(&["PING"]).await), "PONG");
    assert_eq!(
        outcome(&other.call(&["LEASE", "INSPECT", "orders:w"]).await),
        "held"
    );
    let released = holder
        .call(&["LEASE", "RELEASE", "orders:w", "OWNER", "h", "OP", "1"])
        .await;
    assert_eq!(outcome(&released), "released");
    let handed = waiter.read().await;
    assert_eq!(outcome(&handed), "acquired");
    assert!(integer(&handed, "fence") > integer(&held, "fence"));
    daemon.stop().await;
}

/// Polls `LEASE INSPECT` until `wanted` (bounded: a deadline for the test, not an assertion on
/// latency).
async fn until_outcome(c: &mut RawClient, resource: &str, wanted: &str) -> Frame {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let inspect = c.call(&["LEASE", "INSPECT", resource]).await;
        if outcome(&inspect) == wanted {
            return inspect;
        }
        assert!(Instant::now() < deadline, "still {inspect:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `SESSION`: the lease lives as long as the connection, past many TTLs, with one fence; when the
/// client goes away it is released at once (not left to its TTL), and a waiter takes it.
#[tokio::test]
async fn a_session_lease_is_renewed_while_its_connection_lives_and_released_when_it_closes() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let mut owner = client(&daemon, "3").await;
    let mut observer = client(&daemon, "2").await;
    let held = owner
        .call(&["LEASE", "ACQUIRE", "orders:s", "300", "SESSION"])
        .await;
    assert_eq!(outcome(&held), "acquired");
    let fence = integer(&held, "fence");
    // Five TTLs later, still the same holding.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let inspect = observer.call(&["LEASE", "INSPECT", "orders:s"]).await;
    assert_eq!(outcome(&inspect), "held");
    assert_eq!(integer(&inspect, "fence"), fence);
    assert_eq!(text(&owner.call(&["PING"]).await), "PONG");

    // A TTL long enough that only the release, never the expiry, can end it within the test.
    let mut long = client(&daemon, "3").await;
    let long_held = long
        .call(&["LEASE", "ACQUIRE", "orders:s2", "3600000", "SESSION"])
        .await;
    assert_eq!(outcome(&long_held), "acquired");
    let mut waiter = client(&daemon, "3").await;
    waiter
        .send(&["LEASE", "ACQUIRE", "orders:s2", "10000", "WAIT", "60000"])
        .await;
    drop(long);
    let handed = waiter.read().await;
    assert_eq!(outcome(&handed), "acquired");

    drop(owner);
    until_outcome(&mut observer, "orders:s", "free").await;
    daemon.stop().await;
}

/// A session lease counts as a watchdog: past `leases.max_watchdogs_per_uid` it is refused
/// with nothing sent, while plain acquires go on.
#[tokio::test]
async fn session_leases_are_bounded_like_watchdogs() {
    let redis = RedisServer::start();
    let daemon = lease_daemon_with(&redis, |config| {
        config.leases.max_watchdogs_per_uid = 1;
    })
    .await;
    let mut c = client(&daemon, "3").await;
    let first = c
        .call(&["LEASE", "ACQUIRE", "orders:b1", "1000", "SESSION"])
        .await;
    assert_eq!(outcome(&first), "acquired");
    let second = c
        .call(&["LEASE", "ACQUIRE", "orders:b2", "1000", "SESSION"])
        .await;
    assert_eq!(outcome(&second), "too_many_watchdogs");
    assert_eq!(integer(&second, "limit"), 1);
    assert_eq!(
        outcome(&c.call(&["LEASE", "INSPECT", "orders:b2"]).await),
        "free"
    );
    let plain = c.call(&["LEASE", "ACQUIRE", "orders:b2", "1000"]).await;
    assert_eq!(outcome(&plain), "acquired");
    daemon.stop().await;
}

/// `COMMAND DOCS LEASE` describes every subcommand and its arguments as Redis describes its own.
#[tokio::test]
async fn command_docs_describe_lease() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let url = format!("redis+unix://{}", daemon.resp_socket().display());
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let docs: redis::Value = redis::cmd("COMMAND")
        .arg(&["DOCS", "LEASE"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let specs = command_docs::commands(&docs);
    let names: Vec<&str> = specs.iter().map(|spec| spec.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "LEASE",
            "LEASE|ACQUIRE",
            "LEASE|INSPECT",
            "LEASE|RELEASE",
            "LEASE|RENEW",
            "LEASE|UNWATCH",
            "LEASE|WATCH"
        ]
    );
    let acquire = &specs[1];
    let tokens: Vec<&str> = acquire
        .args
        .iter()
        .filter_map(|arg| arg.token.as_deref())
        .collect();
    assert_eq!(
        tokens,
        [
            "WAIT", "OWNER", "OP", "REPLICAS", "VALUE", "PERMITS", "COUNT", "MODE", "SESSION",
            "WATCHDOG"
        ]
    );
    assert!(acquire.args[2].optional && !acquire.args[0].optional);
    daemon.stop().await;
}
