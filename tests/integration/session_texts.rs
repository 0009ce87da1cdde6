//! What a session answers where clients and test suites match Redis's exact words, checked against
//! the real redis-server: EXECABORT after a refused LEASE inside MULTI, Redis's error texts
//! (CLIENT KILL ID 0 and USER of no such user, unknown subcommands, protocol errors, skipped empty
//! multibulks), and MONITOR lines with their credentials redacted as Redis redacts them.

use std::time::Duration;

use bytes::Bytes;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

const ALLOW_ALL: &str = r#"
principals:
  local: { any: true }
rules:
  - id: everything
    commands: ["*"]
    allow: this test's clients may do anything
"#;

async fn allowing_all(redis: &RedisServer) -> TestDaemon {
    let policy = redis.dir().join("allow-all.yaml");
    std::fs::write(&policy, ALLOW_ALL).unwrap();
    TestDaemon::start_with(redis, |config| config.policy.files = vec![policy]).await
}

fn simple(text: &str) -> Frame {
    Frame::Simple(Bytes::copy_from_slice(text.as_bytes()))
}

fn is_error_starting(frame: &Frame, prefix: &str) -> bool {
    matches!(frame, Frame::Error(e) if e.starts_with(prefix.as_bytes()))
}

#[tokio::test]
async fn a_lease_command_refused_inside_multi_makes_exec_fail_as_redis_does() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    for lease in [
        &["LEASE", "ACQUIRE", "x", "1000"][..],
        &["LEASE", "RELEASE", "x", "tok"],
        &["LEASE", "WATCH", "x"],
    ] {
        assert_eq!(client.call(&["MULTI"]).await, simple("OK"));
        assert_eq!(client.call(&["SET", "k", "v"]).await, simple("QUEUED"));
        let refused = client.call(lease).await;
        assert!(matches!(refused, Frame::Error(_)), "{lease:?}: {refused:?}");
        let exec = client.call(&["EXEC"]).await;
        assert!(is_error_starting(&exec, "EXECABORT"), "{lease:?}: {exec:?}");
        // Nothing queued ran.
        assert_eq!(client.call(&["EXISTS", "k"]).await, Frame::Integer(0));
    }
    // The daemon's own answer to COMMAND DOCS LEASE is queued like its others.
    assert_eq!(client.call(&["MULTI"]).await, simple("OK"));
    assert_eq!(
        client.call(&["COMMAND", "DOCS", "LEASE"]).await,
        simple("QUEUED")
    );
    assert!(matches!(client.call(&["EXEC"]).await, Frame::Array(replies) if replies.len() == 1));
}

#[tokio::test]
async fn error_texts_are_redis_own() {
    let redis = RedisServer::start();
    let daemon = allowing_all(&redis).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut through = RawClient::connect(&daemon.resp_socket()).await;
    for argv in [
        &["CLIENT", "KILL", "ID", "0"][..],
        &["CLIENT", "KILL", "ID", "-3"],
        &["CONFIG", "GET_XX"],
        &["config", "bad", "x"],
        &["FUNCTION", "bad_subcommand"],
        &["OBJECT", "nope", "k"],
        &["NOSUCHCOMMAND", "a"],
        // No such user: a principal the policy does not name (Redis: an ACL user it lacks).
        &["CLIENT", "KILL", "USER", "wrong_user"],
    ] {
        let expected = direct.call(argv).await;
        assert!(
            matches!(expected, Frame::Error(_)),
            "{argv:?}: {expected:?}"
        );
        assert_eq!(through.call(argv).await, expected, "{argv:?}");
    }
    // The caller's own principal is a user: its other sessions (none here) are killed.
    assert_eq!(
        through.call(&["CLIENT", "KILL", "USER", "local"]).await,
        Frame::Integer(0)
    );
}

#[tokio::test]
async fn protocol_errors_and_empty_multibulks_are_answered_as_redis_answers_them() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    // A count or length of no size Redis takes: Redis's words, then the connection closes.
    for bad in [
        &b"*3000000000\r\n"[..],
        b"*1\r\n$9999999999\r\n",
        b"*1\r\n$-5\r\n",
    ] {
        let mut replies = Vec::new();
        for socket in [redis.socket().to_owned(), daemon.resp_socket()] {
            let mut client = RawClient::connect(&socket).await;
            client.write(bad).await;
            replies.push(client.read_until_closed(Duration::from_secs(5)).await);
        }
        assert!(!replies[0].is_empty(), "{bad:?}");
        assert_eq!(replies[1], replies[0], "{bad:?}");
    }
    // A count of zero or less is an empty command, skipped.
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    client
        .write(b"*-10\r\n*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n")
        .await;
    assert_eq!(client.read().await, simple("PONG"));
}

