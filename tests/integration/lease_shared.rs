//! Semaphores and read/write leases through the daemon (RESP and HTTP) against a real
//! `redis-server`: a semaphore of N permits under 4N contending clients never has more than N
//! holders, a killed holder's permit comes back when its TTL ends (at once for a SESSION), a request
//! for k permits is served in arrival order and not starved by smaller ones; readers and a writer
//! never hold at once, a waiting writer stops new readers and is served under a stream of
//! overlapping readers, and a crashed reader's lease ends by its own TTL; shapes that do not match
//! are refused with `shape_conflict`; INSPECT shows every holder.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::lease_http::lease_daemon;
use crate::lease_resp::{client, fields, integer, outcome};
use crate::support::raw::{text, RawClient};

/// `LEASE ACQUIRE <resource> <ttl> OWNER <owner> OP <owner>-op` and `extra` options.
async fn take(c: &mut RawClient, resource: &str, owner: &str, ttl: &str, extra: &[&str]) -> Frame {
    let op = format!("{owner}-op");
    let mut argv = vec!["LEASE", "ACQUIRE", resource, ttl, "OWNER", owner, "OP", &op];
    argv.extend_from_slice(extra);
    c.call(&argv).await
}

async fn give_back(c: &mut RawClient, resource: &str, owner: &str) -> String {
    let op = format!("{owner}-op");
    outcome(
        &c.call(&["LEASE", "RELEASE", resource, "OWNER", owner, "OP", &op])
            .await,
    )
}

/// The holders INSPECT shows: (fence, permits taken, mode, yours).
fn holders(inspect: &Frame) -> Vec<(i64, i64, String, bool)> {
    let Some(Frame::Array(holders)) = fields(inspect).get("holders").cloned() else {
        return Vec::new();
    };
    holders
        .iter()
        .map(|holder| {
            let yours = match fields(holder)["yours"] {
                Frame::Boolean(flag) => flag,
                Frame::Integer(n) => n == 1,
                ref other => panic!("yours is {other:?}"),
            };
            (
                integer(holder, "fence"),
                integer(holder, "count"),
                text(&fields(holder)["mode"]),
                yours,
            )
        })
        .collect()
}

/// Whether a reply arrives within `limit` (a waiting client's reply must not).
async fn answered_within(c: &mut RawClient, limit: Duration) -> bool {
    c.read_within(limit).await.is_ok()
}

/// Polls INSPECT until `done` holds for its reply (a bound for the test, not a latency assertion).
async fn until(c: &mut RawClient, resource: &str, done: impl Fn(&Frame) -> bool) -> Frame {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let inspect = c.call(&["LEASE", "INSPECT", resource]).await;
        if done(&inspect) {
            return inspect;
        }
        assert!(Instant::now() < deadline, "still {inspect:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// 12 clients on a semaphore of 3 permits, each taking and giving back a permit four times, while
/// a sampler reads INSPECT: neither the clients' own count of holders nor INSPECT ever passes 3,
/// every holder got a fence of its own, and the permits were all in use at some point.
#[tokio::test]
async fn lease_semaphore_of_n_never_has_more_than_n_holders_under_4n_clients() {
    const PERMITS: usize = 3;
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let in_use = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for n in 0..4 * PERMITS {
        let mut c = client(&daemon, if n % 2 == 0 { "2" } else { "3" }).await;
        let (in_use, most, fences) = (in_use.clone(), most.clone(), fences.clone());
        workers.push(tokio::spawn(async move {
            for round in 0..4 {
                let owner = format!("c{n}-r{round}");
                let held = take(
                    &mut c,
                    "orders:sem",
                    &owner,
                    "10000",
                    &["PERMITS", "3", "WAIT", "9000"],
                )
                .await;
                assert_eq!(outcome(&held), "acquired", "{held:?}");
                fences.lock().unwrap().push(integer(&held, "fence"));
                let now = in_use.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= PERMITS, "{now} holders of {PERMITS} permits");
                tokio::time::sleep(Duration::from_millis(15)).await;
                in_use.fetch_sub(1, Ordering::SeqCst);
                assert_eq!(give_back(&mut c, "orders:sem", &owner).await, "released");
            }
        }));
    }
    let sampler = {
        let mut c = client(&daemon, "3").await;
        let done = done.clone();
        tokio::spawn(async move {
            let mut samples = 0;
            while !done.load(Ordering::SeqCst) {
                let inspect = c.call(&["LEASE", "INSPECT", "orders:sem"]).await;
                let taken: i64 = holders(&inspect).iter().map(|h| h.1).sum();
                assert!(taken <= PERMITS as i64, "INSPECT shows {inspect:?}");
                samples += 1;
            }
            samples
        })
    };
    for worker in workers {
        worker.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    assert!(sampler.await.unwrap() > 0);
    assert_eq!(
        most.load(Ordering::SeqCst),
        PERMITS,
        "every permit was in use at once"
    );
    let mut fences = fences.lock().unwrap().clone();
    let handed = fences.len();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), handed, "every holder has its own fence");
    daemon.stop().await;
}

