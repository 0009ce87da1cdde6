//! Connection limits as hostile clients meet them: one uid at its per-uid cap is refused with an
//! error while another OS user, `/healthz` and administrators still get in; a daemon out of file
//! descriptors keeps serving once some close; an HTTP client that never finishes its headers is
//! disconnected.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tollgate_testkit::{http, RedisServer};

use crate::foundation::wait_for_status;
use crate::identity::{daemon_for_all, os_user, redis_cli, USER_B};
use crate::support::daemon::{tempdir, TestDaemon};
use crate::support::raw::{text, RawClient};

/// How long anything here is waited for before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// A new RESP connection's first line after it sends `PING`: `+PONG`, or the error it was turned
/// away with; `None` when the daemon closed it without a word.
async fn first_line(socket: &Path) -> Option<String> {
    let mut stream = UnixStream::connect(socket).await.ok()?;
    // A connection turned away may be closed before this arrives; its reply is read all the same.
    let _ = stream.write_all(b"PING\r\n").await;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        match tokio::time::timeout(PATIENCE, stream.read(&mut byte)).await {
            Ok(Ok(1)) => line.push(byte[0]),
            Ok(_) => break,
            Err(_) => panic!("no reply and no close within {PATIENCE:?}"),
        }
    }
    (!line.is_empty()).then(|| String::from_utf8_lossy(&line).trim_end().to_owned())
}

/// `count` RESP connections that each answered `PING`.
async fn connections(socket: &Path, count: usize) -> Vec<RawClient> {
    let mut held = Vec::new();
    for _ in 0..count {
        let mut client = RawClient::connect(socket).await;
        assert_eq!(text(&client.call(&["PING"]).await), "PONG");
        held.push(client);
    }
    held
}

/// Polls until a new connection is admitted again (the daemon notices closed ones as it reads).
async fn admitted_again(socket: &Path) {
    let deadline = Instant::now() + PATIENCE;
    while first_line(socket).await.as_deref() != Some("+PONG") {
        assert!(Instant::now() < deadline, "no connection admitted again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_uid_at_its_cap_is_refused_while_others_healthz_and_closed_places_get_in() {
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |config| {
        config.limits.max_clients_per_uid = 4;
        // The test runs as root, an administrator by default, who is exempt from the cap.
        config.admin.uids = Some(Vec::new());
    })
    .await;
    let socket = daemon.resp_socket();
    let mut held = connections(&socket, 4).await;
    let uid = nix::unistd::geteuid().as_raw();

    // The next one is told why, then closed.
    let mut refused = RawClient::connect(&socket).await;
    let said = refused.read_within(PATIENCE).await.expect("an answer");
    assert_eq!(
        text(&said.expect("an error before the close")),
        format!("ERR tollgate: too many connections for uid {uid} (limit 4)")
    );
    assert_eq!(
        refused.read_within(PATIENCE).await,
        Ok(None),
        "closed after the error"
    );
    // Still at the cap: another attempt is refused the same way.
    assert_eq!(
        first_line(&socket).await,
        Some(format!(
            "-ERR tollgate: too many connections for uid {uid} (limit 4)"
        ))
    );
    // The HTTP socket counts its own connections: the same uid's health check answers.
    assert_eq!(daemon.get("/healthz").await.status, 200);
    // The held connections are served as before.
    for client in &mut held {
        assert_eq!(text(&client.call(&["PING"]).await), "PONG");
    }

    // Another OS user is not held up by the first one's cap.
    if let Some(user) = os_user(USER_B) {
        let pong = redis_cli(&user, &daemon, &["PING"]).await;
        assert_eq!(pong.trim(), "PONG", "user B: {pong}");
    }

    // Closing two frees two places, and no more.
    held.truncate(2);
    admitted_again(&socket).await;
    let _third = connections(&socket, 1).await;
    let _fourth = connections(&socket, 1).await;
    assert!(
        first_line(&socket)
            .await
            .is_some_and(|line| line.contains("too many connections")),
        "the cap holds again once the freed places are taken"
    );
    daemon.stop().await;
}

#[tokio::test]
async fn administrators_are_exempt_from_the_per_uid_cap() {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: root is an administrator by default; this test runs as another uid");
        return;
    }
    let redis = RedisServer::start();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.limits.max_clients_per_uid = 2;
    })
    .await;
    let socket = daemon.resp_socket();
    let held = connections(&socket, 5).await;
    assert_eq!(held.len(), 5);
    daemon.stop().await;
}

