//! What an unchanged client expects of its connection, checked against what Redis itself answers:
//! the daemon's own replies inside MULTI, RESP3 nulls, arity errors, and pub/sub that delivers what
//! is published once SUBSCRIBE was confirmed.

use std::time::Duration;

use bytes::Bytes;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

fn bulk(text: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(text.as_bytes()))
}

fn simple(text: &str) -> Frame {
    Frame::Simple(Bytes::copy_from_slice(text.as_bytes()))
}

fn is_error(frame: &Frame) -> bool {
    matches!(frame, Frame::Error(_))
}

/// The same commands against Redis directly and through the daemon give the same replies.
async fn same_replies(redis: &RedisServer, daemon: &TestDaemon, script: &[&[&str]]) {
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut through = RawClient::connect(&daemon.resp_socket()).await;
    for argv in script {
        let expected = direct.call(argv).await;
        let got = through.call(argv).await;
        assert_eq!(got, expected, "{argv:?}: daemon vs redis");
    }
}

#[tokio::test]
async fn commands_the_daemon_answers_itself_are_queued_inside_multi_and_answered_by_exec() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(client.call(&["MULTI"]).await, simple("OK"));
    for argv in [
        &["PING"][..],
        &["SET", "k", "v"],
        &["ECHO", "hi"],
        &["CLIENT", "SETNAME", "worker-1"],
        &["SELECT", "0"],
        &["GET", "k"],
        &["CLIENT", "GETNAME"],
    ] {
        assert_eq!(client.call(argv).await, simple("QUEUED"), "{argv:?}");
    }
    assert_eq!(
        client.call(&["EXEC"]).await,
        Frame::Array(vec![
            simple("PONG"),
            simple("OK"),
            bulk("hi"),
            simple("OK"),
            simple("OK"),
            bulk("v"),
            bulk("worker-1"),
        ])
    );
    // The connection is usable as usual afterwards.
    assert_eq!(client.call(&["PING"]).await, simple("PONG"));
}

#[tokio::test]
async fn a_local_command_with_bad_arguments_aborts_the_transaction_as_redis_does() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let script: &[&[&str]] = &[
        &["MULTI"],
        &["SET", "k", "v"],
        &["ECHO"],
        &["EXEC"],
        &["EXISTS", "k"],
    ];
    same_replies(&redis, &daemon, script).await;
}

#[tokio::test]
async fn discard_drops_queued_local_replies_and_a_failed_watch_gives_a_null_exec() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    client.call(&["MULTI"]).await;
    client.call(&["PING"]).await;
    assert_eq!(client.call(&["DISCARD"]).await, simple("OK"));
    // A later transaction's EXEC holds only its own replies.
    client.call(&["MULTI"]).await;
    client.call(&["ECHO", "second"]).await;
    assert_eq!(
        client.call(&["EXEC"]).await,
        Frame::Array(vec![bulk("second")])
    );

    assert_eq!(client.call(&["WATCH", "w"]).await, simple("OK"));
    redis.inline("SET w changed");
    client.call(&["MULTI"]).await;
    client.call(&["PING"]).await;
    client.call(&["GET", "w"]).await;
    assert_eq!(client.call(&["EXEC"]).await, Frame::NullArray);
}

#[tokio::test]
async fn resp3_nulls_are_written_as_resp3_nulls() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert!(matches!(client.call(&["HELLO", "3"]).await, Frame::Map(_)));
    assert_eq!(client.call(&["CLIENT", "GETNAME"]).await, Frame::Null3);
    let reply = client.call(&["UNSUBSCRIBE"]).await;
    assert_eq!(
        reply,
        Frame::Push(vec![bulk("unsubscribe"), Frame::Null3, Frame::Integer(0)])
    );
    // RESP2 keeps its own null.
    let mut resp2 = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(resp2.call(&["CLIENT", "GETNAME"]).await, Frame::Null);
}

