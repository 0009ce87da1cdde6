//! Least privilege: each lane's ACL user, as the daemon provisions it, may do its lane's job and no
//! more. Proven against a real Redis enforcing those users.

use tollgate_lanes::{Exclusive, Lane, Multiplexed};

use crate::lanes::{cmd, Fixture};

fn refused(reply: &tollgate_lanes::Reply) -> bool {
    reply.bytes().starts_with(b"-NOPERM")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lane_user_can_do_its_job_and_nothing_more() {
    let fixture = Fixture::start(|_| {}).await;
    let lanes = &fixture.lanes;

    let regular = lanes.multiplexed(Multiplexed::Regular).unwrap();
    assert_eq!(
        &regular.send(cmd(&["SET", "k", "v"])).await.unwrap().bytes()[..],
        b"+OK\r\n"
    );
    for argv in [
        &["EVAL", "return 1", "0"][..],
        &["CONFIG", "GET", "maxmemory"],
        &["FUNCTION", "LIST"],
    ] {
        let reply = regular.send(cmd(argv)).await.unwrap();
        assert!(refused(&reply), "REGULAR ran {argv:?}: {:?}", reply.frame());
    }

    let script = lanes.multiplexed(Multiplexed::Script).unwrap();
    let eval = script
        .send(cmd(&[
            "EVAL",
            "return redis.call('GET', KEYS[1])",
            "1",
            "k",
        ]))
        .await
        .unwrap();
    assert_eq!(&eval.bytes()[..], b"$1\r\nv\r\n");
    let config = script
        .send(cmd(&["CONFIG", "SET", "maxmemory", "1"]))
        .await
        .unwrap();
    assert!(
        refused(&config),
        "SCRIPT ran CONFIG SET: {:?}",
        config.frame()
    );

    let mut admin = lanes.borrow(Exclusive::Admin).await.unwrap();
    // Under the default policy, which lets clients read diagnostics (CLIENT LIST is answered by
    // the daemon from its own sessions, never sent).
    for argv in [
        &["INFO", "server"][..],
        &["CONFIG", "GET", "maxmemory"],
        &["SLOWLOG", "GET"],
    ] {
        let reply = admin.send(cmd(argv)).await.unwrap();
        assert!(
            !reply.is_error(),
            "ADMIN could not read diagnostics {argv:?}: {:?}",
            reply.frame()
        );
    }
    for argv in [
        &["CLIENT", "LIST"][..],
        &["CONFIG", "SET", "maxmemory", "1"],
        &["GET", "k"],
        &["SET", "k", "x"],
        &["FLUSHALL"],
        &["EVAL", "return 1", "0"],
    ] {
        let reply = admin.send(cmd(argv)).await.unwrap();
        assert!(refused(&reply), "ADMIN ran {argv:?}: {:?}", reply.frame());
    }
    admin.release().await;

    let mut blocking = lanes.borrow(Exclusive::Blocking).await.unwrap();
    let eval = blocking
        .send(cmd(&["EVAL", "return 1", "0"]))
        .await
        .unwrap();
    assert!(refused(&eval), "BLOCKING ran EVAL");
    blocking.release().await;

    let users: Vec<String> = crate::lanes::client_list(&fixture.redis)
        .into_iter()
        .map(|c| c.user)
        .filter(|u| u.starts_with("tollgate-"))
        .collect();
    for lane in ["regular", "script", "admin", "blocking"] {
        assert!(
            users.contains(&format!("tollgate-{lane}")),
            "{lane} connected as its own user: {users:?}"
        );
    }
}

/// Sends `argv` on a connection of `lane`, whichever kind the lane lends.
async fn on_lane(
    lanes: &tollgate_lanes::Lanes,
    lane: Lane,
    argv: &[&str],
) -> tollgate_lanes::Reply {
    let exclusive = match lane {
        Lane::Regular => return on_channel(lanes, Multiplexed::Regular, argv).await,
        Lane::Script => return on_channel(lanes, Multiplexed::Script, argv).await,
        Lane::Blocking => Exclusive::Blocking,
        Lane::Transaction => Exclusive::Transaction,
        Lane::Admin => Exclusive::Admin,
        Lane::Pubsub => panic!("the PUBSUB lane lends no connection to send on"),
    };
    let mut conn = lanes.borrow(exclusive).await.unwrap();
    let reply = conn.send(cmd(argv)).await.unwrap();
    conn.release().await;
    reply
}

async fn on_channel(
    lanes: &tollgate_lanes::Lanes,
    lane: Multiplexed,
    argv: &[&str],
) -> tollgate_lanes::Reply {
    let channel = lanes.multiplexed(lane).unwrap();
    channel.send(cmd(argv)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_lane_user_reaches_the_reserved_keyspace_whatever_it_sends() {
    let fixture = Fixture::start(|_| {}).await;
    let lanes = &fixture.lanes;
    // Straight to Redis, past admission: only the users' ACL rules stand in the way.
    let attacks: [&[&str]; 9] = [
        &["GET", "tollgate:lease:{x}"],
        &["SET", "tollgate:lease:{x}:fence", "1"],
        &["DEL", "decoy", "tollgate:lease:{x}"],
        &["PUBLISH", "tollgate:lease:{x}:released", "x"],
        &["SPUBLISH", "tollgate:lease:{x}:released", "x"],
        &["FLUSHALL"],
        &["SWAPDB", "0", "1"],
        &["SELECT", "1"],
        &["EVAL", "return redis.call('SET', 'tollgate:x', 1)", "0"],
    ];
    for lane in [
        Lane::Regular,
        Lane::Blocking,
        Lane::Transaction,
        Lane::Script,
        Lane::Admin,
    ] {
        for attack in attacks {
            let reply = on_lane(lanes, lane, attack).await;
            assert!(
                reply.is_error(),
                "{lane} ran {attack:?}: {:?}",
                reply.frame()
            );
        }
    }
    // The complement is exact: names that only resemble the prefix stay the clients'. (BLOCKING's
    // user runs only the blocking commands the policy admits.)
    for key in [
        "t",
        "tollgate",
        "tollgat:x",
        "tollgatex",
        "Tollgate:x",
        "x:tollgate:y",
        "[^t]",
    ] {
        for lane in [Lane::Regular, Lane::Transaction] {
            let reply = on_lane(lanes, lane, &["SET", key, "v"]).await;
            assert_eq!(&reply.bytes()[..], b"+OK\r\n", "{lane} refused key {key:?}");
        }
        let reply = on_lane(
            lanes,
            Lane::Blocking,
            &["BLMOVE", key, "other", "LEFT", "LEFT", "0.01"],
        )
        .await;
        assert!(
            !refused(&reply),
            "BLOCKING refused key {key:?}: {:?}",
            reply.frame()
        );
    }
    let script = on_lane(
        lanes,
        Lane::Script,
        &["EVAL", "return redis.call('GET', 'tollgatex')", "0"],
    )
    .await;
    assert_eq!(&script.bytes()[..], b"$1\r\nv\r\n");
}
