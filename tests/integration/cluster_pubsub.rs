//! Pub/sub through the daemon's one socket on a real local cluster (3 masters, a replica each), in
//! RESP2 and RESP3: `SUBSCRIBE`/`PSUBSCRIBE` hear what is published on any node (a cluster delivers
//! them everywhere), `SSUBSCRIBE` hears its shard wherever the shard lives, and when a shard
//! channel's slot moves to another master the subscription follows it: the client never sees the
//! `sunsubscribe` Redis sends the daemon, and keeps receiving on the new owner.

use std::time::Duration;

use tollgate_lanes::{Slot, Splitting};
use tollgate_resp::Frame;
use tollgate_testkit::RedisCluster;

use crate::cluster::{cluster, keys_on_every_master};
use crate::lanes::eventually;
use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

const PROTOCOLS: [&str; 2] = ["2", "3"];

/// A client on the daemon's socket speaking `protocol` (2 or 3).
async fn client(daemon: &TestDaemon, protocol: &str) -> RawClient {
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    if protocol == "3" {
        let hello = client.call(&["HELLO", "3"]).await;
        assert!(matches!(hello, Frame::Map(_)), "{hello:?}");
    }
    client
}

/// A pushed frame's items as text: an array in RESP2, a push in RESP3 (panics on anything else).
fn pushed(frame: &Frame, protocol: &str) -> Vec<String> {
    let items = match (protocol, frame) {
        ("2", Frame::Array(items)) | ("3", Frame::Push(items)) => items,
        _ => panic!("not a RESP{protocol} push: {frame:?}"),
    };
    items
        .iter()
        .map(|item| match item {
            Frame::Integer(n) => n.to_string(),
            other => text(other),
        })
        .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}

/// The next frame, as text items, within 10 s.
async fn next(client: &mut RawClient, protocol: &str) -> Vec<String> {
    pushed(&client.read().await, protocol)
}

/// Subscribers of shard channel `channel` that `node` itself counts.
pub(crate) fn shard_subscribers(cluster: &RedisCluster, node: usize, channel: &str) -> i64 {
    match cluster.call(node, &["PUBSUB", "SHARDNUMSUB", channel]) {
        Frame::Array(items) => match items.get(1) {
            Some(Frame::Integer(n)) => *n,
            other => panic!("SHARDNUMSUB count: {other:?}"),
        },
        other => panic!("SHARDNUMSUB on node {node}: {other:?}"),
    }
}

fn spublish(cluster: &RedisCluster, node: usize, channel: &str, payload: &str) -> Frame {
    cluster.call(node, &["SPUBLISH", channel, payload])
}

/// Moves `slot` from its master to `to` as an operator would (`SETSLOT … IMPORTING/MIGRATING`,
/// `MIGRATE`, `SETSLOT … NODE`), off the async workers: it blocks until the nodes agree.
fn move_slot(cluster: &RedisCluster, slot: u16, to: usize) {
    let from = cluster.master_of(slot);
    assert_ne!(from, to, "slot {slot} is on node {to} already");
    tokio::task::block_in_place(|| {
        cluster.begin_migration(slot, from, to);
        cluster.migrate_keys(slot, from, to);
        cluster.finish_migration(slot, to);
    });
}