#[tokio::test]
async fn the_daemons_own_commands_check_their_arity_as_redis_does() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let script: &[&[&str]] = &[
        &["PING", "a", "b"],
        &["PING", "a"],
        &["ECHO", "a", "b"],
        &["CLIENT", "GETNAME", "extra"],
        &["CLIENT", "ID", "extra"],
        &["PING"],
        // Checked by the admission host before any catalog reads key positions.
        &["LMPOP"],
        &["LMPOP", "1"],
        &["SINTERCARD"],
        &["GET"],
        &["GET", "a", "b"],
        &["FOOBAR", "x", "y"],
        &["foobar"],
    ];
    same_replies(&redis, &daemon, script).await;
}

#[tokio::test]
async fn client_reply_off_still_delivers_messages_and_confirmations() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut subscriber = RawClient::connect(&daemon.resp_socket()).await;
    subscriber.send(&["CLIENT", "REPLY", "OFF"]).await;
    subscriber.send(&["SUBSCRIBE", "quiet"]).await;
    let confirmation = subscriber.read().await;
    assert_eq!(
        confirmation,
        Frame::Array(vec![bulk("subscribe"), bulk("quiet"), Frame::Integer(1)])
    );
    let mut publisher = RawClient::connect(&daemon.resp_socket()).await;
    publisher.call(&["PUBLISH", "quiet", "still heard"]).await;
    assert_eq!(
        subscriber.read().await,
        Frame::Array(vec![bulk("message"), bulk("quiet"), bulk("still heard")])
    );
}

/// channels-redis' pattern: subscribe, then publish on another connection at once. Every message
/// published after the confirmation arrives, every run, including when the channel was just left
/// by another subscriber (the shared subscription is torn down and built again).
#[tokio::test]
async fn a_message_published_after_subscribe_is_confirmed_is_always_delivered() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut publisher = RawClient::connect(&daemon.resp_socket()).await;
    for run in 0..200 {
        let channel = format!("run-{}", run % 3);
        let mut subscriber = RawClient::connect(&daemon.resp_socket()).await;
        let confirmation = subscriber.call(&["SUBSCRIBE", &channel]).await;
        assert!(!is_error(&confirmation), "run {run}: {confirmation:?}");
        let payload = format!("m{run}");
        publisher.call(&["PUBLISH", &channel, &payload]).await;
        let message = subscriber
            .read_within(Duration::from_secs(5))
            .await
            .unwrap_or_else(|()| panic!("run {run}: message lost"))
            .expect("connection open");
        assert_eq!(
            message,
            Frame::Array(vec![bulk("message"), bulk(&channel), bulk(&payload)]),
            "run {run}"
        );
        // Leaving at once makes the next run of this channel race the shared unsubscribe.
        drop(subscriber);
    }
    let mut check = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&check.call(&["PING"]).await), "PONG");
}

