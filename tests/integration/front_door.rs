//! The Redis-protocol front door against a real redis-server: unchanged clients (redis-rs,
//! redis-cli, redis-benchmark), pipelines with denied commands, transactions, pub/sub, blocking
//! commands, scripts, RESP3, and bad input that costs only its own connection.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

fn bulk(text: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(text.as_bytes()))
}

fn is_error_starting(frame: &Frame, prefix: &str) -> bool {
    matches!(frame, Frame::Error(e) if e.starts_with(prefix.as_bytes()))
}

async fn redis_rs(daemon: &TestDaemon) -> redis::aio::MultiplexedConnection {
    let url = format!("redis+unix://{}", daemon.resp_socket().display());
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("redis-rs connects through the daemon")
}

/// The clients Redis itself sees, one `CLIENT LIST` line each.
pub(crate) fn redis_clients(redis: &RedisServer) -> Vec<String> {
    redis
        .inline("CLIENT LIST")
        .lines()
        .filter(|line| line.starts_with("id="))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn an_unchanged_redis_rs_client_works_through_the_daemon() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut conn = redis_rs(&daemon).await;
    let _: () = redis::cmd("SET")
        .arg("greeting")
        .arg("hello")
        .query_async(&mut conn)
        .await
        .unwrap();
    let value: String = redis::cmd("GET")
        .arg("greeting")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(value, "hello");
    let counter: i64 = redis::cmd("INCRBY")
        .arg("n")
        .arg(5)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(counter, 5);
    let _: () = redis::cmd("RPUSH")
        .arg("list")
        .arg(&["a", "b", "c"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let items: Vec<String> = redis::cmd("LRANGE")
        .arg("list")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(items, ["a", "b", "c"]);
    // The data really is in Redis.
    assert!(redis.inline("GET greeting").contains("hello"));
    daemon.stop().await;
}

#[tokio::test]
async fn a_denied_command_answers_in_its_own_slot_and_the_pipeline_goes_on() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    client
        .pipeline(&[
            &["SET", "kept", "1"],
            &["FLUSHALL"],
            &["INCR", "kept"],
            &["GET", "kept"],
        ])
        .await;
    assert_eq!(text(&client.read().await), "OK");
    let denied = client.read().await;
    assert!(
        is_error_starting(&denied, "NOPERM tollgate: rule "),
        "{denied:?}"
    );
    assert!(text(&denied).contains("denies FLUSHALL"), "{denied:?}");
    assert_eq!(client.read().await, Frame::Integer(2));
    assert_eq!(client.read().await, bulk("2"));
    assert!(
        redis.inline("GET kept").contains('2'),
        "FLUSHALL must not have reached Redis"
    );
    daemon.stop().await;
}

#[tokio::test]
async fn client_reply_silences_only_its_own_client() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut quiet = RawClient::connect(&daemon.resp_socket()).await;
    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    quiet
        .pipeline(&[
            &["CLIENT", "REPLY", "OFF"],
            &["SET", "k", "1"],
            &["GET", "k"],
        ])
        .await;
    // Forwarded, CLIENT REPLY OFF would have silenced the REGULAR connection both clients share.
    assert_eq!(other.call(&["INCR", "k"]).await, Frame::Integer(2));
    assert_eq!(other.call(&["GET", "k"]).await, bulk("2"));
    quiet
        .pipeline(&[
            &["CLIENT", "REPLY", "ON"],
            &["GET", "k"],
            &["CLIENT", "REPLY", "SKIP"],
            &["INCR", "k"],
            &["GET", "k"],
        ])
        .await;
    assert_eq!(text(&quiet.read().await), "OK", "ON answers; OFF did not");
    assert_eq!(quiet.read().await, bulk("2"));
    assert_eq!(quiet.read().await, bulk("3"), "SKIP silenced exactly INCR");
    assert_eq!(
        quiet.read_within(Duration::from_millis(200)).await,
        Err(()),
        "nothing else was answered, and the connection stays open"
    );
    daemon.stop().await;
}