/// A holder that dies without releasing keeps its permit until its TTL, then the permit comes back
/// to a waiter; one whose lease was bound to its connection (SESSION) gives it back on hang-up.
#[tokio::test]
async fn lease_semaphore_returns_a_killed_holders_permit() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let sem = ["PERMITS", "2"];
    let mut killed = client(&daemon, "3").await;
    let first = take(&mut killed, "orders:kill", "doomed", "600", &sem).await;
    assert_eq!(outcome(&first), "acquired");
    drop(killed);
    let mut b = client(&daemon, "3").await;
    let second = take(&mut b, "orders:kill", "b", "30000", &sem).await;
    assert_eq!(outcome(&second), "acquired");

    let mut c = client(&daemon, "3").await;
    let full = take(&mut c, "orders:kill", "c", "30000", &sem).await;
    assert_eq!(
        outcome(&full),
        "contended",
        "the dead holder's permit still counts"
    );
    assert!(integer(&full, "retry_after_ms") <= 600);
    let waited = take(
        &mut c,
        "orders:kill",
        "c",
        "30000",
        &["PERMITS", "2", "WAIT", "9000"],
    )
    .await;
    assert_eq!(outcome(&waited), "acquired", "{waited:?}");
    assert!(integer(&waited, "fence") > integer(&second, "fence"));
    let inspect = c
        .call(&[
            "LEASE",
            "INSPECT",
            "orders:kill",
            "OWNER",
            "c",
            "OP",
            "c-op",
        ])
        .await;
    let seen: Vec<(i64, bool)> = holders(&inspect).iter().map(|h| (h.0, h.3)).collect();
    assert_eq!(
        seen,
        vec![
            (integer(&second, "fence"), false),
            (integer(&waited, "fence"), true)
        ],
        "the dead holder is gone"
    );
    assert_eq!(give_back(&mut c, "orders:kill", "c").await, "released");

    let mut session = client(&daemon, "3").await;
    let bound = take(
        &mut session,
        "orders:kill",
        "s",
        "30000",
        &["PERMITS", "2", "SESSION"],
    )
    .await;
    assert_eq!(outcome(&bound), "acquired");
    let mut waiter = client(&daemon, "3").await;
    waiter
        .send(&[
            "LEASE",
            "ACQUIRE",
            "orders:kill",
            "30000",
            "PERMITS",
            "2",
            "WAIT",
            "20000",
        ])
        .await;
    assert!(
        !answered_within(&mut waiter, Duration::from_millis(300)).await,
        "both permits held"
    );
    drop(session);
    let handed = waiter.read().await;
    assert_eq!(
        outcome(&handed),
        "acquired",
        "the session's permit came back on hang-up"
    );
    daemon.stop().await;
}