/// redis-py and most clients reconnect their pub/sub on a connection error, but give up on an
/// error reply: a lost Redis ends a subscription by closing the client's connection, no `-ERR`.
#[tokio::test]
async fn a_lost_redis_closes_subscribers_without_an_error_so_that_they_reconnect() {
    // The embedded Redis: its supervisor brings it back with the lane users after a crash.
    let daemon = TestDaemon::start_embedded().await;
    let mut subscriber = RawClient::connect(&daemon.resp_socket()).await;
    subscriber.call(&["SUBSCRIBE", "jobs"]).await;
    let pid = daemon.embedded_pid().expect("an embedded redis-server");
    assert!(std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let seen = subscriber.read_until_closed(Duration::from_secs(10)).await;
    assert!(
        seen.iter().all(|frame| !is_error(frame)),
        "closed with {seen:?}"
    );
    // The client's reconnect: subscribing again works and delivers.
    let resubscribed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let mut again = RawClient::connect(&daemon.resp_socket()).await;
            if !is_error(&again.call(&["SUBSCRIBE", "jobs"]).await) {
                return again;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("subscribing works again after Redis is back");
    let mut subscriber = resubscribed;
    let mut publisher = RawClient::connect(&daemon.resp_socket()).await;
    publisher.call(&["PUBLISH", "jobs", "after"]).await;
    assert_eq!(
        subscriber.read().await,
        Frame::Array(vec![bulk("message"), bulk("jobs"), bulk("after")])
    );
}

/// Malformed frames get Redis's own protocol-error text before the connection closes.
#[tokio::test]
async fn malformed_frames_get_the_protocol_errors_redis_gives() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    for malformed in [
        &b"*abc\r\n"[..],
        b"*1\r\n$x\r\n",
        b"*1\r\n$-5\r\n",
        b"*1\r\nfoo\r\n",
        b"SET \"unbalanced\r\n",
    ] {
        let mut direct = RawClient::to_redis(redis.socket()).await;
        let mut through = RawClient::connect(&daemon.resp_socket()).await;
        direct.write(malformed).await;
        through.write(malformed).await;
        let expected = direct.read_until_closed(Duration::from_secs(5)).await;
        let got = through.read_until_closed(Duration::from_secs(5)).await;
        assert_eq!(got, expected, "{}", String::from_utf8_lossy(malformed));
    }
}

const CLIENTS_POLICY: &str = r#"
principals:
  local: { any: true }
rules:
  - id: everything
    commands: ["*"]
    allow: this test's clients may do anything
"#;

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
}

/// Tools find their workers by `CLIENT SETNAME` (BullMQ's getWorkers, RQ): the list must show the
/// daemon's client sessions, not its lane connections to Redis.
#[tokio::test]
async fn client_list_shows_the_clients_sessions_and_client_kill_ends_one() {
    let redis = RedisServer::start();
    let policy = redis.dir().join("clients.yaml");
    std::fs::write(&policy, CLIENTS_POLICY).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy]).await;
    let mut first = RawClient::connect(&daemon.resp_socket()).await;
    let mut second = RawClient::connect(&daemon.resp_socket()).await;
    first.call(&["CLIENT", "SETNAME", "worker-a"]).await;
    second.call(&["CLIENT", "SETNAME", "worker-b"]).await;
    second.call(&["SUBSCRIBE", "jobs"]).await;
    let first_id = match first.call(&["CLIENT", "ID"]).await {
        Frame::Integer(id) => id,
        other => panic!("CLIENT ID: {other:?}"),
    };

    let list = text(&first.call(&["CLIENT", "LIST"]).await);
    let lines: Vec<&str> = list.lines().collect();
    let names: Vec<Option<&str>> = lines.iter().map(|line| field(line, "name")).collect();
    assert_eq!(names, [Some("worker-a"), Some("worker-b")], "{list}");
    assert_eq!(field(lines[0], "id"), Some(first_id.to_string().as_str()));
    assert_eq!(field(lines[0], "cmd"), Some("client|list"));
    assert_eq!(field(lines[1], "sub"), Some("1"));
    assert_eq!(field(lines[1], "flags"), Some("PU"));
    assert!(
        !list.contains("user=tollgate-"),
        "no lane connection is listed: {list}"
    );
    let info = text(&first.call(&["CLIENT", "INFO"]).await);
    assert_eq!(
        info.trim_end(),
        lines[0].replace("cmd=client|list", "cmd=client|info")
    );
    let pubsub = text(&first.call(&["CLIENT", "LIST", "TYPE", "pubsub"]).await);
    assert_eq!(pubsub.lines().count(), 1, "{pubsub}");

    // Killed by another session: its connection closes, the killer goes on.
    let second_id = field(lines[1], "id").unwrap();
    assert_eq!(
        first.call(&["CLIENT", "KILL", "ID", second_id]).await,
        Frame::Integer(1)
    );
    assert!(second
        .read_until_closed(Duration::from_secs(5))
        .await
        .is_empty());
    let after = text(&first.call(&["CLIENT", "LIST"]).await);
    assert_eq!(after.lines().count(), 1, "{after}");
    assert_eq!(
        first.call(&["CLIENT", "KILL", "ID", second_id]).await,
        Frame::Integer(0)
    );
    assert!(is_error(
        &first.call(&["CLIENT", "KILL", "no-such:1"]).await
    ));
    assert_eq!(text(&first.call(&["PING"]).await), "PONG");
}

