//! Clean reuse, Redis going away and coming back, and the drain on shutdown, against a real Redis.

use std::time::Duration;

use tokio::time::Instant;
use tollgate_lanes::{
    CallError, CloseOutcome, Exclusive, Lane, LaneError, LifeState, Multiplexed, SubscriptionKind,
};

use crate::lanes::{cmd, eventually, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_abandoned_mid_blocking_command_is_never_lent_again() {
    let fixture = Fixture::start(|config| config.blocking.connections = Some(1)).await;
    let lanes = &fixture.lanes;

    // Given up on by deadline.
    let mut conn = lanes.borrow(Exclusive::Blocking).await.unwrap();
    let outcome = conn
        .send_within(
            cmd(&["BLPOP", "queue", "0"]),
            Some(Duration::from_millis(100)),
        )
        .await;
    assert!(
        matches!(outcome, Err(CallError::Indeterminate { .. })),
        "{outcome:?}"
    );
    drop(conn);

    // Cancelled by the caller, then handed back politely: still must not be reused.
    let mut conn = lanes.borrow(Exclusive::Blocking).await.unwrap();
    let abandoned = fixture.client_ids("tollgate-blocking");
    assert!(tokio::time::timeout(
        Duration::from_millis(100),
        conn.send(cmd(&["BLPOP", "queue", "0"]))
    )
    .await
    .is_err());
    conn.release().await;

    assert!(
        eventually(Duration::from_secs(5), || {
            let now = fixture.client_ids("tollgate-blocking");
            now.iter().all(|id| !abandoned.contains(id))
        })
        .await,
        "the abandoned connections are closed"
    );
    let mut next = lanes.borrow(Exclusive::Blocking).await.unwrap();
    assert!(fixture
        .client_ids("tollgate-blocking")
        .iter()
        .all(|id| !abandoned.contains(id)));
    // A value pushed now goes to the new borrower, not to an abandoned BLPOP.
    let regular = lanes.multiplexed(Multiplexed::Regular).unwrap();
    regular
        .send(cmd(&["LPUSH", "queue", "mine"]))
        .await
        .unwrap();
    let reply = next.send(cmd(&["BLPOP", "queue", "1"])).await.unwrap();
    assert_eq!(&reply.bytes()[..], b"*2\r\n$5\r\nqueue\r\n$4\r\nmine\r\n");
    next.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_connection_comes_back_clean() {
    let fixture = Fixture::start(|config| config.transaction.connections = Some(1)).await;
    let mut conn = fixture.lanes.borrow(Exclusive::Transaction).await.unwrap();
    for argv in [
        &["WATCH", "k"][..],
        &["MULTI"],
        &["SET", "k", "left-behind"],
    ] {
        conn.send(cmd(argv)).await.unwrap();
    }
    let id = fixture.client_ids("tollgate-transaction");
    conn.release().await;

    let mut again = fixture.lanes.borrow(Exclusive::Transaction).await.unwrap();
    assert_eq!(
        fixture.client_ids("tollgate-transaction"),
        id,
        "the same connection was reused"
    );
    // Not inside the old MULTI: EXEC without MULTI is an error, and the queued SET never ran.
    let exec = again.send(cmd(&["EXEC"])).await.unwrap();
    assert!(exec.is_error(), "{:?}", exec.frame());
    let get = again.send(cmd(&["GET", "k"])).await.unwrap();
    assert_eq!(&get.bytes()[..], b"$-1\r\n");
    again.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_redis_gives_unavailable_quickly_and_the_lanes_recover() {
    let mut fixture = Fixture::start_with_durable_users(|config| {
        config.blocking.acquire_timeout = Some(Duration::from_secs(10));
        config.regular.acquire_timeout = Some(Duration::from_secs(10));
    })
    .await;
    let lanes = fixture.lanes.clone();
    lanes.ping(Duration::from_secs(1)).await.unwrap();
    lanes
        .borrow(Exclusive::Blocking)
        .await
        .unwrap()
        .release()
        .await;

    fixture.redis.kill();
    let started = Instant::now();
    let mut regular_outcome = None;
    for _ in 0..5 {
        // The first send may race the closed socket (sent, unknown); later ones must fail before sending.
        match lanes
            .multiplexed(Multiplexed::Regular)
            .unwrap()
            .send(cmd(&["PING"]))
            .await
        {
            Err(CallError::NotSent(LaneError::Unavailable { reason })) => {
                regular_outcome = Some(reason);
                break;
            }
            Err(CallError::Indeterminate { .. }) => continue,
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
    assert!(
        regular_outcome.is_some(),
        "REGULAR never reported Unavailable"
    );
    match lanes.borrow(Exclusive::Blocking).await {
        Err(LaneError::Unavailable { .. }) => {}
        other => panic!("expected Unavailable, got {:?}", other.map(|_| ())),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failing took {:?}: callers waited instead of failing fast",
        started.elapsed()
    );
    assert!(lanes.ping(Duration::from_millis(500)).await.is_err());

    fixture.redis.restart();
    let mut recovered = false;
    for _ in 0..100 {
        if lanes.ping(Duration::from_millis(500)).await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovered, "REGULAR did not recover after Redis came back");
    // BLOCKING's own connector may still be pausing after its failure: recovery within its backoff.
    let mut blocking = None;
    for _ in 0..100 {
        if let Ok(conn) = lanes.borrow(Exclusive::Blocking).await {
            blocking = Some(conn);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut blocking = blocking.expect("BLOCKING recovered");
    assert_eq!(
        &blocking.send(cmd(&["PING"])).await.unwrap().bytes()[..],
        b"+PONG\r\n"
    );
    blocking.release().await;
    let status = lanes.status();
    let regular = status
        .lanes
        .iter()
        .find(|l| l.lane == Lane::Regular)
        .unwrap();
    assert!(regular.reconnects >= 1, "a reconnect is counted");
    assert!(regular.rejections.unavailable >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_borrowed_connections_that_come_back_in_time() {
    let fixture = Fixture::start(|_| {}).await;
    let mut conn = fixture.lanes.borrow(Exclusive::Transaction).await.unwrap();
    let worker = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let reply = conn.send(cmd(&["PING"])).await;
        conn.release().await;
        reply
    });
    let started = Instant::now();
    assert_eq!(
        fixture.lanes.close(Duration::from_secs(5)).await,
        CloseOutcome::Drained
    );
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "close waited for the borrower"
    );
    assert!(
        worker.await.unwrap().is_ok(),
        "in-flight work finished during the drain"
    );
    assert!(matches!(
        fixture.lanes.borrow(Exclusive::Blocking).await,
        Err(LaneError::Closed)
    ));
    assert!(matches!(
        fixture.lanes.multiplexed(Multiplexed::Regular),
        Err(LaneError::Closed)
    ));
    assert_eq!(fixture.lanes.status().state, LifeState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_cuts_off_a_stuck_borrower_at_the_deadline() {
    let fixture = Fixture::start(|_| {}).await;
    let mut conn = fixture.lanes.borrow(Exclusive::Blocking).await.unwrap();
    let stuck =
        tokio::spawn(async move { conn.send(cmd(&["BLPOP", "never", "0"])).await.map(drop) });
    assert!(
        eventually(Duration::from_secs(5), || fixture
            .client_ids("tollgate-blocking")
            .len()
            == 1)
        .await
    );
    let started = Instant::now();
    assert_eq!(
        fixture.lanes.close(Duration::from_millis(300)).await,
        CloseOutcome::Forced
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "close overran its deadline: {:?}",
        started.elapsed()
    );
    assert!(matches!(
        stuck.await.unwrap(),
        Err(CallError::Indeterminate { .. })
    ));
    assert!(
        eventually(Duration::from_secs(5), || fixture.no_lane_connections()).await,
        "every lane connection is closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_is_closed_exactly_once_and_a_second_close_is_a_no_op() {
    let fixture = Fixture::start(|_| {}).await;
    let lanes = &fixture.lanes;
    lanes.ping(Duration::from_secs(1)).await.unwrap();
    let script = lanes.multiplexed(Multiplexed::Script).unwrap();
    assert_eq!(
        &script
            .send(cmd(&["EVAL", "return 1", "0"]))
            .await
            .unwrap()
            .bytes()[..],
        b":1\r\n"
    );
    for lane in [
        Exclusive::Blocking,
        Exclusive::Transaction,
        Exclusive::Admin,
    ] {
        let mut conn = lanes.borrow(lane).await.unwrap();
        conn.send(cmd(&["PING"])).await.unwrap();
        conn.release().await;
    }
    let mut subscription = lanes
        .pubsub()
        .subscribe(SubscriptionKind::Channel, "news".into(), 8)
        .await
        .unwrap();

    assert_eq!(
        lanes.close(Duration::from_secs(5)).await,
        CloseOutcome::Drained
    );
    let after_first = lanes.status();
    for lane in &after_first.lanes {
        assert!(lane.opened >= 1, "{:?} opened a connection", lane.lane);
        assert_eq!(lane.open, 0, "{:?} left connections open", lane.lane);
        assert_eq!(
            lane.opened, lane.closed,
            "{:?}: every opened connection closed once",
            lane.lane
        );
    }
    assert!(
        subscription.recv().await.is_err(),
        "subscriptions end with the lanes"
    );

    assert_eq!(
        lanes.close(Duration::from_secs(5)).await,
        CloseOutcome::AlreadyClosed
    );
    let after_second = lanes.status();
    for (first, second) in after_first.lanes.iter().zip(&after_second.lanes) {
        assert_eq!(
            first.closed, second.closed,
            "{:?}: the second close closed nothing",
            first.lane
        );
    }
    assert!(
        eventually(Duration::from_secs(5), || fixture.no_lane_connections()).await,
        "redis still lists lane connections after close"
    );
    let text = fixture.metrics_text();
    assert!(
        text.contains(r#"lane_connections_open{lane="admin"} 0"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_idle_connection_is_replaced_on_borrow() {
    let fixture = Fixture::start(|config| config.admin.connections = Some(1)).await;
    let mut conn = fixture.lanes.borrow(Exclusive::Admin).await.unwrap();
    conn.send(cmd(&["PING"])).await.unwrap();
    conn.release().await;
    let before = fixture.client_ids("tollgate-admin");
    assert_eq!(before.len(), 1);
    fixture.redis.inline("CLIENT KILL USER tollgate-admin");
    assert!(
        eventually(Duration::from_secs(5), || fixture
            .client_ids("tollgate-admin")
            .is_empty())
        .await
    );

    let mut conn = fixture.lanes.borrow(Exclusive::Admin).await.unwrap();
    let reply = conn
        .send(cmd(&["PING"]))
        .await
        .expect("a fresh connection, not the dead one");
    assert_eq!(&reply.bytes()[..], b"+PONG\r\n");
    let after = fixture.client_ids("tollgate-admin");
    assert!(
        after.len() == 1 && after != before,
        "replaced: {before:?} -> {after:?}"
    );
    conn.release().await;
}
