//! `INFO` through the daemon: its keyspace shows database 0 alone (the lease database is no
//! client's), and a caller whose keys the policy constrains (a tenant) sees neither the key counts
//! nor the per-command counts of the whole server, which are every tenant's.

use redis::AsyncCommands;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

/// One tenant, every local user: its keys are `t:*`, and it may read INFO.
const TENANT: &str = r#"
principals:
  tenant: { any: true }
rules:
  - id: tenant-keys
    commands: ["@read", "@write", "@keyspace"]
    keys: ["t:*"]
    allow: the tenant's own keys
  - id: diagnostics
    commands: [INFO, MULTI, EXEC, PING]
    allow: diagnostics
"#;

/// Another tenant's keys in database 0 and the daemon's in database 1, written around the daemon.
async fn others_keys(redis: &RedisServer) {
    for db in [0, 1] {
        let mut conn = redis::Client::open(redis.url_in(db))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = conn.set("other:1", "x").await.unwrap();
        let _: () = conn.set("other:2", "x").await.unwrap();
    }
}

async fn info(client: &mut RawClient, section: &str) -> String {
    let reply = client.call(&["INFO", section]).await;
    assert!(matches!(reply, Frame::Bulk(_)), "INFO {section}: {reply:?}");
    text(&reply)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_no_server_wide_key_or_command_counts() {
    let redis = RedisServer::start();
    others_keys(&redis).await;
    let policy = redis.dir().join("tenant.yaml");
    std::fs::write(&policy, TENANT).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy]).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["SET", "t:1", "v"]).await), "OK");

    let keyspace = info(&mut client, "keyspace").await;
    assert!(keyspace.contains("# Keyspace"), "{keyspace}");
    assert!(
        !keyspace.contains("db0:") && !keyspace.contains("db1:"),
        "{keyspace}"
    );
    let stats = info(&mut client, "commandstats").await;
    assert!(stats.contains("# Commandstats"), "{stats}");
    assert!(!stats.contains("cmdstat_"), "{stats}");
    let everything = info(&mut client, "everything").await;
    for hidden in ["cmdstat_", "errorstat_", "db0:", "db1:"] {
        assert!(!everything.contains(hidden), "{hidden} in {everything}");
    }
    assert!(everything.contains("redis_version:"), "the rest is Redis's");

    // A transaction's reply is not edited: INFO is refused while queueing.
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    let queued = client.call(&["INFO", "keyspace"]).await;
    assert!(
        text(&queued).starts_with("ERR tollgate: INFO cannot run inside a transaction"),
        "{queued:?}"
    );
    assert!(text(&client.call(&["EXEC"]).await).starts_with("EXECABORT"));
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_default_policy_info_shows_database_zero_and_the_command_counts() {
    let redis = RedisServer::start();
    others_keys(&redis).await;
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let keyspace = info(&mut client, "keyspace").await;
    assert!(keyspace.contains("db0:keys=2"), "{keyspace}");
    assert!(!keyspace.contains("db1:"), "the lease database: {keyspace}");
    let stats = info(&mut client, "commandstats").await;
    assert!(stats.contains("cmdstat_"), "{stats}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connected_clients_counts_the_daemons_clients_not_its_lanes() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut client = RawClient::connect(&daemon.resp_socket()).await;
        // Each sends something, so that its session is registered, and the lanes open.
        assert_eq!(text(&client.call(&["SET", "k", "v"]).await), "OK");
        clients.push(client);
    }
    let listed = text(&clients[0].call(&["CLIENT", "LIST"]).await);
    assert_eq!(listed.lines().count(), 3, "{listed}");
    let section = info(&mut clients[0], "clients").await;
    assert!(section.contains("connected_clients:3\r\n"), "{section}");
    drop(clients.pop());
    // The closed session leaves the list (asynchronously): INFO follows CLIENT LIST.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let section = info(&mut clients[0], "clients").await;
        if section.contains("connected_clients:2\r\n") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{section}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    daemon.stop().await;
}
