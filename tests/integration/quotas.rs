//! The policy's `quotas:` (issue 28): a principal past a quota's rate gets `-THROTTLED` over RESP
//! and 429 with `Retry-After` over HTTP, naming the quota and when to retry; it is admitted again
//! after that time; other principals are not held by its buckets; a quota that names no principal
//! spares the daemon's administrators; and `/metrics`, `/v1/principals` and `policy diff` show the
//! quotas. Against a real `redis-server` and a real second OS user.

use std::time::Duration;

use tollgate_policy::classes::diff;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::identity::{daemon_for_all, os_user, redis_cli, USER_B};
use crate::policy_support::{admission, config};
use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

/// Root is `app` (an administrator of the daemon, held all the same because `app-rate` names
/// it); the second user is `other`, held only by `everyone`, which names no principal.
fn policy(other_uid: u32) -> String {
    format!(
        r#"
principals:
  app: {{ uids: [0] }}
  other: {{ uids: [{other_uid}] }}
rules:
  - id: everything
    commands: ["*"]
    allow: the quota tests judge rates, not commands
  - id: leases
    leases: ["*"]
    allow: any lease
quotas:
  - id: app-rate
    principals: [app]
    commands_per_second: 20
    burst: 5
  - id: everyone
    commands_per_second: 1
    burst: 1
"#
    )
}

async fn quota_daemon(redis: &RedisServer, other_uid: u32) -> TestDaemon {
    let path = redis.dir().join("quotas.yaml");
    std::fs::write(&path, policy(other_uid)).expect("write the policy");
    daemon_for_all(redis, |config| config.policy.files = vec![path]).await
}

/// The milliseconds a `-THROTTLED … retry in N ms` refusal asks for.
fn retry_ms(refusal: &str) -> u64 {
    let (_, rest) = refusal
        .rsplit_once("retry in ")
        .unwrap_or_else(|| panic!("no retry time in {refusal}"));
    rest.trim_end_matches(" ms")
        .parse()
        .unwrap_or_else(|_| panic!("no retry time in {refusal}"))
}

#[tokio::test]
async fn a_principal_past_its_rate_is_throttled_over_resp_and_admitted_after_the_retry_time() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = quota_daemon(&redis, b.uid).await;

    // Twenty GETs at once, pipelined: the burst of five is admitted, then one every 50 ms.
    let mut app = RawClient::connect(&daemon.resp_socket()).await;
    let gets: Vec<[&str; 2]> = (0..20).map(|_| ["GET", "quota:k"]).collect();
    let argvs: Vec<&[&str]> = gets.iter().map(|argv| argv.as_slice()).collect();
    app.pipeline(&argvs).await;
    let mut replies = Vec::new();
    for _ in 0..20 {
        replies.push(app.read().await);
    }
    let admitted = replies.iter().filter(|r| **r == Frame::Null).count();
    let refusals: Vec<String> = replies
        .iter()
        .filter(|r| matches!(r, Frame::Error(_)))
        .map(text)
        .collect();
    assert!(
        replies[..5].iter().all(|r| *r == Frame::Null),
        "the burst is admitted: {replies:?}"
    );
    assert_eq!(admitted + refusals.len(), 20, "{replies:?}");
    assert!(refusals.len() >= 10, "{replies:?}");
    for refusal in &refusals {
        assert!(
            refusal
                .starts_with("THROTTLED tollgate: quota app-rate: over 20 commands/s; retry in "),
            "{refusal}"
        );
        // `everyone` names no principal: root, an administrator, is not held by it.
        assert!(!refusal.contains("everyone"), "{refusal}");
        assert!(retry_ms(refusal) <= 50, "{refusal}");
    }

    // The other principal has its own buckets: app's empty one does not hold it.
    let theirs = redis_cli(&b, &daemon, &["GET", "quota:k"]).await;
    assert!(!theirs.contains("THROTTLED"), "{theirs}");

    // Told when, app is admitted then. A token may have come back while the other user's
    // redis-cli ran (one every 50 ms): spend it first, so that the call below is refused and says
    // when to come back.
    let mut last = app.call(&["GET", "quota:k"]).await;
    for _ in 0..10 {
        if matches!(last, Frame::Error(_)) {
            break;
        }
        last = app.call(&["GET", "quota:k"]).await;
    }
    assert!(matches!(last, Frame::Error(_)), "never refused: {last:?}");
    tokio::time::sleep(Duration::from_millis(retry_ms(&text(&last)))).await;
    assert_eq!(app.call(&["GET", "quota:k"]).await, Frame::Null);

    // `everyone` holds the other user (not an administrator): one a second, burst one.
    let repeated = redis_cli(&b, &daemon, &["-r", "3", "GET", "quota:k"]).await;
    assert!(
        repeated.contains("THROTTLED tollgate: quota everyone: over 1 commands/s"),
        "{repeated}"
    );

    // Counted per quota in /metrics, and per principal in /v1/principals.
    let metrics = daemon.get("/metrics").await.body;
    let throttled = metrics
        .lines()
        .find(|line| {
            line.starts_with("tollgate_quota_throttled_total{")
                && line.contains(r#"quota="app-rate""#)
                && line.contains(r#"limit="commands""#)
        })
        .unwrap_or_else(|| panic!("no app-rate counter in\n{metrics}"));
    let count: u64 = throttled.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= refusals.len() as u64, "{throttled}");
    let principals = daemon.get("/v1/principals").await.json();
    let row = principals["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["principal"] == "app" && row["quota"] == "app-rate")
        .unwrap_or_else(|| panic!("no app-rate row in {principals}"))
        .clone();
    assert!(
        row["throttled"].as_u64().unwrap() >= refusals.len() as u64,
        "{row}"
    );
    assert!(row["admitted"].as_u64().unwrap() >= 6, "{row}");
    daemon.stop().await;
}

/// Inside MULTI a throttled command fails EXEC, as Redis fails a transaction with a command it
/// refused to queue: a transaction is never run with a command missing.
#[tokio::test]
async fn a_throttled_command_inside_multi_fails_the_transaction() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = quota_daemon(&redis, b.uid).await;
    let mut app = RawClient::connect(&daemon.resp_socket()).await;
    let mut argvs: Vec<Vec<&str>> = vec![vec!["MULTI"]];
    argvs.extend((0..10).map(|_| vec!["INCR", "quota:n"]));
    argvs.push(vec!["EXEC"]);
    let argvs: Vec<&[&str]> = argvs.iter().map(Vec::as_slice).collect();
    app.pipeline(&argvs).await;
    let mut replies = Vec::new();
    for _ in 0..argvs.len() {
        replies.push(app.read().await);
    }
    let exec = text(replies.last().unwrap());
    assert!(exec.starts_with("EXECABORT"), "{replies:?}");
    assert!(
        replies.iter().any(|r| text(r).starts_with("THROTTLED")),
        "{replies:?}"
    );
    // Nothing of it ran (asked once a token is back).
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(app.call(&["GET", "quota:n"]).await, Frame::Null);
    daemon.stop().await;
}

