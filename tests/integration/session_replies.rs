//! When a session's replies reach its client: each as soon as Redis gives it, whatever is pipelined
//! before or behind it (a blocking command behind a reply must not hold the reply back), and a
//! large pipeline written before any reply is read is answered (reading the client and writing to
//! it never wait on each other).
//!
//! Nothing here times a reply: a reply that is held back is caught by a command behind it that
//! blocks forever (timeout 0), so the reply arrives promptly or not at all.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream as StdStream;
use std::time::Duration;

use bytes::Bytes;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::RawClient;

fn bulk(text: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(text.as_bytes()))
}

fn array(frames: Vec<Frame>) -> Frame {
    Frame::Array(frames)
}

/// One blocking command, the command that wakes it, and the reply it then gets.
struct Blocking {
    name: &'static str,
    /// Blocks on `key` forever (or, for WAIT, a while).
    blocks: &'static [&'static str],
    /// Sent by another client to wake it (none: it wakes by itself).
    wakes: &'static [&'static str],
    reply: fn(&Frame) -> bool,
}

fn blocking_family() -> Vec<Blocking> {
    vec![
        Blocking {
            name: "BLPOP",
            blocks: &["BLPOP", "k", "0"],
            wakes: &["LPUSH", "k", "x"],
            reply: |frame| *frame == array(vec![bulk("k"), bulk("x")]),
        },
        Blocking {
            name: "BRPOP",
            blocks: &["BRPOP", "k", "0"],
            wakes: &["LPUSH", "k", "x"],
            reply: |frame| *frame == array(vec![bulk("k"), bulk("x")]),
        },
        Blocking {
            name: "BRPOPLPUSH",
            blocks: &["BRPOPLPUSH", "k", "k:dst", "0"],
            wakes: &["LPUSH", "k", "x"],
            reply: |frame| *frame == bulk("x"),
        },
        Blocking {
            name: "BLMOVE",
            blocks: &["BLMOVE", "k", "k:dst", "LEFT", "RIGHT", "0"],
            wakes: &["LPUSH", "k", "x"],
            reply: |frame| *frame == bulk("x"),
        },
        Blocking {
            name: "BZPOPMIN",
            blocks: &["BZPOPMIN", "z", "0"],
            wakes: &["ZADD", "z", "1", "m"],
            reply: |frame| *frame == array(vec![bulk("z"), bulk("m"), bulk("1")]),
        },
        Blocking {
            name: "XREAD BLOCK",
            blocks: &["XREAD", "BLOCK", "0", "STREAMS", "s", "$"],
            wakes: &["XADD", "s", "1-1", "f", "v"],
            reply: |frame| matches!(frame, Frame::Array(streams) if streams.len() == 1),
        },
        Blocking {
            name: "WAIT",
            // No replica will ever acknowledge: Redis answers 0 when the 200 ms are up.
            blocks: &["WAIT", "1", "200"],
            wakes: &[],
            reply: |frame| *frame == Frame::Integer(0),
        },
    ]
}

/// Waits until Redis shows a client blocked (so that a wake-up is not sent before the command).
async fn until_blocked(redis: &RedisServer, count: usize) {
    for _ in 0..500 {
        let info = redis.inline("INFO clients");
        let blocked = info
            .lines()
            .find_map(|line| line.strip_prefix("blocked_clients:"))
            .and_then(|n| n.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if blocked >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("Redis never showed {count} blocked client(s)");
}

#[tokio::test]
async fn a_blocking_commands_reply_is_not_held_behind_the_next_blocking_command() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    for case in blocking_family() {
        let mut client = RawClient::connect(&daemon.resp_socket()).await;
        // Behind it, a command that blocks until this test wakes it.
        client
            .pipeline(&[case.blocks, &["BLPOP", "behind", "0"]])
            .await;
        if !case.wakes.is_empty() {
            until_blocked(&redis, 1).await;
            other.call(case.wakes).await;
        }
        let first = client.read().await;
        assert!((case.reply)(&first), "{}: got {first:?}", case.name);
        // The command behind it is served in turn.
        until_blocked(&redis, 1).await;
        other.call(&["LPUSH", "behind", "y"]).await;
        assert_eq!(
            client.read().await,
            array(vec![bulk("behind"), bulk("y")]),
            "{}",
            case.name
        );
        other.call(&["DEL", "k", "k:dst", "z", "s"]).await;
    }
}

#[tokio::test]
async fn bee_queues_two_pipelined_brpoplpush_deliver_the_job_pushed_first() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut worker = RawClient::connect(&daemon.resp_socket()).await;
    let mut producer = RawClient::connect(&daemon.resp_socket()).await;
    // bee-queue's two processing loops share one connection.
    let brpoplpush: &[&str] = &["BRPOPLPUSH", "bq:q:wait", "bq:q:active", "0"];
    worker.pipeline(&[brpoplpush, brpoplpush]).await;
    until_blocked(&redis, 1).await;
    assert_eq!(
        producer.call(&["LPUSH", "bq:q:wait", "job-1"]).await,
        Frame::Integer(1)
    );
    assert_eq!(worker.read().await, bulk("job-1"));
    until_blocked(&redis, 1).await;
    producer.call(&["LPUSH", "bq:q:wait", "job-2"]).await;
    assert_eq!(worker.read().await, bulk("job-2"));
}

