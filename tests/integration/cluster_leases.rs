//! Leases over RESP through the daemon's one socket on a real local cluster (3 masters, a replica
//! each): a resource's keys share one slot and live on its master, fences only grow, a waiter is
//! woken by the release's sharded notification on that slot, and `REPLICAS` waits with `WAIT` on
//! that slot's master.

use std::collections::BTreeMap;
use std::time::Duration;

use tollgate_lanes::{Slot, Splitting};
use tollgate_lease::{LeaseKeys, Resource};
use tollgate_resp::Frame;
use tollgate_testkit::RedisCluster;

use crate::cluster::cluster;
use crate::cluster_pubsub::shard_subscribers;
use crate::lease_http::LEASE_POLICY;
use crate::lease_resp::{client, fields, integer, outcome};
use crate::support::daemon::TestDaemon;
use crate::support::raw::RawClient;

/// The daemon against `cluster`, under the lease tests' policy.
async fn lease_daemon(cluster: &RedisCluster) -> TestDaemon {
    let dir = cluster
        .node(0)
        .socket()
        .parent()
        .expect("the node's directory");
    let policy = dir.join("leases.yaml");
    std::fs::write(&policy, LEASE_POLICY).expect("write the test policy");
    TestDaemon::start_cluster_with(cluster, Splitting::Split, |config| {
        config.policy.files = vec![policy];
    })
    .await
}

fn slot_of(key: &str) -> u16 {
    Slot::of(key.as_bytes()).number()
}

/// One resource (`orders:<prefix>:<n>`) per master, with its keys; the master's index first.
fn resources_on_every_master(
    cluster: &RedisCluster,
    prefix: &str,
) -> BTreeMap<usize, (String, LeaseKeys)> {
    let masters = cluster.masters();
    let mut found = BTreeMap::new();
    for n in 0.. {
        let name = format!("orders:{prefix}:{n}");
        let keys = LeaseKeys::of(&Resource::parse(&name).expect("a resource name"));
        found
            .entry(cluster.master_of(slot_of(&keys.lease)))
            .or_insert((name, keys));
        if found.len() == masters.len() {
            return found;
        }
    }
    unreachable!()
}