const MONITOR_POLICY: &str = r#"
principals:
  local: { any: true }
rules:
  - id: no-del
    commands: [DEL]
    deny: this test's clients may not delete
  - id: everything
    commands: ["*"]
    allow: this test's clients may do anything else
"#;

/// MONITOR streams what the daemon's sessions run, in Redis's format, and nothing the policy
/// refused (it never ran); the default policy refuses MONITOR itself.
#[tokio::test]
async fn monitor_streams_the_commands_sessions_run_in_redis_format() {
    let redis = RedisServer::start();
    let default = TestDaemon::start(&redis).await;
    let mut refused = RawClient::connect(&default.resp_socket()).await;
    assert!(is_error(&refused.call(&["MONITOR"]).await));

    let policy = redis.dir().join("monitor.yaml");
    std::fs::write(&policy, MONITOR_POLICY).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy]).await;
    let mut monitor = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(monitor.call(&["MONITOR"]).await, simple("OK"));
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    client.call(&["SET", "k", "a \"quoted\" value"]).await;
    assert!(is_error(&client.call(&["DEL", "k"]).await));
    client.call(&["PING"]).await;
    let mut lines = Vec::new();
    for _ in 0..2 {
        lines.push(text(&monitor.read().await));
    }
    let shape = |line: &str| {
        line.split_once(" [0 unix:")
            .map(|(_, rest)| rest.to_owned())
    };
    let time: f64 = lines[0]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .expect("a timestamp");
    assert!(time > 1.0e9, "{}", lines[0]);
    let first = shape(&lines[0]).expect("Redis's shape");
    assert!(
        first.ends_with(r#"] "SET" "k" "a \"quoted\" value""#),
        "{first}"
    );
    assert!(
        shape(&lines[1]).unwrap().ends_with(r#"] "PING""#),
        "{}",
        lines[1]
    );
    // Nothing more: the refused DEL (between SET and PING) was never shown.
    assert!(monitor
        .read_within(Duration::from_millis(300))
        .await
        .is_err());
}

/// Redis counts the daemon's one subscribed connection; clients count the clients.
#[tokio::test]
async fn numsub_and_publish_count_the_clients_subscribed_through_the_daemon() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut a = RawClient::connect(&daemon.resp_socket()).await;
    let mut b = RawClient::connect(&daemon.resp_socket()).await;
    let mut p = RawClient::connect(&daemon.resp_socket()).await;
    a.call(&["SUBSCRIBE", "news"]).await;
    b.call(&["SUBSCRIBE", "news"]).await;
    p.call(&["PSUBSCRIBE", "ne*"]).await;
    // Someone subscribed to Redis directly counts too.
    let mut direct = RawClient::to_redis(redis.socket()).await;
    direct.call(&["SUBSCRIBE", "news"]).await;

    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        client.call(&["PUBSUB", "NUMSUB", "news", "other"]).await,
        Frame::Array(vec![
            bulk("news"),
            Frame::Integer(3),
            bulk("other"),
            Frame::Integer(0)
        ])
    );
    assert_eq!(
        client.call(&["PUBLISH", "news", "hello"]).await,
        Frame::Integer(4),
        "two channel subscribers here, one pattern subscriber here, one directly"
    );
    assert_eq!(
        client.call(&["PUBLISH", "other", "hello"]).await,
        Frame::Integer(0)
    );
}

