//! Leader election and holder watches against the daemon in-process and a real `redis-server`:
//! candidates campaign with `LEASE ACQUIRE … WAIT … VALUE … SESSION`, observers follow with `LEASE
//! WATCH` (RESP2 and RESP3) and the HTTP holders stream, a leader whose connection ends is replaced
//! by a waiting candidate with a higher fence, expiries and renewals are told apart, and watching
//! is admitted and scoped like the other lease commands. Semaphores and read/write leases keep no
//! value and cannot be watched, and say so.

use std::time::Duration;

use tollgate_lease::watch::HolderEvent;
use tollgate_lease_client::{Events, LeaseClient};
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::lease_http::lease_daemon;
use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

const LEADER: &str = "orders:leader";

/// A client on the daemon's RESP socket speaking `protocol` (2 or 3).
async fn client(daemon: &TestDaemon, protocol: u8) -> RawClient {
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    if protocol == 3 {
        assert!(matches!(client.call(&["HELLO", "3"]).await, Frame::Map(_)));
    }
    client
}

/// A reply's or event's fields by name, from a RESP3 map or a RESP2 flat array.
fn fields(frame: &Frame) -> Vec<(String, Frame)> {
    match frame {
        Frame::Map(pairs) => pairs
            .iter()
            .map(|(name, value)| (text(name), value.clone()))
            .collect(),
        Frame::Array(items) if items.len() % 2 == 0 => items
            .chunks(2)
            .map(|pair| (text(&pair[0]), pair[1].clone()))
            .collect(),
        other => panic!("not a map: {other:?}"),
    }
}

fn field(frame: &Frame, name: &str) -> Frame {
    fields(frame)
        .into_iter()
        .find(|(field, _)| field == name)
        .unwrap_or_else(|| panic!("no {name} in {frame:?}"))
        .1
}

fn integer(frame: &Frame, name: &str) -> u64 {
    match field(frame, name) {
        Frame::Integer(n) => u64::try_from(n).expect("a positive integer"),
        other => panic!("{name} is not an integer: {other:?}"),
    }
}

/// What an observer saw, reduced to what every observer must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Free,
    Held(u64, Option<String>),
    Released(u64),
    Expired(u64),
}

impl From<HolderEvent> for Seen {
    fn from(event: HolderEvent) -> Seen {
        match event {
            HolderEvent::Held { fence, value, .. } => Seen::Held(fence, value),
            HolderEvent::Free => Seen::Free,
            HolderEvent::Released { fence } => Seen::Released(fence),
            HolderEvent::Expired { fence } => Seen::Expired(fence),
            other => panic!("the watch lost track: {other:?}"),
        }
    }
}

/// An observer on the RESP socket: `LEASE WATCH` confirmed, then one push per change.
struct Observer {
    client: RawClient,
    resp3: bool,
}

impl Observer {
    async fn watch(daemon: &TestDaemon, protocol: u8, resource: &str) -> Observer {
        let mut client = client(daemon, protocol).await;
        let confirmed = client.call(&["LEASE", "WATCH", resource]).await;
        let items = match (&confirmed, protocol) {
            (Frame::Push(items), 3) | (Frame::Array(items), 2) => items.clone(),
            other => panic!("not a watch confirmation: {other:?}"),
        };
        assert_eq!(
            items,
            vec![
                Frame::Bulk("watch".into()),
                Frame::Bulk(resource.to_owned().into()),
                Frame::Integer(1)
            ]
        );
        Observer {
            client,
            resp3: protocol == 3,
        }
    }

    async fn next(&mut self) -> Seen {
        let frame = self.client.read().await;
        let items = match (&frame, self.resp3) {
            (Frame::Push(items), true) | (Frame::Array(items), false) => items.clone(),
            other => panic!("not a change: {other:?}"),
        };
        assert_eq!(text(&items[0]), "lease", "{frame:?}");
        let event = &items[2];
        let fence = || integer(event, "fence");
        match text(&field(event, "event")).as_str() {
            "free" => Seen::Free,
            "held" => {
                let value = fields(event)
                    .into_iter()
                    .find(|(name, _)| name == "value")
                    .map(|(_, value)| text(&value));
                Seen::Held(fence(), value)
            }
            "released" => Seen::Released(fence()),
            "expired" => Seen::Expired(fence()),
            other => panic!("unexpected event {other}: {frame:?}"),
        }
    }
}

async fn next_http(events: &mut Events<HolderEvent>) -> Seen {
    tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
        .expect("a readable event")
        .into()
}