/// With 3 of 4 permits held, a request for 3 waits; a later request for 1 waits behind it although
/// a permit is free, and a try-once for 1 is refused. The 3 go to the first request as soon as
/// they are free, and the later request is served after it.
#[tokio::test]
async fn lease_semaphore_serves_a_k_permit_request_in_arrival_order() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let mut holders_conn = client(&daemon, "3").await;
    for owner in ["h1", "h2", "h3"] {
        let held = take(
            &mut holders_conn,
            "orders:fifo",
            owner,
            "30000",
            &["PERMITS", "4"],
        )
        .await;
        assert_eq!(outcome(&held), "acquired");
    }
    let mut big = client(&daemon, "3").await;
    big.send(&[
        "LEASE",
        "ACQUIRE",
        "orders:fifo",
        "30000",
        "PERMITS",
        "4",
        "COUNT",
        "3",
        "WAIT",
        "20000",
    ])
    .await;
    assert!(
        !answered_within(&mut big, Duration::from_millis(300)).await,
        "3 of 4 are held"
    );
    let mut small = client(&daemon, "2").await;
    small
        .send(&[
            "LEASE",
            "ACQUIRE",
            "orders:fifo",
            "30000",
            "PERMITS",
            "4",
            "WAIT",
            "20000",
        ])
        .await;
    assert!(
        !answered_within(&mut small, Duration::from_millis(300)).await,
        "a free permit does not let a later request pass the one waiting for 3"
    );
    let mut probe = client(&daemon, "3").await;
    let barging = take(&mut probe, "orders:fifo", "p", "30000", &["PERMITS", "4"]).await;
    assert_eq!(
        outcome(&barging),
        "contended",
        "nor does it let a try-once pass"
    );

    assert_eq!(
        give_back(&mut holders_conn, "orders:fifo", "h1").await,
        "released"
    );
    assert!(
        !answered_within(&mut big, Duration::from_millis(200)).await,
        "2 free, 3 wanted"
    );
    assert!(!answered_within(&mut small, Duration::from_millis(200)).await);
    assert_eq!(
        give_back(&mut holders_conn, "orders:fifo", "h2").await,
        "released"
    );
    let served = big.read().await;
    assert_eq!(outcome(&served), "acquired", "{served:?}");
    assert!(
        !answered_within(&mut small, Duration::from_millis(300)).await,
        "all 4 permits are held now"
    );
    assert_eq!(
        give_back(&mut holders_conn, "orders:fifo", "h3").await,
        "released"
    );
    let after = small.read().await;
    assert_eq!(outcome(&after), "acquired");
    assert!(integer(&after, "fence") > integer(&served, "fence"));
    let inspect = probe.call(&["LEASE", "INSPECT", "orders:fifo"]).await;
    let mut counts: Vec<i64> = holders(&inspect).iter().map(|h| h.1).collect();
    counts.sort_unstable();
    assert_eq!(counts, vec![1, 3]);
    daemon.stop().await;
}

/// A head of the line that hangs up while waiting leaves the head at once: the request behind it,
/// for a permit that is free, is served then, not when the head's wait would have ended (past the
/// 10 s a reply is awaited here).
#[tokio::test]
async fn lease_semaphore_line_moves_on_when_its_head_hangs_up() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let mut holder = client(&daemon, "3").await;
    let held = take(
        &mut holder,
        "orders:hangup",
        "h",
        "60000",
        &["PERMITS", "2"],
    )
    .await;
    assert_eq!(outcome(&held), "acquired");
    let mut head = client(&daemon, "3").await;
    head.send(&[
        "LEASE",
        "ACQUIRE",
        "orders:hangup",
        "60000",
        "PERMITS",
        "2",
        "COUNT",
        "2",
        "WAIT",
        "60000",
    ])
    .await;
    assert!(!answered_within(&mut head, Duration::from_millis(300)).await);
    let mut behind = client(&daemon, "3").await;
    behind
        .send(&[
            "LEASE",
            "ACQUIRE",
            "orders:hangup",
            "60000",
            "PERMITS",
            "2",
            "WAIT",
            "60000",
        ])
        .await;
    assert!(
        !answered_within(&mut behind, Duration::from_millis(300)).await,
        "behind the head although a permit is free"
    );
    drop(head);
    let served = behind.read().await;
    assert_eq!(outcome(&served), "acquired", "{served:?}");
    daemon.stop().await;
}

