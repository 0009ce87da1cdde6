//! Resharding under load: while clients read and write through the daemon, a slot holding their
//! keys moves between masters again and again (`SETSLOT … MIGRATING/IMPORTING`, `MIGRATE`,
//! `SETSLOT … NODE`). The daemon follows every `ASK`, `MOVED` and `TRYAGAIN`, so the clients see
//! no error at all, and each reads back what it wrote.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use tollgate_lanes::{Slot, Splitting};
use tollgate_testkit::RedisCluster;

use crate::cluster::cluster;
use crate::support::daemon::TestDaemon;

/// How many times the slot moves in one test: the "20 runs out of 20".
const RUNS: usize = 20;
/// Clients writing and reading during the moves.
const CLIENTS: usize = 4;
/// Keys per client, all in the moving slot.
const KEYS: usize = 8;

/// What the load saw: commands answered, and every error by its text's first word.
#[derive(Debug, Default)]
struct Seen {
    ok: u64,
    errors: std::collections::BTreeMap<String, u64>,
    stale_reads: u64,
}

/// One client's loop: SET each of its keys to the next value, GET it back (read your writes),
/// and an MGET of all of them (a multi-key command across a slot half moved: TRYAGAIN).
async fn load(daemon_socket: std::path::PathBuf, client: usize, stop: Arc<AtomicBool>) -> Seen {
    let url = format!("redis+unix://{}", daemon_socket.display());
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = (0..KEYS)
        .map(|n| format!("{{moving}}:{client}:{n}"))
        .collect();
    let mut seen = Seen::default();
    let note = |seen: &mut Seen, outcome: Result<(), redis::RedisError>| match outcome {
        Ok(()) => seen.ok += 1,
        Err(error) => {
            let kind = crate::cluster::error_kind(&error);
            *seen.errors.entry(kind).or_default() += 1;
        }
    };
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        for key in &keys {
            let set: Result<(), _> = conn.set(key, round).await;
            note(&mut seen, set);
            let got: Result<Option<u64>, _> = conn.get(key).await;
            if let Ok(value) = &got {
                if *value != Some(round) {
                    seen.stale_reads += 1;
                }
            }
            note(&mut seen, got.map(|_| ()));
        }
        let all: Result<Vec<Option<u64>>, _> = conn.mget(&keys).await;
        if let Ok(values) = &all {
            if values.iter().any(|v| *v != Some(round)) {
                seen.stale_reads += 1;
            }
        }
        note(&mut seen, all.map(|_| ()));
    }
    seen
}

/// Moves `slot` from its master to the next one, `RUNS` times, the keys migrated in small
/// batches while the load runs.
fn reshard(cluster: &RedisCluster, slot: u16) {
    let masters = cluster.masters();
    for run in 0..RUNS {
        let from = cluster.master_of(slot);
        let to = masters[(masters.iter().position(|&m| m == from).unwrap() + 1) % masters.len()];
        cluster.begin_migration(slot, from, to);
        // Let the load meet the slot half moved (ASK for the moved keys, TRYAGAIN for MGET).
        std::thread::sleep(Duration::from_millis(50));
        let moved = cluster.migrate_keys(slot, from, to);
        std::thread::sleep(Duration::from_millis(20));
        cluster.finish_migration(slot, to);
        assert_eq!(cluster.master_of(slot), to, "run {run}: the slot moved");
        let _ = moved;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_see_no_error_while_their_slot_moves_twenty_times() {
    let cluster = Arc::new(cluster().await);
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    let slot = Slot::of(b"{moving}").number();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| tokio::spawn(load(daemon.resp_socket(), client, stop.clone())))
        .collect();
    // The load runs a moment on the slot's first master before the first move.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let moves = tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || reshard(&cluster, slot)
    });
    moves.await.expect("the slot moved 20 times");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);

    let mut total = Seen::default();
    for client in clients {
        let seen = client.await.unwrap();
        total.ok += seen.ok;
        total.stale_reads += seen.stale_reads;
        for (kind, count) in seen.errors {
            *total.errors.entry(kind).or_default() += count;
        }
    }
    assert!(total.ok > 1000, "the load ran: {total:?}");
    // The moves were met: the daemon sent ASKING after ASK redirects, and nodes refused commands
    // for slots they no longer (or did not yet) serve, which the daemon followed.
    let calls = crate::cluster::calls_everywhere(&cluster);
    let asking = calls.get("asking").map_or(0, |c| c.calls);
    let refused: u64 = ["get", "set", "mget"]
        .iter()
        .filter_map(|name| calls.get(*name))
        .map(|c| c.rejected)
        .sum();
    eprintln!("load {total:?}; ASKING sent {asking}; redirected get/set/mget {refused}");
    assert!(asking > 0, "no ASK redirect was met: {calls:?}");
    assert!(refused > 0, "no command was redirected: {calls:?}");
    assert!(total.errors.is_empty(), "clients saw errors: {total:?}");
    assert_eq!(
        total.stale_reads, 0,
        "a client read something it had not just written: {total:?}"
    );
    // Every key is on the slot's final master, with the last value written.
    let owner = cluster.master_of(slot);
    let keys = cluster.inline(owner, &format!("CLUSTER COUNTKEYSINSLOT {slot}"));
    assert_eq!(keys, format!(":{}\r\n", CLIENTS * KEYS));
    daemon.stop().await;
}