/// A candidate's campaign: blocks its own connection until elected (or WAIT runs out).
async fn campaign(daemon: &TestDaemon, value: &str) -> RawClient {
    let mut candidate = client(daemon, 2).await;
    candidate
        .send(&[
            "LEASE", "ACQUIRE", LEADER, "1000", "WAIT", "30000", "VALUE", value, "SESSION",
        ])
        .await;
    candidate
}

/// Three candidates, the leader's connection ends twice: each time a waiting candidate is
/// elected with a higher fence, and every observer (RESP2, RESP3, HTTP) sees the same succession.
#[tokio::test]
async fn an_election_survives_its_leaders_deaths_with_ever_higher_fences() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let mut resp2 = Observer::watch(&daemon, 2, LEADER).await;
    let mut resp3 = Observer::watch(&daemon, 3, LEADER).await;
    let http = LeaseClient::new(&daemon.http_socket());
    let mut holders = http
        .holders(&tollgate_lease::Resource::parse(LEADER).unwrap())
        .await
        .unwrap();
    let mut seen = vec![Seen::Free];
    for observed in [
        resp2.next().await,
        resp3.next().await,
        next_http(&mut holders).await,
    ] {
        assert_eq!(observed, Seen::Free);
    }

    let mut candidates = Vec::new();
    for value in ["node-a", "node-b", "node-c"] {
        candidates.push((value, campaign(&daemon, value).await));
        // In this order: the first is elected at once, the others wait in line.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut fences = Vec::new();
    let mut leader = 0;
    for round in 0..3 {
        let (value, candidate) = &mut candidates[leader];
        let elected = candidate.read().await;
        assert_eq!(text(&field(&elected, "outcome")), "acquired", "{elected:?}");
        let fence = integer(&elected, "fence");
        seen.push(Seen::Held(fence, Some(value.to_string())));
        fences.push(fence);
        // The leader, its value and fence, for anyone who asks once.
        let mut asker = client(&daemon, 2).await;
        let leading = asker.call(&["LEASE", "INSPECT", LEADER]).await;
        assert_eq!(integer(&leading, "fence"), fence);
        assert_eq!(text(&field(&leading, "value")), *value);
        if round < 2 {
            // The leader's process dies: its connection ends and its session lease is released.
            let (_, gone) = candidates.remove(leader);
            drop(gone);
            seen.push(Seen::Released(fence));
            leader = 0;
        } else {
            let (owner, op) = (field(&elected, "owner"), field(&elected, "operation_id"));
            let resigned = candidate
                .call(&[
                    "LEASE",
                    "RELEASE",
                    LEADER,
                    "OWNER",
                    &text(&owner),
                    "OP",
                    &text(&op),
                ])
                .await;
            assert_eq!(text(&field(&resigned, "outcome")), "released");
            seen.push(Seen::Released(fence));
        }
    }
    assert!(
        fences.windows(2).all(|pair| pair[1] > pair[0]),
        "every new leader's fence is higher: {fences:?}"
    );
    for observer in [&mut resp2, &mut resp3] {
        let mut got = vec![Seen::Free];
        while got.len() < seen.len() {
            got.push(observer.next().await);
        }
        assert_eq!(got, seen);
    }
    let mut got = vec![Seen::Free];
    while got.len() < seen.len() {
        got.push(next_http(&mut holders).await);
    }
    assert_eq!(got, seen);
    daemon.stop().await;
}

/// A holder that lets its TTL run out is reported expired; one that renews in time is not, and
/// its release is reported as such.
#[tokio::test]
async fn a_watch_tells_an_expiry_from_a_renewal_and_a_release() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let resource = "orders:expiring";
    let mut observer = Observer::watch(&daemon, 3, resource).await;
    assert_eq!(observer.next().await, Seen::Free);
    let mut holder = client(&daemon, 2).await;
    let first = holder
        .call(&[
            "LEASE", "ACQUIRE", resource, "300", "OWNER", "o", "OP", "one",
        ])
        .await;
    let first = integer(&first, "fence");
    assert_eq!(observer.next().await, Seen::Held(first, None));
    assert_eq!(observer.next().await, Seen::Expired(first));

    let second = holder
        .call(&[
            "LEASE", "ACQUIRE", resource, "300", "OWNER", "o", "OP", "two",
        ])
        .await;
    let second = integer(&second, "fence");
    assert!(second > first);
    let renewed = holder
        .call(&[
            "LEASE", "RENEW", resource, "5000", "OWNER", "o", "OP", "two",
        ])
        .await;
    assert_eq!(text(&field(&renewed, "outcome")), "renewed");
    // Past the first TTL: the watch read the holder again and found it renewed.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let released = holder
        .call(&["LEASE", "RELEASE", resource, "OWNER", "o", "OP", "two"])
        .await;
    assert_eq!(text(&field(&released, "outcome")), "released");
    assert_eq!(observer.next().await, Seen::Held(second, None));
    assert_eq!(observer.next().await, Seen::Released(second));
    daemon.stop().await;
}