#[tokio::test]
async fn no_touch_is_refused_because_connections_are_shared() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    for argv in [&["CLIENT", "NO-TOUCH", "ON"][..]] {
        let refused = client.call(argv).await;
        assert!(
            is_error_starting(&refused, "ERR tollgate: CLIENT ")
                && text(&refused).contains("shared"),
            "{argv:?}: {refused:?}"
        );
    }
    // Tracking never came on: CACHING gets Redis's own answer for a client not tracking.
    let caching = client.call(&["CLIENT", "CACHING", "yes"]).await;
    assert!(
        is_error_starting(&caching, "ERR CLIENT CACHING can be called only"),
        "{caching:?}"
    );
    assert_eq!(
        client.call(&["SET", "k", "v"]).await,
        Frame::Simple(Bytes::from_static(b"OK"))
    );
    let tracking = redis.inline("CLIENT LIST");
    assert!(
        !tracking.contains("flags=t"),
        "no Redis connection has tracking on: {tracking}"
    );
    daemon.stop().await;
}

#[tokio::test]
async fn a_pipeline_that_subscribes_midway_refuses_what_follows_in_resp2() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    client
        .pipeline(&[
            &["SET", "k", "1"],
            &["GET", "k"],
            &["SUBSCRIBE", "ch"],
            &["GET", "k"],
        ])
        .await;
    assert_eq!(text(&client.read().await), "OK");
    assert_eq!(client.read().await, bulk("1"));
    assert_eq!(
        client.read().await,
        Frame::Array(vec![bulk("subscribe"), bulk("ch"), Frame::Integer(1)])
    );
    let refused = client.read().await;
    assert!(
        is_error_starting(&refused, "ERR Can't execute 'get'"),
        "{refused:?}"
    );
    daemon.stop().await;
}

#[tokio::test]
async fn commands_before_malformed_input_are_answered_before_it_closes() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    client
        .write(b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\n*2\r\n$3\r\nGET\r\n$1\r\na\r\n*1\r\n$abc\r\n")
        .await;
    let frames = client.read_until_closed(Duration::from_secs(5)).await;
    assert!(
        matches!(frames.as_slice(), [ok, one, error]
            if text(ok) == "OK" && *one == bulk("1") && is_error_starting(error, "ERR Protocol error")),
        "{frames:?}"
    );
    daemon.stop().await;
}

#[tokio::test]
async fn long_pipelines_keep_their_order() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let commands: Vec<Vec<String>> = (0..2000)
        .map(|i| vec!["RPUSH".to_owned(), "order".to_owned(), i.to_string()])
        .collect();
    let borrowed: Vec<Vec<&str>> = commands
        .iter()
        .map(|c| c.iter().map(String::as_str).collect())
        .collect();
    let slices: Vec<&[&str]> = borrowed.iter().map(Vec::as_slice).collect();
    client.pipeline(&slices).await;
    for i in 0..2000 {
        assert_eq!(client.read().await, Frame::Integer(i + 1));
    }
    daemon.stop().await;
}

#[tokio::test]
async fn transactions_run_on_a_pinned_connection() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    client
        .pipeline(&[&["MULTI"], &["INCR", "tx"], &["INCR", "tx"], &["EXEC"]])
        .await;
    assert_eq!(text(&client.read().await), "OK");
    assert_eq!(text(&client.read().await), "QUEUED");
    assert_eq!(text(&client.read().await), "QUEUED");
    assert_eq!(
        client.read().await,
        Frame::Array(vec![Frame::Integer(1), Frame::Integer(2)])
    );
    daemon.stop().await;
}

#[tokio::test]
async fn a_watched_key_changed_by_another_client_aborts_exec() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut watcher = RawClient::connect(&daemon.resp_socket()).await;
    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&watcher.call(&["WATCH", "balance"]).await), "OK");
    assert_eq!(text(&other.call(&["SET", "balance", "100"]).await), "OK");
    assert_eq!(text(&watcher.call(&["MULTI"]).await), "OK");
    assert_eq!(
        text(&watcher.call(&["SET", "balance", "0"]).await),
        "QUEUED"
    );
    assert_eq!(watcher.call(&["EXEC"]).await, Frame::NullArray);
    assert!(redis.inline("GET balance").contains("100"));
    daemon.stop().await;
}