/// Four readers and two writers take and give back a read/write lease six times each: a writer
/// never holds with anyone, a reader never with a writer, and each writer's fence is above every
/// fence handed out before it.
#[tokio::test]
async fn lease_read_write_never_lets_a_writer_hold_with_anyone() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::<i64>::new()));
    let mut tasks = Vec::new();
    for n in 0..6 {
        let write = n >= 4;
        let mut c = client(&daemon, "3").await;
        let (readers, writers, fences) = (readers.clone(), writers.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            let mode = if write { "WRITE" } else { "READ" };
            for round in 0..6 {
                let owner = format!("{mode}-{n}-{round}");
                let held = take(
                    &mut c,
                    "orders:rw",
                    &owner,
                    "10000",
                    &["MODE", mode, "WAIT", "9000"],
                )
                .await;
                assert_eq!(outcome(&held), "acquired", "{held:?}");
                let fence = integer(&held, "fence");
                {
                    let mut fences = fences.lock().unwrap();
                    if write {
                        assert!(fences.iter().all(|earlier| *earlier < fence));
                    }
                    fences.push(fence);
                }
                if write {
                    assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "a writer with readers");
                } else {
                    readers.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(writers.load(Ordering::SeqCst), 0, "a reader with a writer");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                match write {
                    true => writers.fetch_sub(1, Ordering::SeqCst),
                    false => readers.fetch_sub(1, Ordering::SeqCst),
                };
                assert_eq!(give_back(&mut c, "orders:rw", &owner).await, "released");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(fences.lock().unwrap().len(), 36);
    daemon.stop().await;
}

/// A waiting writer stops new readers, even a try-once while only readers hold; and two readers
/// who keep the lease read-held without a gap do not starve it: it is served, and they after it.
#[tokio::test]
async fn lease_read_write_never_starves_a_waiting_writer() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let mut r1 = client(&daemon, "3").await;
    let read = take(&mut r1, "orders:pref", "r1", "30000", &["MODE", "READ"]).await;
    assert_eq!(outcome(&read), "acquired");
    let mut r2 = client(&daemon, "3").await;
    let shared = take(&mut r2, "orders:pref", "r2", "30000", &["MODE", "READ"]).await;
    assert_eq!(outcome(&shared), "acquired", "readers share");
    assert_eq!(give_back(&mut r2, "orders:pref", "r2").await, "released");
    let mut w = client(&daemon, "3").await;
    w.send(&[
        "LEASE",
        "ACQUIRE",
        "orders:pref",
        "30000",
        "MODE",
        "WRITE",
        "WAIT",
        "20000",
    ])
    .await;
    assert!(
        !answered_within(&mut w, Duration::from_millis(300)).await,
        "a reader holds"
    );
    let stopped = take(&mut r2, "orders:pref", "r3", "30000", &["MODE", "READ"]).await;
    assert_eq!(
        outcome(&stopped),
        "contended",
        "a waiting writer stops new readers"
    );
    assert_eq!(give_back(&mut r1, "orders:pref", "r1").await, "released");
    let written = w.read().await;
    assert_eq!(outcome(&written), "acquired");
    assert!(integer(&written, "fence") > integer(&shared, "fence"));
    let writer_op = text(&fields(&written)["operation_id"]);
    let writer_owner = text(&fields(&written)["owner"]);
    let released = w
        .call(&[
            "LEASE",
            "RELEASE",
            "orders:pref",
            "OWNER",
            &writer_owner,
            "OP",
            &writer_op,
        ])
        .await;
    assert_eq!(outcome(&released), "released");

    // Two readers overlapping without a gap: the lease is never free of readers.
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for n in 0..2 {
        let mut c = client(&daemon, "3").await;
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20 * n)).await;
            let mut round = 0;
            while !stop.load(Ordering::SeqCst) {
                let owner = format!("stream-{n}-{round}");
                let held = take(
                    &mut c,
                    "orders:pref",
                    &owner,
                    "10000",
                    &["MODE", "READ", "WAIT", "9000"],
                )
                .await;
                assert_eq!(outcome(&held), "acquired", "{held:?}");
                tokio::time::sleep(Duration::from_millis(40)).await;
                assert_eq!(give_back(&mut c, "orders:pref", &owner).await, "released");
                round += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let waited = take(
        &mut w,
        "orders:pref",
        "w2",
        "10000",
        &["MODE", "WRITE", "WAIT", "9000"],
    )
    .await;
    assert_eq!(outcome(&waited), "acquired", "{waited:?}");
    let inspect = r1.call(&["LEASE", "INSPECT", "orders:pref"]).await;
    let modes: Vec<String> = holders(&inspect).into_iter().map(|h| h.2).collect();
    assert_eq!(modes, vec!["write".to_owned()], "the writer holds alone");
    assert_eq!(give_back(&mut w, "orders:pref", "w2").await, "released");
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        reader.await.unwrap();
    }
    daemon.stop().await;
}

