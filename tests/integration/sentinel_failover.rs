//! Failovers of a three-sentinel set under pipelined write load through the daemon (issue 34): a
//! `SENTINEL FAILOVER` led by a sentinel that is not the first the daemon knows, then a `kill -9` of
//! the promoted master. What a client was told was written is checked against what the final
//! master holds, and lease fences (acquired with `REPLICAS 1`) must rise strictly throughout.
//!
//! Redis replicates asynchronously, so a write a master acknowledged after its replica stopped
//! replicating from it is lost; that window is Sentinel's, and the daemon keeps it to the time it
//! takes to hear of the promotion. The test prints what was lost and over how long (BENCHMARKS.md
//! records the figures) and asserts what must hold whatever the timing: the writes lost in each
//! failover form one run (the daemon never goes back to a master it left, which would lose a second
//! run), writes resume on the new master, and no acknowledged lease is handed out twice.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_lanes::RedisConfig;
use tollgate_resp::Frame;
use tollgate_testkit::{loopback_port, RedisServer};

use crate::lanes_sentinel::{wait_until, Sentinel};
use crate::lease_resp::{integer, outcome};
use crate::support::daemon::TestDaemon;
use crate::support::raw::RawClient;

/// Commands per pipelined batch of the writer.
const DEPTH: usize = 50;

/// One `RPUSH` the writer sent, and whether (and when) the daemon acknowledged it.
struct Sent {
    index: u64,
    acked_at: Option<Instant>,
    /// When its reply (an acknowledgement or an error) came.
    replied_at: Instant,
}

/// A run of consecutive acknowledged writes missing from the final master.
#[derive(Debug)]
struct LostRun {
    first: Instant,
    last: Instant,
    writes: usize,
}

fn start_node(replica_of: Option<u16>) -> (RedisServer, u16) {
    let port = loopback_port();
    let mut builder = RedisServer::builder()
        .arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1");
    if let Some(master) = replica_of {
        builder = builder
            .arg("--replicaof")
            .arg("127.0.0.1")
            .arg(master.to_string());
    }
    (builder.start(), port)
}

/// Pipelines `RPUSH log <index>` in batches until `stop`, recording each reply.
async fn write_until(socket: std::path::PathBuf, stop: Arc<AtomicBool>) -> Vec<Sent> {
    let mut client = RawClient::connect(&socket).await;
    let mut sent = Vec::new();
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let indices: Vec<String> = (next..next + DEPTH as u64).map(|i| i.to_string()).collect();
        let commands: Vec<[&str; 3]> = indices.iter().map(|i| ["RPUSH", "log", i]).collect();
        let argvs: Vec<&[&str]> = commands.iter().map(|c| &c[..]).collect();
        client.pipeline(&argvs).await;
        for offset in 0..DEPTH as u64 {
            let reply = client.read().await;
            let replied_at = Instant::now();
            let acked_at = matches!(reply, Frame::Integer(_)).then_some(replied_at);
            sent.push(Sent {
                index: next + offset,
                acked_at,
                replied_at,
            });
        }
        next += DEPTH as u64;
        // A breath between batches keeps the test from taking both cores of a CI machine (and the
        // writer from spinning on errors while no master is up); still tens of thousands a second.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    sent
}

