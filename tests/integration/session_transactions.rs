//! A transaction's queued commands are written to Redis as the client pipelines them, without
//! waiting for each `+QUEUED` (`daemon/src/server/resp/transaction.rs`): what a client sees, what
//! a command Redis refuses to queue does to EXEC, and that a connection left owing replies is never
//! lent to the next transaction.

use std::time::Duration;

use bytes::Bytes;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

fn simple(text: &str) -> Frame {
    Frame::Simple(Bytes::copy_from_slice(text.as_bytes()))
}

fn bulk(text: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(text.as_bytes()))
}

#[tokio::test]
async fn queued_commands_are_answered_without_waiting_for_redis() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(client.call(&["MULTI"]).await, simple("OK"));

    // Redis reads nothing for three seconds; the queued commands are answered all the same, as
    // they are written (held one round trip each, the first reply would wait out the pause).
    redis.inline("CLIENT PAUSE 3000 ALL");
    client
        .pipeline(&[&["SET", "a", "1"], &["INCR", "n"], &["GET", "a"]])
        .await;
    for argv in ["SET", "INCR", "GET"] {
        let reply = client.read_within(Duration::from_secs(2)).await;
        assert_eq!(
            reply,
            Ok(Some(simple("QUEUED"))),
            "{argv} answered while Redis is paused"
        );
    }
    // EXEC runs them once Redis reads again.
    assert_eq!(
        client.call(&["EXEC"]).await,
        Frame::Array(vec![simple("OK"), Frame::Integer(1), bulk("1")])
    );
    assert_eq!(redis.inline("GET a"), "$1\r\n1\r\n");
}

#[tokio::test]
async fn a_pipelined_transaction_gets_every_reply_in_order() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let mut commands: Vec<Vec<String>> = vec![vec!["MULTI".into()]];
    for i in 0..50 {
        commands.push(vec!["RPUSH".into(), "list".into(), i.to_string()]);
    }
    commands.push(vec!["ECHO".into(), "local".into()]);
    commands.push(vec!["LLEN".into(), "list".into()]);
    commands.push(vec!["EXEC".into()]);
    commands.push(vec!["LRANGE".into(), "list".into(), "0".into(), "2".into()]);
    let argvs: Vec<Vec<&str>> = commands
        .iter()
        .map(|argv| argv.iter().map(String::as_str).collect())
        .collect();
    let pipeline: Vec<&[&str]> = argvs.iter().map(Vec::as_slice).collect();
    client.pipeline(&pipeline).await;

    assert_eq!(client.read().await, simple("OK"));
    for _ in 0..52 {
        assert_eq!(client.read().await, simple("QUEUED"));
    }
    let mut exec: Vec<Frame> = (1..=50).map(Frame::Integer).collect();
    exec.push(bulk("local"));
    exec.push(Frame::Integer(50));
    assert_eq!(client.read().await, Frame::Array(exec));
    assert_eq!(
        client.read().await,
        Frame::Array(vec![bulk("0"), bulk("1"), bulk("2")])
    );
}

#[tokio::test]
async fn a_command_redis_refuses_to_queue_fails_exec_naming_why() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(client.call(&["MULTI"]).await, simple("OK"));
    assert_eq!(client.call(&["INCR", "before"]).await, simple("QUEUED"));
    // Out of memory: Redis refuses to queue a command that may grow it, and discards the
    // transaction at EXEC. The client was told QUEUED (the command was written, not awaited).
    redis.inline("CONFIG SET maxmemory 1");
    let refused = client.call(&["SET", "k", "v"]).await;
    assert_eq!(refused, simple("QUEUED"));
    let exec = client.call(&["EXEC"]).await;
    redis.inline("CONFIG SET maxmemory 0");
    let exec = text(&exec);
    assert!(
        exec.starts_with("EXECABORT") && exec.contains("OOM"),
        "EXEC: {exec}"
    );
    assert_eq!(redis.inline("EXISTS k"), ":0\r\n");
    assert_eq!(redis.inline("EXISTS before"), ":0\r\n", "nothing of it ran");
    // The session goes on as usual.
    assert_eq!(client.call(&["INCR", "after"]).await, Frame::Integer(1));
}

#[tokio::test]
async fn a_connection_owing_queued_replies_is_never_lent_again() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.lanes.transaction.connections = Some(1)
    })
    .await;
    // A client queues commands and vanishes while its EXEC is unanswered (Redis paused): every
    // reply written ahead is still owed on the connection, though it will have left MULTI.
    let mut gone = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(gone.call(&["MULTI"]).await, simple("OK"));
    redis.inline("CLIENT PAUSE 700 ALL");
    assert_eq!(gone.call(&["SET", "x", "1"]).await, simple("QUEUED"));
    assert_eq!(gone.call(&["SET", "y", "1"]).await, simple("QUEUED"));
    gone.send(&["EXEC"]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(gone);

    // The next transaction, on the lane's one connection, gets its own replies only.
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    for _ in 0..3 {
        assert_eq!(client.call(&["MULTI"]).await, simple("OK"));
        assert_eq!(client.call(&["INCR", "n"]).await, simple("QUEUED"));
        let exec = client.call(&["EXEC"]).await;
        assert!(
            matches!(&exec, Frame::Array(items) if items.len() == 1),
            "{exec:?}"
        );
    }
    assert_eq!(redis.inline("GET n"), "$1\r\n3\r\n");
}

#[tokio::test]
async fn a_long_transaction_is_collected_as_it_goes_and_a_refusal_early_in_it_is_named() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;

    // 3,000 queued commands in one pipeline: past the thousand the daemon writes ahead before it
    // collects, every reply still in order.
    let pushes: Vec<Vec<String>> = (0..3000)
        .map(|i| vec!["RPUSH".into(), "long".into(), i.to_string()])
        .collect();
    let mut pipeline: Vec<Vec<&str>> = vec![vec!["MULTI"]];
    pipeline.extend(
        pushes
            .iter()
            .map(|argv| argv.iter().map(String::as_str).collect()),
    );
    pipeline.push(vec!["EXEC"]);
    let commands: Vec<&[&str]> = pipeline.iter().map(Vec::as_slice).collect();
    client.pipeline(&commands).await;
    assert_eq!(client.read().await, simple("OK"));
    for _ in 0..3000 {
        assert_eq!(client.read().await, simple("QUEUED"));
    }
    let exec = client.read().await;
    assert_eq!(
        exec,
        Frame::Array((1..=3000).map(Frame::Integer).collect()),
        "EXEC's replies"
    );

    // Refused first, then 1,100 more: the refusal is read back before the rest is written, and
    // EXEC still names it.
    assert_eq!(client.call(&["MULTI"]).await, simple("OK"));
    redis.inline("CONFIG SET maxmemory 1");
    let mut pipeline: Vec<&[&str]> = vec![&["SET", "refused", "v"]];
    pipeline.extend(std::iter::repeat_n(&["INCR", "n"][..], 1100));
    client.pipeline(&pipeline).await;
    for _ in 0..1101 {
        assert_eq!(client.read().await, simple("QUEUED"));
    }
    let exec = text(&client.call(&["EXEC"]).await);
    redis.inline("CONFIG SET maxmemory 0");
    assert!(
        exec.starts_with("EXECABORT") && exec.contains("OOM"),
        "EXEC: {exec}"
    );
    assert_eq!(redis.inline("EXISTS refused n"), ":0\r\n");
}