#[tokio::test]
async fn scripts_run_inside_transactions_as_on_redis() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    // WATCH pins a TRANSACTION connection; the EVAL after it runs there.
    assert_eq!(text(&client.call(&["WATCH", "w"]).await), "OK");
    let eval = client
        .call(&["EVAL", "return redis.call('SET', KEYS[1], 'a')", "1", "w"])
        .await;
    assert_eq!(text(&eval), "OK", "{eval:?}");
    assert_eq!(text(&client.call(&["UNWATCH"]).await), "OK");
    // EVAL and EVALSHA queued inside MULTI run with EXEC.
    let sha = text(
        &client
            .call(&["SCRIPT", "LOAD", "return redis.call('INCR', KEYS[1])"])
            .await,
    );
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    let queued = client
        .call(&["EVAL", "return redis.call('SET', KEYS[1], 'b')", "1", "m"])
        .await;
    assert_eq!(text(&queued), "QUEUED", "{queued:?}");
    assert_eq!(
        text(&client.call(&["EVALSHA", &sha, "1", "n"]).await),
        "QUEUED"
    );
    assert_eq!(
        client.call(&["EXEC"]).await,
        Frame::Array(vec![Frame::Simple("OK".into()), Frame::Integer(1)])
    );
    assert!(redis.inline("GET w").contains('a'));
    assert!(redis.inline("GET m").contains('b'));
    // The transaction lane's scripts are still kept out of the reserved keyspace by Redis.
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    client
        .call(&[
            "EVAL",
            "return redis.call('DEL', ARGV[1])",
            "0",
            "tollgate:lease:{x}",
        ])
        .await;
    let exec = client.call(&["EXEC"]).await;
    let Frame::Array(replies) = &exec else {
        panic!("EXEC answered {exec:?}");
    };
    assert!(
        matches!(&replies[0], Frame::Error(e) if String::from_utf8_lossy(e).contains("can't access")),
        "{exec:?}"
    );
    daemon.stop().await;
}

#[tokio::test]
async fn a_command_denied_while_queueing_aborts_exec() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    assert_eq!(text(&client.call(&["SET", "half", "1"]).await), "QUEUED");
    assert!(is_error_starting(
        &client.call(&["FLUSHALL"]).await,
        "NOPERM"
    ));
    assert!(is_error_starting(
        &client.call(&["EXEC"]).await,
        "EXECABORT"
    ));
    assert!(redis.inline("EXISTS half").contains(":0"));
    daemon.stop().await;
}

