//! Redis that stops answering, and Redis that dies: every lane's commands get a typed error within
//! their deadline (never a hang), a connection held up by one command does not hold up other
//! clients, and the fault suite: a write load across a `SIGSTOP`/`SIGCONT` of an external Redis
//! (no acknowledged write lost) and across a `kill -9` of the embedded one (service back within
//! seconds), with its figures printed (BENCHMARKS.md, "Fault test").

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::{tempdir, TestDaemon};
use crate::support::raw::{text, RawClient};

/// The deadline the tests configure (`resp.command_timeout`).
const DEADLINE: Duration = Duration::from_secs(1);
/// How long a test waits for a reply or a recovery before it calls it a hang (a bound, not a claim).
const PATIENCE: Duration = Duration::from_secs(30);

/// One command for each lane: REGULAR, SCRIPT, BLOCKING, TRANSACTION, ADMIN.
const POLICY: &str = r#"
principals:
  local: { any: true }
rules:
  - id: fault-tests
    commands: [GET, SET, EXISTS, EVAL, BLPOP, MULTI, EXEC, DISCARD, INFO, "@connection"]
    allow: the fault tests
"#;

fn policy_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("faults.yaml");
    std::fs::write(&path, POLICY).expect("write the test policy");
    path
}

async fn daemon_for(redis: &RedisServer) -> TestDaemon {
    let policy = policy_file(redis.dir());
    TestDaemon::start_with(redis, |config| {
        config.policy.files = vec![policy];
        config.resp.command_timeout = DEADLINE;
    })
    .await
}

/// `SIGSTOP`s a process for as long as it lives: `SIGCONT` on drop, also when the test fails.
struct Stopped(Pid);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        let pid = Pid::from_raw(pid as i32);
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP redis-server");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

/// The error code of a reply the daemon writes for a failure it names (`IOERR`, `UNAVAILABLE`,
/// `BUSY`), or `None` for any other reply.
fn typed_error(reply: &Frame) -> Option<String> {
    let Frame::Error(error) = reply else {
        return None;
    };
    let error = String::from_utf8_lossy(error);
    let (code, rest) = error.split_once(' ')?;
    let typed = ["IOERR", "UNAVAILABLE", "BUSY"].contains(&code) && rest.starts_with("tollgate: ");
    typed.then(|| code.to_owned())
}

/// Each lane's command, as a client sends it. BLPOP's own timeout (plus the 2 s grace) is its
/// deadline, not the command timeout.
fn lane_commands() -> [(&'static str, Vec<&'static str>); 5] {
    [
        ("REGULAR", vec!["GET", "k"]),
        ("SCRIPT", vec!["EVAL", "return 1", "0"]),
        ("BLOCKING", vec!["BLPOP", "q", "1"]),
        ("TRANSACTION", vec!["MULTI"]),
        ("ADMIN", vec!["INFO", "server"]),
    ]
}