/// Redis stops counting a subscriber once its UNSUBSCRIBE is answered, and so does the daemon,
/// although its own unsubscribe from Redis on the shared connection may still be on the way.
#[tokio::test]
async fn publish_right_after_the_last_unsubscribe_counts_no_receiver() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut subscriber = RawClient::connect(&daemon.resp_socket()).await;
    let mut publisher = RawClient::connect(&daemon.resp_socket()).await;
    for round in 0..50 {
        for (subscribe, unsubscribe, name) in [
            ("SUBSCRIBE", "UNSUBSCRIBE", "gone"),
            ("PSUBSCRIBE", "PUNSUBSCRIBE", "go*"),
        ] {
            subscriber.call(&[subscribe, name]).await;
            let heard = publisher.call(&["PUBLISH", "gone", "x"]).await;
            assert_eq!(heard, Frame::Integer(1), "{subscribe}, round {round}");
            subscriber.read().await;
            subscriber.call(&[unsubscribe]).await;
            let unheard = publisher.call(&["PUBLISH", "gone", "x"]).await;
            assert_eq!(unheard, Frame::Integer(0), "{unsubscribe}, round {round}");
        }
        assert_eq!(
            publisher.call(&["PUBSUB", "NUMSUB", "gone"]).await,
            Frame::Array(vec![bulk("gone"), Frame::Integer(0)]),
            "round {round}"
        );
    }
}

/// CONFIG GET answers from Redis (the ADMIN lane's user may read the configuration because the
/// policy lets clients run CONFIG GET), never with a password, and with the one database the
/// daemon serves.
#[tokio::test]
async fn config_get_shows_redis_values_without_secrets() {
    let redis = RedisServer::builder()
        .arg("--masterauth")
        .arg("hunter2")
        .start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let reply = client
        .call(&[
            "CONFIG",
            "GET",
            "maxmemory-policy",
            "masterauth",
            "databases",
        ])
        .await;
    // Redis lists parameters in its own order.
    let Frame::Array(items) = reply else {
        panic!("a flat array: {reply:?}")
    };
    let mut pairs: Vec<(String, String)> = items
        .chunks(2)
        .map(|pair| (text(&pair[0]), text(&pair[1])))
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        [
            ("databases".to_owned(), "1".to_owned()),
            ("maxmemory-policy".to_owned(), "noeviction".to_owned()),
        ]
    );
}

const SCOPED_POLICY: &str = r#"
principals:
  local: { any: true }
rules:
  - id: whole-keyspace
    commands: [KEYS, SCAN, DBSIZE, RANDOMKEY, FLUSHDB]
    allow: whole-keyspace commands, which see only this client's keys
  - id: app-keys
    commands: ["@read", "@write", "@keyspace"]
    keys: ["app:*"]
    allow: the app's own keys
  - id: transactions
    commands: [MULTI, EXEC, DISCARD]
    allow: transactions
"#;

/// A tenant's whole-keyspace commands see and flush that tenant's keys and no one else's.
#[tokio::test]
async fn whole_keyspace_commands_act_only_on_the_keys_the_caller_may_touch() {
    let redis = RedisServer::start();
    for key in ["app:1", "app:2", "other:1", "other:2"] {
        redis.inline(&format!("SET {key} v"));
    }
    let policy = redis.dir().join("scoped.yaml");
    std::fs::write(&policy, SCOPED_POLICY).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy]).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let sorted = |frame: Frame| {
        let Frame::Array(items) = frame else {
            panic!("an array: {frame:?}")
        };
        let mut keys: Vec<String> = items.iter().map(text).collect();
        keys.sort();
        keys
    };
    assert_eq!(
        sorted(client.call(&["KEYS", "*"]).await),
        ["app:1", "app:2"]
    );
    assert_eq!(sorted(client.call(&["KEYS", "*:1"]).await), ["app:1"]);
    assert_eq!(client.call(&["DBSIZE"]).await, Frame::Integer(2));
    let mut scanned = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let Frame::Array(mut reply) = client.call(&["SCAN", &cursor, "COUNT", "1"]).await else {
            panic!("SCAN's reply is an array")
        };
        scanned.extend(sorted(reply.pop().unwrap()));
        cursor = text(&reply.pop().unwrap());
        if cursor == "0" {
            break;
        }
    }
    scanned.sort();
    assert_eq!(scanned, ["app:1", "app:2"]);
    let random = text(&client.call(&["RANDOMKEY"]).await);
    assert!(random.starts_with("app:"), "{random}");

    // Inside a transaction it cannot be served key by key: refused, and EXEC fails.
    client.call(&["MULTI"]).await;
    assert!(is_error(&client.call(&["FLUSHDB"]).await));
    assert!(is_error(&client.call(&["EXEC"]).await));

    assert_eq!(client.call(&["FLUSHDB"]).await, simple("OK"));
    assert_eq!(client.call(&["DBSIZE"]).await, Frame::Integer(0));
    assert_eq!(client.call(&["RANDOMKEY"]).await, Frame::Null);
    assert!(redis.inline("DBSIZE").contains(":2"), "other keys are kept");
    assert!(redis.inline("EXISTS other:1 other:2").contains(":2"));
}

