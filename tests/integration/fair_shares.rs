//! Pooled resources are shared by who is asking — a principal *and* one OS user of it — not by the
//! principal alone: under the default policy every local user is the principal `local`, so a
//! per-principal share let one user take what every other user needs (issue 28). Each test fills
//! one user's share of a pool, as root in-process, and shows a second real OS user (`setpriv`, see
//! `identity`) still served, under the default policy.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use tollgate::config::ByteSize;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::budgets::{unfinished_frames, until_still, MIB};
use crate::identity::{daemon_for_all, os_user, redis_cli, USER_B};
use crate::lease_resp::{integer, outcome};
use crate::support::raw::{text, RawClient};

/// uid 2002's attack, scaled down: one user runs as many `SESSION` leases (each a watchdog) as its
/// share allows; another user of the same principal still gets one, over RESP and HTTP.
#[tokio::test]
async fn one_users_session_leases_leave_another_user_of_the_principal_its_watchdogs() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |config| {
        config.leases.max_watchdogs_per_uid = 2;
    })
    .await;

    let mut attacker = RawClient::connect(&daemon.resp_socket()).await;
    for resource in ["jobs:a1", "jobs:a2"] {
        let taken = attacker
            .call(&["LEASE", "ACQUIRE", resource, "10000", "SESSION"])
            .await;
        assert_eq!(outcome(&taken), "acquired", "{taken:?}");
    }
    let refused: Frame = attacker
        .call(&["LEASE", "ACQUIRE", "jobs:a3", "10000", "SESSION"])
        .await;
    assert_eq!(outcome(&refused), "too_many_watchdogs", "{refused:?}");
    assert_eq!(integer(&refused, "limit"), 2);

    // The attacker still holds both: the other user's SESSION lease and watchdog are its own.
    let theirs = redis_cli(
        &b,
        &daemon,
        &["LEASE", "ACQUIRE", "jobs:b1", "10000", "SESSION"],
    )
    .await;
    assert!(theirs.contains("acquired"), "{theirs}");
    let body =
        r#"{"attempt": {"owner": "b", "operation_id": "op-1"}, "ttl_ms": 10000, "watchdog": true}"#;
    let over_http =
        crate::identity::curl(&b, &daemon, "POST", "/v1/leases/jobs:b2/acquire", body).await;
    assert_eq!(over_http.status, 200, "{:?}", over_http.body);
    assert_eq!(over_http.body["outcome"], "acquired");
    drop(attacker);
    daemon.stop().await;
}

/// uid 2002 holds the BLOCKING lane's whole per-principal share (24 of 32 connections) in
/// `BLPOP … 0`; uid 2001's `BLPOP v 1` is still run, and answered nil when its second is up,
/// instead of `BUSY … holds its whole share` after the acquire timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_blocking_commands_leave_another_user_of_the_principal_its_share() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |_| {}).await;

    const SHARE: usize = 24;
    let mut blockers = Vec::new();
    for _ in 0..SHARE {
        let mut blocker = RawClient::connect(&daemon.resp_socket()).await;
        blocker.send(&["BLPOP", "jobs", "0"]).await;
        blockers.push(blocker);
    }
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let blocked = crate::front_door::redis_clients(&redis)
            .iter()
            .filter(|client| client.contains(" flags=b"))
            .count();
        if blocked >= SHARE {
            break;
        }
        assert!(Instant::now() < until, "{blocked} of {SHARE} blocked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let answered = redis_cli(&b, &daemon, &["BLPOP", "v", "1"]).await;
    assert!(
        !answered.contains("BUSY") && !answered.contains("saturated"),
        "another user of the principal was refused: {answered}"
    );
    // Nil: redis-cli prints an empty line for it when its output is not a terminal.
    assert_eq!(answered.trim(), "", "{answered}");

    // The attacker's own next blocking command is still bounded by its share.
    let mut over = RawClient::connect(&daemon.resp_socket()).await;
    let refused = over.call(&["BLPOP", "jobs", "1"]).await;
    assert!(
        refused.is_error() && format!("{refused:?}").contains("whole share"),
        "{refused:?}"
    );
    drop(blockers);
    daemon.stop().await;
}