/// Watching is admitted by the policy's `leases:` rules; in RESP2 a watching connection takes only
/// watch commands, PING, QUIT and RESET until UNWATCH ends the last watch; RESP3 goes on as usual.
#[tokio::test]
async fn watching_is_admitted_and_scoped_like_subscribing() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let mut outsider = client(&daemon, 2).await;
    let denied = outsider.call(&["LEASE", "WATCH", "payroll:run"]).await;
    assert!(
        matches!(&denied, Frame::Error(e) if e.starts_with(b"NOPERM")),
        "{denied:?}"
    );
    let bad = outsider
        .call(&["LEASE", "WATCH", "orders:a", "orders:b"])
        .await;
    assert!(matches!(bad, Frame::Error(_)), "{bad:?}");

    let mut watcher = Observer::watch(&daemon, 2, "orders:scoped").await;
    assert_eq!(watcher.next().await, Seen::Free);
    let refused = watcher.client.call(&["ECHO", "hi"]).await;
    assert!(
        matches!(&refused, Frame::Error(e) if String::from_utf8_lossy(e).contains("LEASE WATCH")),
        "{refused:?}"
    );
    let pong = watcher.client.call(&["PING"]).await;
    assert_eq!(
        pong,
        Frame::Array(vec![Frame::Bulk("pong".into()), Frame::Bulk("".into())])
    );
    let ended = watcher.client.call(&["LEASE", "UNWATCH"]).await;
    assert_eq!(
        ended,
        Frame::Array(vec![
            Frame::Bulk("unwatch".into()),
            Frame::Bulk("orders:scoped".into()),
            Frame::Integer(0)
        ])
    );
    assert_eq!(
        watcher.client.call(&["ECHO", "hi"]).await,
        Frame::Bulk("hi".into())
    );
    // No longer watching: a change is not pushed.
    let mut holder = client(&daemon, 2).await;
    holder
        .call(&["LEASE", "ACQUIRE", "orders:scoped", "5000"])
        .await;
    assert!(
        watcher
            .client
            .read_within(Duration::from_millis(300))
            .await
            .is_err(),
        "nothing arrives after UNWATCH"
    );

    let mut resp3 = Observer::watch(&daemon, 3, "orders:scoped").await;
    assert!(matches!(resp3.next().await, Seen::Held(..)));
    assert_eq!(
        resp3.client.call(&["ECHO", "hi"]).await,
        Frame::Bulk("hi".into())
    );
    daemon.stop().await;
}

/// A resource held as a semaphore or read/write lease has many holders: `VALUE` is refused with
/// them, `LEASE WATCH` of it is refused with the reason (RESP and HTTP), and the shared holders'
/// own calls are unaffected by the exclusive lease's announcements.
#[tokio::test]
async fn shared_shapes_keep_no_value_and_are_not_watched() {
    let redis = RedisServer::start();
    let daemon = lease_daemon(&redis).await;
    let mut holder = client(&daemon, 2).await;
    for shape in [["PERMITS", "2"], ["MODE", "READ"]] {
        let refused = holder
            .call(&[
                "LEASE",
                "ACQUIRE",
                "orders:pool",
                "5000",
                shape[0],
                shape[1],
                "VALUE",
                "x",
            ])
            .await;
        assert!(
            matches!(&refused, Frame::Error(e) if String::from_utf8_lossy(e).contains("only an exclusive lease keeps a value")),
            "{refused:?}"
        );
    }
    let taken = holder
        .call(&["LEASE", "ACQUIRE", "orders:pool", "5000", "PERMITS", "2"])
        .await;
    assert_eq!(text(&field(&taken, "outcome")), "acquired", "{taken:?}");

    let mut watcher = client(&daemon, 2).await;
    let refused = watcher.call(&["LEASE", "WATCH", "orders:pool"]).await;
    assert!(
        matches!(&refused, Frame::Error(e) if String::from_utf8_lossy(e).contains("semaphore or read/write lease")),
        "{refused:?}"
    );
    // Refused, so not in watch mode: anything goes on.
    assert_eq!(
        watcher.call(&["ECHO", "hi"]).await,
        Frame::Bulk("hi".into())
    );
    let http = LeaseClient::new(&daemon.http_socket());
    assert!(
        http.holders(&tollgate_lease::Resource::parse("orders:pool").unwrap())
            .await
            .is_err(),
        "the HTTP stream is refused too"
    );
    let inspected = holder.call(&["LEASE", "INSPECT", "orders:pool"]).await;
    assert_eq!(text(&field(&inspected, "outcome")), "held_shared");
    daemon.stop().await;
}