/// MONITOR through the daemon shows what Redis's own MONITOR shows of the same commands: the
/// credentials of AUTH, HELLO and MIGRATE redacted, administrative commands not at all.
#[tokio::test]
async fn monitor_redacts_credentials_as_redis_does() {
    let redis = RedisServer::start();
    let daemon = allowing_all(&redis).await;
    let commands: [&[&str]; 9] = [
        &["SET", "key", "v"],
        &[
            "MIGRATE",
            "127.0.0.1",
            "1",
            "key",
            "0",
            "100",
            "AUTH",
            "secretpw",
        ],
        &[
            "MIGRATE",
            "127.0.0.1",
            "1",
            "",
            "0",
            "100",
            "COPY",
            "AUTH2",
            "user",
            "secretpw",
            "KEYS",
            "a",
            "b",
        ],
        &["AUTH", "secretpw"],
        &["AUTH", "user", "secretpw"],
        &["CONFIG", "SET", "masterauth", "secretpw"],
        &["ACL", "SETUSER", "someone", ">secretpw"],
        &["HELLO", "2", "AUTH", "user", "secretpw", "SETNAME", "x"],
        &["PING"],
    ];
    let mut seen = Vec::new();
    for (socket, direct) in [
        (redis.socket().to_owned(), true),
        (daemon.resp_socket(), false),
    ] {
        // Logged in (to Redis, whose `default` is off) before MONITOR starts, so that the
        // login is not among the lines compared.
        let mut client = open(&socket, direct).await;
        let mut monitor = open(&socket, direct).await;
        assert_eq!(monitor.call(&["MONITOR"]).await, simple("OK"));
        for argv in commands {
            client.call(argv).await;
        }
        let mut lines = Vec::new();
        loop {
            let line = text(&monitor.read().await);
            // What follows the client's address: the command's words.
            let words = line.split_once("] ").expect("Redis's shape").1.to_owned();
            let last = words == r#""PING""# || words == r#""ping""#;
            lines.push(words.to_ascii_lowercase());
            if last {
                break;
            }
        }
        seen.push(lines);
    }
    assert!(
        !seen[1].iter().any(|line| line.contains("secretpw")),
        "{:?}",
        seen[1]
    );
    assert_eq!(seen[1], seen[0]);
}

/// Blocks `blocked` in each of a list pop and BRPOPLPUSH, has `other` unblock it (as a timeout,
/// then as an error), and returns every reply both saw: `CLIENT UNBLOCK` of an id that is not
/// blocked and of one that does not exist too.
async fn unblocking(redis: &RedisServer, socket: &std::path::Path, direct: bool) -> Vec<Frame> {
    let mut blocked = open(socket, direct).await;
    let mut other = open(socket, direct).await;
    let Frame::Integer(id) = blocked.call(&["CLIENT", "ID"]).await else {
        panic!("CLIENT ID");
    };
    let id = id.to_string();
    let mut seen = vec![other.call(&["CLIENT", "UNBLOCK", &id]).await];
    for (command, mode) in [
        (&["BLPOP", "k", "0"][..], "TIMEOUT"),
        (&["BRPOPLPUSH", "k", "d", "0"], "TIMEOUT"),
        (&["BLPOP", "k", "0"], "ERROR"),
        (&["BRPOP", "k", "0"], "NEITHER"),
    ] {
        blocked.send(command).await;
        wait_blocked(redis).await;
        let unblock = other.call(&["CLIENT", "UNBLOCK", &id, mode]).await;
        let stopped = matches!(unblock, Frame::Integer(1));
        seen.push(unblock);
        if !stopped {
            other.call(&["LPUSH", "k", "x"]).await;
        }
        seen.push(blocked.read().await);
    }
    seen.push(other.call(&["CLIENT", "UNBLOCK", "987654"]).await);
    seen.push(other.call(&["CLIENT", "UNBLOCK", "x"]).await);
    seen
}

/// Waits until Redis shows a client blocked.
async fn wait_blocked(redis: &RedisServer) {
    for _ in 0..500 {
        if redis.inline("INFO clients").contains("blocked_clients:1") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no client blocked");
}

#[tokio::test]
async fn client_unblock_ends_a_blocking_command_of_a_daemon_session_as_redis_does() {
    let redis = RedisServer::start();
    let daemon = allowing_all(&redis).await;
    let expected = unblocking(&redis, redis.socket(), true).await;
    let got = unblocking(&redis, &daemon.resp_socket(), false).await;
    assert_eq!(got, expected);
    // What Redis answered: not blocked 0; a timeout's nil; the error; a bad reason refused.
    assert_eq!(expected[0], Frame::Integer(0));
    assert_eq!(expected[1], Frame::Integer(1));
    assert!(is_error_starting(&expected[6], "UNBLOCKED"), "{expected:?}");
}

/// A client of Redis itself (`direct`: logged in as testkit's admin, `default` being off there)
/// or of the daemon (whose socket needs no login).
async fn open(socket: &std::path::Path, direct: bool) -> RawClient {
    if direct {
        RawClient::to_redis(socket).await
    } else {
        RawClient::connect(socket).await
    }
}