/// The HTTP/RESP holder watches (each buffering up to 64 messages and 64 events for a reader that
/// never reads) are bounded per user: one user past `leases.max_watches_per_uid` is refused, and
/// another user of the same principal still watches.
#[tokio::test]
async fn one_users_holder_watches_leave_another_user_of_the_principal_its_own() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |config| {
        config.leases.max_watches_per_uid = 2;
    })
    .await;

    let mut attacker = RawClient::connect(&daemon.resp_socket()).await;
    for resource in ["jobs:w1", "jobs:w2"] {
        let confirmed = attacker.call(&["LEASE", "WATCH", resource]).await;
        assert!(!confirmed.is_error(), "{confirmed:?}");
    }
    // A third watch on another connection of the same user is refused, naming the setting.
    let mut more = RawClient::connect(&daemon.resp_socket()).await;
    let refused = more.call(&["LEASE", "WATCH", "jobs:w3"]).await;
    assert!(
        refused.is_error() && format!("{refused:?}").contains("max_watches_per_uid"),
        "{refused:?}"
    );
    // Over HTTP too.
    let over_http = daemon.get("/v1/leases/jobs:w3/holders").await;
    assert_eq!(over_http.status, 429, "{}", over_http.body);

    // The other user's watch starts.
    other_user_watches(&b, &daemon).await;
    drop((attacker, more));
    daemon.stop().await;
}

