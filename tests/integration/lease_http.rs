//! The lease HTTP API and the client library against the daemon in-process and a real
//! `redis-server`: status codes, bad input, a reply cut off inside Redis, retries with the same
//! attempt, and the terminal states of the client's state machine.

use std::time::Duration;

use serde_json::json;
use tollgate_lease::LeaseKeys;
use tollgate_lease_client::{
    Acquisition, ClientError, LeaseClient, LeaseState, LostReason, RenewOutcome, Resource,
};
use tollgate_testkit::RedisServer;

use crate::lease::{attempt, command_calls, request, resource};
use crate::support::daemon::TestDaemon;

/// The policy of the lease tests: everyone is `local` and may take leases on `orders:*` and
/// `warm-up`, nothing else, so the tests also see what a policy refuses.
pub(crate) const LEASE_POLICY: &str = r#"
principals:
  local: { any: true }
rules:
  - id: test-leases
    leases: ["orders:*", "warm-up"]
    allow: the lease tests' resources
"#;

/// The daemon against `redis`, under [`LEASE_POLICY`].
pub async fn lease_daemon(redis: &RedisServer) -> TestDaemon {
    lease_daemon_with(redis, |_| {}).await
}

pub async fn lease_daemon_with(
    redis: &RedisServer,
    adjust: impl FnOnce(&mut tollgate::config::Config),
) -> TestDaemon {
    let policy = redis.dir().join("leases.yaml");
    std::fs::write(&policy, LEASE_POLICY).expect("write the test policy");
    TestDaemon::start_with(redis, |config| {
        config.policy.files = vec![policy];
        adjust(config);
    })
    .await
}

fn acquire_body(owner: &str, ttl_ms: u64) -> String {
    json!({"attempt": {"owner": owner, "operation_id": "op-1"}, "ttl_ms": ttl_ms}).to_string()
}

const ACQUIRE: &str = "/v1/leases/orders:nightly/acquire";

/// The embedded default (no config at all) serves leases: its policy admits them for local users.
#[tokio::test]
async fn the_embedded_default_admits_leases() {
    let daemon = TestDaemon::start_embedded().await;
    let first = daemon
        .post(
            "/v1/leases/nightly-report/acquire",
            &acquire_body("cron", 10_000),
        )
        .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.json()["outcome"], "acquired");
    daemon.stop().await;
}