#[tokio::test]
async fn a_client_that_disconnects_mid_multi_leaves_nothing_open() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    {
        let mut client = RawClient::connect(&daemon.resp_socket()).await;
        assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
        assert_eq!(text(&client.call(&["SET", "never", "1"]).await), "QUEUED");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis_clients(&redis)
        .iter()
        .any(|c| !c.contains(" multi=-1"))
    {
        assert!(
            Instant::now() < deadline,
            "a MULTI stayed open: {:?}",
            redis_clients(&redis)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(redis.inline("EXISTS never").contains(":0"));
    // The cleaned connection serves the next transaction.
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    client
        .pipeline(&[&["MULTI"], &["SET", "next", "1"], &["EXEC"]])
        .await;
    assert_eq!(text(&client.read().await), "OK");
    assert_eq!(text(&client.read().await), "QUEUED");
    assert_eq!(
        client.read().await,
        Frame::Array(vec![Frame::Simple(Bytes::from_static(b"OK"))])
    );
    daemon.stop().await;
}

#[tokio::test]
async fn pub_sub_fans_out_to_many_subscribers_over_one_redis_subscription() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut subscribers = Vec::new();
    for _ in 0..50 {
        let mut client = RawClient::connect(&daemon.resp_socket()).await;
        let confirmation = client.call(&["SUBSCRIBE", "news"]).await;
        assert_eq!(
            confirmation,
            Frame::Array(vec![bulk("subscribe"), bulk("news"), Frame::Integer(1)])
        );
        subscribers.push(client);
    }
    let mut publisher = RawClient::connect(&daemon.resp_socket()).await;
    // Redis sees one subscriber, the shared PUBSUB connection; the client is told how many
    // clients received the message.
    assert!(redis.inline("PUBSUB NUMSUB news").ends_with(":1\r\n"));
    assert_eq!(
        publisher.call(&["PUBLISH", "news", "extra"]).await,
        Frame::Integer(subscribers.len() as i64)
    );
    for subscriber in &mut subscribers {
        assert_eq!(
            subscriber.read().await,
            Frame::Array(vec![bulk("message"), bulk("news"), bulk("extra")])
        );
    }
    // In RESP2 subscribed mode only the pub/sub commands run.
    let refused = subscribers[0].call(&["GET", "x"]).await;
    assert!(
        is_error_starting(&refused, "ERR Can't execute 'get'"),
        "{refused:?}"
    );
    let bye = subscribers[0].call(&["UNSUBSCRIBE"]).await;
    assert_eq!(
        bye,
        Frame::Array(vec![bulk("unsubscribe"), bulk("news"), Frame::Integer(0)])
    );
    daemon.stop().await;
}

#[tokio::test]
async fn a_slow_subscriber_is_disconnected_and_the_others_keep_receiving() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start_with(&redis, |config| config.resp.subscriber_buffer = 16).await;
    let mut slow = RawClient::connect(&daemon.resp_socket()).await;
    slow.call(&["SUBSCRIBE", "firehose"]).await;
    let mut healthy = RawClient::connect(&daemon.resp_socket()).await;
    healthy.call(&["SUBSCRIBE", "firehose"]).await;
    let mut publisher = redis_rs(&daemon).await;
    let payload = "x".repeat(64 * 1024);
    // The slow client never reads; the healthy one reads every message as it comes.
    for i in 0..200 {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("firehose")
            .arg(&payload)
            .query_async(&mut publisher)
            .await
            .unwrap();
        let message = healthy.read().await;
        assert!(
            matches!(&message, Frame::Array(items) if items.len() == 3),
            "message {i}: {message:?}"
        );
    }
    // Read what reached the slow subscriber's socket, to its end: the daemon closed it (a
    // read that times out instead is `Err`). The reason comes last when its socket had room
    // for it within the daemon's last-words time; a client whose socket is full is closed
    // without it, as Redis closes a client past its output buffer limit.
    let mut frames = Vec::new();
    loop {
        match slow.read_within(Duration::from_secs(10)).await {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => break,
            Err(()) => panic!("the slow subscriber was not disconnected"),
        }
    }
    if let Some(last) = frames.last().filter(|last| last.is_error()) {
        assert!(
            is_error_starting(last, "ERR tollgate: subscriber too slow"),
            "{last:?}"
        );
    }
    assert!(
        frames.len() < 200,
        "the slow subscriber was buffered without bound"
    );
    daemon.stop().await;
}

#[tokio::test]
async fn blocking_commands_time_out_on_their_own_lane() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let started = Instant::now();
    assert_eq!(
        client.call(&["BLPOP", "empty", "0.2"]).await,
        Frame::NullArray
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    // A blocked client does not hold up another client's plain commands.
    let mut waiter = RawClient::connect(&daemon.resp_socket()).await;
    waiter.send(&["BLPOP", "jobs", "5"]).await;
    let mut producer = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        producer.call(&["RPUSH", "jobs", "job-1"]).await,
        Frame::Integer(1)
    );
    assert_eq!(
        waiter.read().await,
        Frame::Array(vec![bulk("jobs"), bulk("job-1")])
    );
    daemon.stop().await;
}

