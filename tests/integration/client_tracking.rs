//! `CLIENT TRACKING` served by the daemon to its own clients (issue 29), against a real
//! redis-server: a client is told of a key it read when anyone changes it — a client of the
//! daemon (at once, after the write's reply) or a client straight to Redis (once Redis's
//! invalidation reaches the daemon) — in RESP3 pushes or, redirected, as RESP2 messages on
//! `__redis__:invalidate`; BCAST prefixes, OPTIN, flushes; and never of a key its principal may
//! not read, nor through a session of another principal.

use std::time::Duration;

use bytes::Bytes;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::identity::{os_user, run_as, OsUser};
use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

/// How long an invalidation from Redis may take to arrive (polled, never slept).
const ARRIVES: Duration = Duration::from_secs(5);

fn ok() -> Frame {
    Frame::Simple(Bytes::from_static(b"OK"))
}

fn bulk(text: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(text.as_bytes()))
}

/// An `invalidate` push of `keys` (`None`: everything).
fn invalidate(keys: Option<&[&str]>) -> Frame {
    let keys = match keys {
        Some(keys) => Frame::Array(keys.iter().map(|key| bulk(key)).collect()),
        None => Frame::Null3,
    };
    Frame::Push(vec![bulk("invalidate"), keys])
}

/// A RESP3 client of the daemon, tracking with `options`.
async fn tracking(daemon: &TestDaemon, options: &[&str]) -> RawClient {
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let hello = client.call(&["HELLO", "3"]).await;
    assert!(matches!(hello, Frame::Map(_)), "{hello:?}");
    let mut argv = vec!["CLIENT", "TRACKING", "ON"];
    argv.extend_from_slice(options);
    assert_eq!(client.call(&argv).await, ok(), "{argv:?}");
    client
}

/// The next frame, which must come within [`ARRIVES`].
async fn next(client: &mut RawClient) -> Frame {
    match client.read_within(ARRIVES).await {
        Ok(Some(frame)) => frame,
        other => panic!("nothing arrived within {ARRIVES:?}: {other:?}"),
    }
}

/// Nothing more arrives for a while (after something that would have come before it did).
async fn silent(client: &mut RawClient, why: &str) {
    let got = client.read_within(Duration::from_millis(300)).await;
    assert_eq!(got, Err(()), "{why}");
}

#[tokio::test]
async fn a_key_read_through_the_daemon_is_invalidated_when_anyone_writes_it() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut reader = tracking(&daemon, &[]).await;
    let mut writer = RawClient::connect(&daemon.resp_socket()).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    assert_eq!(writer.call(&["SET", "user:1", "v1"]).await, ok());
    assert_eq!(reader.call(&["GET", "user:1"]).await, bulk("v1"));

    // A write straight to Redis: told once Redis's invalidation reaches the daemon.
    assert_eq!(direct.call(&["SET", "user:1", "v2"]).await, ok());
    assert_eq!(next(&mut reader).await, invalidate(Some(&["user:1"])));
    // Told once per read: not again until it is read again.
    assert_eq!(direct.call(&["SET", "user:1", "v3"]).await, ok());
    silent(&mut reader, "the key was not read again").await;

    // Read again; a write by another client of the daemon.
    assert_eq!(reader.call(&["GET", "user:1"]).await, bulk("v3"));
    assert_eq!(writer.call(&["SET", "user:1", "v4"]).await, ok());
    assert_eq!(next(&mut reader).await, invalidate(Some(&["user:1"])));
    // Redis tells the daemon too: the second is not passed on (the key is no longer tracked).
    silent(&mut reader, "one write, one invalidation").await;

    // An expiry in Redis is a change too.
    assert_eq!(reader.call(&["GET", "user:1"]).await, bulk("v4"));
    assert_eq!(
        direct.call(&["PEXPIRE", "user:1", "1"]).await,
        Frame::Integer(1)
    );
    assert_eq!(next(&mut reader).await, invalidate(Some(&["user:1"])));
    daemon.stop().await;
}

