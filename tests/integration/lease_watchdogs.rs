//! Watchdogs are bounded per user of a principal (`leases.max_watchdogs_per_uid`): past the cap an
//! acquire asking for one gets 429 naming the limit and nothing reaches Redis, acquires without a
//! watchdog go on working, and a released lease gives its place back.

use serde_json::json;
use tollgate_testkit::RedisServer;

use crate::lease::command_calls;
use crate::lease_http::lease_daemon_with;
use crate::support::daemon::TestDaemon;

fn acquire_body(owner: &str, watchdog: bool) -> String {
    json!({
        "attempt": {"owner": owner, "operation_id": "op-1"},
        "ttl_ms": 10_000,
        "watchdog": watchdog,
    })
    .to_string()
}

async fn acquire(daemon: &TestDaemon, resource: &str, watchdog: bool) -> (u16, serde_json::Value) {
    let reply = daemon
        .post(
            &format!("/v1/leases/{resource}/acquire"),
            &acquire_body("cap", watchdog),
        )
        .await;
    (reply.status, reply.json())
}

#[tokio::test]
async fn a_principal_past_its_watchdog_cap_gets_429_until_it_releases_one() {
    let redis = RedisServer::start();
    let daemon = lease_daemon_with(&redis, |config| {
        config.leases.max_watchdogs_per_uid = 2;
    })
    .await;

    for resource in ["orders:a", "orders:b"] {
        let (status, body) = acquire(&daemon, resource, true).await;
        assert_eq!(
            (status, &body["outcome"]),
            (200, &json!("acquired")),
            "{body}"
        );
    }
    let scripts_before = command_calls(&redis, "evalsha") + command_calls(&redis, "eval");
    let (status, body) = acquire(&daemon, "orders:c", true).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body, json!({"outcome": "too_many_watchdogs", "limit": 2}));
    assert_eq!(
        command_calls(&redis, "evalsha") + command_calls(&redis, "eval"),
        scripts_before,
        "the refused acquire reached Redis"
    );
    let inspect = daemon.post("/v1/leases/orders:c/inspect", "{}").await;
    assert_eq!(inspect.json()["outcome"], "free", "{}", inspect.body);

    // Without a watchdog the principal is not limited; a replay of a watched lease needs no place.
    let (status, body) = acquire(&daemon, "orders:c", false).await;
    assert_eq!(
        (status, &body["outcome"]),
        (200, &json!("acquired")),
        "{body}"
    );
    let (status, body) = acquire(&daemon, "orders:a", true).await;
    assert_eq!(
        (status, &body["outcome"]),
        (200, &json!("replayed")),
        "{body}"
    );

    let release = daemon
        .post(
            "/v1/leases/orders:a/release",
            &json!({"attempt": {"owner": "cap", "operation_id": "op-1"}}).to_string(),
        )
        .await;
    assert_eq!(release.json()["outcome"], "released", "{}", release.body);
    let (status, body) = acquire(&daemon, "orders:d", true).await;
    assert_eq!(
        (status, &body["outcome"]),
        (200, &json!("acquired")),
        "{body}"
    );
    let (status, _) = acquire(&daemon, "orders:e", true).await;
    assert_eq!(status, 429, "the freed place is taken again");
    daemon.stop().await;
}