#[tokio::test]
async fn a_client_that_hangs_up_while_blocked_leaves_no_blocked_connection() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    {
        let mut client = RawClient::connect(&daemon.resp_socket()).await;
        client.send(&["BLPOP", "abandoned", "0"]).await;
        // Let the command reach Redis before hanging up.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !redis_clients(&redis)
            .iter()
            .any(|c| c.contains("cmd=blpop"))
        {
            assert!(Instant::now() < deadline, "BLPOP never reached Redis");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis_clients(&redis).iter().any(|c| c.contains("flags=b")) {
        assert!(
            Instant::now() < deadline,
            "a blocked connection stayed: {:?}",
            redis_clients(&redis)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Nothing steals the next element: the next waiter gets it.
    let mut producer = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        producer.call(&["RPUSH", "abandoned", "v"]).await,
        Frame::Integer(1)
    );
    let mut next = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        next.call(&["BLPOP", "abandoned", "1"]).await,
        Frame::Array(vec![bulk("abandoned"), bulk("v")])
    );
    daemon.stop().await;
}

#[tokio::test]
async fn scripts_run_with_their_keys_admitted() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["SET", "script-key", "41"]).await), "OK");
    let reply = client
        .call(&[
            "EVAL",
            "return redis.call('INCR', KEYS[1])",
            "1",
            "script-key",
        ])
        .await;
    assert_eq!(reply, Frame::Integer(42));
    let sha = client.call(&["SCRIPT", "LOAD", "return ARGV[1]"]).await;
    let sha = text(&sha);
    assert_eq!(client.call(&["EVALSHA", &sha, "0", "hi"]).await, bulk("hi"));
    daemon.stop().await;
}

#[tokio::test]
async fn resp3_clients_get_maps_and_push_messages() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let hello = client.call(&["HELLO", "3", "SETNAME", "resp3-test"]).await;
    let Frame::Map(pairs) = hello else {
        panic!("HELLO 3 answers a map: {hello:?}")
    };
    assert!(pairs.contains(&(bulk("proto"), Frame::Integer(3))));
    // The server and version are Redis's own, as its HELLO says them (clients pick features by
    // them: redis-py's cache wants `redis` 7.4 or later).
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let Frame::Map(theirs) = direct.call(&["HELLO", "3"]).await else {
        panic!("Redis's HELLO 3 answers a map")
    };
    for field in ["server", "version"] {
        let of = |pairs: &[(Frame, Frame)]| {
            pairs
                .iter()
                .find(|(key, _)| *key == bulk(field))
                .map(|(_, value)| value.clone())
        };
        assert_eq!(of(&pairs), of(&theirs), "{field}");
        assert!(of(&pairs).is_some(), "{field}");
    }
    assert_eq!(
        client.call(&["CLIENT", "GETNAME"]).await,
        bulk("resp3-test")
    );
    let confirmation = client.call(&["SUBSCRIBE", "r3"]).await;
    assert_eq!(
        confirmation,
        Frame::Push(vec![bulk("subscribe"), bulk("r3"), Frame::Integer(1)])
    );
    // RESP3 clients may run commands while subscribed.
    assert_eq!(
        text(&client.call(&["SET", "while-subscribed", "1"]).await),
        "OK"
    );
    let mut publisher = RawClient::connect(&daemon.resp_socket()).await;
    publisher.call(&["PUBLISH", "r3", "pushed"]).await;
    assert_eq!(
        client.read().await,
        Frame::Push(vec![bulk("message"), bulk("r3"), bulk("pushed")])
    );
    daemon.stop().await;
}

