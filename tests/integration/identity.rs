//! Identities that cannot be borrowed and administrative endpoints only for administrators, tried
//! with real OS users: the daemon runs in-process (as root), and a second user's client is a child
//! process (`curl` or `redis-cli` under `setpriv`) on the daemon's sockets. The users are created
//! when missing, which needs root; without root a test prints why and returns.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::config::{Config, SocketMode, Unmapped};
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;

/// The second OS user of these tests.
pub(crate) const USER_B: &str = "tollgate-test-b";
/// A user named like a principal of `policies/examples/tenants.yaml`.
pub(crate) const USER_GLOBEX: &str = "globex";

/// One user at a time: two `useradd` at once fail on the password file's lock.
static USERADD: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[derive(Clone)]
pub(crate) struct OsUser {
    name: String,
    pub(crate) uid: u32,
    gid: u32,
}

/// The OS user `name`, created (a system user without a home) when missing; `None`, with the
/// reason printed, when this process cannot create users or lacks a tool the tests run.
pub(crate) fn os_user(name: &str) -> Option<OsUser> {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: creating and acting as the OS user `{name}` needs root");
        return None;
    }
    for tool in ["setpriv", "curl", "redis-cli", "useradd"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        if !found {
            println!("skipped: `{tool}` is not installed");
            return None;
        }
    }
    let _serial = USERADD
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if lookup(name).is_none() {
        let status = std::process::Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(name)
            .status()
            .expect("run useradd");
        // 9: another process created it meanwhile.
        assert!(
            status.success() || status.code() == Some(9),
            "useradd {name}: {status}"
        );
    }
    Some(lookup(name).unwrap_or_else(|| panic!("user {name} exists after useradd")))
}

fn lookup(name: &str) -> Option<OsUser> {
    let user = nix::unistd::User::from_name(name).ok().flatten()?;
    Some(OsUser {
        name: user.name,
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
    })
}

/// The daemon against `redis`, its sockets open to every local user (mode 0666 in a directory
/// anyone may traverse), so that the policy and the identity rules are all that stand in the way.
pub(crate) async fn daemon_for_all(
    redis: &RedisServer,
    adjust: impl FnOnce(&mut Config),
) -> TestDaemon {
    TestDaemon::start_with(redis, |config| {
        let dir = config
            .runtime_dir
            .clone()
            .expect("the test config names its directory");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .expect("open the socket directory");
        // The runtime directory (the daemon's own) stays apart from the sockets' directory.
        config.runtime_dir = Some(dir.join("run"));
        config.listen.mode = SocketMode(0o666);
        adjust(config);
    })
    .await
}

/// A policy file from `policies/` in this repository.
pub(crate) fn repository_policy(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("policies")
        .join(name)
}

/// A child process run as `user` (its uid and primary gid, no supplementary groups).
pub(crate) async fn run_as(user: &OsUser, program: &str, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new("setpriv")
        .arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .arg("--clear-groups")
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run a client as another user")
}

/// An HTTP reply as `curl` saw it.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

/// One HTTP request from `user` on the daemon's HTTP socket.
pub(crate) async fn curl(
    user: &OsUser,
    daemon: &TestDaemon,
    method: &str,
    path: &str,
    body: &str,
) -> Reply {
    let socket = daemon.http_socket();
    let url = format!("http://tollgate{path}");
    let mut args = vec![
        "-q",
        "-sS",
        "--max-time",
        "10",
        "--unix-socket",
        socket.to_str().expect("a UTF-8 socket path"),
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ];
    if !body.is_empty() {
        args.extend(["-H", "content-type: application/json", "-d", body]);
    }
    args.push(&url);
    let output = run_as(user, "curl", &args).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let (text, status) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    Reply {
        status: status.parse().unwrap_or_else(|_| {
            panic!(
                "curl as {} printed no status: {stdout} {}",
                user.name,
                String::from_utf8_lossy(&output.stderr)
            )
        }),
        body: serde_json::from_str(text).unwrap_or(Value::Null),
    }
}

/// One command from `user` with `redis-cli` on the daemon's RESP socket: what it printed.
pub(crate) async fn redis_cli(user: &OsUser, daemon: &TestDaemon, command: &[&str]) -> String {
    let socket = daemon.resp_socket();
    let mut args = vec!["-s", socket.to_str().expect("a UTF-8 socket path")];
    args.extend(command);
    let output = run_as(user, "redis-cli", &args).await;
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn attempt_body(extra: Value) -> String {
    let mut body = json!({"attempt": {"owner": "cron", "operation_id": "op-1"}});
    if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
        body.extend(extra);
    }
    body.to_string()
}