/// A reader that crashed without releasing is gone after its own TTL even while another reader's
/// lease is renewed (SESSION); the writer waiting behind both gets the lease when that one hangs up.
#[tokio::test]
async fn lease_read_write_ends_each_readers_lease_on_its_own() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let mut crashed = client(&daemon, "3").await;
    let first = take(
        &mut crashed,
        "orders:rexp",
        "gone",
        "400",
        &["MODE", "READ"],
    )
    .await;
    assert_eq!(outcome(&first), "acquired");
    drop(crashed);
    let mut live = client(&daemon, "3").await;
    let kept = take(
        &mut live,
        "orders:rexp",
        "kept",
        "300",
        &["MODE", "READ", "SESSION"],
    )
    .await;
    assert_eq!(outcome(&kept), "acquired");
    let mut observer = client(&daemon, "2").await;
    let one_left = until(&mut observer, "orders:rexp", |inspect| {
        holders(inspect).len() == 1
    })
    .await;
    assert_eq!(
        holders(&one_left)[0].0,
        integer(&kept, "fence"),
        "the crashed reader's lease ended, the renewed one's did not"
    );
    let renew = observer
        .call(&[
            "LEASE",
            "RENEW",
            "orders:rexp",
            "400",
            "OWNER",
            "gone",
            "OP",
            "gone-op",
        ])
        .await;
    assert_eq!(text(&fields(&renew)["reason"]), "absent");
    // Past several of its TTLs, the session reader still holds.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let inspect = observer.call(&["LEASE", "INSPECT", "orders:rexp"]).await;
    assert_eq!(holders(&inspect).len(), 1, "{inspect:?}");
    let mut writer = client(&daemon, "3").await;
    writer
        .send(&[
            "LEASE",
            "ACQUIRE",
            "orders:rexp",
            "5000",
            "MODE",
            "WRITE",
            "WAIT",
            "20000",
        ])
        .await;
    assert!(!answered_within(&mut writer, Duration::from_millis(300)).await);
    drop(live);
    let written = writer.read().await;
    assert_eq!(outcome(&written), "acquired");
    assert!(integer(&written, "fence") > integer(&kept, "fence"));
    daemon.stop().await;
}