#[tokio::test]
async fn a_principal_past_its_rate_gets_429_with_retry_after_over_http_then_is_served() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = quota_daemon(&redis, b.uid).await;
    let body = |n: usize| {
        serde_json::json!({"attempt": {"owner": "q", "operation_id": format!("op-{n}")}, "ttl_ms": 1000})
            .to_string()
    };
    let mut statuses = Vec::new();
    let mut throttled = None;
    for n in 0..12 {
        let reply = daemon
            .post(&format!("/v1/leases/quota:{n}/acquire"), &body(n))
            .await;
        statuses.push(reply.status);
        if reply.status == 429 && throttled.is_none() {
            throttled = Some(reply);
        }
    }
    assert_eq!(statuses[..5], [200; 5], "{statuses:?}");
    let throttled = throttled.unwrap_or_else(|| panic!("never throttled: {statuses:?}"));
    let json = throttled.json();
    assert_eq!(json["outcome"], "throttled", "{json}");
    assert_eq!(json["quota"], "app-rate", "{json}");
    assert_eq!(json["limit"], "commands", "{json}");
    let retry_ms = json["retry_after_ms"].as_u64().unwrap();
    assert!((1..=50).contains(&retry_ms), "{json}");
    let retry_after = throttled
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("retry-after"))
        .map(|(_, value)| value.clone());
    assert_eq!(retry_after.as_deref(), Some("1"), "{:?}", throttled.headers);

    tokio::time::sleep(Duration::from_millis(retry_ms)).await;
    let again = daemon
        .post("/v1/leases/quota:again/acquire", &body(99))
        .await;
    assert_eq!(again.status, 200, "{}", again.body);
    daemon.stop().await;
}