/// The client's own write: its reply first, then the invalidation (Redis's order), so that a
/// client that reads the key after the reply never reads its old cached value.
#[tokio::test]
async fn a_clients_own_write_is_invalidated_right_after_its_reply() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = tracking(&daemon, &[]).await;
    assert_eq!(client.call(&["SET", "k", "1"]).await, ok());
    assert_eq!(client.call(&["GET", "k"]).await, bulk("1"));
    client.pipeline(&[&["INCR", "k"], &["PING"]]).await;
    assert_eq!(client.read().await, Frame::Integer(2));
    let after = [client.read().await, client.read().await];
    assert!(
        after
            == [
                invalidate(Some(&["k"])),
                Frame::Simple(Bytes::from_static(b"PONG"))
            ]
            || after
                == [
                    Frame::Simple(Bytes::from_static(b"PONG")),
                    invalidate(Some(&["k"]))
                ],
        "the invalidation comes after INCR's reply: {after:?}"
    );
    // NOLOOP: not told of its own write, neither by the daemon nor by Redis's invalidation of it.
    let mut noloop = tracking(&daemon, &["NOLOOP"]).await;
    assert_eq!(noloop.call(&["GET", "k"]).await, bulk("2"));
    assert_eq!(noloop.call(&["SET", "k", "3"]).await, ok());
    silent(&mut noloop, "NOLOOP: its own write is not told").await;
    // Another client's write is (read again first: its own write took it out of the table).
    assert_eq!(noloop.call(&["GET", "k"]).await, bulk("3"));
    assert_eq!(client.call(&["SET", "k", "4"]).await, ok());
    assert_eq!(next(&mut noloop).await, invalidate(Some(&["k"])));
    daemon.stop().await;
}

/// An invalidation that overtakes the reply of a read in flight waits for it: the client gets
/// the (possibly old) value, then the invalidation that drops it.
#[tokio::test]
async fn an_invalidation_waits_behind_the_replies_in_flight() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = tracking(&daemon, &[]).await;
    let mut writer = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(writer.call(&["SET", "k", "1"]).await, ok());
    for round in 0..50 {
        // The read, then at once a write from elsewhere: whichever Redis runs first, the client
        // must end with the invalidation after the read's reply.
        client.send(&["GET", "k"]).await;
        writer.send(&["INCR", "k"]).await;
        let reply = client.read().await;
        assert!(matches!(reply, Frame::Bulk(_)), "round {round}: {reply:?}");
        assert!(matches!(writer.read().await, Frame::Integer(_)));
        assert_eq!(
            next(&mut client).await,
            invalidate(Some(&["k"])),
            "round {round}"
        );
        // Redis's own invalidation of the same write may follow, once: drain it before the
        // next round (a second GET tracks the key again).
        let _ = client.read_within(Duration::from_millis(20)).await;
    }
    daemon.stop().await;
}