#[tokio::test]
async fn an_http_connection_past_the_cap_gets_503_with_json() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.limits.max_clients_per_uid = 2;
        config.admin.uids = Some(Vec::new());
    })
    .await;
    let socket = daemon.http_socket();
    // Two connections that have not sent a request yet hold both places.
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(UnixStream::connect(&socket).await.unwrap());
    }
    let reply = http::get(&socket, "/healthz").await.expect("an HTTP reply");
    assert_eq!(reply.status, 503, "{}", reply.body);
    let uid = nix::unistd::geteuid().as_raw();
    assert_eq!(reply.json()["outcome"], "unavailable");
    assert_eq!(
        reply.json()["error"],
        format!("too many connections for uid {uid} (limit 2)")
    );
    drop(idle);
    wait_for_status(&socket, "/healthz", 200).await;
    daemon.stop().await;
}

#[tokio::test]
async fn an_http_client_that_never_finishes_its_headers_is_disconnected() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.limits.http_header_timeout = Duration::from_millis(500);
    })
    .await;
    let mut stream = UnixStream::connect(daemon.http_socket()).await.unwrap();
    stream.write_all(b"GET /heal").await.unwrap();
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut sink)).await;
    assert!(
        closed.is_ok(),
        "still open {PATIENCE:?} after half a request line"
    );
    // The listener itself is fine.
    assert_eq!(daemon.get("/healthz").await.status, 200);
    daemon.stop().await;
}

#[tokio::test]
async fn an_idle_http_connection_outlasts_the_header_timeout_then_closes_when_idle_too_long() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.limits.http_header_timeout = Duration::from_millis(300);
        config.limits.http_idle_timeout = Duration::from_secs(2);
    })
    .await;
    let mut stream = UnixStream::connect(daemon.http_socket()).await.unwrap();
    // Idle for longer than the header timeout, which only runs once a request has begun.
    tokio::time::sleep(Duration::from_millis(900)).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: tollgate\r\n\r\n")
        .await
        .unwrap();
    let mut reply = vec![0u8; 1024];
    let n = tokio::time::timeout(PATIENCE, stream.read(&mut reply))
        .await
        .expect("a reply")
        .unwrap();
    assert!(
        reply[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&reply[..n])
    );
    // Kept alive, then closed once idle past the idle timeout.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "an idle keep-alive connection stays open");
    daemon.stop().await;
}

/// The real binary under a descriptor limit of 256 (soft and hard, since `serve` raises its soft
/// limit to the hard one), sent 400 connections: some are served, the rest are closed rather than
/// left hanging, and once they close new connections and `/healthz` are served again.
#[tokio::test]
async fn a_daemon_out_of_descriptors_sheds_new_connections_and_recovers() {
    let dir = tempdir();
    let mut child = tokio::process::Command::new("prlimit")
        .args(["--nofile=256:256", "--"])
        .arg(env!("CARGO_BIN_EXE_tollgate"))
        .arg("serve")
        .env("XDG_RUNTIME_DIR", dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run tollgate under prlimit");
    let runtime = dir.path().join("tollgate");
    let http_socket = runtime.join("http.sock");
    let resp_socket = runtime.join("resp.sock");
    wait_for_status(&http_socket, "/readyz", 200).await;

    let mut open = Vec::new();
    let mut served = 0;
    let mut shed = 0;
    for _ in 0..400 {
        let Ok(mut client) = UnixStream::connect(&resp_socket).await else {
            shed += 1;
            continue;
        };
        let _ = client.write_all(b"PING\r\n").await;
        let mut reply = [0u8; 7];
        match tokio::time::timeout(PATIENCE, client.read(&mut reply)).await {
            Ok(Ok(n)) if reply[..n].starts_with(b"+PONG") => {
                served += 1;
                open.push(client);
            }
            Ok(_) => shed += 1,
            Err(_) => panic!("a connection past the descriptor limit hangs"),
        }
    }
    println!("under 256 descriptors: served {served}, shed {shed}");
    assert!(served > 0 && shed > 0, "served {served}, shed {shed}");
    assert_eq!(served + shed, 400);

    drop(open);
    admitted_again(&resp_socket).await;
    wait_for_status(&http_socket, "/healthz", 200).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().expect("running") as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");
}