/// Acquires and releases one lease with `REPLICAS 1` until `stop`; the fences of acquisitions.
async fn lease_until(socket: std::path::PathBuf, stop: Arc<AtomicBool>) -> Vec<i64> {
    let mut client = RawClient::connect(&socket).await;
    let mut fences = Vec::new();
    let mut op = 0u64;
    while !stop.load(Ordering::Relaxed) {
        op += 1;
        let op_id = format!("op-{op}");
        let acquired = client
            .call(&[
                "LEASE",
                "ACQUIRE",
                "failover:lease",
                "2000",
                "OWNER",
                "writer",
                "OP",
                &op_id,
                "REPLICAS",
                "1",
            ])
            .await;
        if matches!(acquired, Frame::Array(_) | Frame::Map(_)) && outcome(&acquired) == "acquired" {
            fences.push(integer(&acquired, "fence"));
            client
                .call(&[
                    "LEASE",
                    "RELEASE",
                    "failover:lease",
                    "OWNER",
                    "writer",
                    "OP",
                    &op_id,
                ])
                .await;
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    fences
}

/// The runs of acknowledged writes that `held` lacks, in the order they were sent.
fn lost_runs(sent: &[Sent], held: &HashSet<u64>) -> Vec<LostRun> {
    let mut runs: Vec<LostRun> = Vec::new();
    let mut in_run = false;
    for write in sent {
        let Some(at) = write.acked_at else { continue };
        if held.contains(&write.index) {
            in_run = false;
            continue;
        }
        match runs.last_mut() {
            Some(run) if in_run => {
                run.last = at;
                run.writes += 1;
            }
            _ => runs.push(LostRun {
                first: at,
                last: at,
                writes: 1,
            }),
        }
        in_run = true;
    }
    runs
}

/// Subscribes to `channel` on the sentinel at `port` and returns when its first message came.
fn first_message(port: u16, channel: &'static str) -> std::thread::JoinHandle<Option<Instant>> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to sentinel");
    stream
        .write_all(format!("SUBSCRIBE {channel}\r\n").as_bytes())
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        let message = format!("$7\r\nmessage\r\n${}\r\n{channel}", channel.len());
        loop {
            let n = stream.read(&mut buffer).ok().filter(|n| *n > 0)?;
            seen.extend_from_slice(&buffer[..n]);
            if String::from_utf8_lossy(&seen).contains(&message) {
                return Some(Instant::now());
            }
        }
    })
}