/// A policy that admits every command, for comparing the daemon with Redis itself.
pub(crate) const ALLOW_ALL: &str = r#"
principals:
  local: { any: true }
rules:
  - id: all
    commands: ["*"]
    allow: the RESP3 comparison
"#;

/// A reply's RESP3 type structure, with the values every server gives alike: simple strings and
/// errors in full, booleans, a map's keys and a verbatim string's format; bulk strings, integers
/// and doubles by type only. A map's entries are sorted by key (Redis's order is a hash's).
fn shape(frame: &Frame) -> String {
    let list = |items: &[Frame]| items.iter().map(shape).collect::<Vec<_>>().join(",");
    match frame {
        Frame::Simple(s) => format!("+{}", String::from_utf8_lossy(s)),
        Frame::Error(e) => format!("-{}", String::from_utf8_lossy(e)),
        Frame::BulkError(e) => format!("!{}", String::from_utf8_lossy(e)),
        Frame::Integer(_) => ":".into(),
        Frame::Bulk(_) => "$".into(),
        Frame::Null => "$-1".into(),
        Frame::Null3 => "_".into(),
        Frame::NullArray => "*-1".into(),
        Frame::Array(items) => format!("*[{}]", list(items)),
        Frame::Set(items) => format!("~[{}]", list(items)),
        Frame::Push(items) => format!(">[{}]", list(items)),
        Frame::Map(pairs) => {
            let mut entries: Vec<String> = pairs
                .iter()
                .map(|(key, value)| format!("{}={}", text(key), shape(value)))
                .collect();
            entries.sort();
            format!("%{{{}}}", entries.join(","))
        }
        Frame::Double(_) => ",".into(),
        Frame::Boolean(b) => format!("#{b}"),
        Frame::BigNumber(_) => "(".into(),
        Frame::Verbatim { format, .. } => format!("={}", String::from_utf8_lossy(format)),
        Frame::Attribute { value, .. } => format!("|{}", shape(value)),
    }
}

/// `argv` sent to both, and the `replies` frames each answers with.
async fn both(
    direct: &mut RawClient,
    through: &mut RawClient,
    argv: &[&str],
    replies: usize,
) -> Vec<(Frame, Frame)> {
    direct.send(argv).await;
    through.send(argv).await;
    let mut answers = Vec::with_capacity(replies);
    for _ in 0..replies {
        answers.push((direct.read().await, through.read().await));
    }
    if argv[0].eq_ignore_ascii_case("RESET") {
        // RESET logs the direct connection back in as `default`, which is off on testkit's
        // servers: log in as testkit's admin again.
        let password = tollgate_testkit::admin_password();
        let login = direct
            .call(&["AUTH", tollgate_testkit::ADMIN_USER, password])
            .await;
        assert_eq!(login, Frame::Simple("OK".into()), "testkit admin's AUTH");
    }
    answers
}