#[tokio::test]
async fn resp3_clients_get_resp3_replies_from_redis_on_every_lane() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    redis.inline("HSET h f v");
    redis.inline("ZADD z 1.5 m");
    let mut resp2 = RawClient::connect(&daemon.resp_socket()).await;
    let mut resp3 = RawClient::connect(&daemon.resp_socket()).await;
    resp3.call(&["HELLO", "3"]).await;
    let map = Frame::Map(vec![(bulk("f"), bulk("v"))]);
    // REGULAR: the same command, side by side, in each client's protocol.
    assert_eq!(resp3.call(&["HGETALL", "h"]).await, map);
    assert_eq!(
        resp2.call(&["HGETALL", "h"]).await,
        Frame::Array(vec![bulk("f"), bulk("v")])
    );
    // BLOCKING: the score is a double in RESP3. The RESP2 client's borrow leaves an idle RESP2
    // connection, which the RESP3 client's borrow switches rather than opening another.
    redis.inline("ZADD z2 2.5 n");
    assert_eq!(
        resp2.call(&["BZPOPMIN", "z2", "1"]).await,
        Frame::Array(vec![bulk("z2"), bulk("n"), bulk("2.5")])
    );
    assert_eq!(
        resp3.call(&["BZPOPMIN", "z", "1"]).await,
        Frame::Array(vec![bulk("z"), bulk("m"), Frame::Double(1.5)])
    );
    let blocking = redis_clients(&redis)
        .into_iter()
        .filter(|client| client.contains("name=tollgate-blocking"))
        .count();
    assert_eq!(blocking, 1, "one BLOCKING connection, switched to RESP3");
    // TRANSACTION: EXEC's replies too.
    assert_eq!(text(&resp3.call(&["MULTI"]).await), "OK");
    assert_eq!(text(&resp3.call(&["HGETALL", "h"]).await), "QUEUED");
    assert_eq!(resp3.call(&["EXEC"]).await, Frame::Array(vec![map.clone()]));
    // Back to RESP2 (HELLO 2, as a client that downgrades does): arrays again.
    resp3.call(&["HELLO", "2"]).await;
    assert_eq!(
        resp3.call(&["HGETALL", "h"]).await,
        Frame::Array(vec![bulk("f"), bulk("v")])
    );
    daemon.stop().await;
}

#[tokio::test]
async fn a_protocol_change_midway_through_a_pipeline_keeps_its_order() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    // The writes go out on a RESP2 connection and the reads after HELLO on a RESP3 one: HELLO
    // waits for what was sent before it, so the reads see the writes.
    let writes: Vec<[String; 3]> = (0..50)
        .map(|i| ["SET".into(), format!("k{i}"), format!("{i}")])
        .collect();
    let mut pipeline: Vec<Vec<&str>> = writes
        .iter()
        .map(|w| w.iter().map(String::as_str).collect())
        .collect();
    pipeline.push(vec!["HSET", "h", "f", "v"]);
    pipeline.push(vec!["HELLO", "3"]);
    pipeline.push(vec!["GET", "k49"]);
    pipeline.push(vec!["HGETALL", "h"]);
    let commands: Vec<&[&str]> = pipeline.iter().map(Vec::as_slice).collect();
    client.pipeline(&commands).await;
    for _ in 0..50 {
        assert_eq!(text(&client.read().await), "OK");
    }
    assert_eq!(client.read().await, Frame::Integer(1));
    assert!(
        matches!(client.read().await, Frame::Map(_)),
        "HELLO 3 answers a map"
    );
    assert_eq!(client.read().await, bulk("49"));
    assert_eq!(
        client.read().await,
        Frame::Map(vec![(bulk("f"), bulk("v"))])
    );
    daemon.stop().await;
}

#[tokio::test]
async fn malformed_input_closes_only_that_connection() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut healthy = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&healthy.call(&["SET", "survivor", "1"]).await), "OK");
    let mut broken = RawClient::connect(&daemon.resp_socket()).await;
    broken.write(b"*1\r\n$abc\r\n").await;
    let frames = broken.read_until_closed(Duration::from_secs(5)).await;
    assert!(
        matches!(frames.as_slice(), [error] if is_error_starting(error, "ERR Protocol error")),
        "{frames:?}"
    );
    assert_eq!(healthy.call(&["GET", "survivor"]).await, bulk("1"));
    daemon.stop().await;
}

#[tokio::test]
async fn an_oversized_command_is_refused_and_closes_its_connection() {
    let redis = RedisServer::start();
    let daemon =
        TestDaemon::start_with(&redis, |config| config.resp.max_command_bytes = 4096).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let big = "v".repeat(16 * 1024);
    client.send(&["SET", "big", &big]).await;
    let frames = client.read_until_closed(Duration::from_secs(5)).await;
    assert!(
        // Redis's words for an argument longer than it takes (its `proto-max-bulk-len`).
        matches!(frames.as_slice(), [error] if is_error_starting(error, "ERR Protocol error: invalid bulk length")),
        "{frames:?}"
    );
    assert!(redis.inline("EXISTS big").contains(":0"));
    let mut next = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&next.call(&["PING"]).await), "PONG");
    daemon.stop().await;
}