/// The HTTP holders streams the issue left uncounted (500 never-read streams from one user took
/// the daemon from 53 to 348 MB): each watch now holds the most it may buffer for a reader that
/// never reads in its user's byte share, from the moment it starts until it ends. One user past
/// its share is refused another, over HTTP (429) and RESP (`BUSY`), naming the share; another user
/// still watches; and a stream that ends gives its room back.
#[tokio::test]
async fn one_users_holder_streams_count_in_its_byte_share_and_leave_another_user_its_own() {
    use tollgate_lease_client::LeaseClient;
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let watch_bytes = tollgate_lease::watch::MOST_BUFFERED;
    let daemon = daemon_for_all(&redis, |config| {
        config.resp.budgets.total = ByteSize::mib(64);
        // Room for three watches and a little more, not four.
        config.resp.budgets.per_uid = Some(ByteSize(3 * watch_bytes + watch_bytes / 2));
    })
    .await;
    let http = LeaseClient::new(&daemon.http_socket());
    let resource = |n: usize| tollgate_lease::Resource::parse(&format!("jobs:s{n}")).unwrap();
    let mut streams = Vec::new();
    for n in 0..3 {
        streams.push(http.holders(&resource(n)).await.expect("within the share"));
    }
    let refused = match http.holders(&resource(3)).await {
        Ok(_) => panic!("a fourth stream fit in a share of three"),
        Err(error) => error.to_string(),
    };
    assert!(
        refused.contains("429") && refused.contains("over resp.budgets.per_uid"),
        "{refused}"
    );
    let mut resp = RawClient::connect(&daemon.resp_socket()).await;
    let busy = resp.call(&["LEASE", "WATCH", "jobs:r"]).await;
    assert!(
        busy.is_error() && text(&busy).contains("over resp.budgets.per_uid"),
        "{busy:?}"
    );

    // Another user of the same principal watches in its own share.
    other_user_watches(&b, &daemon).await;

    // One stream ends: once the daemon sees its connection close, the room is back.
    drop(streams.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match http.holders(&resource(3)).await {
            Ok(stream) => {
                streams.push(stream);
                break;
            }
            Err(error) => assert!(
                Instant::now() < deadline,
                "a closed stream's room never came back: {error}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(streams);
    daemon.stop().await;
}

/// Subscriptions are a pooled resource too (each a forwarding task and buffers on the PUBSUB
/// lane), and `resp.max_subscriptions` bounded only one client: one user's many clients could hold
/// any number. Now a user's clients together stop at `resp.max_subscriptions_per_uid`, the
/// refusal says so and makes none of the names, another user of the same principal still
/// subscribes, and a client that goes gives its subscriptions back.
#[tokio::test]
async fn one_users_subscriptions_leave_another_user_of_the_principal_its_own() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |config| {
        config.resp.max_subscriptions = 3;
        config.resp.max_subscriptions_per_uid = 4;
    })
    .await;
    let mut first = RawClient::connect(&daemon.resp_socket()).await;
    first.send(&["SUBSCRIBE", "a1", "a2", "a3"]).await;
    for _ in 0..3 {
        let confirmed = first.read().await;
        assert!(!confirmed.is_error(), "{confirmed:?}");
    }
    let mut second = RawClient::connect(&daemon.resp_socket()).await;
    let refused = second.call(&["SUBSCRIBE", "b1", "b2"]).await;
    assert_eq!(
        text(&refused),
        "ERR tollgate: 2 more subscriptions would take this user's clients past \
         resp.max_subscriptions_per_uid (4); none were made"
    );
    // Within the share: one more.
    let one = second.call(&["SUBSCRIBE", "b1"]).await;
    assert!(!one.is_error(), "{one:?}");

    // The other user's client subscribes to three in its own share.
    let socket = daemon.resp_socket();
    let socket = socket.to_str().expect("a UTF-8 socket path");
    let output = crate::identity::run_as(
        &b,
        "timeout",
        &[
            "2",
            "redis-cli",
            "-s",
            socket,
            "SUBSCRIBE",
            "c1",
            "c2",
            "c3",
        ],
    )
    .await;
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        printed.contains("c3") && !printed.contains("max_subscriptions"),
        "{printed}"
    );

    // The first client goes: its three come back to its user.
    drop(first);
    let mut third = RawClient::connect(&daemon.resp_socket()).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        third.send(&["SUBSCRIBE", "d1", "d2", "d3"]).await;
        let reply = third.read().await;
        if !reply.is_error() {
            for _ in 0..2 {
                assert!(!third.read().await.is_error());
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a closed client's subscriptions were never given back: {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop((second, third));
    daemon.stop().await;
}

/// A multiplexed lane refuses every command past its `in_flight + queue_length` at once, whoever
/// sends it: one user's pipelining clients could fill REGULAR and have another user's `GET`
/// refused `lane REGULAR saturated`. Each user now has a share of the lane's commands (a quarter
/// unless set); past it the user's clients are paused, not refused, and another user of the same
/// principal is answered every time. Scaled down: a lane of 16, four clients pipelining 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_pipelines_leave_another_user_of_the_principal_room_on_the_lane() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |config| {
        config.lanes.regular.in_flight = Some(4);
        config.lanes.regular.queue_length = Some(12);
    })
    .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut attackers = Vec::new();
    for _ in 0..4 {
        let mut client = RawClient::connect(&daemon.resp_socket()).await;
        let (stop, refused) = (stop.clone(), refused.clone());
        attackers.push(tokio::spawn(async move {
            let gets: Vec<[&str; 2]> = (0..200).map(|_| ["GET", "attack"]).collect();
            let argvs: Vec<&[&str]> = gets.iter().map(|argv| argv.as_slice()).collect();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                client.pipeline(&argvs).await;
                for _ in 0..200 {
                    if client.read().await.is_error() {
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let theirs = redis_cli_within(&b, &daemon, "redis-cli -s SOCKET -r 300 GET victim").await;
    // Meanwhile the attacker's commands outstanding, as /v1/principals shows them: never past
    // its share (8, half of 16) plus one per session.
    let mut most = 0;
    for _ in 0..20 {
        let principals = daemon.get("/v1/principals").await.json();
        let root = principals["principals"]
            .as_array()
            .expect("a list")
            .iter()
            .find(|row| row["uid"] == 0)
            .cloned()
            .expect("root's row");
        most = most.max(root["in_flight"].as_u64().expect("a count"));
    }
    assert!((1..=8 + 4).contains(&most), "in flight at most {most}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for attacker in attackers {
        attacker.await.expect("the attacker's client");
    }
    let answers: Vec<&str> = theirs.lines().collect();
    assert_eq!(answers.len(), 300, "{theirs}");
    assert!(
        answers.iter().all(|line| line.is_empty()),
        "the other user's GETs were refused: {:?}",
        answers.iter().find(|line| !line.is_empty())
    );
    // The attacker was paused, not refused.
    assert_eq!(refused.load(std::sync::atomic::Ordering::Relaxed), 0);
    daemon.stop().await;
}

/// uid 2002's byte-total attack, scaled down: sixteen connections of one user each start a 30 MiB
/// `SET` and never finish it. Before shares, they were read until all clients together held
/// `resp.budgets.total`; then another user's 100 KiB `GET` was refused (its client disconnected)
/// and its 1 MiB `SET` waited for room. Now the attacker is read only up to its share (a quarter
/// of the total), and the other user of the same principal is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_unfinished_uploads_leave_another_user_of_the_principal_the_total() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |config| {
        config.resp.budgets.total = ByteSize::mib(96);
    })
    .await;
    let value = "v".repeat(100 * 1024);
    let mut root = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        text(&root.call(&["SET", "shared:100k", &value]).await),
        "OK"
    );

    let (holders, written) = unfinished_frames(&daemon.resp_socket(), 30);
    let accepted = until_still(&written).await;
    println!(
        "the attacker's 16 unfinished 30 MiB frames: {:.1} MiB read",
        accepted as f64 / MIB as f64
    );
    assert!(accepted < 16 * 30 * MIB, "the attacker was never paused");

    let started = Instant::now();
    let read = redis_cli_within(&b, &daemon, "redis-cli -s SOCKET STRLEN shared:100k").await;
    let got = redis_cli_within(&b, &daemon, "redis-cli -s SOCKET GET shared:100k").await;
    assert_eq!(read.trim(), "102400", "{read}");
    assert_eq!(
        got.trim().len(),
        value.len(),
        "{}",
        &got[..got.len().min(200)]
    );
    let set = redis_cli_within(
        &b,
        &daemon,
        "head -c 1048576 /dev/zero | tr '\\0' v | redis-cli -s SOCKET -x SET victim:1m",
    )
    .await;
    assert_eq!(set.trim(), "OK", "{set}");
    println!(
        "the other user's 100 KiB GET and 1 MiB SET served in {:?} while the attacker held its share",
        started.elapsed()
    );
    let stored = root.call(&["STRLEN", "victim:1m"]).await;
    assert_eq!(stored, Frame::Integer(MIB as i64));
    for holder in holders {
        holder.abort();
    }
    daemon.stop().await;
}

/// `user`'s `LEASE WATCH jobs:b` starts, refused by nothing: redis-cli prints the confirmation
/// and waits for changes until `timeout` ends it (3 s).
async fn other_user_watches(
    user: &crate::identity::OsUser,
    daemon: &crate::support::daemon::TestDaemon,
) {
    let socket = daemon.resp_socket();
    let socket = socket.to_str().expect("a UTF-8 socket path");
    let output = crate::identity::run_as(
        user,
        "timeout",
        &["3", "redis-cli", "-s", socket, "LEASE", "WATCH", "jobs:b"],
    )
    .await;
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        printed.contains("watch") && !printed.contains("BUSY"),
        "{printed}"
    );
}