/// Every reply the daemon writes itself (HELLO, PING/ECHO, CLIENT …, SELECT, CONFIG GET, errors,
/// MULTI/EXEC with local replies spliced in, the whole-keyspace commands, subscriptions and their
/// messages, PUBSUB NUMSUB, RESET, MONITOR), and a few it forwards (COMMAND DOCS), has the RESP3
/// type structure Redis gives it, asked of Redis directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_replies_have_the_type_structure_redis_gives_them() {
    let redis = RedisServer::start();
    let policy = redis.dir().join("all.yaml");
    std::fs::write(&policy, ALLOW_ALL).expect("write the policy");
    let daemon = TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy]).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut through = RawClient::connect(&daemon.resp_socket()).await;
    let script: &[(&[&str], usize)] = &[
        (&["HELLO", "3"], 1),
        (&["PING"], 1),
        (&["PING", "hi"], 1),
        (&["ECHO", "hi"], 1),
        (&["ECHO"], 1),
        (&["NOSUCHCOMMAND", "a"], 1),
        (&["CLIENT", "GETNAME"], 1),
        (&["CLIENT", "SETNAME", "shape"], 1),
        (&["CLIENT", "SETNAME", "two words"], 1),
        (&["CLIENT", "GETNAME"], 1),
        (&["CLIENT", "ID"], 1),
        (&["CLIENT", "INFO"], 1),
        (&["CLIENT", "LIST"], 1),
        (&["CLIENT", "LIST", "TYPE", "normal"], 1),
        (&["CLIENT", "LIST", "TYPE", "nonsense"], 1),
        (&["CLIENT", "KILL", "ID", "987654321"], 1),
        (&["CLIENT", "KILL", "10.0.0.1:1"], 1),
        (&["CLIENT", "REPLY", "ON"], 1),
        (&["SELECT", "0"], 1),
        (&["CONFIG", "GET", "maxmemory"], 1),
        (&["CONFIG", "GET", "databases"], 1),
        (&["CONFIG", "GET", "no-such-parameter"], 1),
        (&["FLUSHDB"], 1),
        (&["RANDOMKEY"], 1),
        (&["DBSIZE"], 1),
        (&["KEYS", "*"], 1),
        (&["SCAN", "0"], 1),
        (&["SET", "k", "v"], 1),
        (&["RANDOMKEY"], 1),
        (&["KEYS", "*"], 1),
        (&["SCAN", "0", "COUNT", "10"], 1),
        (&["DBSIZE"], 1),
        (&["MULTI"], 1),
        (&["PING"], 1),
        (&["ECHO", "queued"], 1),
        (&["CLIENT", "ID"], 1),
        (&["CLIENT", "GETNAME"], 1),
        (&["CONFIG", "GET", "databases"], 1),
        (&["CLIENT", "INFO"], 1),
        (&["SELECT", "0"], 1),
        (&["GET", "k"], 1),
        (&["EXEC"], 1),
        (&["MULTI"], 1),
        (&["ECHO"], 1),
        (&["EXEC"], 1),
        (&["WATCH", "k"], 1),
        (&["SET", "k", "changed"], 1),
        (&["MULTI"], 1),
        (&["PING"], 1),
        (&["EXEC"], 1),
        (&["PUBLISH", "nobody", "x"], 1),
        (&["PUBSUB", "NUMSUB", "nobody", "nothing"], 1),
        (&["PUBSUB", "SHARDNUMSUB", "nobody"], 1),
        (&["PUBSUB", "NUMPAT"], 1),
        (&["COMMAND", "COUNT"], 1),
        (&["COMMAND", "DOCS", "get"], 1),
        (&["COMMAND", "INFO", "get"], 1),
        (&["UNSUBSCRIBE"], 1),
        (&["PUNSUBSCRIBE"], 1),
        (&["SUBSCRIBE", "a", "b"], 2),
        (&["PSUBSCRIBE", "p*"], 1),
        (&["SSUBSCRIBE", "s"], 1),
        (&["PING"], 1),
        (&["GET", "k"], 1),
        (&["UNSUBSCRIBE", "a"], 1),
        (&["UNSUBSCRIBE"], 1),
        (&["PUNSUBSCRIBE"], 1),
        (&["SUNSUBSCRIBE"], 1),
        (&["RESET"], 1),
        (&["CLIENT", "GETNAME"], 1),
        (&["HELLO", "3", "SETNAME", "again"], 1),
        (&["HELLO", "2"], 1),
        (&["HELLO", "3"], 1),
        (&["HELLO", "4"], 1),
        (&["HELLO"], 1),
    ];
    for (argv, replies) in script {
        for (expected, got) in both(&mut direct, &mut through, argv, *replies).await {
            assert_eq!(shape(&got), shape(&expected), "{argv:?}: daemon vs redis");
        }
    }

    // Messages, pushed to a RESP3 subscriber.
    let mut publisher = RawClient::to_redis(redis.socket()).await;
    for argv in [
        &["SUBSCRIBE", "m"][..],
        &["PSUBSCRIBE", "m*"],
        &["SSUBSCRIBE", "sm"],
    ] {
        both(&mut direct, &mut through, argv, 1).await;
    }
    // Each subscriber hears the message of its channel and of its pattern. Redis sends the channel's
    // first; through the daemon the two come from the shared subscriber connections their names
    // hash to, in either order (docs/lanes.md).
    publisher.call(&["PUBLISH", "m", "hi"]).await;
    let (mut expected, mut got) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        expected.push(shape(&direct.read().await));
        got.push(shape(&through.read().await));
    }
    expected.sort();
    got.sort();
    assert_eq!(got, expected, "a message and a pmessage");
    publisher.call(&["SPUBLISH", "sm", "hi"]).await;
    let (expected, got) = (direct.read().await, through.read().await);
    assert_eq!(shape(&got), shape(&expected), "a shard message");
    both(&mut direct, &mut through, &["RESET"], 1).await;

    // MONITOR: its confirmation and each line it streams.
    let (expected, got) = both(&mut direct, &mut through, &["MONITOR"], 1)
        .await
        .remove(0);
    assert_eq!(shape(&got), shape(&expected), "MONITOR");
    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    other.call(&["GET", "k"]).await;
    // A line's text is a timestamp and an address: only its type is Redis's.
    let (expected, got) = (direct.read().await, through.read().await);
    assert!(matches!(expected, Frame::Simple(_)), "{expected:?}");
    assert!(matches!(got, Frame::Simple(_)), "{got:?}");
    daemon.stop().await;
}