#[tokio::test]
async fn outcomes_map_to_status_codes() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;

    let first = daemon.post(ACQUIRE, &acquire_body("alice", 10_000)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.json()["outcome"], "acquired");
    assert!(first.json()["fence"]
        .as_u64()
        .is_some_and(|fence| fence >= 1));

    let replay = daemon.post(ACQUIRE, &acquire_body("alice", 10_000)).await;
    assert_eq!(
        (replay.status, replay.json()["outcome"].clone()),
        (200, json!("replayed"))
    );

    let contended = daemon.post(ACQUIRE, &acquire_body("bob", 10_000)).await;
    assert_eq!(contended.status, 409);
    assert_eq!(contended.json()["outcome"], "contended");
    assert!(contended.json()["retry_after_ms"].as_u64().unwrap() > 0);

    let conflict = daemon
        .post(
            ACQUIRE,
            &json!({"attempt": {"owner": "alice", "operation_id": "op-2"}, "ttl_ms": 10_000})
                .to_string(),
        )
        .await;
    assert_eq!(
        (conflict.status, conflict.json()["outcome"].clone()),
        (409, json!("conflict"))
    );

    let inspect = daemon
        .post(
            "/v1/leases/orders:nightly/inspect",
            &json!({"attempt": {"owner": "alice", "operation_id": "op-1"}}).to_string(),
        )
        .await;
    assert_eq!(inspect.status, 200);
    assert_eq!(
        (
            inspect.json()["outcome"].clone(),
            inspect.json()["yours"].clone()
        ),
        (json!("held"), json!(true))
    );

    let release = json!({"attempt": {"owner": "alice", "operation_id": "op-1"}}).to_string();
    let released = daemon
        .post("/v1/leases/orders:nightly/release", &release)
        .await;
    assert_eq!(
        (released.status, released.json()["outcome"].clone()),
        (200, json!("released"))
    );
    let again = daemon
        .post("/v1/leases/orders:nightly/release", &release)
        .await;
    assert_eq!(again.json()["outcome"], "already_absent");

    drop(redis);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let down = daemon.post(ACQUIRE, &acquire_body("alice", 10_000)).await;
    assert_eq!(down.status, 503, "{}", down.body);
    assert_eq!(down.json()["outcome"], "unavailable");
    assert!(down.header("retry-after").is_some());
    daemon.stop().await;
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let cases = [
        (
            ACQUIRE,
            json!({"attempt": {"owner": "a", "operation_id": "b"}, "ttl_ms": 1000, "colour": 1}),
            "colour",
        ),
        (
            ACQUIRE,
            json!({"attempt": {"owner": "a", "operation_id": "b", "x": 1}, "ttl_ms": 1000}),
            "attempt.x",
        ),
        (
            ACQUIRE,
            json!({"attempt": {"owner": "a", "operation_id": "b"}, "ttl_ms": 1}),
            "ttl_ms",
        ),
        (
            ACQUIRE,
            json!({"attempt": {"owner": "a", "operation_id": "b"}, "ttl_ms": 1000, "wait_ms": 999_999_999}),
            "wait_ms",
        ),
        (
            ACQUIRE,
            json!({"attempt": {"owner": "a b", "operation_id": "b"}, "ttl_ms": 1000}),
            "attempt.owner",
        ),
        (
            "/v1/leases/orders%2Fx/acquire",
            json!({"attempt": {"owner": "a", "operation_id": "b"}, "ttl_ms": 1000}),
            "resource",
        ),
    ];
    for (path, body, field) in cases {
        let reply = daemon.post(path, &body.to_string()).await;
        assert_eq!(reply.status, 400, "{body}: {}", reply.body);
        assert_eq!(reply.json()["field"], field, "{body}: {}", reply.body);
    }
    let huge = format!(
        r#"{{"attempt": {{"owner": "{}", "operation_id": "b"}}, "ttl_ms": 1000}}"#,
        "a".repeat(100_000)
    );
    let oversized = daemon.post(ACQUIRE, &huge).await;
    assert_eq!(
        oversized.json()["outcome"],
        "body_too_large",
        "{}",
        oversized.body
    );
    // Nothing reached Redis, and the daemon still serves.
    assert_eq!(
        daemon
            .post(ACQUIRE, &acquire_body("alice", 10_000))
            .await
            .status,
        200
    );
    daemon.stop().await;
}

/// Acquires elsewhere once, so the acquire script is loaded on the server.
async fn warm_up(daemon: &TestDaemon) {
    let reply = daemon
        .post("/v1/leases/warm-up/acquire", &acquire_body("warm", 10_000))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

/// Holds the server's writes, lets the daemon's acquisition go out, then cuts the daemon's
/// connections: the script was sent and never ran, and its reply is lost.
async fn cut_while_paused(redis: &RedisServer) {
    tokio::time::sleep(Duration::from_millis(150)).await;
    redis.inline("CLIENT KILL TYPE normal");
}

#[tokio::test]
async fn a_cut_reply_is_indeterminate_and_a_retry_with_the_same_attempt_holds_once() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    // Load the scripts first so that the cut call is the acquisition itself.
    warm_up(&daemon).await;
    let body = acquire_body("alice", 10_000);
    redis.inline("CLIENT PAUSE 600 WRITE");
    let (reply, ()) = tokio::join!(daemon.post(ACQUIRE, &body), cut_while_paused(&redis));
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert_eq!(reply.json()["outcome"], "indeterminate");

    tokio::time::sleep(Duration::from_millis(600)).await;
    let retry = daemon.post(ACQUIRE, &acquire_body("alice", 10_000)).await;
    assert_eq!(retry.status, 200, "{}", retry.body);
    let counter = redis.inline_in(1, &format!("GET {}", LeaseKeys::of(&resource()).fence));
    assert!(
        counter.contains(&format!("\r\n{}\r\n", retry.json()["fence"])),
        "held exactly once: counter {counter:?}, {}",
        retry.body
    );
    daemon.stop().await;
}

