//! `tollgate lease run` as a user runs it: the real binary against the daemon in-process and a real
//! `redis-server`. CMD sees the fencing token, its exit code comes through, and losing the lease
//! stops it.

use std::time::Duration;

use tokio::process::Command;
use tollgate_lease::LeaseKeys;
use tollgate_lease_client::{InspectOutcome, LeaseClient};
use tollgate_testkit::RedisServer;

use crate::lease::resource;
use crate::lease_http::lease_daemon;
use crate::support::daemon::TestDaemon;

fn lease_run(daemon: &TestDaemon, ttl: &str, command: &[&str]) -> Command {
    let mut run = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    run.args(["lease", "run", "--socket"])
        .arg(daemon.http_socket())
        .args([
            "--resource",
            resource().as_str(),
            "--ttl",
            ttl,
            "--grace",
            "1s",
            "--",
        ])
        .args(command)
        .kill_on_drop(true);
    run
}

#[tokio::test]
async fn cmd_gets_the_fencing_token_and_its_exit_code_comes_through() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let out = daemon.dir().join("seen");
    let script = format!(
        "echo \"$TOLLGATE_FENCING_TOKEN $TOLLGATE_LEASE_RESOURCE\" > {}; exit 7",
        out.display()
    );
    let status = lease_run(&daemon, "5s", &["sh", "-c", &script])
        .status()
        .await
        .unwrap();
    assert_eq!(status.code(), Some(7));
    // The token is the fence this acquisition was handed: the counter's value in the lease database.
    let counter = redis.inline_in(1, &format!("GET {}", LeaseKeys::of(&resource()).fence));
    let fence = counter.lines().nth(1).expect("a fence counter");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().trim(),
        format!("{fence} orders:nightly")
    );
    let client = LeaseClient::new(&daemon.http_socket());
    assert_eq!(
        client.inspect(&resource(), None).await.unwrap(),
        InspectOutcome::Free,
        "released on exit"
    );

    let status = lease_run(&daemon, "5s", &["true"]).status().await.unwrap();
    assert_eq!(status.code(), Some(0));
    daemon.stop().await;
}

#[tokio::test]
async fn a_held_resource_is_a_distinct_exit_code() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let mut holder = lease_run(&daemon, "5s", &["sleep", "30"]).spawn().unwrap();
    let client = LeaseClient::new(&daemon.http_socket());
    wait_until_held(&client).await;
    let status = lease_run(&daemon, "5s", &["true"]).status().await.unwrap();
    assert_eq!(status.code(), Some(75), "could not acquire");
    holder.kill().await.unwrap();
    daemon.stop().await;
}

#[tokio::test]
async fn losing_the_lease_stops_cmd_and_exits_lost() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let pid_file = daemon.dir().join("cmd.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let run = lease_run(&daemon, "600ms", &["sh", "-c", &script])
        .spawn()
        .unwrap();
    let client = LeaseClient::new(&daemon.http_socket());
    wait_until_held(&client).await;
    let cmd_pid = read_pid(&pid_file).await;

    redis.inline_in(1, &format!("DEL {}", LeaseKeys::of(&resource()).lease));
    let output = tokio::time::timeout(Duration::from_secs(10), run.wait_with_output())
        .await
        .expect("lease run ends once the lease is lost")
        .unwrap();
    assert_eq!(output.status.code(), Some(76), "lost");
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(cmd_pid), None).is_ok();
    assert!(!alive, "CMD was stopped");
    daemon.stop().await;
}

#[tokio::test]
async fn killing_lease_run_releases_the_lease_at_once_and_stops_cmd() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let pid_file = daemon.dir().join("cmd.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let mut run = lease_run(&daemon, "30s", &["sh", "-c", &script])
        .spawn()
        .unwrap();
    let client = LeaseClient::new(&daemon.http_socket());
    wait_until_held(&client).await;
    let cmd_pid = read_pid(&pid_file).await;
    run.kill().await.unwrap();
    // The holder process died: its pidfd tells the daemon, which releases long before the 30 s TTL.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while client.inspect(&resource(), None).await.unwrap() != InspectOutcome::Free {
        assert!(
            tokio::time::Instant::now() < deadline,
            "lease still held after the holder died"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // CMD got SIGTERM from the kernel when its parent died (it is reaped by init, not by us).
    while std::fs::metadata(format!("/proc/{cmd_pid}")).is_ok_and(|_| !is_zombie(cmd_pid)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "CMD outlived lease run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    daemon.stop().await;
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .unwrap_or_default()
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

async fn read_pid(file: &std::path::Path) -> i32 {
    loop {
        if let Ok(text) = std::fs::read_to_string(file) {
            if let Ok(pid) = text.trim().parse() {
                return pid;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_until_held(client: &LeaseClient) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let InspectOutcome::Held { .. } = client.inspect(&resource(), None).await.unwrap() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "lease run never took the lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sigterm_is_passed_on_to_cmd_and_the_lease_released_after_it() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let run = lease_run(&daemon, "30s", &["sleep", "30"]).spawn().unwrap();
    let client = LeaseClient::new(&daemon.http_socket());
    wait_until_held(&client).await;
    let pid = nix::unistd::Pid::from_raw(run.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let output = tokio::time::timeout(Duration::from_secs(10), run.wait_with_output())
        .await
        .expect("lease run ends with CMD")
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(128 + 15),
        "CMD's own end by SIGTERM"
    );
    assert_eq!(
        client.inspect(&resource(), None).await.unwrap(),
        InspectOutcome::Free
    );
    daemon.stop().await;
}