/// The deadline each lane's command is given, as its `IOERR` names it.
fn deadline_of(lane: &str) -> Duration {
    match lane {
        "BLOCKING" => Duration::from_secs(3),
        _ => DEADLINE,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_gives_every_lane_a_typed_error_within_its_deadline_and_service_resumes() {
    let redis = RedisServer::start();
    let daemon = daemon_for(&redis).await;
    let mut clients = Vec::new();
    for (lane, argv) in lane_commands() {
        let mut client = RawClient::connect(&daemon.resp_socket()).await;
        // Each lane has a connection open before Redis stops.
        let reply = client.call(&argv).await;
        assert!(typed_error(&reply).is_none(), "{lane} {argv:?}: {reply:?}");
        if lane == "TRANSACTION" {
            assert_eq!(text(&client.call(&["DISCARD"]).await), "OK");
        }
        clients.push((lane, argv, client));
    }

    let stopped = Stopped::new(redis.pid().expect("redis-server runs"));
    let mut waiting = Vec::new();
    for (lane, argv, mut client) in clients {
        waiting.push(tokio::spawn(async move {
            let sent = Instant::now();
            client.send(&argv).await;
            let reply = client.read_within(PATIENCE).await;
            (lane, argv, client, reply, sent.elapsed())
        }));
    }
    let mut clients = Vec::new();
    for waiting in waiting {
        let (lane, argv, client, reply, took) = waiting.await.expect("the client task");
        let reply = reply
            .unwrap_or_else(|()| panic!("{lane}: no reply while redis is stopped"))
            .unwrap_or_else(|| panic!("{lane}: the connection closed"));
        println!("{lane}: {reply:?} after {took:?}");
        let code = typed_error(&reply).unwrap_or_else(|| panic!("{lane}: {reply:?}"));
        // The connection was written to before Redis stopped: the lane waited the deadline.
        assert_eq!(code, "IOERR", "{lane}: {reply:?}");
        let named = format!("no reply within {:?}", deadline_of(lane));
        assert!(text(&reply).contains(&named), "{lane}: {reply:?}");
        assert!(text(&reply).contains("command may have run"), "{lane}");
        clients.push((lane, argv, client));
    }
    // A client's session goes on meanwhile: its PING (which asks Redis) gets a typed error too,
    // within the deadline, rather than PONG from a Redis that does not answer.
    let (_, _, first) = &mut clients[0];
    let ping = first.call(&["PING"]).await;
    assert!(typed_error(&ping).is_some(), "PING while stopped: {ping:?}");

    drop(stopped);
    for (lane, argv, mut client) in clients {
        let until = Instant::now() + PATIENCE;
        loop {
            let reply = client.call(&argv).await;
            if typed_error(&reply).is_none() {
                break;
            }
            assert!(Instant::now() < until, "{lane} never recovered: {reply:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if lane == "TRANSACTION" {
            assert_eq!(text(&client.call(&["DISCARD"]).await), "OK");
        }
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_clients_reads_are_answered_while_a_paused_write_holds_its_connection() {
    let redis = RedisServer::start();
    let policy = policy_file(redis.dir());
    // The default command timeout (10 s): longer than the pause, so the write waits it out.
    let daemon = TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy]).await;
    let mut writer = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&writer.call(&["SET", "k", "before"]).await), "OK");

    assert!(redis.inline("CLIENT PAUSE 5000 WRITE").starts_with("+OK"));
    // The write is held in Redis, and with it its multiplexed connection.
    writer.send(&["SET", "k", "during"]).await;
    // Longer than the lane lets a connection owe its oldest reply before it sends work elsewhere.
    tokio::time::sleep(Duration::from_secs(1)).await;

    for reader in 0..4 {
        let mut client = RawClient::connect(&daemon.resp_socket()).await;
        let reply = client.call(&["GET", "k"]).await;
        assert_eq!(text(&reply), "before", "reader {reader}");
        // Answered while the write is still held: not queued behind it.
        assert!(
            writer.read_within(Duration::ZERO).await.is_err(),
            "reader {reader} was answered only after the paused write"
        );
    }
    let reply = writer.read_within(PATIENCE).await;
    assert!(
        matches!(&reply, Ok(Some(frame)) if text(frame) == "OK"),
        "the paused write: {reply:?}"
    );
    daemon.stop().await;
}

/// What a write load saw.
#[derive(Default)]
struct Load {
    /// Keys whose SET was answered `+OK`.
    acknowledged: Vec<String>,
    /// Replies other than `+OK`, by their first word.
    errors: BTreeMap<String, usize>,
    /// Errors that are none of the daemon's typed ones.
    untyped: Vec<String>,
    /// The longest any one SET waited for its reply.
    longest: Duration,
    /// The longest an error took.
    longest_error: Duration,
    /// The distinct texts of the typed errors.
    causes: std::collections::BTreeSet<String>,
}

/// Whether a typed error of a stopped Redis names the bound that ended its wait: the command
/// deadline (`IOERR`) or the connection attempt (`UNAVAILABLE`, also during the pause between
/// attempts that follows a failed one).
fn bounded(cause: &str) -> bool {
    let deadline = format!("no reply within {DEADLINE:?}");
    cause.contains(&deadline) || cause.contains("no answer within")
}

/// `clients` clients, each SETting keys of its own, one at a time, until `stop`. A client whose
/// connection the daemon closes reconnects.
async fn write_load(
    socket: std::path::PathBuf,
    clients: usize,
    prefix: &'static str,
    stop: Arc<AtomicBool>,
) -> Load {
    let load = Arc::new(Mutex::new(Load::default()));
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (socket, stop, load) = (socket.clone(), stop.clone(), load.clone());
        tasks.push(tokio::spawn(async move {
            let mut connection = RawClient::connect(&socket).await;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("{prefix}:{client}:{n}");
                n += 1;
                let sent = Instant::now();
                connection.send(&["SET", &key, "v"]).await;
                let reply = connection.read_within(PATIENCE).await;
                let took = sent.elapsed();
                let failed = {
                    let mut load = load.lock().unwrap();
                    load.longest = load.longest.max(took);
                    match reply {
                        Err(()) => panic!("SET {key}: no reply within {PATIENCE:?}"),
                        Ok(None) => panic!("SET {key}: the daemon closed the connection"),
                        Ok(Some(Frame::Simple(ok))) if &ok[..] == b"OK" => {
                            load.acknowledged.push(key);
                            false
                        }
                        Ok(Some(reply)) => {
                            load.longest_error = load.longest_error.max(took);
                            match typed_error(&reply) {
                                Some(code) => {
                                    *load.errors.entry(code).or_default() += 1;
                                    // Durations in backoff texts vary; the cause is what counts.
                                    let cause = text(&reply);
                                    let cause =
                                        cause.split(" (next attempt in").next().unwrap_or_default();
                                    load.causes.insert(cause.to_owned());
                                }
                                None => load.untyped.push(format!("{reply:?}")),
                            }
                            true
                        }
                    }
                };
                if failed {
                    // As a client backs off after an error.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a load client");
    }
    Arc::try_unwrap(load)
        .ok()
        .expect("every client is done")
        .into_inner()
        .unwrap()
}

/// How many of `keys` Redis holds, asked directly.
async fn present(redis_url: &str, keys: &[String]) -> usize {
    let client = redis::Client::open(redis_url).expect("a redis URL");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis directly");
    let mut found = 0;
    for chunk in keys.chunks(1000) {
        let count: usize = redis::cmd("EXISTS")
            .arg(chunk)
            .query_async(&mut connection)
            .await
            .expect("EXISTS");
        found += count;
    }
    found
}

fn report(title: &str, load: &Load, extra: &str) {
    println!(
        "fault test, {title}: errors by kind {:?}, untyped {}, longest stall {:?} (longest error {:?}), {extra}",
        load.errors,
        load.untyped.len(),
        load.longest,
        load.longest_error,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_load_across_a_stopped_redis_gets_typed_errors_and_loses_no_acknowledged_write() {
    const CLIENTS: usize = 8;
    let redis = RedisServer::start();
    let daemon = daemon_for(&redis).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(write_load(
        daemon.resp_socket(),
        CLIENTS,
        "pause",
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped = Stopped::new(redis.pid().expect("redis-server runs"));
    tokio::time::sleep(Duration::from_secs(4)).await;
    drop(stopped);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let load = load.await.expect("the load");

    let present = present(&redis.url(), &load.acknowledged).await;
    report(
        "SIGSTOP 4 s",
        &load,
        &format!("acknowledged {} present {present}", load.acknowledged.len()),
    );
    assert!(load.untyped.is_empty(), "{:?}", load.untyped);
    // Stopped for four deadlines: SETs failed (rather than waiting out the pause), each as
    // the deadline or the connection attempt that bounded it says.
    assert!(
        load.errors.get("IOERR").is_some_and(|&n| n > 0),
        "{:?}",
        load.errors
    );
    assert!(
        load.causes.iter().all(|cause| bounded(cause)),
        "{:?}",
        load.causes
    );
    assert_eq!(present, load.acknowledged.len(), "acknowledged writes lost");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_load_across_a_killed_embedded_redis_gets_typed_errors_and_recovers() {
    const CLIENTS: usize = 8;
    let dir = tempdir();
    let mut config = TestDaemon::config(dir.path());
    config.policy.files = vec![policy_file(dir.path())];
    config.resp.command_timeout = DEADLINE;
    let daemon = TestDaemon::start_config(dir, config).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(write_load(
        daemon.resp_socket(),
        CLIENTS,
        "kill",
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;

    let old = daemon.embedded_pid().expect("embedded redis-server runs");
    kill(Pid::from_raw(old as i32), Signal::SIGKILL).expect("kill -9 redis-server");
    let killed = Instant::now();
    // Recovered: a SET from a fresh client is acknowledged.
    let mut probe = RawClient::connect(&daemon.resp_socket()).await;
    let recovered = loop {
        let reply = probe.call(&["SET", "probe", "v"]).await;
        if text(&reply) == "OK" {
            break killed.elapsed();
        }
        assert!(typed_error(&reply).is_some(), "{reply:?}");
        assert!(killed.elapsed() < PATIENCE, "never recovered: {reply:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let load = load.await.expect("the load");
    report(
        "kill -9 of the embedded redis",
        &load,
        &format!(
            "acknowledged {}, serving again {recovered:?} after the kill",
            load.acknowledged.len()
        ),
    );
    assert!(load.untyped.is_empty(), "{:?}", load.untyped);
    daemon.stop().await;
}

/// A Redis that answers others `BUSY` once a script has run `busy_ms`, and a daemon whose policy
/// lets everyone run `commands` (and scripts on any key), without a script time limit.
async fn scripts_daemon(busy_ms: &str, commands: &str) -> (RedisServer, TestDaemon) {
    let redis = RedisServer::builder()
        .arg("--busy-reply-threshold")
        .arg(busy_ms)
        .start();
    let policy = redis.dir().join("scripts.yaml");
    let rules = format!(
        "principals:\n  local: {{ any: true }}\nrules:\n  - id: scripts\n    commands: [{commands}, \"@connection\"]\n    scripts: unconstrained\n    allow: the runaway script test\n"
    );
    std::fs::write(&policy, rules).expect("write the test policy");
    // Redis's own busy behaviour is under test here: the daemon's script time limit is off.
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.policy.files = vec![policy];
        config.resp.script_time_limit = Duration::ZERO;
    })
    .await;
    (redis, daemon)
}

/// A script that never ends holds its SCRIPT connection; with Redis answering others `BUSY` past
/// its busy threshold, another client's script gets that `BUSY`, and `SCRIPT KILL` reaches Redis on
/// another connection and stops it (issue 16), rather than waiting behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_script_can_be_killed_and_other_scripts_get_redis_busy_meanwhile() {
    let (_redis, daemon) = scripts_daemon("200", "EVAL, SCRIPT KILL").await;
    let mut runaway = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        runaway.call(&["EVAL", "return 1", "0"]).await,
        Frame::Integer(1)
    );
    runaway.send(&["EVAL", "while true do end", "0"]).await;
    // Past the busy threshold, and past the time after which the lane sends work elsewhere.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    let until = Instant::now() + PATIENCE;
    let busy = loop {
        let reply = other.call(&["EVAL", "return 2", "0"]).await;
        // The replacement connection may still be opening (its handshake waits for Redis too).
        if !text(&reply).starts_with("UNAVAILABLE") {
            break reply;
        }
        assert!(Instant::now() < until, "{reply:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_redis_busy(&busy);
    let mut killer = RawClient::connect(&daemon.resp_socket()).await;
    kill_the_runaway(&mut killer, &mut runaway).await;
    assert_eq!(
        runaway.call(&["EVAL", "return 3", "0"]).await,
        Frame::Integer(3)
    );
    daemon.stop().await;
}

/// Redis's own answer to a script sent while another one runs past its busy threshold.
fn assert_redis_busy(reply: &Frame) {
    assert!(
        matches!(reply, Frame::Error(e) if e.starts_with(b"BUSY Redis is busy running a script")),
        "{reply:?}"
    );
}

/// `SCRIPT KILL` through the daemon is answered OK, and the runaway script's client then gets
/// Redis's "killed by user" on a connection that stays open.
async fn kill_the_runaway(killer: &mut RawClient, runaway: &mut RawClient) {
    assert_eq!(text(&killer.call(&["SCRIPT", "KILL"]).await), "OK");
    let killed = runaway
        .read_within(PATIENCE)
        .await
        .expect("the runaway script's reply")
        .expect("its connection stays open");
    assert!(text(&killed).contains("killed by user"), "{killed:?}");
}

/// Whether Redis (asked directly) is held up by a script: a PING it does not answer at once.
async fn redis_held_up(redis: &RedisServer) -> bool {
    // Logged in without waiting for the answer: a held-up Redis answers neither.
    let mut direct = RawClient::connect(redis.socket()).await;
    let password = tollgate_testkit::admin_password();
    direct
        .send(&["AUTH", tollgate_testkit::ADMIN_USER, password])
        .await;
    direct
        .read_within(Duration::from_millis(300))
        .await
        .is_err()
}

/// A kill has a SCRIPT connection of its own, open before it is needed (issue 16): sent in a
/// runaway script's first moments, before Redis reads anything (its busy threshold is longer than
/// a connection's handshake may take), `SCRIPT KILL` through the daemon succeeds on the first try
/// (and `FUNCTION STATS` and `FUNCTION KILL` for a runaway function);
/// and past the threshold another client's script gets Redis's `BUSY` rather than hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_kill_succeeds_on_the_first_try_in_a_runaway_scripts_first_moments() {
    let (redis, daemon) = scripts_daemon("1500", "EVAL, FCALL, SCRIPT KILL, FUNCTION").await;
    let mut runaway = RawClient::connect(&daemon.resp_socket()).await;
    let mut killer = RawClient::connect(&daemon.resp_socket()).await;
    let library =
        "#!lua name=spin\nredis.register_function('spin', function() while true do end end)";
    assert_eq!(
        text(&killer.call(&["FUNCTION", "LOAD", "REPLACE", library]).await),
        "spin"
    );
    for (run, kill) in [
        (&["EVAL", "while true do end", "0"][..], "SCRIPT"),
        (&["FCALL", "spin", "0"][..], "FUNCTION"),
    ] {
        runaway.send(run).await;
        let until = Instant::now() + PATIENCE;
        while !redis_held_up(&redis).await {
            assert!(Instant::now() < until, "{run:?} never started");
        }
        // Still inside the busy threshold: Redis reads nothing yet.
        if kill == "FUNCTION" {
            // What to kill, asked on the same path: Redis answers it while busy too.
            let stats = killer.call(&["FUNCTION", "STATS"]).await;
            let Frame::Array(stats) = &stats else {
                panic!("FUNCTION STATS: {stats:?}");
            };
            assert_eq!(text(&stats[0]), "running_script");
            assert!(matches!(&stats[1], Frame::Array(running) if !running.is_empty()));
        }
        assert_eq!(
            text(&killer.call(&[kill, "KILL"]).await),
            "OK",
            "{kill} KILL"
        );
        let killed = runaway
            .read_within(PATIENCE)
            .await
            .expect("the runaway script's reply")
            .expect("its connection stays open");
        assert!(text(&killed).contains("killed by user"), "{killed:?}");
    }

    // Past the threshold, another client's script is answered BUSY, then the kill works at once.
    runaway.send(&["EVAL", "while true do end", "0"]).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let until = Instant::now() + PATIENCE;
    loop {
        let reply = direct.call(&["PING"]).await;
        if text(&reply).starts_with("BUSY") {
            break;
        }
        assert!(
            Instant::now() < until,
            "redis never answered BUSY: {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    let busy = tokio::time::timeout(PATIENCE, other.call(&["EVAL", "return 1", "0"]))
        .await
        .expect("another script is answered, not held");
    assert_redis_busy(&busy);
    kill_the_runaway(&mut killer, &mut runaway).await;
    assert_eq!(
        other.call(&["EVAL", "return 1", "0"]).await,
        Frame::Integer(1)
    );
    daemon.stop().await;
}

/// Connection pools health-check with PING: it says PONG only while Redis answers.
#[tokio::test]
async fn ping_fails_while_redis_is_stopped_and_answers_again_after() {
    let redis = RedisServer::start();
    let daemon = daemon_for(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["PING"]).await), "PONG");
    let stopped = Stopped::new(redis.pid().expect("a running redis-server"));
    let reply = tokio::time::timeout(PATIENCE, client.call(&["PING"]))
        .await
        .expect("PING answers within the deadline, not never");
    assert!(
        typed_error(&reply).is_some(),
        "PING while stopped: {reply:?}"
    );
    drop(stopped);
    let again = tokio::time::timeout(PATIENCE, async {
        loop {
            let mut client = RawClient::connect(&daemon.resp_socket()).await;
            if text(&client.call(&["PING", "back"]).await) == "back" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(again.is_ok(), "PING answers again once Redis does");
}