/// Under the default policy every local user is the principal `local`; the lease is still bound
/// to the uid that took it, so a second user who knows (or reads) the owner token can neither
/// replay, renew, release, see it as theirs nor watch its events.
#[tokio::test]
async fn another_uid_cannot_use_a_lease_of_the_same_principal() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |_| {}).await;
    let lease = "/v1/leases/nightly-report";

    // Root takes the lease with a watchdog bound to this test process.
    let taken = daemon
        .post(
            &format!("{lease}/acquire"),
            &attempt_body(json!({"ttl_ms": 30_000, "watchdog": true})),
        )
        .await;
    assert_eq!(taken.json()["outcome"], "acquired", "{}", taken.body);

    let replay = curl(
        &b,
        &daemon,
        "POST",
        &format!("{lease}/acquire"),
        &attempt_body(json!({"ttl_ms": 30_000})),
    )
    .await;
    assert_eq!(
        (replay.status, replay.body["outcome"].clone()),
        (409, json!("contended")),
        "the same attempt from another uid is not a replay: {replay:?}"
    );
    let renew = curl(
        &b,
        &daemon,
        "POST",
        &format!("{lease}/renew"),
        &attempt_body(json!({"ttl_ms": 30_000})),
    )
    .await;
    assert_eq!(
        renew.body,
        json!({"outcome": "lost", "reason": "not_owner"}),
        "{renew:?}"
    );
    let release = curl(
        &b,
        &daemon,
        "POST",
        &format!("{lease}/release"),
        &attempt_body(json!({})),
    )
    .await;
    assert_eq!(release.body, json!({"outcome": "not_owner"}), "{release:?}");
    let inspect = curl(
        &b,
        &daemon,
        "POST",
        &format!("{lease}/inspect"),
        &attempt_body(json!({})),
    )
    .await;
    assert_eq!(
        (
            inspect.body["outcome"].clone(),
            inspect.body["yours"].clone()
        ),
        (json!("held"), json!(false)),
        "{inspect:?}"
    );
    let events = curl(
        &b,
        &daemon,
        "GET",
        &format!("{lease}/events?owner=cron&operation_id=op-1"),
        "",
    )
    .await;
    assert_eq!(events.status, 404, "another uid's events: {events:?}");

    // The owner's lease is untouched by all of that.
    let mine = daemon
        .post(&format!("{lease}/inspect"), &attempt_body(json!({})))
        .await;
    assert_eq!(
        (mine.json()["outcome"].clone(), mine.json()["yours"].clone()),
        (json!("held"), json!(true)),
        "{}",
        mine.body
    );
    let released = daemon
        .post(&format!("{lease}/release"), &attempt_body(json!({})))
        .await;
    assert_eq!(released.json()["outcome"], "released", "{}", released.body);
    daemon.stop().await;
}

/// A user whose login name is a principal's name (`globex` under the tenants example) but whose
/// uid the policy does not map is `uid:<n>`, with none of globex's keys or leases.
#[tokio::test]
async fn a_login_name_never_becomes_a_principal() {
    let Some(globex) = os_user(USER_GLOBEX) else {
        return;
    };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |config| {
        config.policy.files = vec![repository_policy("examples/tenants.yaml")];
    })
    .await;
    let principal = format!("uid:{}", globex.uid);

    // The policy would admit the principal `globex` (asked by root, an administrator) ...
    let for_globex = daemon
        .post(
            "/v1/policy/explain",
            &json!({"principal": "globex", "argv": ["SET", "globex:1", "v"]}).to_string(),
        )
        .await;
    assert_eq!(
        for_globex.json()["outcome"],
        "admitted",
        "{}",
        for_globex.body
    );
    // ... but the user called globex is not that principal.
    let set = redis_cli(&globex, &daemon, &["SET", "globex:1", "v"]).await;
    assert!(set.contains("NOPERM tollgate: rule default-deny"), "{set}");
    let ping = redis_cli(&globex, &daemon, &["PING"]).await;
    assert!(
        ping.contains("PONG"),
        "an unmapped uid is still served: {ping}"
    );
    let lease = curl(
        &globex,
        &daemon,
        "POST",
        "/v1/leases/globex:nightly/acquire",
        &attempt_body(json!({"ttl_ms": 10_000})),
    )
    .await;
    assert_eq!(
        (lease.status, lease.body["outcome"].clone()),
        (403, json!("denied")),
        "{lease:?}"
    );
    // Asking about `globex` is asking about someone else: refused, and the reply says who it is.
    let explain = curl(
        &globex,
        &daemon,
        "POST",
        "/v1/policy/explain",
        &json!({"principal": "globex", "argv": ["GET", "globex:1"]}).to_string(),
    )
    .await;
    assert_eq!(explain.status, 403, "{explain:?}");
    let reason = explain.body["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("your principal is `{principal}`")),
        "{explain:?}"
    );
    let own = curl(
        &globex,
        &daemon,
        "POST",
        "/v1/policy/explain",
        &json!({"principal": principal, "argv": ["GET", "globex:1"]}).to_string(),
    )
    .await;
    assert_eq!(
        (own.status, own.body["outcome"].clone()),
        (200, json!("denied")),
        "one's own principal may be explained: {own:?}"
    );
    daemon.stop().await;
}