/// A shell command line run as `user`, with `SOCKET` replaced by the daemon's RESP socket, given
/// 10 s (a client left waiting for room prints nothing and is killed): what it printed.
async fn redis_cli_within(
    user: &crate::identity::OsUser,
    daemon: &crate::support::daemon::TestDaemon,
    line: &str,
) -> String {
    let socket = daemon.resp_socket();
    let line = line.replace("SOCKET", socket.to_str().expect("a UTF-8 socket path"));
    let output = crate::identity::run_as(user, "timeout", &["10", "sh", "-c", &line]).await;
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The spinning-module attack: one user's 16 connections each pipeline 640 commands that the
/// repository's hostile guard spins on (each run of 64 costs the guard's whole budget). Before
/// admission time was shared per user, every session of the attacker took the daemon's one worker
/// in turn, and another client's `GET` waited behind all of them (p50 269 ms in the issue's run);
/// now the attacker past its share waits before it admits more, and the other client's GETs are
/// all answered while the attacker's pipelines are still being decided.
#[tokio::test]
async fn one_users_spinning_admissions_leave_another_user_the_worker() {
    // Five times as many GETs as the attack has runs of 64 (16 × 10): waiting about one run each,
    // as each did before (7.5 s for 400 in a debug build, the attack over in 7 s), they outlast
    // the attack; now 400 took 0.66 s, the attack slowed to 15 s.
    const GETS: usize = 800;
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |config| {
        config.policy.modules = vec![crate::policy_guard_cost::spinning_guard()];
    })
    .await;
    let mut victim = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&victim.call(&["SET", "fine", "v"]).await), "OK");

    // The attacker: another OS user, 16 connections (`redis-cli --pipe`, which sends its input
    // whole and reads every reply, errors included), each 640 spinning commands.
    let dir = crate::support::daemon::tempdir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let commands = dir.path().join("spin.resp");
    std::fs::write(
        &commands,
        "*2\r\n$3\r\nGET\r\n$7\r\nhostile\r\n".repeat(640),
    )
    .unwrap();
    let line = format!(
        "for i in $(seq 16); do redis-cli -s {} --pipe < {} & done; wait",
        daemon.resp_socket().display(),
        commands.display()
    );
    let attacker =
        tokio::spawn(async move { crate::identity::run_as(&b, "sh", &["-c", &line]).await });
    // Until the attacker's sessions are spinning.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!attacker.is_finished(), "the attack ended before the GETs");

    let started = Instant::now();
    for _ in 0..GETS {
        assert_eq!(
            victim.call(&["GET", "fine"]).await,
            Frame::Bulk(bytes::Bytes::from_static(b"v"))
        );
    }
    let served = started.elapsed();
    let attacker_still_spinning = !attacker.is_finished();
    let output = attacker.await.expect("the attacker's processes");
    let printed = String::from_utf8_lossy(&output.stdout);
    let refused = printed.matches("errors: 640, replies: 640").count();
    println!("{GETS} GETs of another user served in {served:?} during the attack");
    assert!(
        attacker_still_spinning,
        "the other user's {GETS} GETs were answered only after the attacker's pipelines"
    );
    assert_eq!(refused, 16, "every spinning command refused: {printed}");
    // The attacker's waits are counted in /metrics (over every user).
    let metrics = daemon.get("/metrics").await.body;
    let deferrals = metrics
        .lines()
        .find_map(|line| line.strip_prefix("tollgate_admission_deferrals_total "))
        .and_then(|count| count.trim().parse::<u64>().ok())
        .expect("the deferral counter in /metrics");
    assert!(deferrals > 0, "{metrics}");
    daemon.stop().await;
}