/// A quota change is a row of `policy diff`'s plan, and a diff of quotas alone is a change.
#[test]
fn policy_diff_shows_a_changed_quota_as_a_row_of_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.yaml");
    let new = dir.path().join("new.yaml");
    std::fs::write(&old, policy(4242)).unwrap();
    std::fs::write(
        &new,
        policy(4242).replace(
            "commands_per_second: 20\n    burst: 5",
            "commands_per_second: 200",
        ),
    )
    .unwrap();
    let old = admission(&config(&[&old], vec![])).current();
    let new = admission(&config(&[&new], vec![])).current();
    let diff = diff::diff(&old, &new);
    assert!(diff.changed());
    assert_eq!(diff.rows.len(), 0, "no decision changed");
    let plan = diff.render("replay", false);
    assert!(
        plan.contains(
            "~ quota app-rate (app): 20 commands/s (burst 5) -> 200 commands/s (burst 200)"
        ),
        "{plan}"
    );
    assert!(plan.contains("; 1 quota changed"), "{plan}");
}

/// A quota of bytes counts what is sent and what is read back: a large reply is owed once read,
/// and the principal's next command waits for it.
#[tokio::test]
async fn a_quota_of_bytes_counts_requests_and_the_replies_read_back() {
    let redis = RedisServer::start();
    let path = redis.dir().join("bytes.yaml");
    std::fs::write(
        &path,
        r#"
principals:
  app: { uids: [0] }
rules:
  - id: everything
    commands: ["*"]
    allow: the quota tests judge rates, not commands
quotas:
  - id: app-bytes
    principals: [app]
    bytes_per_second: 64KiB
"#,
    )
    .expect("write the policy");
    let daemon = daemon_for_all(&redis, |config| config.policy.files = vec![path]).await;
    let mut app = RawClient::connect(&daemon.resp_socket()).await;
    let value = "v".repeat(40 * 1024);
    // 40 KiB sent: within the 64 KiB a full bucket holds.
    assert_eq!(text(&app.call(&["SET", "quota:big", &value]).await), "OK");
    // 40 KiB more would be 80: refused, naming the bytes.
    let refused = text(&app.call(&["SET", "quota:big2", &value]).await);
    assert!(
        refused.starts_with("THROTTLED tollgate: quota app-bytes: over 65536 bytes/s; retry in "),
        "{refused}"
    );
    // Some time past the retry: 40 KiB would now fit (about 0.8 s of the 1 s bucket in use).
    tokio::time::sleep(Duration::from_millis(retry_ms(&refused) + 200)).await;
    // A small GET is admitted, and the 40 KiB reply it reads back is owed ...
    let got = app.call(&["GET", "quota:big"]).await;
    assert_eq!(text(&got).len(), value.len());
    // ... so the 40 KiB SET that would have fit without it waits (about 0.4 s more).
    let after = text(&app.call(&["SET", "quota:big2", &value]).await);
    assert!(after.starts_with("THROTTLED"), "{after}");
    assert!(retry_ms(&after) > 250, "{after}");
    daemon.stop().await;
}

/// `leases:` counts what a principal holds at once (issue 28's `leases: 100`). Root is `app`,
/// held to two; the second user is `other`, under no lease quota.
fn lease_policy(other_uid: u32) -> String {
    format!(
        r#"
principals:
  app: {{ uids: [0] }}
  other: {{ uids: [{other_uid}] }}
rules:
  - id: leases
    leases: ["*"]
    allow: any lease
quotas:
  - id: app-leases
    principals: [app]
    leases: 2
"#
    )
}

fn acquire<'a>(resource: &'a str, ttl: &'a str, op: &'a str) -> [&'a str; 8] {
    ["LEASE", "ACQUIRE", resource, ttl, "OWNER", "app", "OP", op]
}

