//! The foundation: configuration errors from the real binary, socket files (stale and live), the
//! embedded redis-server's life, `/readyz` following Redis, and SIGTERM leaving nothing behind.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate::runtime::StartError;
use tollgate::server::socket::BindError;
use tollgate::Daemon;
use tollgate_testkit::{http, RedisServer};

use crate::support::daemon::{durable_lane_users, lane_users, tempdir, TestDaemon};

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

#[test]
fn check_config_names_a_missing_file() {
    let output = tollgate()
        .args(["check-config", "/nonexistent/tollgate.yaml"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/nonexistent/tollgate.yaml: cannot read"),
        "{stderr}"
    );
}

#[test]
fn check_config_points_at_an_unknown_key() {
    let dir = tempdir();
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(&file, "listen:\n  http: /tmp/x.sock\n  colour: blue\n").unwrap();
    let output = tollgate().arg("check-config").arg(&file).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let expected = format!(
        "{}:3:3: key `listen.colour`: unknown field `colour`",
        file.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

#[test]
fn check_config_points_at_a_wrong_type() {
    let dir = tempdir();
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(&file, "shutdown:\n  drain_timeout: soon\n").unwrap();
    let output = tollgate().arg("check-config").arg(&file).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let expected = format!("{}:2:18: key `shutdown.drain_timeout`", file.display());
    assert!(stderr.contains(&expected), "{stderr}");
}

#[test]
fn check_config_accepts_a_valid_file() {
    let dir = tempdir();
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(
        &file,
        "listen:\n  mode: \"0600\"\nshutdown:\n  drain_timeout: 3s\n",
    )
    .unwrap();
    let output = tollgate().arg("check-config").arg(&file).output().unwrap();
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn check_config_refuses_an_external_redis_until_its_users_come_from_redis_acl() {
    // A stock server: `default` on, no password, every key.
    let redis = RedisServer::builder().open_default().start();
    let dir = tempdir();
    let file = dir.path().join("tollgate.yaml");
    let redis_section = format!("redis:\n  address: unix:{}\n", redis.socket().display());
    std::fs::write(&file, &redis_section).unwrap();
    let refused = tollgate().arg("check-config").arg(&file).output().unwrap();
    assert!(!refused.status.success(), "{refused:?}");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("`default`") && message.contains("tollgate:*"),
        "{message}"
    );

    // The operator's steps from docs/lanes.md: the users into Redis (`default` turned off last),
    // their section into the file, and the administrator the lines create named as trusted, as
    // `redis-acl` says.
    let passwords = dir.path().join("acl");
    let acl = tollgate()
        .args(["redis-acl", "--passwords"])
        .arg(&passwords)
        .output()
        .unwrap();
    assert!(acl.status.success(), "{acl:?}");
    let why = String::from_utf8_lossy(&acl.stderr);
    assert!(
        why.contains("default") && why.contains("trusted_users: [tollgate-root]"),
        "{why}"
    );
    let mut cli = std::process::Command::new("redis-cli")
        .arg("-s")
        .arg(redis.socket())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("redis-cli");
    use std::io::Write as _;
    cli.stdin.take().unwrap().write_all(&acl.stdout).unwrap();
    let applied = cli.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&applied.stdout)
            .matches("OK")
            .count(),
        9,
        "six lane users, the lease user, the administrator, `default` off: {applied:?}"
    );
    let mut open = std::os::unix::net::UnixStream::connect(redis.socket()).unwrap();
    open.write_all(b"PING\r\n").unwrap();
    let mut reply = [0u8; 7];
    std::io::Read::read_exact(&mut open, &mut reply).unwrap();
    assert_eq!(
        &reply, b"-NOAUTH",
        "`default` still answers without a password"
    );

    let lanes = tollgate()
        .args(["redis-acl", "--lanes-yaml", "--passwords"])
        .arg(&passwords)
        .output()
        .unwrap();
    let lanes = String::from_utf8_lossy(&lanes.stdout).into_owned();
    // Without naming the administrator, it is refused: it can reach every key. (testkit's own
    // administrator, which this test's server has too, is trusted throughout.)
    let testkit = tollgate_testkit::ADMIN_USER;
    std::fs::write(
        &file,
        format!("{redis_section}  trusted_users: [{testkit}]\n{lanes}"),
    )
    .unwrap();
    let untrusted = tollgate().arg("check-config").arg(&file).output().unwrap();
    assert!(!untrusted.status.success(), "{untrusted:?}");
    let message = String::from_utf8_lossy(&untrusted.stderr);
    assert!(message.contains("`tollgate-root`"), "{message}");
    assert!(!message.contains("`default` may run"), "{message}");

    std::fs::write(
        &file,
        format!("{redis_section}  trusted_users: [tollgate-root, {testkit}]\n{lanes}"),
    )
    .unwrap();
    let accepted = tollgate().arg("check-config").arg(&file).output().unwrap();
    assert!(accepted.status.success(), "{accepted:?}");
    assert!(
        String::from_utf8_lossy(&accepted.stdout).contains("no client lane user"),
        "{accepted:?}"
    );
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced() {
    let redis = RedisServer::start();
    let dir = tempdir();
    // A socket file whose listener is gone, as a crashed daemon leaves it.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("http.sock")).unwrap());
    let mut config = TestDaemon::config(dir.path());
    config.redis = Some(crate::support::daemon::trusting_testkit(
        tollgate_lanes::RedisConfig::standalone(tollgate_lanes::Endpoint::Unix(
            redis.socket().to_owned(),
        )),
    ));
    config.lanes = lane_users(&[&redis], dir.path()).await;
    let daemon = Daemon::start(config).await.expect("stale socket replaced");
    let reply = http::get(&dir.path().join("http.sock"), "/healthz")
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_socket_held_by_a_live_daemon_is_refused() {
    let redis = RedisServer::start();
    let first = TestDaemon::start(&redis).await;
    let mut config = TestDaemon::config(first.dir());
    config.redis = Some(crate::support::daemon::trusting_testkit(
        tollgate_lanes::RedisConfig::standalone(tollgate_lanes::Endpoint::Unix(
            redis.socket().to_owned(),
        )),
    ));
    let error = Daemon::start(config)
        .await
        .err()
        .expect("second daemon refused");
    assert!(
        matches!(error, StartError::Bind(BindError::InUse { .. })),
        "{error}"
    );
    // The first daemon is unharmed.
    assert_eq!(first.get("/healthz").await.status, 200);
    first.stop().await;
}

#[tokio::test]
async fn socket_files_get_the_configured_mode() {
    use std::os::unix::fs::PermissionsExt;
    let redis = RedisServer::start();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.listen.mode = tollgate::config::SocketMode(0o600);
    })
    .await;
    let mode = std::fs::metadata(daemon.http_socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    daemon.stop().await;
}

#[tokio::test]
async fn readyz_follows_redis_down_and_back() {
    let dir = tempdir();
    let (builder, lanes) = durable_lane_users(dir.path());
    let mut redis = builder.start();
    let mut config = TestDaemon::config(dir.path());
    config.redis = Some(crate::support::daemon::trusting_testkit(
        tollgate_lanes::RedisConfig::standalone(tollgate_lanes::Endpoint::Unix(
            redis.socket().to_owned(),
        )),
    ));
    config.lanes = lanes;
    let daemon = TestDaemon::start_config(dir, config).await;
    let ready = daemon.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.json()["outcome"], "ready");

    redis.kill();
    let down = daemon.get("/readyz").await;
    assert_eq!(down.status, 503, "{}", down.body);
    assert_eq!(down.json()["outcome"], "not_ready");
    assert!(down.body.contains("unavailable"), "{}", down.body);
    assert_eq!(down.header("retry-after"), Some("1"));

    redis.restart();
    let back = wait_for_status(&daemon.http_socket(), "/readyz", 200).await;
    assert_eq!(back.json()["outcome"], "ready");
    daemon.stop().await;
}

#[tokio::test]
async fn unknown_paths_get_json_errors() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let reply = daemon.get("/nope").await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["outcome"], "not_found");
    let reply = daemon.post("/healthz", "{}").await;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.json()["outcome"], "method_not_allowed");
    daemon.stop().await;
}