fn exists(cluster: &RedisCluster, node: usize, key: &str) -> bool {
    cluster.call(node, &["EXISTS", key]) == Frame::Integer(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_every_master_take_and_give_back_with_growing_fences() {
    let cluster = cluster().await;
    let daemon = lease_daemon(&cluster).await;
    let resources = resources_on_every_master(&cluster, "fence");
    for (round, protocol) in ["2", "3", "2"].into_iter().enumerate() {
        let mut c = client(&daemon, protocol).await;
        for (&master, (resource, keys)) in &resources {
            let slot = slot_of(&keys.lease);
            assert_eq!(slot_of(&keys.fence), slot, "{resource}: one slot");
            assert_eq!(slot_of(&keys.channel), slot, "{resource}: one slot");

            let op = format!("op-{round}");
            let acquired = c
                .call(&[
                    "LEASE", "ACQUIRE", resource, "30000", "OWNER", "alice", "OP", &op,
                ])
                .await;
            assert_eq!(outcome(&acquired), "acquired", "{resource}: {acquired:?}");
            let fence = integer(&acquired, "fence");
            assert!(
                exists(&cluster, master, &keys.lease),
                "{resource}'s lease is on its slot's master (node {master})"
            );
            let contended = c.call(&["LEASE", "ACQUIRE", resource, "30000"]).await;
            assert_eq!(outcome(&contended), "contended");
            let inspect = c.call(&["LEASE", "INSPECT", resource]).await;
            assert_eq!(
                (outcome(&inspect), integer(&inspect, "fence")),
                ("held".to_owned(), fence)
            );
            let released = c
                .call(&["LEASE", "RELEASE", resource, "OWNER", "alice", "OP", &op])
                .await;
            assert_eq!(outcome(&released), "released");
            assert!(!exists(&cluster, master, &keys.lease));

            // The next holder's fence is strictly higher than every earlier one.
            let bob = format!("bob-{round}");
            let next = c
                .call(&[
                    "LEASE", "ACQUIRE", resource, "30000", "OWNER", &bob, "OP", "1",
                ])
                .await;
            assert_eq!(outcome(&next), "acquired");
            assert!(integer(&next, "fence") > fence, "{next:?} after {fence}");
            let counter = cluster.call(master, &["GET", &keys.fence]);
            assert_eq!(
                counter,
                Frame::Bulk(integer(&next, "fence").to_string().into()),
                "the fence counter lives with the lease"
            );
            let released = c
                .call(&["LEASE", "RELEASE", resource, "OWNER", &bob, "OP", "1"])
                .await;
            assert_eq!(outcome(&released), "released");
        }
    }
    daemon.stop().await;
}

/// The holders' TTL is an hour and the waiters wait a minute: only the release's notification
/// (an `SPUBLISH` on the resource's slot, heard on that slot's master) can hand them the lease
/// before a reply deadline of ten seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_every_master_is_woken_by_the_release() {
    let cluster = cluster().await;
    let daemon = lease_daemon(&cluster).await;
    let resources = resources_on_every_master(&cluster, "wait");
    for (&master, (resource, keys)) in &resources {
        let mut holder = client(&daemon, "3").await;
        let mut waiter = client(&daemon, "2").await;
        let held = holder
            .call(&[
                "LEASE", "ACQUIRE", resource, "3600000", "OWNER", "h", "OP", "1",
            ])
            .await;
        assert_eq!(outcome(&held), "acquired");
        waiter
            .send(&["LEASE", "ACQUIRE", resource, "10000", "WAIT", "60000"])
            .await;
        // The waiter is subscribed on the slot's master before it waits; released, it is told.
        let subscribed = crate::lanes::eventually(Duration::from_secs(10), || {
            shard_subscribers(&cluster, master, &keys.channel) == 1
        })
        .await;
        assert!(
            subscribed,
            "{resource}: the waiter listens on node {master}"
        );
        let released = holder
            .call(&["LEASE", "RELEASE", resource, "OWNER", "h", "OP", "1"])
            .await;
        assert_eq!(outcome(&released), "released");
        let handed = waiter.read().await;
        assert_eq!(outcome(&handed), "acquired", "{resource}: {handed:?}");
        assert!(integer(&handed, "fence") > integer(&held, "fence"));
    }
    daemon.stop().await;
}

/// Whether `replica` holds `key`, read on the replica itself (`READONLY` lets it answer).
async fn on_replica(cluster: &RedisCluster, replica: usize, key: &str) -> bool {
    let mut direct = RawClient::to_redis(cluster.node(replica).socket()).await;
    direct.pipeline(&[&["READONLY"], &["EXISTS", key]]).await;
    let _ = direct.read().await;
    direct.read().await == Frame::Integer(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_one_waits_on_the_slot_s_master() {
    let cluster = cluster().await;
    let daemon = lease_daemon(&cluster).await;
    let mut c = client(&daemon, "3").await;
    for (&master, (resource, keys)) in &resources_on_every_master(&cluster, "durable") {
        let waits = |node: usize| {
            cluster
                .commandstats(node)
                .get("wait")
                .map_or(0, |calls| calls.calls)
        };
        let before: Vec<u64> = cluster.masters().into_iter().map(waits).collect();
        let acquired = c
            .call(&[
                "LEASE", "ACQUIRE", resource, "30000", "REPLICAS", "1", "OWNER", "a", "OP", "1",
            ])
            .await;
        assert_eq!(outcome(&acquired), "acquired", "{resource}: {acquired:?}");
        let after: Vec<u64> = cluster.masters().into_iter().map(waits).collect();
        // On the slot's master only (twice when the first EVALSHA met NOSCRIPT: the WAIT queued
        // behind it ran too, and again behind the retry).
        for ((node, before), after) in cluster.masters().into_iter().zip(before).zip(after) {
            match node == master {
                true => assert!(after > before, "no WAIT on node {node} ({resource})"),
                false => assert_eq!(after, before, "WAIT on node {node} ({resource})"),
            }
        }
        let replica = cluster.replicas_of(master)[0];
        assert!(
            on_replica(&cluster, replica, &keys.lease).await,
            "{resource}: the replica confirmed the lease, so it holds it"
        );
        // More replicas than the shard has: the acquisition is undone, not half-made.
        let refused = c
            .call(&["LEASE", "ACQUIRE", resource, "30000", "REPLICAS", "2"])
            .await;
        assert_eq!(outcome(&refused), "contended", "{refused:?}");
        let released = c
            .call(&["LEASE", "RELEASE", resource, "OWNER", "a", "OP", "1"])
            .await;
        assert_eq!(outcome(&released), "released");
        let unconfirmed = c
            .call(&["LEASE", "ACQUIRE", resource, "30000", "REPLICAS", "2"])
            .await;
        assert_eq!(outcome(&unconfirmed), "unavailable", "{unconfirmed:?}");
        let reason = crate::support::raw::text(&fields(&unconfirmed)["reason"]);
        assert!(reason.contains("1 of 2 replicas"), "{reason}");
        let inspect = c.call(&["LEASE", "INSPECT", resource]).await;
        assert_eq!(
            outcome(&inspect),
            "free",
            "the unconfirmed acquisition was undone"
        );
    }
    daemon.stop().await;
}

/// The resource's slot is resharded to another master while a waiter waits: its lease and fence
/// counter move with the slot, its release notification is published on the new master, and the
/// waiter (whose subscription followed the slot) is woken by it with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_after_its_resource_s_slot_moved() {
    let cluster = cluster().await;
    let daemon = lease_daemon(&cluster).await;
    let (from, (resource, keys)) = resources_on_every_master(&cluster, "moving")
        .pop_first()
        .expect("a resource");
    let to = cluster
        .masters()
        .into_iter()
        .find(|&master| master != from)
        .expect("another master");
    let mut holder = client(&daemon, "3").await;
    let mut waiter = client(&daemon, "3").await;
    let held = holder
        .call(&[
            "LEASE", "ACQUIRE", &resource, "3600000", "OWNER", "h", "OP", "1",
        ])
        .await;
    assert_eq!(outcome(&held), "acquired");
    waiter
        .send(&["LEASE", "ACQUIRE", &resource, "10000", "WAIT", "60000"])
        .await;
    let listening = |node: usize| {
        let cluster = &cluster;
        let channel = keys.channel.clone();
        move || shard_subscribers(cluster, node, &channel) == 1
    };
    assert!(crate::lanes::eventually(Duration::from_secs(10), listening(from)).await);

    let slot = slot_of(&keys.lease);
    tokio::task::block_in_place(|| {
        cluster.begin_migration(slot, from, to);
        assert!(
            cluster.migrate_keys(slot, from, to) >= 2,
            "the lease and its counter"
        );
        cluster.finish_migration(slot, to);
    });
    assert!(
        crate::lanes::eventually(Duration::from_secs(10), listening(to)).await,
        "the waiter's subscription followed the slot"
    );
    let released = holder
        .call(&["LEASE", "RELEASE", &resource, "OWNER", "h", "OP", "1"])
        .await;
    assert_eq!(outcome(&released), "released");
    let handed = waiter.read().await;
    assert_eq!(outcome(&handed), "acquired", "{handed:?}");
    assert!(integer(&handed, "fence") > integer(&held, "fence"));
    assert!(
        exists(&cluster, to, &keys.lease),
        "the new holder's lease is on the new master"
    );
    daemon.stop().await;
}

/// A semaphore on every master: its line's head key shares the resource's slot, and the release of
/// a permit (published by the shared-release script) wakes the next in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_on_every_master_hands_a_released_permit_to_its_waiter() {
    let cluster = cluster().await;
    let daemon = lease_daemon(&cluster).await;
    for (_, (resource, _)) in resources_on_every_master(&cluster, "pool") {
        let mut holder = client(&daemon, "2").await;
        for owner in ["a", "b"] {
            let taken = holder
                .call(&[
                    "LEASE", "ACQUIRE", &resource, "3600000", "PERMITS", "2", "OWNER", owner, "OP",
                    "1",
                ])
                .await;
            assert_eq!(outcome(&taken), "acquired", "{resource}: {taken:?}");
        }
        let mut waiter = client(&daemon, "3").await;
        waiter
            .send(&[
                "LEASE", "ACQUIRE", &resource, "10000", "PERMITS", "2", "WAIT", "60000",
            ])
            .await;
        assert!(
            waiter
                .read_within(Duration::from_millis(300))
                .await
                .is_err(),
            "{resource}: both permits are taken, the third waits"
        );
        let released = holder
            .call(&["LEASE", "RELEASE", &resource, "OWNER", "a", "OP", "1"])
            .await;
        assert_eq!(outcome(&released), "released");
        let handed = waiter.read().await;
        assert_eq!(outcome(&handed), "acquired", "{resource}: {handed:?}");
    }
    daemon.stop().await;
}