/// A principal holding as many leases as its quota allows is refused another, over RESP and
/// HTTP, with when the first of them expires; replaying one it holds is not another; a release,
/// an expiry and the end of a watchdog each give a place back; a lease a watchdog keeps alive
/// holds its place past its TTL (then no time can be promised); another principal is not held.
#[tokio::test]
async fn a_principal_holding_its_quota_of_leases_is_refused_another_until_one_is_given_up() {
    use crate::lease_resp::{integer, outcome};
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let path = redis.dir().join("leases.yaml");
    std::fs::write(&path, lease_policy(b.uid)).expect("write the policy");
    let daemon = daemon_for_all(&redis, |config| config.policy.files = vec![path]).await;
    let mut app = RawClient::connect(&daemon.resp_socket()).await;

    let long = app.call(&acquire("held:a", "60000", "op-a")).await;
    assert_eq!(outcome(&long), "acquired", "{long:?}");
    let short = app.call(&acquire("held:b", "1500", "op-b")).await;
    assert_eq!(outcome(&short), "acquired", "{short:?}");
    let refused = text(&app.call(&acquire("held:c", "60000", "op-c")).await);
    assert!(
        refused
            .starts_with("THROTTLED tollgate: quota app-leases: holds 2 leases at once; retry in "),
        "{refused}"
    );
    // The retry is when `held:b` expires, not `held:a`.
    assert!(retry_ms(&refused) <= 1500, "{refused}");
    // Its own lease again (a replay after a lost reply) is not a third.
    let replayed = app.call(&acquire("held:a", "60000", "op-a")).await;
    assert_eq!(outcome(&replayed), "replayed", "{replayed:?}");

    // Over HTTP: 429, the limit named, Retry-After.
    let body = r#"{"attempt": {"owner": "app", "operation_id": "op-h"}, "ttl_ms": 60000}"#;
    let http = daemon.post("/v1/leases/held:h/acquire", body).await;
    assert_eq!(http.status, 429, "{}", http.body);
    let json = http.json();
    assert_eq!(
        (json["quota"].as_str(), json["limit"].as_str()),
        (Some("app-leases"), Some("leases")),
        "{json}"
    );
    assert!(json["retry_after_ms"].as_u64().unwrap() <= 1500, "{json}");
    assert!(
        http.headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("retry-after")),
        "{:?}",
        http.headers
    );

    // Another principal is not held by app's count.
    for n in 0..3 {
        let theirs = redis_cli(
            &b,
            &daemon,
            &["LEASE", "ACQUIRE", &format!("held:other{n}"), "60000"],
        )
        .await;
        assert!(theirs.contains("acquired"), "{theirs}");
    }

    // A release gives a place back at once.
    let released = app
        .call(&["LEASE", "RELEASE", "held:a", "OWNER", "app", "OP", "op-a"])
        .await;
    assert_eq!(outcome(&released), "released", "{released:?}");
    let c = app.call(&acquire("held:c", "60000", "op-c")).await;
    assert_eq!(outcome(&c), "acquired", "{c:?}");
    // An expiry does too: `held:b` ends within its 1.5 s.
    let mut d = app.call(&acquire("held:d", "60000", "op-d")).await;
    if let Frame::Error(_) = d {
        tokio::time::sleep(Duration::from_millis(retry_ms(&text(&d)))).await;
        d = app.call(&acquire("held:d", "60000", "op-d")).await;
    }
    assert_eq!(outcome(&d), "acquired", "{d:?}");

    // Leases a watchdog keeps alive hold their places past their TTL.
    for (resource, op) in [("held:c", "op-c"), ("held:d", "op-d")] {
        let released = app
            .call(&["LEASE", "RELEASE", resource, "OWNER", "app", "OP", op])
            .await;
        assert_eq!(outcome(&released), "released", "{released:?}");
    }
    let mut session = RawClient::connect(&daemon.resp_socket()).await;
    for (resource, op) in [("held:s1", "op-s1"), ("held:s2", "op-s2")] {
        let mut argv = acquire(resource, "600", op).to_vec();
        argv.push("SESSION");
        let kept = session.call(&argv).await;
        assert_eq!(outcome(&kept), "acquired", "{kept:?}");
        assert!(integer(&kept, "valid_for_ms") <= 600);
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let refused = text(&app.call(&acquire("held:e", "60000", "op-e")).await);
    assert_eq!(
        refused,
        "THROTTLED tollgate: quota app-leases: holds 2 leases at once; release one first"
    );
    let http = daemon.post("/v1/leases/held:h/acquire", body).await;
    assert_eq!(http.status, 429, "{}", http.body);
    assert!(http.json()["retry_after_ms"].is_null(), "{}", http.body);
    assert!(
        !http
            .headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("retry-after")),
        "no time can be promised: {:?}",
        http.headers
    );
    let principals = daemon.get("/v1/principals").await.json();
    let row = principals["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["quota"] == "app-leases")
        .unwrap_or_else(|| panic!("no app-leases row in {principals}"))
        .clone();
    assert_eq!(row["leases_held"], 2, "{row}");
    let metrics = daemon.get("/metrics").await.body;
    assert!(
        metrics
            .lines()
            .any(|line| line
                == r#"tollgate_quota_leases_held{quota="app-leases",principal="app"} 2"#),
        "{metrics}"
    );

    // The session ends: its watchdogs release, and the places come back.
    drop(session);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let e = app.call(&acquire("held:e", "60000", "op-e")).await;
        if matches!(e, Frame::Array(_) | Frame::Map(_)) {
            assert_eq!(outcome(&e), "acquired", "{e:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session's leases still hold their places: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let metrics = daemon.get("/metrics").await.body;
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("tollgate_quota_throttled_total{")
                && line.contains(r#"quota="app-leases""#)
                && line.contains(r#"limit="leases""#)
                && !line.ends_with(" 0")),
        "{metrics}"
    );
    daemon.stop().await;
}