#[tokio::test]
async fn metrics_are_prometheus_text() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let reply = daemon.get("/metrics").await;
    assert_eq!(reply.status, 200);
    assert!(reply
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text"));
    assert!(reply.body.ends_with("# EOF\n"), "{}", reply.body);
    daemon.stop().await;
}

#[tokio::test]
async fn embedded_redis_starts_with_the_daemon_and_stops_with_it() {
    let daemon = TestDaemon::start_embedded().await;
    let redis_socket = daemon.dir().join("redis.sock");
    assert!(redis_socket.exists());
    assert_eq!(daemon.get("/readyz").await.status, 200);
    let dir = daemon.dir().to_owned();
    daemon.stop().await;
    assert!(!redis_socket.exists(), "embedded socket file left behind");
    assert!(
        processes_mentioning(&dir).is_empty(),
        "embedded redis-server left running"
    );
}

/// The README's run command, end to end: the real binary on the embedded default, `/readyz` 200,
/// then SIGTERM exits 0 and leaves no socket file and no redis-server behind. Without
/// `XDG_RUNTIME_DIR` (root on a fresh machine), so the runtime directory is the relative `.tollgate`.
#[tokio::test]
async fn the_binary_serves_on_the_embedded_default_and_sigterm_cleans_up() {
    let dir = tempdir();
    let mut child = serve_embedded(dir.path(), &[]);
    let runtime = dir.path().join(".tollgate");
    let http_socket = runtime.join("http.sock");
    let ready = wait_for_status(&http_socket, "/readyz", 200).await;
    assert_eq!(ready.json()["outcome"], "ready");

    let status = terminate(&mut child);
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(!http_socket.exists(), "HTTP socket file left behind");
    assert!(
        !runtime.join("resp.sock").exists(),
        "RESP socket file left behind"
    );
    assert!(
        !runtime.join("redis.sock").exists(),
        "redis socket left behind"
    );
    assert!(
        processes_mentioning(&runtime).is_empty(),
        "redis-server left running"
    );
}