/// Whether `server` says it is `role`; not yet when the answer is cut off (Sentinel kills the
/// normal clients of an instance it reconfigures, ours among them).
fn role_is(server: &RedisServer, role: &str) -> bool {
    server
        .try_inline("ROLE")
        .is_ok_and(|reply| reply.contains(role))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_writes_stop_reaching_the_old_master_when_the_promotion_begins_and_fences_keep_rising(
) {
    let (mut master, master_port) = start_node(None);
    let (mut replica, _) = start_node(Some(master_port));
    assert!(wait_until(Duration::from_secs(10), || replica
        .inline("INFO replication")
        .contains("master_link_status:up")));
    let sentinels: Vec<Sentinel> = (0..3)
        .map(|_| Sentinel::start_with_quorum(master_port, 2, None))
        .collect();
    // Each must know the other two (to elect a leader after the kill) and the replica.
    assert!(
        wait_until(Duration::from_secs(20), || sentinels.iter().all(|s| {
            s.ask("SENTINEL MASTER mymaster").is_some_and(|r| {
                r.contains("num-other-sentinels\r\n$1\r\n2\r\n")
                    && r.contains("num-slaves\r\n$1\r\n1\r\n")
            })
        })),
        "the sentinels never learnt of each other and the replica"
    );
    let daemon = TestDaemon::start_redis(
        RedisConfig::sentinel(
            "mymaster",
            sentinels.iter().map(Sentinel::endpoint).collect(),
        ),
        &[&master, &replica],
    )
    .await;
    let socket = daemon.resp_socket();
    let mut probe = RawClient::connect(&socket).await;
    assert_eq!(probe.call(&["DEL", "log"]).await, Frame::Integer(0));

    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write_until(socket.clone(), stop.clone()));
    let leases = tokio::spawn(lease_until(socket.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A failover led by the last sentinel: the daemon hears of it from whichever it watches.
    let promotion = first_message(sentinels[2].port(), "+failover-state-wait-promotion");
    let asked_at = Instant::now();
    assert_eq!(
        sentinels[2].ask("SENTINEL FAILOVER mymaster").as_deref(),
        Some("+OK\r\n")
    );
    assert!(
        wait_until(Duration::from_secs(30), || role_is(&replica, "master")
            && role_is(&master, "slave")
            && master
                .try_inline("INFO replication")
                .is_ok_and(|info| info.contains("master_link_status:up"))),
        "the first failover never completed"
    );
    let promoting_at = promotion
        .join()
        .unwrap()
        .expect("the leader announced no +failover-state-wait-promotion");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The promoted master dies as a crash would; the sentinels elect one to promote the old one.
    let killed_at = Instant::now();
    replica.kill();
    assert!(
        wait_until(Duration::from_secs(30), || role_is(&master, "master")),
        "the second failover never completed"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let sent = writer.await.unwrap();
    let fences = leases.await.unwrap();

    let held: HashSet<u64> = match probe.call(&["LRANGE", "log", "0", "-1"]).await {
        Frame::Array(items) => items
            .iter()
            .map(|item| crate::support::raw::text(item).parse().unwrap())
            .collect(),
        other => panic!("LRANGE: {other:?}"),
    };
    let acked: Vec<&Sent> = sent.iter().filter(|s| s.acked_at.is_some()).collect();
    let runs = lost_runs(&sent, &held);
    eprintln!(
        "sent {} acknowledged {} refused {} lost {}",
        sent.len(),
        acked.len(),
        sent.len() - acked.len(),
        runs.iter().map(|r| r.writes).sum::<usize>()
    );
    let refused_in = |from: Instant, to: Instant| {
        sent.iter()
            .filter(|s| s.acked_at.is_none() && s.replied_at >= from && s.replied_at < to)
            .count()
    };
    eprintln!(
        "promotion began {:?} after the failover was asked",
        promoting_at - asked_at
    );
    eprintln!(
        "refused during the first failover {}, after the kill {}",
        refused_in(asked_at, killed_at),
        refused_in(killed_at, Instant::now())
    );
    for run in &runs {
        eprintln!(
            "lost run: {} writes over {:?}, from {:?} after the failover was asked ({:?} after the \
             promotion began) to {:?} after the promotion began; {:?} after the kill",
            run.writes,
            run.last - run.first,
            run.first.checked_duration_since(asked_at),
            run.first.checked_duration_since(promoting_at),
            run.last.checked_duration_since(promoting_at),
            run.first.checked_duration_since(killed_at),
        );
    }
    eprintln!(
        "leases acquired {}, fences {:?} .. {:?}",
        fences.len(),
        fences.first(),
        fences.last()
    );

    assert!(
        acked
            .iter()
            .any(|s| s.acked_at.unwrap() > killed_at + Duration::from_secs(1)),
        "writes never resumed after the second failover"
    );
    assert!(
        runs.len() <= 2,
        "lost writes in {} separate runs (at most one per failover): {runs:?}",
        runs.len()
    );
    // Runs before this are the first failover's; after it, the kill's (writes the killed master
    // acknowledged and had not yet replicated).
    let midway = promoting_at + (killed_at - promoting_at) / 2;
    for run in &runs {
        assert!(
            run.first >= asked_at,
            "a write acknowledged before any failover was lost: {run:?}"
        );
        // The daemon stops writing to the old master when the leader tells the replica to take
        // over, not ~1 s later at +switch-master: nothing acknowledged well after that is lost.
        // (The margin is for a loaded machine; before the daemon followed this event, runs reached
        // 0.9-1 s past it.)
        assert!(
            run.last >= midway || run.last < promoting_at + Duration::from_millis(250),
            "writes acknowledged {:?} after the promotion began were lost: {run:?}",
            run.last.saturating_duration_since(promoting_at)
        );
    }
    assert!(!fences.is_empty(), "no lease was ever acquired");
    for pair in fences.windows(2) {
        assert!(
            pair[1] > pair[0],
            "a fence went backwards or repeated: {} then {}",
            pair[0],
            pair[1]
        );
    }
    master.kill();
    daemon.stop().await;
}