fn slot_of(name: &str) -> u16 {
    Slot::of(name.as_bytes()).number()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_and_psubscribe_hear_what_is_published_on_any_node() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    for protocol in PROTOCOLS {
        let channel = format!("news{protocol}");
        let pattern = format!("new*{protocol}");
        let mut subscriber = client(&daemon, protocol).await;
        subscriber.send(&["SUBSCRIBE", &channel]).await;
        assert_eq!(
            next(&mut subscriber, protocol).await,
            strings(&["subscribe", &channel, "1"])
        );
        subscriber.send(&["PSUBSCRIBE", &pattern]).await;
        assert_eq!(
            next(&mut subscriber, protocol).await,
            strings(&["psubscribe", &pattern, "2"])
        );
        // The daemon holds the subscriptions on one node; a publish on every master (and so on
        // at least two nodes that are not it) reaches them through the cluster bus.
        for node in cluster.masters() {
            let payload = format!("from node {node}");
            let published = cluster.call(node, &["PUBLISH", &channel, &payload]);
            assert!(matches!(published, Frame::Integer(_)), "{published:?}");
            let mut heard = vec![
                next(&mut subscriber, protocol).await,
                next(&mut subscriber, protocol).await,
            ];
            // The channel and the pattern may be held on different connections of the lane.
            heard.sort();
            assert_eq!(
                heard,
                vec![
                    strings(&["message", &channel, &payload]),
                    strings(&["pmessage", &pattern, &channel, &payload]),
                ],
                "RESP{protocol}, published on node {node}"
            );
        }
        // And a publish through the daemon, which runs on a node of its choosing.
        let mut publisher = client(&daemon, protocol).await;
        let published = publisher.call(&["PUBLISH", &channel, "through"]).await;
        assert!(matches!(published, Frame::Integer(_)), "{published:?}");
        let mut heard = vec![
            next(&mut subscriber, protocol).await,
            next(&mut subscriber, protocol).await,
        ];
        heard.sort();
        assert_eq!(
            heard,
            vec![
                strings(&["message", &channel, "through"]),
                strings(&["pmessage", &pattern, &channel, "through"]),
            ]
        );
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssubscribe_hears_every_shard_on_its_own_master() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    for protocol in PROTOCOLS {
        let channels = keys_on_every_master(&cluster, &format!("shard{protocol}"), 2);
        let mut subscriber = client(&daemon, protocol).await;
        let mut ssubscribe = vec!["SSUBSCRIBE"];
        ssubscribe.extend(channels.iter().map(String::as_str));
        subscriber.send(&ssubscribe).await;
        for (n, channel) in channels.iter().enumerate() {
            assert_eq!(
                next(&mut subscriber, protocol).await,
                strings(&["ssubscribe", channel, &(n + 1).to_string()])
            );
        }
        let mut publisher = client(&daemon, protocol).await;
        for channel in &channels {
            let owner = cluster.master_of(slot_of(channel));
            assert_eq!(
                shard_subscribers(&cluster, owner, channel),
                1,
                "{channel} is subscribed on its slot's master (node {owner})"
            );
            for other in cluster.masters().into_iter().filter(|&m| m != owner) {
                assert_eq!(shard_subscribers(&cluster, other, channel), 0);
            }

            // SPUBLISH through the daemon: it counts the one client subscribed through it.
            let through = publisher.call(&["SPUBLISH", channel, "through"]).await;
            assert_eq!(through, Frame::Integer(1), "SPUBLISH {channel}");
            assert_eq!(
                next(&mut subscriber, protocol).await,
                strings(&["smessage", channel, "through"])
            );
            // And sent to the shard's master directly.
            assert_eq!(
                spublish(&cluster, owner, channel, "direct"),
                Frame::Integer(1)
            );
            assert_eq!(
                next(&mut subscriber, protocol).await,
                strings(&["smessage", channel, "direct"])
            );
        }
    }
    daemon.stop().await;
}

/// The hard case: the slot of a subscribed shard channel is resharded to another master. Redis
/// unsubscribes the daemon (`sunsubscribe`); the daemon subscribes again on the new owner, and the
/// client's subscription goes on as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_subscription_follows_its_slot_to_the_new_master() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    // Two channels of one slot, one client of each protocol; a third channel on another slot of
    // the same master stays where it is.
    let (moving2, moving3) = ("{moving}resp2", "{moving}resp3");
    let slot = slot_of(moving2);
    let from = cluster.master_of(slot);
    let staying = (0..)
        .map(|n| format!("staying:{n}"))
        .find(|name| cluster.master_of(slot_of(name)) == from && slot_of(name) != slot)
        .expect("a channel on the same master");
    let to = cluster
        .masters()
        .into_iter()
        .find(|&master| master != from)
        .expect("another master");

    let mut subscriber2 = client(&daemon, "2").await;
    subscriber2.send(&["SSUBSCRIBE", moving2, &staying]).await;
    assert_eq!(
        next(&mut subscriber2, "2").await,
        strings(&["ssubscribe", moving2, "1"])
    );
    assert_eq!(
        next(&mut subscriber2, "2").await,
        strings(&["ssubscribe", &staying, "2"])
    );
    let mut subscriber3 = client(&daemon, "3").await;
    subscriber3.send(&["SSUBSCRIBE", moving3]).await;
    assert_eq!(
        next(&mut subscriber3, "3").await,
        strings(&["ssubscribe", moving3, "1"])
    );
    // And many channels of the slot on one client: Redis lets go of all of them at once.
    let many: Vec<String> = (0..20).map(|n| format!("{{moving}}many:{n}")).collect();
    let mut subscriber_many = client(&daemon, "2").await;
    let mut ssubscribe = vec!["SSUBSCRIBE"];
    ssubscribe.extend(many.iter().map(String::as_str));
    subscriber_many.send(&ssubscribe).await;
    for (n, channel) in many.iter().enumerate() {
        assert_eq!(
            next(&mut subscriber_many, "2").await,
            strings(&["ssubscribe", channel, &(n + 1).to_string()])
        );
    }
    assert_eq!(
        spublish(&cluster, from, moving2, "before"),
        Frame::Integer(1)
    );
    assert_eq!(
        next(&mut subscriber2, "2").await,
        strings(&["smessage", moving2, "before"])
    );

    move_slot(&cluster, slot, to);
    assert_eq!(cluster.master_of(slot), to);
    let resubscribed = eventually(Duration::from_secs(10), || {
        shard_subscribers(&cluster, to, moving2) == 1
            && shard_subscribers(&cluster, to, moving3) == 1
    })
    .await;
    assert!(
        resubscribed,
        "the daemon subscribes again on the slot's new master"
    );
    assert_eq!(shard_subscribers(&cluster, from, moving2), 0);
    let all_moved = eventually(Duration::from_secs(10), || {
        many.iter()
            .all(|channel| shard_subscribers(&cluster, to, channel) == 1)
    })
    .await;
    assert!(
        all_moved,
        "every channel of the slot is subscribed on its new master"
    );
    for channel in &many {
        assert_eq!(spublish(&cluster, to, channel, "moved"), Frame::Integer(1));
        assert_eq!(
            next(&mut subscriber_many, "2").await,
            strings(&["smessage", channel, "moved"])
        );
    }

    // What the clients read next is the new owner's message: had the daemon passed Redis's
    // `sunsubscribe` on, it would come first.
    for (subscriber, protocol, channel) in [
        (&mut subscriber2, "2", moving2),
        (&mut subscriber3, "3", moving3),
    ] {
        assert_eq!(spublish(&cluster, to, channel, "after"), Frame::Integer(1));
        assert_eq!(
            next(subscriber, protocol).await,
            strings(&["smessage", channel, "after"]),
            "RESP{protocol}"
        );
        // SPUBLISH through the daemon finds the new owner too.
        let mut publisher = client(&daemon, protocol).await;
        let through = publisher.call(&["SPUBLISH", channel, "through"]).await;
        assert_eq!(through, Frame::Integer(1), "RESP{protocol}");
        assert_eq!(
            next(subscriber, protocol).await,
            strings(&["smessage", channel, "through"])
        );
    }
    // The channel whose slot stayed is untouched.
    assert_eq!(shard_subscribers(&cluster, from, &staying), 1);
    assert_eq!(
        spublish(&cluster, from, &staying, "still"),
        Frame::Integer(1)
    );
    assert_eq!(
        next(&mut subscriber2, "2").await,
        strings(&["smessage", &staying, "still"])
    );

    // Unsubscribing the moved channel unsubscribes it on its new owner.
    subscriber3.send(&["SUNSUBSCRIBE", moving3]).await;
    assert_eq!(
        next(&mut subscriber3, "3").await,
        strings(&["sunsubscribe", moving3, "0"])
    );
    assert_eq!(shard_subscribers(&cluster, to, moving3), 0);
    assert_eq!(shard_subscribers(&cluster, to, moving2), 1);
    daemon.stop().await;
}

