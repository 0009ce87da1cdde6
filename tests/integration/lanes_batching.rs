//! How a multiplexed lane uses its connections, against a real Redis: commands that arrive while a
//! connection's last write is being answered go out together in its next write (unless Redis is a
//! network round trip away: then at once), and work is packed on as few connections as carry it;
//! held commands that never left are reported as not sent.

use std::time::Duration;

use tollgate_lanes::{CallError, Lane, LaneError, Multiplexed};

use crate::lanes::{cmd, Fixture};

/// `lane_writes_total` of the REGULAR lane.
fn regular_writes(fixture: &Fixture) -> u64 {
    regular_counter(fixture, "lane_writes_total")
}

/// `name{lane="regular"}`.
fn regular_counter(fixture: &Fixture, name: &str) -> u64 {
    let text = fixture.metrics_text();
    let prefix = format!("{name}{{lane=\"regular\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no REGULAR {name} in:\n{text}"))
        .parse()
        .expect("a numeric counter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_for_a_redis_a_round_trip_away_are_not_held_behind_the_last_write() {
    // 1 ms each way: a round trip far past the distance below which a connection holds.
    let fixture = Fixture::start_behind_hop(Duration::from_millis(1), |config| {
        config.regular.connections = Some(1)
    })
    .await;
    let channel = fixture.lanes.multiplexed(Multiplexed::Regular).unwrap();
    // A window of writes (`turnaround::WINDOW`), one at a time, each timed: Redis answers a
    // round trip away.
    for _ in 0..1024 {
        channel.send(cmd(&["PING"])).await.unwrap();
    }
    let writes = regular_writes(&fixture);
    let overlapping = regular_counter(&fixture, "lane_overlapping_writes_total");

    // Redis's replies held at the hop: the first command stays unanswered for as long as the
    // test needs. The second, sent once the first is written, goes out too (held, it would wait
    // for that reply before its own write).
    let hop = fixture.hop.as_ref().expect("a hop");
    hop.hold_replies();
    let first = channel.send(cmd(&["INCR", "n"]));
    let written = |count| {
        let fixture = &fixture;
        move || regular_writes(fixture) - writes == count
    };
    assert!(
        crate::lanes::eventually(Duration::from_secs(10), written(1)).await,
        "the first command written"
    );
    let second = channel.send(cmd(&["INCR", "n"]));
    assert!(
        crate::lanes::eventually(Duration::from_secs(10), written(2)).await,
        "the second command written while the first is unanswered"
    );
    hop.release_replies();
    assert_eq!(&first.await.unwrap().bytes()[..], b":1\r\n");
    assert_eq!(&second.await.unwrap().bytes()[..], b":2\r\n");
    assert_eq!(regular_writes(&fixture) - writes, 2, "a write each");
    assert_eq!(
        regular_counter(&fixture, "lane_overlapping_writes_total") - overlapping,
        1,
        "the second written while the first was unanswered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_sent_while_a_write_is_unanswered_go_out_in_one_write() {
    let fixture = Fixture::start(|config| config.regular.connections = Some(1)).await;
    let channel = fixture.lanes.multiplexed(Multiplexed::Regular).unwrap();
    channel.send(cmd(&["PING"])).await.unwrap();
    let before = regular_writes(&fixture);

    // Redis holds every reply for the pause, so the first command stays unanswered while the
    // others arrive one by one (the pause is long enough for a slow machine's 20 short sleeps).
    fixture.redis.inline("CLIENT PAUSE 1500 ALL");
    let first = channel.send(cmd(&["INCR", "n"]));
    let mut later = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        later.push(channel.send(cmd(&["INCR", "n"])));
    }
    assert_eq!(&first.await.unwrap().bytes()[..], b":1\r\n");
    for (i, reply) in later.into_iter().enumerate() {
        assert_eq!(reply.await.unwrap().bytes(), &format!(":{}\r\n", i + 2));
    }
    assert_eq!(
        regular_writes(&fixture) - before,
        2,
        "the first command alone, then the 20 sent while it was unanswered together"
    );
    assert_eq!(
        regular_counter(&fixture, "lane_overlapping_writes_total"),
        0,
        "a Redis on this host: no write while another is unanswered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_is_packed_on_one_connection_until_it_spills_over() {
    let fixture = Fixture::start(|config| config.regular.connections = Some(4)).await;
    let user = tollgate_lanes::user_name(Lane::Regular);
    for _ in 0..20 {
        let channel = fixture.lanes.multiplexed(Multiplexed::Regular).unwrap();
        channel.send(cmd(&["PING"])).await.unwrap();
    }
    assert_eq!(
        fixture.client_ids(&user).len(),
        1,
        "twenty callers one after another share one connection"
    );

    // 1,100 commands outstanding on the first connection (past its 1,024) send the next caller
    // to the second.
    fixture.redis.inline("CLIENT PAUSE 300 ALL");
    let busy = fixture.lanes.multiplexed(Multiplexed::Regular).unwrap();
    let outstanding: Vec<_> = (0..1100).map(|_| busy.send(cmd(&["PING"]))).collect();
    spills_to_a_second_connection(&fixture, outstanding, b"+PONG\r\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_commands_spill_over_before_their_count_does() {
    let fixture = Fixture::start(|config| config.regular.connections = Some(4)).await;
    let first = fixture.lanes.multiplexed(Multiplexed::Regular).unwrap();
    first.send(cmd(&["PING"])).await.unwrap();
    let user = tollgate_lanes::user_name(Lane::Regular);
    assert_eq!(fixture.client_ids(&user).len(), 1);

    // 40 commands of 2 KiB outstanding (80 KiB, more than the next write gathers) send the next
    // caller to a connection of its own, though 40 is far below the count that spills.
    let value = "v".repeat(2048);
    fixture.redis.inline("CLIENT PAUSE 300 ALL");
    let outstanding: Vec<_> = (0..40)
        .map(|i| first.send(cmd(&["SET", &format!("big:{i}"), &value])))
        .collect();
    spills_to_a_second_connection(&fixture, outstanding, b"+OK\r\n").await;
}

/// With `outstanding` held on the lane's first connection (Redis paused), a new caller is answered
/// on a second one; then every held command is answered `reply`, and the lane has two connections.
async fn spills_to_a_second_connection(
    fixture: &Fixture,
    outstanding: Vec<tollgate_lanes::SendFuture>,
    reply: &[u8],
) {
    let spilled = fixture.lanes.multiplexed(Multiplexed::Regular).unwrap();
    assert_eq!(
        &spilled.send(cmd(&["PING"])).await.unwrap().bytes()[..],
        b"+PONG\r\n"
    );
    for held in outstanding {
        assert_eq!(&held.await.unwrap().bytes()[..], reply);
    }
    let user = tollgate_lanes::user_name(Lane::Regular);
    assert_eq!(fixture.client_ids(&user).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_held_for_the_next_write_are_not_sent_when_the_connection_is_lost() {
    let mut fixture = Fixture::start(|config| config.regular.connections = Some(1)).await;
    let channel = fixture.lanes.multiplexed(Multiplexed::Regular).unwrap();
    channel.send(cmd(&["PING"])).await.unwrap();

    fixture.redis.inline("CLIENT PAUSE 5000 ALL");
    let written = channel.send(cmd(&["INCR", "n"]));
    // Time for the driver to write it, then for the next to be taken up and held.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = channel.send(cmd(&["INCR", "n"]));
    tokio::time::sleep(Duration::from_millis(100)).await;
    fixture.redis.kill();

    match written.await {
        Err(CallError::Indeterminate { .. }) => {}
        other => panic!("the written command may have run: expected Indeterminate, got {other:?}"),
    }
    match held.await {
        Err(CallError::NotSent(LaneError::Unavailable { .. })) => {}
        other => panic!("the held command never left: expected Unavailable, got {other:?}"),
    }
}
