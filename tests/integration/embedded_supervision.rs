//! The supervised embedded redis-server: after `kill -9` it is reaped (no zombie), started again on
//! the same socket with the daemon's users and their unchanged passwords, the lanes reconnect,
//! `/readyz` turns 200 again, the restart is counted, a restart that fails is tried again (with
//! `/readyz` saying why meanwhile), and stopping the daemon leaves no redis-server behind, also when
//! it was killed just before the stop.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

use crate::foundation::{processes_mentioning, wait_for_status};
use crate::support::daemon::{tempdir, TestDaemon};
use crate::support::raw::{text, RawClient};

/// How long a restart may take before the test gives up instead of hanging (a bound, not a claim).
const PATIENCE: Duration = Duration::from_secs(30);

fn acquire_body(operation: &str) -> String {
    json!({"attempt": {"owner": "cron", "operation_id": operation}, "ttl_ms": 60_000}).to_string()
}

/// A lease acquisition, retried while the lease lanes are still reconnecting (`unavailable` means
/// not sent, so a client retries it); the reply's JSON once it is anything else.
async fn acquire(daemon: &TestDaemon, operation: &str) -> serde_json::Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let reply = daemon
            .post(
                "/v1/leases/nightly-report/acquire",
                &acquire_body(operation),
            )
            .await;
        let body = reply.json();
        if body["outcome"] != "unavailable" {
            assert_eq!(reply.status, 200, "{}", reply.body);
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "leases unavailable: {}",
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The state letter in `/proc/<pid>/stat` (`Z` for a zombie), or `None` when there is no such process.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

async fn restarts(daemon: &TestDaemon) -> String {
    let metrics = daemon.get("/metrics").await.body;
    metrics
        .lines()
        .find(|line| line.starts_with("tollgate_embedded_redis_restarts_total "))
        .unwrap_or_else(|| panic!("no restart counter in {metrics}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_embedded_redis_is_reaped_restarted_with_its_users_and_serves_again() {
    let daemon = TestDaemon::start_embedded().await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["SET", "before", "1"]).await), "OK");
    let before = acquire(&daemon, "op-before").await;
    assert_eq!(before["outcome"], "acquired", "{before}");
    let fence_before = before["fence"].as_u64().expect("a fence");
    assert_eq!(
        restarts(&daemon).await,
        "tollgate_embedded_redis_restarts_total 0"
    );

    let old = daemon.embedded_pid().expect("embedded redis-server runs");
    kill(Pid::from_raw(old as i32), Signal::SIGKILL).unwrap();

    let deadline = Instant::now() + PATIENCE;
    let new = loop {
        match daemon.embedded_pid() {
            Some(pid) if pid != old => break pid,
            _ => {
                assert!(
                    Instant::now() < deadline,
                    "embedded redis-server not restarted"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_ne!(
        process_state(old),
        Some('Z'),
        "the killed redis-server (pid {old}) is a zombie"
    );
    wait_for_status(&daemon.http_socket(), "/readyz", 200).await;

    // Every daemon user is back, with the password the lanes read at start-up.
    let mut redis = RawClient::connect(&daemon.dir().join("redis.sock")).await;
    for user in
        tollgate_lanes::daemon_users(daemon.dir(), &crate::support::daemon::default_grants())
    {
        let password = std::fs::read_to_string(&user.password_file).unwrap();
        let reply = redis.call(&["AUTH", &user.name, password.trim_end()]).await;
        assert_eq!(text(&reply), "OK", "{}", user.name);
    }

    // The same client connection goes on working; the data is new (no persistence).
    assert_eq!(text(&client.call(&["SET", "after", "2"]).await), "OK");
    assert_eq!(text(&client.call(&["GET", "after"]).await), "2");
    let after = acquire(&daemon, "op-after").await;
    assert_eq!(after["outcome"], "acquired", "{after}");
    let fence_after = after["fence"].as_u64().expect("a fence");
    assert!(
        fence_after > fence_before,
        "fence {fence_after} after the restart, {fence_before} before"
    );
    assert_eq!(
        restarts(&daemon).await,
        "tollgate_embedded_redis_restarts_total 1"
    );

    let dir = daemon.dir().to_owned();
    let socket = dir.join("redis.sock");
    daemon.stop().await;
    assert!(!socket.exists(), "embedded socket file left behind");
    assert_eq!(processes_mentioning(&dir), Vec::<u32>::new());
    assert_eq!(
        process_state(new),
        None,
        "the restarted redis-server is still there"
    );
}

/// Killed just before the stop: whether or not the supervisor got to restart it, nothing is left.
#[tokio::test]
async fn stopping_right_after_a_kill_leaves_no_redis_server() {
    let daemon = TestDaemon::start_embedded().await;
    let pid = daemon.embedded_pid().expect("embedded redis-server runs");
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    let dir = daemon.dir().to_owned();
    daemon.stop().await;
    assert!(!dir.join("redis.sock").exists(), "socket file left behind");
    assert_eq!(processes_mentioning(&dir), Vec::<u32>::new());
}

/// While restarts fail (here the binary refuses to run again) the supervisor keeps trying,
/// `/readyz` says why it is not ready and nothing is counted; once the binary runs, it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_restart_is_tried_again_and_readyz_names_the_embedded_server_meanwhile() {
    let scratch = tempdir();
    let refuse = scratch.path().join("refuse");
    let binary = scratch.path().join("redis-server-unless-refused");
    std::fs::write(
        &binary,
        format!(
            "#!/bin/sh\n[ -e '{}' ] && exit 1\nexec redis-server \"$@\"\n",
            refuse.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tempdir();
    let mut config = TestDaemon::config(dir.path());
    config.embedded.binary = binary;
    let daemon = TestDaemon::start_config(dir, config).await;
    assert_eq!(daemon.get("/readyz").await.status, 200);

    std::fs::write(&refuse, "").unwrap();
    let pid = daemon.embedded_pid().expect("embedded redis-server runs");
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + PATIENCE;
    let reasons = loop {
        let reply = daemon.get("/readyz").await;
        let reasons = reply.json()["reasons"].to_string();
        if reasons.contains("embedded redis-server exited; it is being restarted") {
            assert_eq!(reply.status, 503);
            break reasons;
        }
        assert!(
            Instant::now() < deadline,
            "readyz never said why: {reasons}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The daemon itself is fine: liveness stays 200.
    assert_eq!(daemon.get("/healthz").await.status, 200, "{reasons}");
    assert_eq!(
        restarts(&daemon).await,
        "tollgate_embedded_redis_restarts_total 0"
    );

    std::fs::remove_file(&refuse).unwrap();
    wait_for_status(&daemon.http_socket(), "/readyz", 200).await;
    assert_eq!(
        restarts(&daemon).await,
        "tollgate_embedded_redis_restarts_total 1"
    );
    let dir = daemon.dir().to_owned();
    daemon.stop().await;
    assert_eq!(processes_mentioning(&dir), Vec::<u32>::new());
}
