//! Clients are served database 0 only (`SELECT` of another is refused): no command's database
//! argument may name another — `MOVE`, `COPY … DB`, `MIGRATE`'s destination db, `SWAPDB` — and no
//! script may call them against another database, where the daemon keeps its leases and no client
//! could see or delete what it put there. Under the default policy and one that allows everything.

use redis::AsyncCommands;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

const ALLOW_EVERYTHING: &str = r#"
principals:
  everyone: { any: true }
rules:
  - id: everything
    commands: ["*"]
    allow: every command
"#;

/// The lease database, as Redis's `default` user sees it.
async fn database(redis: &RedisServer, db: u8) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url_in(db.into()))
        .expect("redis-rs client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis")
}

async fn no_database_but_zero(redis: &RedisServer, daemon: TestDaemon) {
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["SET", "k", "v"]).await), "OK");
    // Refused before any connection is tried: the port needs no server behind it.
    let port = "6379";

    let at_admission: Vec<Vec<&str>> = vec![
        vec!["MOVE", "k", "1"],
        vec!["MOVE", "k", "15"],
        vec!["COPY", "k", "k2", "DB", "1", "REPLACE"],
        vec!["COPY", "k", "k2", "REPLACE", "db", "1"],
        vec!["COPY", "k", "k2", "DB", "0", "DB", "1"],
        vec!["SWAPDB", "0", "1"],
        vec!["MIGRATE", "127.0.0.1", port, "k", "1", "1000", "COPY"],
        vec!["MIGRATE", "127.0.0.1", port, "", "1", "1000", "KEYS", "k"],
    ];
    for attack in &at_admission {
        let reply = client.call(attack).await;
        let message = text(&reply);
        let expected = match attack[0] {
            // Refused by name with the reserved keyspace (or first by the default policy's rule).
            "SWAPDB" => message.starts_with("NOPERM tollgate: rule "),
            name => {
                let db = if attack.contains(&"15") { "15" } else { "1" };
                message.starts_with("ERR DB index is out of range: tollgate serves database 0 only")
                    && message.ends_with(&format!("{name} names database {db}"))
            }
        };
        assert!(
            matches!(reply, Frame::Error(_)) && expected,
            "{attack:?} was answered {message}"
        );
    }
    // In a transaction too: refused while queueing, so EXEC aborts.
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    let queued = client.call(&["COPY", "k", "k2", "DB", "1"]).await;
    assert!(
        text(&queued).starts_with("ERR DB index is out of range: tollgate serves database 0 only"),
        "{queued:?}"
    );
    let exec = client.call(&["EXEC"]).await;
    assert!(text(&exec).starts_with("EXECABORT"), "{exec:?}");

    // Database 0 itself is no other database: COPY within it works.
    assert_eq!(
        client.call(&["COPY", "k", "k0", "DB", "0"]).await,
        Frame::Integer(1)
    );

    // From scripts, which no admission sees: Redis refuses the lane user the commands.
    let scripts: Vec<Vec<&str>> = vec![
        vec!["EVAL", "return redis.call('MOVE', KEYS[1], '1')", "1", "k"],
        vec![
            "EVAL",
            "return redis.call('COPY', KEYS[1], KEYS[2], 'DB', '1', 'REPLACE')",
            "2",
            "k",
            "k2",
        ],
        vec!["EVAL", "return redis.call('SWAPDB', '0', '1')", "0"],
        vec![
            "EVAL",
            "redis.call('SELECT', '1') return redis.call('SET', KEYS[1], 'x')",
            "1",
            "k3",
        ],
        vec![
            "EVAL",
            "return redis.call('MIGRATE', '127.0.0.1', ARGV[1], KEYS[1], '1', '1000', 'COPY')",
            "1",
            "k",
            port,
        ],
    ];
    for script in &scripts {
        let reply = client.call(script).await;
        assert!(
            text(&reply).contains("The user executing the script can't run this command"),
            "{script:?} was answered {reply:?}"
        );
    }
    // Inside MULTI a script runs on the TRANSACTION lane's user: refused there too.
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    client
        .call(&[
            "EVAL",
            "return redis.call('COPY', KEYS[1], KEYS[2], 'DB', '1')",
            "2",
            "k",
            "k4",
        ])
        .await;
    let exec = client.call(&["EXEC"]).await;
    let Frame::Array(results) = &exec else {
        panic!("EXEC answered {exec:?}");
    };
    assert!(
        text(&results[0]).contains("The user executing the script can't run this command"),
        "{exec:?}"
    );

    // Nothing reached database 1; the key is where it was.
    let mut lease_database = database(redis, 1).await;
    for key in ["k", "k2", "k3", "k4"] {
        let there: bool = lease_database.exists(key).await.unwrap();
        assert!(!there, "{key} reached database 1");
    }
    assert_eq!(client.call(&["GET", "k"]).await, Frame::Bulk("v".into()));
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_arguments_name_database_zero_only_under_the_default_policy() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    no_database_but_zero(&redis, daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_arguments_name_database_zero_only_under_a_policy_allowing_all() {
    let redis = RedisServer::start();
    let policy = redis.dir().join("everything.yaml");
    std::fs::write(&policy, ALLOW_EVERYTHING).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy]).await;
    no_database_but_zero(&redis, daemon).await;
}

/// Where Redis would refuse a database argument itself (not an integer, past a C `int`), the
/// daemon's refusal is in Redis's words; a database Redis has and the daemon does not serve is
/// "out of range", as for a Redis whose `databases` is 1 (what the daemon's `CONFIG GET` says).
/// Redis's own test suite matches these texts (`keyspace`: COPY to a non-integer DB; `other`:
/// SELECT an out of range DB).
#[tokio::test]
async fn database_arguments_redis_refuses_are_answered_in_redis_words() {
    let redis = RedisServer::start();
    let policy = redis.dir().join("everything.yaml");
    std::fs::write(&policy, ALLOW_EVERYTHING).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy]).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let mut through = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&through.call(&["SET", "k", "v"]).await), "OK");
    assert_eq!(text(&direct.call(&["SET", "k", "v"]).await), "OK");
    for argv in [
        &["SELECT", "notanumber"][..],
        &["SELECT", "01"],
        &["SELECT", "3000000000"],
        &["MOVE", "k", "x"],
        &["MOVE", "k", "3000000000"],
        &["COPY", "k", "k2", "DB", "notanumber"],
        &["COPY", "k", "k2", "DB", "-0", "REPLACE"],
        &["COPY", "k", "k2", "DB", "3000000000"],
    ] {
        let expected = direct.call(argv).await;
        assert!(
            matches!(expected, Frame::Error(_)),
            "{argv:?}: {expected:?}"
        );
        assert_eq!(through.call(argv).await, expected, "{argv:?}");
    }
    for argv in [
        &["SELECT", "1000000"][..],
        &["SELECT", "1"],
        &["MOVE", "k", "-1"],
        &["COPY", "k", "k2", "DB", "1"],
    ] {
        let reply = through.call(argv).await;
        assert!(
            matches!(&reply, Frame::Error(_))
                && text(&reply)
                    .starts_with("ERR DB index is out of range: tollgate serves database 0 only"),
            "{argv:?}: {reply:?}"
        );
    }
    assert_eq!(
        direct.call(&["SELECT", "1000000"]).await,
        Frame::Error("ERR DB index is out of range".into())
    );
    assert_eq!(through.call(&["EXISTS", "k2"]).await, Frame::Integer(0));
    daemon.stop().await;
}
