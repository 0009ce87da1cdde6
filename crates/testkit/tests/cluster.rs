//! The local cluster the other crates test against: its layout, its command counts, and a
//! coordinated failover.

use tollgate_resp::Frame;
use tollgate_testkit::{Calls, RedisCluster};

#[test]
fn a_cluster_has_the_layout_asked_for_and_counts_what_reaches_each_node() {
    let cluster = RedisCluster::start(3, 1);
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.masters(), [0, 1, 2]);
    for master in 0..3 {
        assert_eq!(cluster.replicas_of(master), [3 + master]);
    }
    assert_eq!(cluster.master_of(0), 0);
    assert_eq!(cluster.master_of(5461), 1);
    assert_eq!(cluster.master_of(16383), 2);
    for node in cluster.nodes() {
        assert_eq!(node.address(), format!("127.0.0.1:{}", node.port()));
        assert!(node.socket().exists());
    }

    // `foo` is in slot 12182, master 2's.
    let owner = cluster.master_of(12182);
    assert_eq!(cluster.inline(owner, "SET foo bar"), "+OK\r\n");
    let elsewhere = (owner + 1) % 3;
    assert!(cluster
        .inline(elsewhere, "GET foo")
        .starts_with(&format!("-MOVED 12182 {}", cluster.node(owner).address())));
    assert_eq!(
        cluster.commandstats(owner).get("set"),
        Some(&Calls {
            calls: 1,
            rejected: 0
        })
    );
    assert_eq!(
        cluster.commandstats(elsewhere).get("get"),
        Some(&Calls {
            calls: 0,
            rejected: 1
        })
    );
    assert_eq!(cluster.commandstats(elsewhere).get("set"), None);
}

#[test]
fn a_coordinated_failover_swaps_a_master_and_its_replica() {
    let cluster = RedisCluster::start(3, 1);
    cluster.failover(3);
    assert_eq!(cluster.master_of(0), 3);
    assert_eq!(cluster.masters(), [3, 1, 2]);
    // The old master lives on as the new master's replica.
    assert_eq!(cluster.replicas_of(3), [0]);
    match cluster.call(0, &["ROLE"]) {
        Frame::Array(role) => assert_eq!(role[0], Frame::Bulk("slave".into())),
        other => panic!("ROLE: {other:?}"),
    }
}
