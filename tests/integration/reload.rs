//! One reload, whoever asks: SIGHUP to the real binary and `POST /v1/policy/reload` fired at the
//! same moment go through the same throttle and lock — one generation at a time, and within
//! `admin.reload_interval` only one of them reloads; the other is refused and counted as such.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_testkit::http;

use crate::support::daemon::tempdir;

const POLICY: &str = "principals:\n  me: { any: true }\nrules:\n  - id: data\n    commands: [\"@read\", \"@write\", \"@connection\"]\n    allow: data\n";

/// `tollgate_policy_reload_requests_total{…}` lines of `/metrics`, as (trigger, outcome, count).
async fn reload_requests(socket: &Path) -> Vec<(String, String, u64)> {
    let metrics = http::get(socket, "/metrics").await.unwrap().body;
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("tollgate_policy_reload_requests_total{"))
        .map(|rest| {
            let (labels, count) = rest.split_once("} ").unwrap();
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
                    .unwrap()
                    .trim_end_matches('"')
                    .to_owned()
            };
            (
                label("trigger"),
                label("outcome"),
                count.trim().parse().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_http_reloads_share_one_throttle_and_one_lock() {
    let dir = tempdir();
    let policy = dir.path().join("policy.yaml");
    let config = dir.path().join("tollgate.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    std::fs::write(
        &config,
        format!(
            "policy:\n  files: [{}]\nadmin:\n  reload_interval: 1h\n",
            policy.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("XDG_RUNTIME_DIR", dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let socket = dir.path().join("tollgate/http.sock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http::get(&socket, "/readyz")
        .await
        .is_ok_and(|reply| reply.status == 200)
    {
        assert!(Instant::now() < deadline, "the daemon never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Both at once: the signal and the request.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (answer, ()) = tokio::join!(http::post(&socket, "/v1/policy/reload", "{}"), async {
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    });
    let answer = answer.unwrap();

    // The signal's reload is done once it is counted.
    let deadline = Instant::now() + Duration::from_secs(60);
    let counted = loop {
        let counted = reload_requests(&socket).await;
        let total: u64 = counted.iter().map(|(_, _, count)| count).sum();
        if total == 2 {
            break counted;
        }
        assert!(
            Instant::now() < deadline,
            "both reloads never got counted: {counted:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reloaded: Vec<_> = counted.iter().filter(|c| c.1 == "reloaded").collect();
    let throttled: Vec<_> = counted.iter().filter(|c| c.1 == "throttled").collect();
    assert_eq!(
        reloaded.len(),
        1,
        "exactly one of the two reloads: {counted:?}"
    );
    assert_eq!(throttled.len(), 1, "the other one throttled: {counted:?}");
    assert_ne!(reloaded[0].0, throttled[0].0, "{counted:?}");
    // Whichever lost, the HTTP answer says the same as the counts.
    if reloaded[0].0 == "http" {
        assert_eq!(answer.status, 200, "{:?}", answer.json());
    } else {
        assert_eq!(answer.status, 429, "{:?}", answer.json());
        assert!(
            answer.json()["reason"]
                .as_str()
                .is_some_and(|reason| reason.contains("admin.reload_interval")),
            "{:?}",
            answer.json()
        );
    }
    let shown = http::get(&socket, "/v1/policy").await.unwrap().json();
    assert_eq!(
        shown["generation"]["number"], 2,
        "one generation more: {shown}"
    );

    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());
}
