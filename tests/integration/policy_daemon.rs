//! The policy inside the daemon: `GET /v1/policy`, `POST /v1/policy/explain`, reload over HTTP
//! (a broken policy is refused with line:column and the running generation keeps deciding, seen
//! through the RESP socket), SIGHUP reload of the real binary, and the `tollgate policy` CLI.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_testkit::{http, RedisServer};

use crate::policy_support::root;
use crate::support::daemon::{tempdir, TestDaemon};

const ALLOW_ALL_DATA: &str = "principals:\n  me: { any: true }\nrules:\n  - id: data\n    commands: [\"@read\", \"@write\", \"@connection\"]\n    allow: data\n";
const READ_ONLY: &str = "principals:\n  me: { any: true }\nrules:\n  - id: reads\n    commands: [\"@read\", \"@connection\"]\n    allow: reads only\n";
const BROKEN: &str = "principals:\n  me: { any: true }\nrules:\n  - id: reads\n    commands: [\"@reads\"]\n    allow: typo\n";

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

async fn set(resp: &Path) -> redis::RedisResult<()> {
    let client = redis::Client::open(format!("unix://{}", resp.display())).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await?;
    redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut connection)
        .await
}

#[tokio::test]
async fn http_shows_explains_and_reloads_and_a_broken_policy_never_becomes_active() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, ALLOW_ALL_DATA).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.policy.files = vec![policy.clone()];
        // Two reloads follow each other here; their spacing is `identity::reloads_are_rate_limited`'s.
        config.admin.reload_interval = std::time::Duration::from_millis(1);
    })
    .await;

    let shown = daemon.get("/v1/policy").await.json();
    assert_eq!(shown["outcome"], "ok");
    assert_eq!(shown["generation"]["number"], 1);
    assert_eq!(
        shown["generation"]["files"][0]["path"],
        policy.display().to_string()
    );
    assert_eq!(shown["generation"]["modules"][0]["name"], "catalog");

    let explained = daemon
        .post(
            "/v1/policy/explain",
            r#"{"principal":"me","argv":["SET","k","v"]}"#,
        )
        .await
        .json();
    assert_eq!(explained["outcome"], "admitted");
    assert_eq!(explained["rule"], "data");
    assert_eq!(explained["descriptor"]["keys"][0]["position"], 1);
    assert_eq!(explained["steps"][1]["verdict"], "allow");
    let unknown_field = daemon
        .post(
            "/v1/policy/explain",
            r#"{"principal":"me","argv":["GET"],"x":1}"#,
        )
        .await;
    assert_eq!(unknown_field.status, 400);

    set(&daemon.resp_socket())
        .await
        .expect("SET is allowed by generation 1");

    std::fs::write(&policy, BROKEN).unwrap();
    let refused = daemon.post("/v1/policy/reload", "").await;
    assert_eq!(refused.status, 422);
    let refused = refused.json();
    assert_eq!(refused["outcome"], "rejected");
    let error = refused["errors"][0].as_str().unwrap();
    assert!(
        error.contains("policy.yaml:5:16: error: unknown category `@reads`"),
        "{error}"
    );
    assert_eq!(
        daemon.get("/v1/policy").await.json()["generation"]["number"],
        1
    );
    set(&daemon.resp_socket())
        .await
        .expect("generation 1 still decides");

    std::fs::write(&policy, READ_ONLY).unwrap();
    let reloaded = daemon.post("/v1/policy/reload", "").await;
    assert_eq!(reloaded.status, 200);
    assert_eq!(reloaded.json()["generation"]["number"], 2);
    let denied = set(&daemon.resp_socket()).await.unwrap_err();
    assert!(denied.to_string().contains("denies SET"), "{denied}");
    daemon.stop().await;
}