/// `identity.unmapped: refuse`: an unmapped user's RESP command is answered with `-NOPERM` naming
/// its uid, and its HTTP requests get 403 `forbidden`.
#[tokio::test]
async fn refuse_mode_turns_unmapped_users_away_on_both_sockets() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |config| {
        config.policy.files = vec![repository_policy("examples/tenants.yaml")];
        config.identity.unmapped = Unmapped::Refuse;
    })
    .await;
    let refusal = format!("uid {} (gid {}) maps to no principal", b.uid, b.gid);

    let ping = redis_cli(&b, &daemon, &["PING"]).await;
    assert!(ping.contains("NOPERM tollgate: "), "{ping}");
    assert!(ping.contains(&refusal), "{ping}");
    let lease = curl(
        &b,
        &daemon,
        "POST",
        "/v1/leases/acme:nightly/acquire",
        &attempt_body(json!({"ttl_ms": 10_000})),
    )
    .await;
    assert_eq!(
        (lease.status, lease.body["outcome"].clone()),
        (403, json!("forbidden")),
        "{lease:?}"
    );
    assert!(
        lease.body["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains(&refusal)),
        "{lease:?}"
    );
    daemon.stop().await;
}

/// The refusal closes the RESP connection after its one error line. Root is unmapped under the
/// tenants example, so this runs as any user.
#[tokio::test]
async fn a_refused_resp_connection_gets_one_error_then_closes() {
    let uid = nix::unistd::geteuid().as_raw();
    if uid == 2001 || uid == 2002 {
        println!("skipped: uid {uid} is a principal of the tenants example");
        return;
    }
    let redis = RedisServer::start();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.policy.files = vec![repository_policy("examples/tenants.yaml")];
        config.identity.unmapped = Unmapped::Refuse;
    })
    .await;
    let mut conn = tokio::net::UnixStream::connect(daemon.resp_socket())
        .await
        .expect("connect");
    conn.write_all(b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n")
        .await
        .expect("send");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut reply))
        .await
        .expect("the daemon closes the connection")
        .expect("read until closed");
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.starts_with(&format!("-NOPERM tollgate: uid {uid} ")),
        "{reply}"
    );
    assert_eq!(
        reply.matches("\r\n").count(),
        1,
        "one line, then closed: {reply}"
    );
    daemon.stop().await;
}

/// Reloading and explaining another principal are for administrators (root and the daemon's uid
/// by default): another user gets 403 naming why, root is served.
#[tokio::test]
async fn only_administrators_reload_or_explain_another_principal() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |_| {}).await;
    let explain_other =
        json!({"principal": "ops", "argv": ["CONFIG", "SET", "maxmemory", "1"]}).to_string();

    let reload = curl(&b, &daemon, "POST", "/v1/policy/reload", "").await;
    assert_eq!(
        (reload.status, reload.body["outcome"].clone()),
        (403, json!("forbidden")),
        "{reload:?}"
    );
    let reason = reload.body["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with(&format!(
            "reloading the policy is for administrators; uid {} ",
            b.uid
        )),
        "{reload:?}"
    );
    let other = curl(&b, &daemon, "POST", "/v1/policy/explain", &explain_other).await;
    assert_eq!(
        (other.status, other.body["outcome"].clone()),
        (403, json!("forbidden")),
        "{other:?}"
    );
    let own = curl(
        &b,
        &daemon,
        "POST",
        "/v1/policy/explain",
        &json!({"principal": "local", "argv": ["GET", "k"]}).to_string(),
    )
    .await;
    assert_eq!(
        (own.status, own.body["outcome"].clone()),
        (200, json!("admitted")),
        "{own:?}"
    );
    let generation = curl(&b, &daemon, "GET", "/v1/policy", "").await;
    assert_eq!(generation.body["generation"]["number"], 1, "{generation:?}");

    let by_root = daemon.post("/v1/policy/reload", "").await;
    assert_eq!(by_root.json()["outcome"], "reloaded", "{}", by_root.body);
    let by_root = daemon.post("/v1/policy/explain", &explain_other).await;
    assert_eq!(
        (by_root.status, by_root.json()["outcome"].clone()),
        (200, json!("denied")),
        "{}",
        by_root.body
    );
    daemon.stop().await;
}

/// Reloads are spaced out: the next one inside `admin.reload_interval` gets 429 with Retry-After.
/// Root is an administrator, so this runs without a second user.
#[tokio::test]
async fn reloads_are_rate_limited() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.admin.reload_interval = Duration::from_secs(3600);
        config.admin.uids = Some(vec![nix::unistd::geteuid().as_raw()]);
    })
    .await;
    let first = daemon.post("/v1/policy/reload", "").await;
    assert_eq!(first.json()["outcome"], "reloaded", "{}", first.body);
    let second = daemon.post("/v1/policy/reload", "").await;
    assert_eq!(
        (second.status, second.json()["outcome"].clone()),
        (429, json!("rate_limited")),
        "{}",
        second.body
    );
    let retry_after: u64 = second
        .header("retry-after")
        .and_then(|value| value.parse().ok())
        .expect("Retry-After in seconds");
    assert!(
        (1..=3600).contains(&retry_after),
        "retry after {retry_after} s"
    );
    assert_eq!(
        daemon.get("/v1/policy").await.json()["generation"]["number"],
        2,
        "the refused reload changed nothing"
    );
    daemon.stop().await;
}