/// Log lines name what they belong to: a RESP session's carry its client id, uid, pid and
/// principal; an HTTP request's its method, path, uid and principal; and no escape codes reach a
/// log that is not a terminal.
#[tokio::test]
async fn log_lines_name_the_session_or_request_they_were_logged_in() {
    let dir = tempdir();
    let mut child = serve_embedded(dir.path(), &[("RUST_LOG", "info,tollgate=debug")]);
    let runtime = dir.path().join(".tollgate");
    let http_socket = runtime.join("http.sock");
    wait_for_status(&http_socket, "/readyz", 200).await;

    // A RESP session that pings and hangs up logs why it ended.
    let mut resp = tokio::net::UnixStream::connect(runtime.join("resp.sock"))
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut resp, b"PING\r\n")
        .await
        .unwrap();
    let mut reply = [0u8; 7];
    tokio::io::AsyncReadExt::read_exact(&mut resp, &mut reply)
        .await
        .unwrap();
    assert_eq!(&reply, b"+PONG\r\n");
    drop(resp);
    // A reload over HTTP logs that the lane users were cut to the policy.
    let reload = http::post(&http_socket, "/v1/policy/reload", "")
        .await
        .unwrap();
    assert_eq!(reload.status, 200, "{:?}", reload.json());
    tokio::time::sleep(Duration::from_millis(200)).await;

    terminate(&mut child);
    let mut log = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut log).unwrap();
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a piped log:\n{log}"
    );
    let uid = nix::unistd::geteuid().as_raw();
    let line_of = |message: &str| {
        log.lines()
            .find(|line| line.contains(message))
            .unwrap_or_else(|| panic!("no line with {message:?} in:\n{log}"))
            .to_owned()
    };
    let ended = line_of("RESP session ended");
    assert!(
        ended.contains("resp{client=1 uid=")
            && ended.contains(&format!("uid={uid} pid="))
            && ended.contains("principal=local"),
        "{ended}"
    );
    let cut = line_of("lane users cut to the policy");
    assert!(
        cut.contains(&format!(
            "http{{method=POST path=/v1/policy/reload uid={uid} pid="
        )) && cut.contains("principal=local"),
        "{cut}"
    );
}

/// The real binary serving on the embedded default in `dir`, as the README runs it: without
/// `XDG_RUNTIME_DIR` (root on a fresh machine), so the runtime directory is `dir/.tollgate`; its
/// stderr piped for the test to read.
fn serve_embedded(dir: &Path, env: &[(&str, &str)]) -> std::process::Child {
    tollgate()
        .arg("serve")
        .env_remove("XDG_RUNTIME_DIR")
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// SIGTERM, then the exit status (within 20 s).
fn terminate(child: &mut std::process::Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_for_exit(child, Duration::from_secs(20))
}

pub(crate) async fn wait_for_status(socket: &Path, path: &str, status: u16) -> http::HttpReply {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(reply) = http::get(socket, path).await {
            if reply.status == status {
                return reply;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{path} did not answer {status} in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn wait_for_exit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tollgate did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pids of live processes whose command line mentions `path` (the embedded redis-server names its socket).
pub(crate) fn processes_mentioning(path: &Path) -> Vec<u32> {
    let needle = path.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) && !is_zombie(pid) {
            found.push(pid);
        }
    }
    found
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.split(") ").nth(1).is_some_and(|s| s.starts_with('Z')))
        .unwrap_or(true)
}

/// A second SIGINT does not wait for the drain: with a client blocked forever the first SIGINT
/// starts a drain that would take `drain_timeout`; the second exits at once, still cleaning up.
#[tokio::test]
async fn a_second_sigint_exits_at_once_and_still_cleans_up() {
    let dir = tempdir();
    let mut child = tollgate()
        .arg("serve")
        .env("XDG_RUNTIME_DIR", dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let runtime = dir.path().join("tollgate");
    wait_for_status(&runtime.join("http.sock"), "/readyz", 200).await;
    let mut blocked = crate::support::raw::RawClient::connect(&runtime.join("resp.sock")).await;
    blocked.send(&["BLPOP", "never", "0"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first SIGINT drains, it does not exit"
    );
    let second = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = wait_for_exit(&mut child, Duration::from_secs(5));
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(second.elapsed() < Duration::from_secs(3));
    assert!(!runtime.join("http.sock").exists());
    assert!(!runtime.join("resp.sock").exists());
    // The embedded server dies with the daemon (SIGKILL from the abort path, PDEATHSIG as backstop).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_mentioning(&runtime).is_empty() {
        assert!(Instant::now() < deadline, "redis-server left running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