/// A client that does not track is answered about client-side caching as Redis answers it
/// (`client_tracking.rs`): GETREDIR, TRACKINGINFO, CACHING's error, TRACKING OFF and its checks.
/// Then TRACKING ON: the daemon's own tracking (`client_tracking.rs` in the integration tests).
#[tokio::test]
async fn client_side_caching_of_a_client_that_does_not_track_is_answered_as_redis_answers_it() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    same_replies(
        &redis,
        &daemon,
        &[
            &["CLIENT", "GETREDIR"],
            &["CLIENT", "TRACKINGINFO"],
            &["CLIENT", "CACHING", "yes"],
            &["CLIENT", "CACHING", "maybe"],
            &["CLIENT", "TRACKING", "off"],
            &["CLIENT", "TRACKING", "off", "REDIRECT", "987654"],
            &["CLIENT", "TRACKING", "off", "REDIRECT", "x"],
            &["CLIENT", "TRACKING", "maybe"],
            &["CLIENT", "TRACKING", "off", "NOSUCHOPTION"],
        ],
    )
    .await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let on = client.call(&["CLIENT", "TRACKING", "on"]).await;
    assert_eq!(on, simple("OK"));
    assert_eq!(
        client.call(&["CLIENT", "GETREDIR"]).await,
        Frame::Integer(0)
    );
    daemon.stop().await;
}
