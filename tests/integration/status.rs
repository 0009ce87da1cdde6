//! `tollgate status` against a running daemon: the real binary asks the daemon's HTTP socket
//! (`GET /v1/status`) and prints one screen, snapshotted with the parts that change from run to
//! run (paths, versions, times, connection counts) redacted; `--json` gives the daemon's answer.

use std::process::Command;

use tollgate_testkit::RedisServer;

use crate::policy_support::root;
use crate::support::daemon::TestDaemon;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_one_screen_of_a_running_daemon() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    // Ready once Redis answers; status says so (and exits 0) from then on.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while daemon.get("/readyz").await.status != 200 {
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (code, screen) = tokio::task::spawn_blocking({
        let socket = daemon.http_socket();
        move || {
            let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
                .arg("status")
                .arg("--socket")
                .arg(socket)
                .output()
                .unwrap();
            (
                output.status.code().unwrap(),
                String::from_utf8(output.stdout).unwrap(),
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{screen}");

    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(root().join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.add_filter(r"redis \d+\.\d+\.\d+", "redis [version]");
    settings.add_filter(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "[time]");
    settings.add_filter(r"(?m)^(  [A-Z]+ +)\d+", "$1[n]");
    settings.add_filter(r"/tmp/[^\s:]+", "[path]");
    settings.bind(|| insta::assert_snapshot!("status", screen));

    let (code, json) = tokio::task::spawn_blocking({
        let daemon_socket = daemon.http_socket();
        move || {
            let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
                .args(["status", "--json", "--socket"])
                .arg(daemon_socket)
                .output()
                .unwrap();
            (
                output.status.code().unwrap(),
                String::from_utf8(output.stdout).unwrap(),
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["ready"], true);
    assert_eq!(json["redis"]["mode"], "standalone");
    assert_eq!(json["redis"]["nodes"][0]["reachable"], true, "{json}");
    assert_eq!(json["policy"]["generation"], 1);
    assert_eq!(json["lanes"]["lanes"].as_array().unwrap().len(), 6);
    daemon.stop().await;
}

#[test]
fn status_of_no_daemon_says_so_and_exits_2() {
    let dir = crate::support::daemon::tempdir();
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["status", "--socket"])
        .arg(dir.path().join("absent.sock"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("absent.sock"), "{stderr}");
}
