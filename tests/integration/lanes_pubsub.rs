//! The PUBSUB lane: shared subscriptions with local fan-out, unsubscribe on the last drop, and a
//! subscriber that falls behind loses its subscription instead of growing a buffer.

use std::time::Duration;

use tollgate_lanes::{Multiplexed, Subscription, SubscriptionEnded, SubscriptionKind};

use crate::lanes::{cmd, eventually, Fixture};

async fn publish(fixture: &Fixture, channel: &str, payload: &str) {
    let regular = fixture.lanes.multiplexed(Multiplexed::Regular).unwrap();
    regular
        .send(cmd(&["PUBLISH", channel, payload]))
        .await
        .unwrap();
}

async fn next(subscription: &mut Subscription) -> tollgate_lanes::Message {
    tokio::time::timeout(Duration::from_secs(5), subscription.recv())
        .await
        .expect("a message within 5 s")
        .expect("subscription still open")
}

fn subscribers(fixture: &Fixture, channel: &str) -> String {
    fixture.redis.inline(&format!("PUBSUB NUMSUB {channel}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_subscribers_share_one_redis_subscription() {
    let fixture = Fixture::start(|_| {}).await;
    let pubsub = fixture.lanes.pubsub();
    let mut a = pubsub
        .subscribe(SubscriptionKind::Channel, "news".into(), 8)
        .await
        .unwrap();
    let mut b = pubsub
        .subscribe(SubscriptionKind::Channel, "news".into(), 8)
        .await
        .unwrap();
    let mut p = pubsub
        .subscribe(SubscriptionKind::Pattern, "ne*".into(), 8)
        .await
        .unwrap();
    assert!(
        subscribers(&fixture, "news").contains(":1\r\n"),
        "one Redis subscriber for two local ones"
    );

    publish(&fixture, "news", "hello").await;
    for subscription in [&mut a, &mut b] {
        let message = next(subscription).await;
        assert_eq!(
            (&message.channel[..], &message.payload[..]),
            (&b"news"[..], &b"hello"[..])
        );
    }
    let matched = next(&mut p).await;
    assert_eq!(matched.pattern.as_deref(), Some(&b"ne*"[..]));
    assert_eq!(&matched.payload[..], b"hello");

    drop(a);
    assert!(
        subscribers(&fixture, "news").contains(":1\r\n"),
        "still subscribed for b"
    );
    drop(b);
    assert!(
        eventually(Duration::from_secs(5), || subscribers(&fixture, "news")
            .contains(":0\r\n"))
        .await,
        "the last local subscriber's drop unsubscribes on Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_falls_behind_ends_with_lagged() {
    let fixture = Fixture::start(|_| {}).await;
    let pubsub = fixture.lanes.pubsub();
    let mut slow = pubsub
        .subscribe(SubscriptionKind::Channel, "busy".into(), 2)
        .await
        .unwrap();
    let mut keeping_up = pubsub
        .subscribe(SubscriptionKind::Channel, "busy".into(), 16)
        .await
        .unwrap();
    for i in 0..4 {
        publish(&fixture, "busy", &i.to_string()).await;
    }
    for i in 0..4 {
        assert_eq!(next(&mut keeping_up).await.payload, i.to_string());
    }
    assert_eq!(next(&mut slow).await.payload, "0");
    assert_eq!(next(&mut slow).await.payload, "1");
    assert_eq!(slow.recv().await, Err(SubscriptionEnded::Lagged));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_uses_at_most_its_ceiling_of_connections() {
    let fixture = Fixture::start(|config| config.pubsub.connections = Some(2)).await;
    let pubsub = fixture.lanes.pubsub();
    let mut held = Vec::new();
    for i in 0..20 {
        held.push(
            pubsub
                .subscribe(SubscriptionKind::Channel, format!("c{i}").into(), 4)
                .await
                .unwrap(),
        );
    }
    let connections = fixture.client_ids("tollgate-pubsub").len();
    assert!(
        (1..=2).contains(&connections),
        "{connections} PUBSUB connections, ceiling 2"
    );
}