/// A slot moved behind the daemon's back, with nothing of the daemon's on it: a subscription to a
/// channel in it is made on the new owner, whether the daemon's map is stale (the old owner
/// answers `-MOVED`) or already refreshed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_subscription_to_a_slot_that_just_moved_lands_on_its_new_owner() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    // The daemon learns the map before the slot moves.
    let mut subscriber = client(&daemon, "3").await;
    subscriber.send(&["SSUBSCRIBE", "warm"]).await;
    assert_eq!(
        next(&mut subscriber, "3").await,
        strings(&["ssubscribe", "warm", "1"])
    );
    let channel = "{moved}news";
    let slot = slot_of(channel);
    let to = cluster
        .masters()
        .into_iter()
        .find(|&master| master != cluster.master_of(slot))
        .expect("another master");
    move_slot(&cluster, slot, to);

    subscriber.send(&["SSUBSCRIBE", channel]).await;
    assert_eq!(
        next(&mut subscriber, "3").await,
        strings(&["ssubscribe", channel, "2"])
    );
    assert_eq!(shard_subscribers(&cluster, to, channel), 1);
    assert_eq!(spublish(&cluster, to, channel, "here"), Frame::Integer(1));
    assert_eq!(
        next(&mut subscriber, "3").await,
        strings(&["smessage", channel, "here"])
    );
    daemon.stop().await;
}

/// A graceful failover (`CLUSTER FAILOVER` on the replica, the old master still up): the old
/// master gives its slots up and lets go of the daemon's shard subscriptions in them, and the
/// subscription goes on on the promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_subscription_follows_its_slot_through_a_graceful_failover() {
    let cluster = cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, Splitting::Split).await;
    let channel = "{failover}news";
    let old = cluster.master_of(slot_of(channel));
    let replica = cluster.replicas_of(old)[0];
    let mut subscriber = client(&daemon, "3").await;
    subscriber.send(&["SSUBSCRIBE", channel]).await;
    assert_eq!(
        next(&mut subscriber, "3").await,
        strings(&["ssubscribe", channel, "1"])
    );

    tokio::task::block_in_place(|| cluster.failover(replica));
    assert_eq!(cluster.master_of(slot_of(channel)), replica);
    let resubscribed = eventually(Duration::from_secs(10), || {
        shard_subscribers(&cluster, replica, channel) == 1
    })
    .await;
    assert!(
        resubscribed,
        "the daemon subscribes on the promoted replica"
    );
    assert_eq!(
        spublish(&cluster, replica, channel, "after"),
        Frame::Integer(1)
    );
    assert_eq!(
        next(&mut subscriber, "3").await,
        strings(&["smessage", channel, "after"])
    );
    // Once: the old master, now a replica, hears the shard's messages too, and the daemon must not
    // still be listening there.
    assert_eq!(
        spublish(&cluster, replica, channel, "again"),
        Frame::Integer(1)
    );
    assert_eq!(
        next(&mut subscriber, "3").await,
        strings(&["smessage", channel, "again"])
    );
    assert_eq!(shard_subscribers(&cluster, old, channel), 0);
    daemon.stop().await;
}
