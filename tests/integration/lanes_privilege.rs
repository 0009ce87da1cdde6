//! Least privilege: each lane's ACL user, as the daemon provisions it, may do its lane's job and no
//! more. Proven against a real Redis enforcing those users.

use tollgate_lanes::Lane;

use crate::lanes::{cmd, Fixture};

fn refused(reply: &tollgate_lanes::Reply) -> bool {
    reply.bytes().starts_with(b"-NOPERM")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lane_user_can_do_its_job_and_nothing_more() {
    let fixture = Fixture::start(|_| {}).await;
    let lanes = &fixture.lanes;

    let regular = lanes.multiplexed(Lane::Regular).unwrap();
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

    let script = lanes.multiplexed(Lane::Script).unwrap();
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

    let mut admin = lanes.borrow(Lane::Admin).await.unwrap();
    for argv in [
        &["INFO", "server"][..],
        &["CLIENT", "LIST"],
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
        &["CONFIG", "GET", "maxmemory"][..],
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

    let mut blocking = lanes.borrow(Lane::Blocking).await.unwrap();
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