#[tokio::test]
async fn sighup_reloads_the_policy_of_the_running_binary() {
    let dir = tempdir();
    let policy = dir.path().join("policy.yaml");
    let config = dir.path().join("tollgate.yaml");
    std::fs::write(&policy, ALLOW_ALL_DATA).unwrap();
    std::fs::write(
        &config,
        format!("policy:\n  files: [{}]\n", policy.display()),
    )
    .unwrap();
    let mut child = tollgate()
        .args(["serve", "--config"])
        .arg(&config)
        .env("XDG_RUNTIME_DIR", dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let socket = dir.path().join("tollgate/http.sock");
    wait_for_generation(&socket, 1).await;

    std::fs::write(&policy, READ_ONLY).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let shown = wait_for_generation(&socket, 2).await;
    assert_eq!(shown["generation"]["files"][0]["rules"], 1);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
}

async fn wait_for_generation(socket: &Path, number: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(reply) = http::get(socket, "/v1/policy").await {
            let shown = reply.json();
            if shown["generation"]["number"] == number {
                return shown;
            }
        }
        assert!(
            Instant::now() < deadline,
            "generation {number} never became active"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn run(args: &[&str]) -> (bool, String, String) {
    let output = tollgate().args(args).current_dir(root()).output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn cli_compile_points_at_errors_and_passes_good_policies() {
    let dir = tempdir();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, BROKEN).unwrap();
    let (ok, _, stderr) = run(&["policy", "compile", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("bad.yaml:5:16: error: unknown category `@reads`"),
        "{stderr}"
    );

    let (ok, stdout, stderr) = run(&[
        "policy",
        "test",
        "policies/default.yaml",
        "policies/examples/tenants.yaml",
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(
            "policies/examples/tenants.yaml: ok (12 rules, 2 principals, 28 expectations passed, 7 invariants hold)"
        ),
        "{stdout}"
    );
}

#[test]
fn cli_review_diff_and_explain() {
    // The review lists classes of commands, then one row per principal, class and key class.
    let (ok, table, stderr) = run(&["policy", "review", "policies/examples/tenants.yaml"]);
    assert!(ok, "{stderr}");
    let get_class = table
        .lines()
        .find(|l| l.starts_with('C') && l.split_whitespace().any(|word| word == "GET"))
        .and_then(|l| l.split_once(':'))
        .map(|(class, _)| format!(" {class} "))
        .unwrap_or_else(|| panic!("a command class holds GET:\n{table}"));
    let line = table
        .lines()
        .find(|l| l.starts_with("acme") && l.contains(&get_class) && l.contains("globex:x"))
        .unwrap_or_else(|| panic!("acme's row for{get_class}on globex:x:\n{table}"));
    assert!(line.ends_with("deny default-deny"), "{line}");

    let dir = tempdir();
    let (old, new) = (dir.path().join("old.yaml"), dir.path().join("new.yaml"));
    std::fs::write(&old, ALLOW_ALL_DATA).unwrap();
    std::fs::write(&new, READ_ONLY).unwrap();
    let (old, new) = (old.to_str().unwrap(), new.to_str().unwrap());
    // A diff that changes decisions exits 2 (like `terraform plan -detailed-exitcode`), with a
    // count line and the rule that now decides each group.
    let diff = tollgate()
        .args(["policy", "diff", old, new])
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(diff.status.code(), Some(2), "{diff:?}");
    let plan = String::from_utf8_lossy(&diff.stdout);
    assert!(
        plan.lines()
            .next()
            .is_some_and(|l| l.starts_with("0 request classes newly allowed, ")),
        "{plan}"
    );
    assert!(plan.contains("now deny default-deny"), "{plan}");
    assert!(plan.contains("now allow reads"), "{plan}");
    let same = tollgate()
        .args(["policy", "diff", old, old])
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(same.status.code(), Some(0), "{same:?}");
    // Replayed: SET goes from allowed to denied, GET stays allowed by another rule.
    let explain = |command: &[&str]| {
        let mut args = vec![
            "policy",
            "explain",
            "--policy",
            old,
            "--against",
            new,
            "--principal",
            "me",
            "--",
        ];
        args.extend_from_slice(command);
        let (ok, explained, stderr) = run(&args);
        assert!(ok, "{stderr}");
        explained
    };
    let set = explain(&["SET", "x", "v"]);
    assert!(
        set.contains("=> admitted by data") && set.contains("=> denied (no-rule)"),
        "{set}"
    );
    let get = explain(&["GET", "x"]);
    assert!(
        get.contains("=> admitted by data") && get.contains("=> admitted by reads"),
        "{get}"
    );

    let (ok, explained, stderr) = run(&[
        "policy",
        "explain",
        "--principal",
        "local",
        "--",
        "FLUSHALL",
    ]);
    assert!(ok, "{stderr}");
    assert!(explained.contains("yaml-guard:default.yaml"), "{explained}");
    assert!(
        explained.contains("=> denied (rule): rule no-wipe denies FLUSHALL"),
        "{explained}"
    );
}

/// `tollgate policy review … | head`: the reader leaving early ends the CLI as SIGPIPE ends any
/// Unix filter, with nothing on stderr (no panic in `println!`).
#[test]
fn a_review_piped_into_a_reader_that_stops_early_ends_quietly() {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    // A pipe smaller than the review, so that the CLI is still writing when the reader leaves.
    let mut ends = [0; 2];
    // SAFETY: `ends` has room for the two descriptors pipe(2) writes; each is owned exactly once
    // below.
    let (reader, writer) = unsafe {
        // Close-on-exec: a read end inherited by the CLI would keep the pipe from ever breaking.
        assert_eq!(libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC), 0);
        assert!(libc::fcntl(ends[1], libc::F_SETPIPE_SZ, 4096) >= 4096);
        (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1]))
    };
    let mut review = tollgate()
        .args(["policy", "review", "policies/default.yaml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tollgate");
    let mut stdout = std::fs::File::from(reader);
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).expect("some output");
    drop(stdout);
    let mut stderr = String::new();
    review
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = review.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "{status:?}: {stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}