#[tokio::test]
async fn redis_cli_works_interactively_and_in_pipe_mode() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let socket = daemon.resp_socket();
    let socket = socket.to_str().unwrap().to_owned();
    let output = tokio::task::spawn_blocking({
        let socket = socket.clone();
        move || {
            Command::new("redis-cli")
                .args(["-s", &socket, "SET", "cli-key", "cli-value"])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "OK");

    let mut commands = String::new();
    for i in 0..500 {
        commands.push_str(&format!("SET pipe:{i} {i}\r\n"));
    }
    let output = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new("redis-cli")
            .args(["-s", &socket, "--pipe"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(commands.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("errors: 0, replies: 500"), "{stdout}");
    assert!(redis.inline("GET pipe:499").contains("499"));
    daemon.stop().await;
}

#[tokio::test]
async fn redis_benchmark_runs_its_default_tests_under_the_default_policy() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let socket = daemon.resp_socket().to_str().unwrap().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("redis-benchmark")
            .args(["-s", &socket, "-n", "200", "-c", "5", "-q"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // -q still draws progress with carriage returns; each finished test ends as "NAME...: N requests per second".
    let finished: Vec<&str> = stdout
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|line| line.contains("requests per second"))
        .collect();
    for test in [
        "SET:",
        "GET:",
        "INCR:",
        "LPUSH:",
        "RPOP:",
        "SADD:",
        "HSET:",
        "LRANGE_600",
        "MSET",
    ] {
        assert!(
            finished.iter().any(|line| line.starts_with(test)),
            "{test} missing:\n{stdout}\n{stderr}"
        );
    }
    assert!(
        !stdout.contains("ERR") && !stderr.contains("ERR"),
        "{stdout}\n{stderr}"
    );
    daemon.stop().await;
}

/// On the embedded default every lane has its own least-privilege ACL user; each lane's user must
/// still run what the default policy admits for that lane.
#[tokio::test]
async fn every_lane_works_on_the_embedded_default_with_its_own_acl_user() {
    let daemon = TestDaemon::start_embedded().await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    // REGULAR
    assert_eq!(
        text(&client.call(&["SET", "lane:regular", "1"]).await),
        "OK"
    );
    // SCRIPT
    assert_eq!(
        client
            .call(&[
                "EVAL",
                "return redis.call('GET', KEYS[1])",
                "1",
                "lane:regular"
            ])
            .await,
        bulk("1")
    );
    // BLOCKING
    assert_eq!(
        client.call(&["BLPOP", "lane:empty", "0.1"]).await,
        Frame::NullArray
    );
    // TRANSACTION
    client
        .pipeline(&[&["MULTI"], &["INCR", "lane:tx"], &["EXEC"]])
        .await;
    assert_eq!(text(&client.read().await), "OK");
    assert_eq!(text(&client.read().await), "QUEUED");
    assert_eq!(client.read().await, Frame::Array(vec![Frame::Integer(1)]));
    // ADMIN: read-only diagnostics
    let info = client.call(&["INFO", "server"]).await;
    assert!(text(&info).contains("redis_version"), "{info:?}");
    // CONFIG GET is answered by the daemon: Redis's configuration (passwords among it) stays hidden.
    assert_eq!(
        client.call(&["CONFIG", "GET", "databases"]).await,
        Frame::Array(vec![bulk("databases"), bulk("1")])
    );
    assert_eq!(
        client.call(&["CONFIG", "GET", "requirepass"]).await,
        Frame::Array(vec![])
    );
    // PUBSUB
    let mut subscriber = RawClient::connect(&daemon.resp_socket()).await;
    subscriber.call(&["SUBSCRIBE", "lane:news"]).await;
    assert_eq!(
        client.call(&["PUBLISH", "lane:news", "hi"]).await,
        Frame::Integer(1)
    );
    assert_eq!(
        subscriber.read().await,
        Frame::Array(vec![bulk("message"), bulk("lane:news"), bulk("hi")])
    );
    daemon.stop().await;
}