/// The first holder fixes the shape: another size, another shape or an exclusive request is refused
/// with `shape_conflict`, naming what the resource is held as, in RESP2 and RESP3 and over HTTP
/// (409). INSPECT lists every holder; renew and release act on one holder only.
#[tokio::test]
async fn lease_shapes_conflict_and_inspect_lists_every_holder() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    for protocol in ["2", "3"] {
        let r = format!("orders:shape{protocol}");
        let r = r.as_str();
        let mut c = client(&daemon, protocol).await;
        let a = take(&mut c, r, "a", "30000", &["PERMITS", "3", "COUNT", "2"]).await;
        assert_eq!(outcome(&a), "acquired");
        let b = take(&mut c, r, "b", "30000", &["PERMITS", "3"]).await;
        assert_eq!(outcome(&b), "acquired");
        assert!(integer(&b, "fence") > integer(&a, "fence"));
        let replay = take(&mut c, r, "b", "30000", &["PERMITS", "3"]).await;
        assert_eq!(
            (outcome(&replay), integer(&replay, "fence")),
            ("replayed".to_owned(), integer(&b, "fence"))
        );
        let resized = take(&mut c, r, "c", "30000", &["PERMITS", "4"]).await;
        assert_eq!(outcome(&resized), "shape_conflict");
        assert_eq!(text(&fields(&resized)["held_as"]), "semaphore");
        assert_eq!(integer(&resized, "permits"), 3);
        for other in [&["MODE", "READ"][..], &[]] {
            let refused = take(&mut c, r, "c", "30000", other).await;
            assert_eq!(outcome(&refused), "shape_conflict", "{other:?}");
            assert_eq!(text(&fields(&refused)["held_as"]), "semaphore");
        }
        let inspect = c
            .call(&["LEASE", "INSPECT", r, "OWNER", "a", "OP", "a-op"])
            .await;
        assert_eq!(outcome(&inspect), "held_shared");
        assert_eq!(integer(&inspect, "permits"), 3);
        let seen: Vec<(i64, String, bool)> = holders(&inspect)
            .into_iter()
            .map(|(_, count, mode, yours)| (count, mode, yours))
            .collect();
        assert_eq!(
            seen,
            vec![
                (2, "permit".to_owned(), true),
                (1, "permit".to_owned(), false)
            ]
        );
        let renewed = c
            .call(&["LEASE", "RENEW", r, "60000", "OWNER", "a", "OP", "a-op"])
            .await;
        assert_eq!(outcome(&renewed), "renewed");
        assert!(integer(&renewed, "valid_for_ms") > 30_000);
        let stranger = c
            .call(&["LEASE", "RENEW", r, "60000", "OWNER", "z", "OP", "z-op"])
            .await;
        assert_eq!(outcome(&stranger), "lost");
        assert_eq!(give_back(&mut c, r, "a").await, "released");
        assert_eq!(give_back(&mut c, r, "a").await, "already_absent");
        assert_eq!(give_back(&mut c, r, "b").await, "released");
        let free = c.call(&["LEASE", "INSPECT", r]).await;
        assert_eq!(outcome(&free), "free", "nothing of the semaphore is left");
        // Once free, the next first holder fixes a new shape.
        let writer = take(&mut c, r, "w", "30000", &["MODE", "WRITE"]).await;
        assert_eq!(outcome(&writer), "acquired");
        assert!(integer(&writer, "fence") > integer(&b, "fence"));
        let as_semaphore = take(&mut c, r, "s", "30000", &["PERMITS", "3"]).await;
        assert_eq!(text(&fields(&as_semaphore)["held_as"]), "read_write");
    }
    let mut c = client(&daemon, "3").await;
    let exclusive = take(&mut c, "orders:excl", "x", "30000", &[]).await;
    assert_eq!(outcome(&exclusive), "acquired");
    let refused = take(&mut c, "orders:excl", "y", "30000", &["MODE", "READ"]).await;
    assert_eq!(
        (outcome(&refused), text(&fields(&refused)["held_as"])),
        ("shape_conflict".to_owned(), "exclusive".to_owned())
    );
    let invalid = c
        .call(&[
            "LEASE",
            "ACQUIRE",
            "orders:bad",
            "1000",
            "PERMITS",
            "2",
            "COUNT",
            "3",
        ])
        .await;
    assert!(text(&invalid).contains("count"), "{invalid:?}");

    let body = |owner: &str, extra: serde_json::Value| {
        let mut body = json!({"attempt": {"owner": owner, "operation_id": "op"}, "ttl_ms": 30000});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body.to_string()
    };
    let path = "/v1/leases/orders:http-sem/acquire";
    let first = daemon.post(path, &body("h1", json!({"permits": 2}))).await;
    assert_eq!(
        (first.status, first.json()["outcome"].clone()),
        (200, json!("acquired"))
    );
    let second = daemon
        .post(path, &body("h2", json!({"permits": 2, "count": 1})))
        .await;
    assert_eq!(second.json()["outcome"], "acquired", "{}", second.body);
    let full = daemon.post(path, &body("h3", json!({"permits": 2}))).await;
    assert_eq!(
        (full.status, full.json()["outcome"].clone()),
        (409, json!("contended"))
    );
    let reader = daemon
        .post(path, &body("h3", json!({"mode": "read"})))
        .await;
    assert_eq!(reader.status, 409);
    assert_eq!(
        reader.json(),
        json!({"outcome": "shape_conflict", "held_as": "semaphore", "permits": 2})
    );
    let inspect = daemon
        .post("/v1/leases/orders:http-sem/inspect", "{}")
        .await
        .json();
    assert_eq!(inspect["outcome"], "held_shared");
    assert_eq!(
        inspect["holders"].as_array().map(Vec::len),
        Some(2),
        "{inspect}"
    );
    daemon.stop().await;
}