#[tokio::test]
async fn the_client_retries_an_indeterminate_call_with_the_same_attempt() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let client = LeaseClient::new(&daemon.http_socket()).with_retries(5);
    warm_up(&daemon).await;
    let request = request(&LeaseClient::new_attempt(), 10_000, 0);
    let resource = resource();
    redis.inline("CLIENT PAUSE 400 WRITE");
    let (acquired, ()) = tokio::join!(
        client.acquire(&resource, &request),
        cut_while_paused(&redis)
    );
    let Acquisition::Held(lease) = acquired.unwrap() else {
        panic!("the retries reach the server once the pause ends");
    };
    let counter = redis.inline_in(1, &format!("GET {}", LeaseKeys::of(&resource).fence));
    assert!(
        counter.contains(&format!("\r\n{}\r\n", lease.fence())),
        "one acquisition, however many sends: counter {counter:?}, fence {}",
        lease.fence()
    );
    daemon.stop().await;
}

#[tokio::test]
async fn renew_after_lost_sends_nothing() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let client = LeaseClient::new(&daemon.http_socket());
    let request = request(&attempt("alice", "op-1"), 10_000, 0);
    let Acquisition::Held(mut lease) = client.acquire(&resource(), &request).await.unwrap() else {
        panic!("free resource");
    };
    redis.inline_in(1, &format!("DEL {}", LeaseKeys::of(&resource()).lease));
    assert_eq!(
        lease.renew(Duration::from_secs(10)).await.unwrap(),
        RenewOutcome::Lost {
            reason: LostReason::Absent
        }
    );
    assert_eq!(lease.state(), LeaseState::Lost);
    let sent = command_calls(&redis, "evalsha");
    assert!(matches!(
        lease.renew(Duration::from_secs(10)).await,
        Err(ClientError::Terminal(_))
    ));
    assert!(matches!(
        lease.release().await,
        Err(ClientError::Terminal(_))
    ));
    assert_eq!(
        command_calls(&redis, "evalsha"),
        sent,
        "nothing reached Redis"
    );
    daemon.stop().await;
}

#[tokio::test]
async fn the_events_stream_reports_the_watchdogs_renewals_and_a_loss() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let client = LeaseClient::new(&daemon.http_socket());
    let mut request = request(&attempt("alice", "op-1"), 600, 0);
    request.watchdog = true;
    let Acquisition::Held(lease) = client.acquire(&resource(), &request).await.unwrap() else {
        panic!("free resource");
    };
    let mut events = lease.events().await.unwrap();
    let first = events.next().await.unwrap().unwrap();
    assert!(
        matches!(first, tollgate_lease_client::LeaseEvent::Renewed { .. }),
        "{first:?}"
    );
    redis.inline_in(1, &format!("DEL {}", LeaseKeys::of(&resource()).lease));
    let lost = loop {
        match events.next().await {
            Some(Ok(tollgate_lease_client::LeaseEvent::Renewed { .. })) => continue,
            other => break other,
        }
    };
    assert!(
        matches!(
            lost,
            Some(Ok(tollgate_lease_client::LeaseEvent::Lost { .. }))
        ),
        "{lost:?}"
    );
    assert!(
        events.next().await.is_none(),
        "the stream ends with the watchdog"
    );
    let unwatched = client
        .events(
            &Resource::parse("orders:elsewhere").unwrap(),
            lease.attempt(),
        )
        .await;
    assert!(matches!(
        unwatched,
        Err(ClientError::Rejected { status: 404, .. })
    ));
    daemon.stop().await;
}

#[tokio::test]
async fn the_policy_admits_leases_per_resource() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let denied = daemon
        .post(
            "/v1/leases/payroll:run/acquire",
            &acquire_body("alice", 10_000),
        )
        .await;
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert_eq!(denied.json()["outcome"], "denied");
    assert!(denied.json()["rule"]
        .as_str()
        .is_some_and(|rule| !rule.is_empty()));
    assert_eq!(command_calls(&redis, "evalsha"), 0, "nothing reached Redis");
    assert_eq!(
        daemon
            .post(ACQUIRE, &acquire_body("alice", 10_000))
            .await
            .status,
        200
    );
    daemon.stop().await;
}