#[tokio::test]
async fn replies_before_a_blocking_command_are_written_at_once() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    let blockers: [&[&str]; 3] = [
        &["BLPOP", "k", "0"],
        &["BRPOPLPUSH", "k", "k:dst", "0"],
        &["XREAD", "BLOCK", "0", "STREAMS", "s", "$"],
    ];
    for blocker in blockers {
        let mut client = RawClient::connect(&daemon.resp_socket()).await;
        client
            .pipeline(&[&["SET", "a", "1"], &["GET", "a"], &["PING"], blocker])
            .await;
        assert_eq!(
            client.read().await,
            Frame::Simple("OK".into()),
            "{blocker:?}"
        );
        assert_eq!(client.read().await, bulk("1"), "{blocker:?}");
        assert_eq!(client.read().await, Frame::Simple("PONG".into()));
        // The blocked command is still served afterwards.
        until_blocked(&redis, 1).await;
        match blocker[0] {
            "XREAD" => other.call(&["XADD", "s", "*", "f", "v"]).await,
            _ => other.call(&["LPUSH", "k", "x"]).await,
        };
        assert!(!matches!(client.read().await, Frame::Error(_)));
        other.call(&["DEL", "k", "k:dst", "s"]).await;
    }
}

#[tokio::test]
async fn a_reply_before_a_blocking_command_in_a_watched_session_is_written_at_once() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    // WATCH pins a connection: each command is then awaited in place, the blocking one too.
    client
        .pipeline(&[&["WATCH", "w"], &["GET", "w"], &["BLPOP", "k", "0"]])
        .await;
    assert_eq!(client.read().await, Frame::Simple("OK".into()));
    assert_eq!(client.read().await, Frame::Null);
    until_blocked(&redis, 1).await;
    other.call(&["LPUSH", "k", "x"]).await;
    assert_eq!(client.read().await, array(vec![bulk("k"), bulk("x")]));
}

/// redis-py's `pipeline()`: every command written before any reply is read. A second thread reads
/// meanwhile, as the daemon's replies would otherwise fill the socket while the client still writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_written_in_one_go_is_answered_while_it_is_still_being_written() {
    const COMMANDS: usize = 200_000;
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let value = "v".repeat(100);
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    client.call(&["SET", "key", &value]).await;
    let socket = daemon.resp_socket();
    let counted = tokio::task::spawn_blocking(move || {
        let stream = StdStream::connect(socket).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut writer = stream.try_clone().unwrap();
        let writing = std::thread::spawn(move || {
            let mut pipeline = Vec::new();
            for _ in 0..COMMANDS {
                pipeline.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n");
            }
            writer
                .write_all(&pipeline)
                .expect("the whole pipeline is taken");
        });
        // Each reply is `$100\r\n<value>\r\n`: two lines.
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        let mut value = vec![0u8; 102];
        let mut replies = 0;
        while replies < COMMANDS {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            assert_eq!(line, "$100\r\n", "reply {replies}");
            reader.read_exact(&mut value).expect("the value");
            replies += 1;
        }
        writing.join().unwrap();
        replies
    })
    .await
    .unwrap();
    assert_eq!(counted, COMMANDS);
}

/// The same pipeline, written all at once by a client that reads nothing until it is done writing
/// (redis-py's `pipeline()` exactly): the replies wait in the daemon, under its output budget.
#[tokio::test]
async fn a_client_that_writes_its_whole_pipeline_before_reading_is_answered() {
    const COMMANDS: usize = 20_000;
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let value = "v".repeat(100);
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    client.call(&["SET", "key", &value]).await;
    let socket = daemon.resp_socket();
    let counted = tokio::task::spawn_blocking(move || {
        let mut stream = StdStream::connect(socket).expect("connect");
        stream
            .set_write_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut pipeline = Vec::new();
        for _ in 0..COMMANDS {
            pipeline.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n");
        }
        stream
            .write_all(&pipeline)
            .expect("the whole pipeline is taken");
        let expected = COMMANDS * (b"$100\r\n".len() + 102);
        let mut read = 0;
        let mut chunk = vec![0u8; 64 * 1024];
        while read < expected {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
        read == expected
    })
    .await
    .unwrap();
    assert!(counted, "every reply arrived");
}