/// `GET /v1/principals` shows administrators what each user of each principal holds now (here
/// root, with RESP sessions and a holder watch, and a second OS user of the default policy, with a
/// RESP session), and refuses everyone else.
#[tokio::test]
async fn principals_shows_each_users_shares_to_administrators_only() {
    let Some(b) = os_user(USER_B) else { return };
    let redis = RedisServer::start();
    let daemon = daemon_for_all(&redis, |_| {}).await;
    let mut root = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&root.call(&["SET", "k", "v"]).await), "OK");
    let mut watching = RawClient::connect(&daemon.resp_socket()).await;
    assert!(!watching
        .call(&["LEASE", "WATCH", "jobs:root"])
        .await
        .is_error());

    // The other user: one RESP session, subscribed (so that redis-cli stays) for a few seconds.
    let socket = daemon.resp_socket();
    let socket = socket.to_str().expect("a UTF-8 socket path").to_owned();
    let client = {
        let b = crate::identity::os_user(USER_B).expect("the same user");
        tokio::spawn(async move {
            crate::identity::run_as(
                &b,
                "timeout",
                &["5", "redis-cli", "-s", &socket, "SUBSCRIBE", "news"],
            )
            .await
        })
    };
    let until = Instant::now() + Duration::from_secs(5);
    let rows = loop {
        let reply = daemon.get("/v1/principals").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let body: serde_json::Value = serde_json::from_str(&reply.body).expect("JSON");
        let rows = body["principals"].as_array().expect("a list").clone();
        let theirs = rows.iter().find(|row| row["uid"] == b.uid);
        if theirs.is_some_and(|row| row["resp_sessions"] == 1) {
            break rows;
        }
        if Instant::now() > until {
            let output = client.await.expect("the other user's client");
            panic!("the other user never showed: {rows:?}; its client: {output:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mine = rows.iter().find(|row| row["uid"] == 0).expect("root's row");
    assert_eq!(mine["resp_sessions"], 2, "{mine}");
    assert_eq!(mine["watches"], 1, "{mine}");
    assert!(
        mine["admission_ms"].as_f64().expect("a number") > 0.0,
        "{mine}"
    );
    let row = rows
        .iter()
        .find(|row| row["uid"] == b.uid)
        .expect("their row");
    assert_eq!(row["principal"], "local", "{row}");
    assert_eq!(row["watches"], 0, "{row}");
    assert_eq!(row["watchdogs"], 0, "{row}");

    // /metrics: the same per principal, both users summed, and no label per uid.
    let metrics = daemon.get("/metrics").await.body;
    let gauge = |name: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with(&format!("tollgate_{name}{{principal=\"local\"}} ")))
            .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} for local in\n{metrics}"))
    };
    assert_eq!(gauge("principal_resp_sessions"), 3.0);
    assert_eq!(gauge("principal_watches"), 1.0);
    assert!(gauge("principal_admission_seconds") > 0.0);
    assert!(
        !metrics
            .lines()
            .any(|line| line.starts_with("tollgate_principal") && line.contains("uid")),
        "{metrics}"
    );

    let refused = crate::identity::curl(&b, &daemon, "GET", "/v1/principals", "").await;
    assert_eq!(refused.status, 403, "{:?}", refused.body);
    client.abort();
    drop((root, watching));
    daemon.stop().await;
}