#[tokio::test]
async fn resp2_clients_are_told_through_a_redirect_to_a_subscriber_of_redis_invalidate() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut listener = RawClient::connect(&daemon.resp_socket()).await;
    let Frame::Integer(listener_id) = listener.call(&["CLIENT", "ID"]).await else {
        panic!("CLIENT ID")
    };
    let subscribed = listener.call(&["SUBSCRIBE", "__redis__:invalidate"]).await;
    assert!(matches!(subscribed, Frame::Array(_)), "{subscribed:?}");
    let mut reader = RawClient::connect(&daemon.resp_socket()).await;
    let id = listener_id.to_string();
    assert_eq!(
        reader
            .call(&["CLIENT", "TRACKING", "on", "REDIRECT", &id])
            .await,
        ok()
    );
    assert_eq!(
        reader.call(&["CLIENT", "GETREDIR"]).await,
        Frame::Integer(listener_id)
    );
    assert_eq!(reader.call(&["GET", "a"]).await, Frame::Null);
    let mut direct = RawClient::to_redis(redis.socket()).await;
    assert_eq!(direct.call(&["SET", "a", "1"]).await, ok());
    assert_eq!(
        next(&mut listener).await,
        Frame::Array(vec![
            bulk("message"),
            bulk("__redis__:invalidate"),
            Frame::Array(vec![bulk("a")])
        ])
    );
    // The tracking client's own write through the daemon, as Redis's suite does it.
    assert_eq!(reader.call(&["SET", "b", "1"]).await, ok());
    assert_eq!(reader.call(&["GET", "b"]).await, bulk("1"));
    assert_eq!(reader.call(&["INCR", "b"]).await, Frame::Integer(2));
    assert_eq!(
        next(&mut listener).await,
        Frame::Array(vec![
            bulk("message"),
            bulk("__redis__:invalidate"),
            Frame::Array(vec![bulk("b")])
        ])
    );
    // A flush of Redis: the null invalidation.
    assert_eq!(reader.call(&["GET", "a"]).await, bulk("1"));
    assert_eq!(direct.call(&["FLUSHALL"]).await, ok());
    assert_eq!(
        next(&mut listener).await,
        Frame::Array(vec![
            bulk("message"),
            bulk("__redis__:invalidate"),
            Frame::Null
        ])
    );
    // The redirect target gone: TRACKINGINFO says the redirect is broken once it is used.
    drop(listener);
    assert_eq!(reader.call(&["GET", "a"]).await, Frame::Null);
    assert_eq!(direct.call(&["SET", "a", "2"]).await, ok());
    let broken = tokio::time::timeout(ARRIVES, async {
        loop {
            let info = text(&reader.call(&["CLIENT", "TRACKINGINFO"]).await);
            if info.contains("broken_redirect") {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(broken.is_ok(), "the redirect was never found broken");
    daemon.stop().await;
}

#[tokio::test]
async fn bcast_tells_every_key_under_a_prefix_and_optin_only_what_was_asked_for() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut bcast = tracking(&daemon, &["BCAST", "PREFIX", "user:"]).await;
    let mut optin = tracking(&daemon, &["OPTIN"]).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;

    assert_eq!(optin.call(&["GET", "user:untracked"]).await, Frame::Null3);
    assert_eq!(optin.call(&["CLIENT", "CACHING", "yes"]).await, ok());
    assert_eq!(optin.call(&["GET", "user:cached"]).await, Frame::Null3);

    direct
        .pipeline(&[
            &["SET", "user:untracked", "1"],
            &["SET", "other", "1"],
            &["SET", "user:cached", "1"],
        ])
        .await;
    for _ in 0..3 {
        assert_eq!(direct.read().await, ok());
    }
    // BCAST: each key under its prefix, whoever read it (here, no one through BCAST).
    let mut told = Vec::new();
    while told.len() < 2 {
        match next(&mut bcast).await {
            Frame::Push(items) => match &items[1] {
                Frame::Array(keys) => told.extend(keys.iter().map(text)),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }
    told.sort();
    assert_eq!(told, ["user:cached", "user:untracked"]);
    silent(&mut bcast, "`other` is under no prefix").await;
    // OPTIN: only the read after CACHING yes.
    assert_eq!(next(&mut optin).await, invalidate(Some(&["user:cached"])));
    silent(&mut optin, "the read without CACHING yes was not tracked").await;

    // Tracking off: nothing more.
    assert_eq!(bcast.call(&["CLIENT", "TRACKING", "off"]).await, ok());
    assert_eq!(direct.call(&["SET", "user:2", "1"]).await, ok());
    silent(&mut bcast, "tracking is off").await;
    daemon.stop().await;
}

#[tokio::test]
async fn redis_invalidation_connection_comes_and_goes_with_the_tracking_clients() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut direct = RawClient::to_redis(redis.socket()).await;
    let open = |list: &Frame| text(list).contains("name=tollgate-invalidations");
    assert!(!open(&direct.call(&["CLIENT", "LIST"]).await));
    let client = tracking(&daemon, &[]).await;
    // Open before TRACKING ON answered.
    assert!(open(&direct.call(&["CLIENT", "LIST"]).await));
    drop(client);
    let closed = tokio::time::timeout(ARRIVES, async {
        while open(&direct.call(&["CLIENT", "LIST"]).await) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the connection outlived the last tracking client"
    );

    // Lost while a client tracks: the client is told that everything changed.
    let mut client = tracking(&daemon, &[]).await;
    assert_eq!(client.call(&["GET", "k"]).await, Frame::Null3);
    let killed = direct
        .call(&["CLIENT", "KILL", "USER", "tollgate-regular"])
        .await;
    assert!(matches!(killed, Frame::Integer(n) if n >= 1), "{killed:?}");
    assert_eq!(next(&mut client).await, invalidate(None));
    daemon.stop().await;
}

/// A tenant hears only of keys its rules let it read, whatever prefix it broadcasts on, and may
/// not redirect its invalidations to a session of another principal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_never_told_of_keys_it_may_not_read() {
    let (Some(acme), Some(globex)) = (os_user("tollgate-acme"), os_user("tollgate-globex")) else {
        return;
    };
    let daemon = crate::scopes_daemon::tenants_daemon(&acme, &globex).await.0;
    // A session acme may not name: root's.
    let mut other = RawClient::connect(&daemon.resp_socket()).await;
    let Frame::Integer(other_id) = other.call(&["CLIENT", "ID"]).await else {
        panic!("CLIENT ID")
    };
    let listening = tokio::spawn({
        let socket = daemon.resp_socket();
        async move { listen_as(&acme, &socket, other_id).await }
    });
    // Both keys written over and over while acme listens, straight to Redis: whenever its
    // tracking came on, it hears of its own key and never of globex's.
    let mut redis = crate::support::daemon::embedded_admin(&daemon.dir().join("run")).await;
    while !listening.is_finished() {
        for key in ["globex:secret", "acme:mine"] {
            assert_eq!(redis.call(&["SET", key, "1"]).await, ok());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let heard = listening.await.unwrap();
    assert!(
        heard.contains("-ERR The client ID you want redirect to does not exist"),
        "{heard}"
    );
    assert!(
        heard.contains("invalidate") && heard.contains("acme:mine"),
        "{heard}"
    );
    assert!(!heard.contains("globex:secret"), "{heard}");
    daemon.stop().await;
}

/// What a RESP3 client of `user` was answered and pushed within 2 s: it tries to redirect to
/// session `other`, then broadcasts on every key.
async fn listen_as(user: &OsUser, socket: &std::path::Path, other: i64) -> String {
    let script = format!(
        r#"
import socket, time
s = socket.socket(socket.AF_UNIX)
s.connect({socket:?})
def send(*argv):
    s.sendall(("*%d\r\n" % len(argv) + "".join("$%d\r\n%s\r\n" % (len(a), a) for a in argv)).encode())
send("HELLO", "3")
send("CLIENT", "TRACKING", "ON", "REDIRECT", "{other}")
send("CLIENT", "TRACKING", "ON", "BCAST")
s.settimeout(0.2)
got = b""
end = time.time() + 2
while time.time() < end:
    try:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    except socket.timeout:
        pass
print(got.decode(errors="replace"))
"#,
        socket = socket.display().to_string()
    );
    let output = run_as(user, "/usr/bin/python3", &["-c", &script]).await;
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// On a Redis Cluster: one invalidation connection per master, so a key written straight to the
/// master that holds it is told, whichever master that is; a key whose slot moved is told by its
/// new master; a failover replaces the connections, and every tracking client is told that
/// everything may have changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_every_master_tells_and_a_failover_drops_everything() {
    let cluster = crate::cluster::cluster().await;
    let daemon = TestDaemon::start_cluster(&cluster, tollgate_lanes::Splitting::Split).await;
    let mut reader = tracking(&daemon, &[]).await;
    let keys = crate::cluster::keys_on_every_master(&cluster, "csc", 1);
    for key in &keys {
        assert_eq!(reader.call(&["GET", key]).await, Frame::Null3);
        let slot = tollgate_lanes::Slot::of(key.as_bytes()).number();
        let master = cluster.master_of(slot);
        assert_eq!(cluster.call(master, &["SET", key, "1"]), ok());
        assert_eq!(
            next(&mut reader).await,
            invalidate(Some(&[key.as_str()])),
            "{key} on master {master}"
        );
    }

    // The first key's slot moves to another master; read again, then written there.
    let key = &keys[0];
    let slot = tollgate_lanes::Slot::of(key.as_bytes()).number();
    let (from, to) = (
        cluster.master_of(slot),
        cluster.master_of(tollgate_lanes::Slot::of(keys[1].as_bytes()).number()),
    );
    assert_eq!(reader.call(&["GET", key]).await, bulk("1"));
    cluster.begin_migration(slot, from, to);
    cluster.migrate_keys(slot, from, to);
    cluster.finish_migration(slot, to);
    // The move itself changes the key on both masters: told (once or more).
    assert_eq!(next(&mut reader).await, invalidate(Some(&[key.as_str()])));
    while reader.read_within(Duration::from_millis(300)).await.is_ok() {}
    assert_eq!(reader.call(&["GET", key]).await, bulk("1"));
    assert_eq!(cluster.call(to, &["SET", key, "2"]), ok());
    assert_eq!(next(&mut reader).await, invalidate(Some(&[key.as_str()])));

    // A failover: the masters change, the connections are replaced, everything is dropped.
    let master = cluster.master_of(tollgate_lanes::Slot::of(keys[2].as_bytes()).number());
    let replica = cluster.replicas_of(master)[0];
    cluster.failover(replica);
    let told = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if reader.read().await == invalidate(None) {
                return;
            }
        }
    })
    .await;
    assert!(
        told.is_ok(),
        "no invalidation of everything after the failover"
    );
    // The promoted replica tells too, once its connection is open (until then, each opening
    // drops everything again: read, write there, and wait to be told).
    let key = keys[2].as_str();
    let heard = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            // Invalidations of everything may still come between the replies.
            reader.send(&["GET", key]).await;
            while matches!(reader.read().await, Frame::Push(_)) {}
            let wrote = cluster.call(replica, &["INCR", key]);
            assert!(matches!(wrote, Frame::Integer(_)), "{wrote:?}");
            while let Ok(Some(frame)) = reader.read_within(Duration::from_millis(300)).await {
                if frame == invalidate(Some(&[key])) {
                    return;
                }
            }
        }
    })
    .await;
    assert!(heard.is_ok(), "the promoted master never told of a write");
    daemon.stop().await;
}

/// A Sentinel switch: the invalidation connection leaves the demoted master for the new one, and
/// a tracking client is told that everything may have changed; a write straight to the new
/// master is told afterwards. (Two worker threads: `wait_until` blocks the one it runs on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_switch_moves_the_invalidation_connection_and_drops_everything() {
    use crate::lanes_sentinel::wait_until;
    let (master, replica, sentinel) = crate::cache::sentinel_group();
    let daemon = TestDaemon::start_redis_with(
        tollgate_lanes::RedisConfig::sentinel("mymaster", vec![sentinel.endpoint()]),
        &[&master, &replica],
        |_| {},
    )
    .await;
    let feeds = |server: &RedisServer| {
        server
            .inline("CLIENT LIST")
            .contains(" name=tollgate-invalidations ")
    };
    let mut client = tracking(&daemon, &[]).await;
    assert!(feeds(&master) && !feeds(&replica));
    assert_eq!(client.call(&["GET", "k"]).await, Frame::Null3);

    assert_eq!(
        sentinel.ask("SENTINEL FAILOVER mymaster").as_deref(),
        Some("+OK\r\n")
    );
    let told = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if client.read().await == invalidate(None) {
                return;
            }
        }
    })
    .await;
    assert!(
        told.is_ok(),
        "no invalidation of everything after the switch"
    );
    assert!(
        wait_until(Duration::from_secs(30), || feeds(&replica)
            && !feeds(&master)),
        "the invalidation connection stayed on the old master: {} / {}",
        master.inline("CLIENT LIST"),
        replica.inline("CLIENT LIST")
    );
    // The new master's writes are told: read (again, past any further null), write, be told.
    let heard = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            client.send(&["GET", "k"]).await;
            while matches!(client.read().await, Frame::Push(_)) {}
            assert!(replica.inline("INCR k").starts_with(':'));
            while let Ok(Some(frame)) = client.read_within(Duration::from_millis(300)).await {
                if frame == invalidate(Some(&["k"])) {
                    return;
                }
            }
        }
    })
    .await;
    assert!(heard.is_ok(), "the new master's write was never told");
    daemon.stop().await;
}
