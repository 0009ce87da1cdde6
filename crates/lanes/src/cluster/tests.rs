//! The cluster pieces against a real local cluster ([`RedisCluster`]): the map read from live
//! `CLUSTER SHARDS` replies, redirects provoked on real nodes, and the refresher across a failover
//! and beside a stale node. They live inside the crate because what they test is `pub(crate)`.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::task::JoinSet;
use tollgate_resp::Frame;
use tollgate_testkit::RedisCluster;

use super::map::SlotMap;
use super::redirect::{redirect, Redirect};
use super::refresh::{fetch_view, ClusterMap, FetchFailure, View};
use super::Slot;
use crate::connector::Credentials;
use crate::life::Life;
use crate::stream::Stream;
use crate::Endpoint;

/// How long anything here may take before the test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

fn endpoint(cluster: &RedisCluster, node: usize) -> Endpoint {
    Endpoint::Tcp {
        host: "127.0.0.1".into(),
        port: cluster.node(node).port(),
    }
}

/// A sample of keys: plain ones and hash-tagged ones.
fn sample_keys() -> Vec<String> {
    (0..60)
        .map(|i| format!("key:{i}"))
        .chain((0..20).map(|i| format!("{{user{i}}}.followers")))
        .collect()
}

/// Asks `node` over TCP, after `HELLO <protocol>` when one is given.
async fn ask(node: &Endpoint, protocol: Option<&str>, argv: &[&str]) -> Frame {
    let mut stream = Stream::connect(node).await.unwrap();
    let mut read = BytesMut::new();
    let version = protocol.unwrap_or("2");
    let (user, password) = (
        tollgate_testkit::ADMIN_USER,
        tollgate_testkit::admin_password(),
    );
    let greeting = stream
        .exchange(&mut read, &["HELLO", version, "AUTH", user, password])
        .await
        .unwrap();
    assert!(!greeting.is_error(), "{greeting:?}");
    stream.exchange(&mut read, argv).await.unwrap()
}

/// Waits until the map holds a view that `wanted` accepts, asking for a refresh each time round.
async fn view_where(map: &ClusterMap, wanted: impl Fn(&View) -> bool) -> Arc<View> {
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(view) = map.current().filter(|view| wanted(view)) {
                return view;
            }
            map.refresh_soon();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    match waited.await {
        Ok(view) => view,
        Err(_) => panic!(
            "no such view within {PATIENCE:?}; holding {:?}",
            map.current()
        ),
    }
}

/// The same master for every slot and the same replicas for every master. (`CLUSTER SLOTS` names
/// no node beyond those, so the nodes to ask may differ.)
fn assert_same_routes(a: &SlotMap, b: &SlotMap) {
    for number in 0..super::SLOT_COUNT {
        let slot = Slot::new(number).unwrap();
        assert_eq!(a.master_of(slot), b.master_of(slot), "slot {slot}");
    }
    assert!(a.masters().eq(b.masters()), "{a:?}\n{b:?}");
    for master in a.masters() {
        assert_eq!(a.replicas_of(master), b.replicas_of(master), "{master}");
    }
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_map_of_a_live_cluster_matches_cluster_slots_and_every_nodes_keyslot() {
    let cluster = Arc::new(blocking(|| RedisCluster::start(3, 1)).await);
    let node = endpoint(&cluster, 0);
    let resp2 = ask(&node, None, &["CLUSTER", "SHARDS"]).await;
    let resp3 = ask(&node, Some("3"), &["CLUSTER", "SHARDS"]).await;
    assert!(
        matches!(&resp3, Frame::Array(shards) if matches!(shards.first(), Some(Frame::Map(_)))),
        "RESP3 shards are maps: {resp3:?}"
    );
    let map = SlotMap::from_shards(&resp2, &node).unwrap();
    assert_eq!(SlotMap::from_shards(&resp3, &node).unwrap(), map);
    let slots = ask(&node, None, &["CLUSTER", "SLOTS"]).await;
    assert_same_routes(&SlotMap::from_slots(&slots, &node).unwrap(), &map);

    assert_eq!(map.covered(), 16384);
    let masters: Vec<Endpoint> = cluster
        .masters()
        .iter()
        .map(|&m| endpoint(&cluster, m))
        .collect();
    let mut listed: Vec<Endpoint> = map.masters().cloned().collect();
    listed.sort_by_key(|e| e.to_string());
    let mut expected = masters.clone();
    expected.sort_by_key(|e| e.to_string());
    assert_eq!(listed, expected);
    for &master in &cluster.masters() {
        let replicas: Vec<Endpoint> = cluster
            .replicas_of(master)
            .iter()
            .map(|&r| endpoint(&cluster, r))
            .collect();
        assert_eq!(map.replicas_of(&endpoint(&cluster, master)), replicas);
    }
    assert_eq!(map.nodes().len(), 6);

    for key in sample_keys() {
        let slot = Slot::of(key.as_bytes());
        for index in 0..cluster.nodes().len() {
            assert_eq!(
                cluster.call(index, &["CLUSTER", "KEYSLOT", &key]),
                Frame::Integer(slot.number().into()),
                "{key} on node {index}"
            );
        }
        assert_eq!(
            map.master_of(slot),
            Some(&endpoint(&cluster, cluster.master_of(slot.number()))),
            "{key}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_and_ask_replies_name_the_nodes_the_map_names() {
    let cluster = Arc::new(blocking(|| RedisCluster::start(3, 0)).await);
    let asked = endpoint(&cluster, 0);
    let map = fetch_view(&asked, Some(&admin()), PATIENCE)
        .await
        .unwrap()
        .map;

    // MOVED: a key whose slot another master serves.
    let key = sample_keys()
        .into_iter()
        .filter(|key| !key.contains('{'))
        .find(|key| map.master_of(Slot::of(key.as_bytes())) != Some(&asked))
        .unwrap();
    let slot = Slot::of(key.as_bytes());
    let reply = cluster.inline(0, &format!("GET {key}"));
    assert_eq!(
        redirect(reply.as_bytes(), &asked),
        Some(Redirect::Moved {
            slot,
            to: map.master_of(slot).unwrap().clone()
        }),
        "{reply}"
    );

    // ASK: while the slot migrates, a key not on the old owner is looked for on the new one.
    let from = cluster.master_of(slot.number());
    let to = (0..3).find(|&m| m != from).unwrap();
    let (kept, missing) = (format!("{{{key}}}.kept"), format!("{{{key}}}.missing"));
    assert_eq!(cluster.inline(from, &format!("SET {kept} v")), "+OK\r\n");
    let (moving, s) = (cluster.clone(), slot.number());
    blocking(move || moving.begin_migration(s, from, to)).await;
    assert_eq!(cluster.inline(from, &format!("GET {kept}")), "$1\r\nv\r\n");
    let reply = cluster.inline(from, &format!("GET {missing}"));
    assert_eq!(
        redirect(reply.as_bytes(), &endpoint(&cluster, from)),
        Some(Redirect::Ask {
            slot,
            to: endpoint(&cluster, to)
        }),
        "{reply}"
    );

    // Once the keys moved and the slot is handed over, the old owner says MOVED and its map agrees.
    let moving = cluster.clone();
    let moved = blocking(move || {
        let moved = moving.migrate_keys(s, from, to);
        moving.finish_migration(s, to);
        moved
    })
    .await;
    assert_eq!(moved, 1);
    let reply = cluster.inline(from, &format!("GET {kept}"));
    assert_eq!(
        redirect(reply.as_bytes(), &endpoint(&cluster, from)),
        Some(Redirect::Moved {
            slot,
            to: endpoint(&cluster, to)
        }),
        "{reply}"
    );
    let view = fetch_view(&endpoint(&cluster, from), Some(&admin()), PATIENCE)
        .await
        .unwrap();
    assert_eq!(view.map.master_of(slot), Some(&endpoint(&cluster, to)));
    assert_eq!(view.map.covered(), 16384);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_refreshed_view_names_the_promoted_node_at_a_higher_epoch() {
    let cluster = Arc::new(parking_lot::Mutex::new(
        blocking(|| RedisCluster::start(3, 1)).await,
    ));
    let (seed, master, replica) = {
        let cluster = cluster.lock();
        let master = cluster.master_of(0);
        let replica = cluster.replicas_of(master)[0];
        (endpoint(&cluster, master), master, replica)
    };
    let life = Arc::new(Life::new());
    let mut drivers = JoinSet::new();
    let map = ClusterMap::start(vec![seed.clone()], Some(admin()), &life, &mut drivers);
    let before = map.ready(PATIENCE).await.unwrap();
    assert_eq!(before.map.master_of(Slot::new(0).unwrap()), Some(&seed));

    // The master crashes, and its replica is promoted without it.
    let promoting = cluster.clone();
    blocking(move || {
        let mut cluster = promoting.lock();
        cluster.kill(master);
        cluster.failover(replica);
    })
    .await;
    let promoted = endpoint(&cluster.lock(), replica);
    // Once the others mark the dead master failed, it is no longer named at all.
    let after = view_where(&map, |view| {
        view.map.master_of(Slot::new(0).unwrap()) == Some(&promoted)
            && !view.map.nodes().contains(&seed)
    })
    .await;
    assert!(
        after.epoch > before.epoch,
        "{} then {}",
        before.epoch,
        after.epoch
    );
    assert!(after.generation > before.generation);
    assert_eq!(after.map.covered(), 16384);
    assert_eq!(after.map.masters().len(), 3);

    life.start_draining();
    tokio::time::timeout(PATIENCE, drivers.join_next())
        .await
        .expect("the refresher stops when the lanes drain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresher_hearing_a_stale_node_keeps_the_current_view() {
    let current = Arc::new(blocking(|| RedisCluster::start(3, 1)).await);
    // A node of another, older cluster: epoch 1 against the current cluster's 6, and a full map.
    let stale = blocking(|| RedisCluster::start(1, 0)).await;
    let stale_node = endpoint(&stale, 0);
    let stale_view = fetch_view(&stale_node, Some(&admin()), PATIENCE)
        .await
        .unwrap();
    let current_view = fetch_view(&endpoint(&current, 0), Some(&admin()), PATIENCE)
        .await
        .unwrap();
    assert!(stale_view.epoch < current_view.epoch);
    assert_eq!(stale_view.map.covered(), 16384);

    let life = Arc::new(Life::new());
    let mut drivers = JoinSet::new();
    let seeds = vec![stale_node.clone(), endpoint(&current, 0)];
    let map = ClusterMap::start(seeds, Some(admin()), &life, &mut drivers);
    map.ready(PATIENCE).await.unwrap();
    // Until the stale node has been heard in several refreshes, each view held is the current one.
    let asked = |stale: &RedisCluster| {
        stale
            .commandstats(0)
            .get("cluster|shards")
            .map_or(0, |calls| calls.calls)
    };
    let heard_before = asked(&stale);
    tokio::time::timeout(PATIENCE, async {
        while asked(&stale) < heard_before + 3 {
            let held = map.current().unwrap();
            assert_eq!(held.epoch, current_view.epoch);
            assert_eq!(held.map, current_view.map);
            map.refresh_soon();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the stale node is asked in some refreshes");
    assert_eq!(map.current().unwrap().map, current_view.map);
    life.start_draining();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_refresh_requests_costs_one_refresh() {
    let cluster = Arc::new(blocking(|| RedisCluster::start(3, 0)).await);
    let life = Arc::new(Life::new());
    let mut drivers = JoinSet::new();
    let seeds = (0..3).map(|n| endpoint(&cluster, n)).collect();
    let map = ClusterMap::start(seeds, Some(admin()), &life, &mut drivers);
    map.ready(PATIENCE).await.unwrap();
    let asked = |cluster: &RedisCluster| -> u64 {
        (0..3)
            .map(|n| {
                cluster
                    .commandstats(n)
                    .get("cluster|shards")
                    .map_or(0, |c| c.calls)
            })
            .sum()
    };
    let before = asked(&cluster);
    for _ in 0..1000 {
        map.refresh_soon();
    }
    // One refresh asks all three nodes; wait for it, then give a second one the time to show up.
    tokio::time::timeout(PATIENCE, async {
        while asked(&cluster) < before + 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a refresh follows the requests");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(asked(&cluster), before + 3);
    life.start_draining();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetching_a_view_authenticates_with_the_credentials_given() {
    let cluster = blocking(|| RedisCluster::start(1, 0)).await;
    let user = "ACL SETUSER mapper on >secret +hello +cluster|info +cluster|shards";
    assert_eq!(cluster.inline(0, user), "+OK\r\n");
    assert_eq!(cluster.inline(0, "ACL SETUSER default off"), "+OK\r\n");
    let node = endpoint(&cluster, 0);
    let credentials = |password: &str| Credentials {
        user: "mapper".into(),
        password: password.into(),
    };
    let view = fetch_view(&node, Some(&credentials("secret")), PATIENCE)
        .await
        .unwrap();
    assert_eq!(view.map.master_of(Slot::new(7).unwrap()), Some(&node));
    for refused in [
        fetch_view(&node, Some(&credentials("wrong")), PATIENCE).await,
        fetch_view(&node, None, PATIENCE).await,
    ] {
        let error = refused.unwrap_err();
        assert!(
            matches!(&error.failure, FetchFailure::HelloRefused(_)),
            "{error}"
        );
    }
}

/// A master that dies and is replaced: once the slot map no longer names it, its lanes are closed
/// (drained), and commands for its slots, on the same channel, go to the promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lanes_of_a_node_the_map_no_longer_names_are_closed() {
    let cluster = Arc::new(parking_lot::Mutex::new(
        blocking(|| RedisCluster::start(3, 1)).await,
    ));
    let (seeds, master, replica, config) = {
        let cluster = cluster.lock();
        let config = as_testkit_admin(&cluster, crate::LanesConfig::default());
        let master = cluster.master_of(0);
        let replica = cluster.replicas_of(master)[0];
        let seeds = (0..cluster.nodes().len())
            .map(|n| endpoint(&cluster, n))
            .collect();
        (seeds, master, replica, config)
    };
    let topology = crate::Topology::Cluster {
        seeds,
        split: crate::Splitting::Split,
        retry_for: Duration::from_secs(10),
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let lanes = crate::Lanes::open(&topology, &config, &mut registry).unwrap();
    let channel = lanes.multiplexed(crate::Multiplexed::Regular).unwrap();
    let set = |key: String| {
        let mut command = BytesMut::new();
        tollgate_resp::encode_command(&["SET", &key, "1"], &mut command);
        let route = crate::Route::Slot(Slot::of(key.as_bytes()));
        channel.send_to(route, command.freeze())
    };
    // A key on every master opens every master's lanes.
    for n in 0..60 {
        let reply = set(format!("spread:{n}")).await.unwrap();
        assert_eq!(&reply.bytes()[..], b"+OK\r\n");
    }
    let cluster_lanes = lanes.cluster().expect("a cluster's lanes");
    let dead = endpoint(&cluster.lock(), master);
    assert!(cluster_lanes.opened_node(&dead).is_some());

    let promoting = cluster.clone();
    blocking(move || {
        let mut cluster = promoting.lock();
        cluster.kill(master);
        cluster.failover(replica);
    })
    .await;
    let closed = tokio::time::timeout(PATIENCE, async {
        loop {
            cluster_lanes.refresh_soon();
            if cluster_lanes.opened_node(&dead).is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "the dead master's lanes are still open");
    // The same channel goes on, its commands for the dead master's slots on the promoted one.
    let key = (0..)
        .map(|n| format!("after:{n}"))
        .find(|key| Slot::of(key.as_bytes()).number() < 100)
        .unwrap();
    let reply = set(key.clone()).await.unwrap();
    assert_eq!(&reply.bytes()[..], b"+OK\r\n");
    let promoted = endpoint(&cluster.lock(), replica);
    assert!(cluster_lanes.opened_node(&promoted).is_some());
    assert_eq!(
        cluster.lock().inline(replica, &format!("GET {key}")),
        "$1\r\n1\r\n"
    );
    lanes.close(Duration::from_secs(5)).await;
}

/// Lanes over a fresh cluster of three masters, with `config`.
async fn cluster_lanes(config: crate::LanesConfig) -> (RedisCluster, crate::Lanes) {
    let cluster = blocking(|| RedisCluster::start(3, 0)).await;
    let seeds = (0..cluster.nodes().len())
        .map(|n| endpoint(&cluster, n))
        .collect();
    let topology = crate::Topology::Cluster {
        seeds,
        split: crate::Splitting::Split,
        retry_for: Duration::from_secs(10),
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let config = as_testkit_admin(&cluster, config);
    let lanes = crate::Lanes::open(&topology, &config, &mut registry).unwrap();
    (cluster, lanes)
}

/// A slot on each of the three masters (the test kit's cluster splits the slots evenly).
fn one_slot_per_master() -> [crate::Route; 3] {
    [0, 8000, 16000].map(|slot| crate::Route::Slot(Slot::new(slot).unwrap()))
}

/// Fails with `why` unless `borrowed` was refused for `cause`.
fn assert_saturated(
    borrowed: Result<crate::Borrowed, crate::LaneError>,
    cause: crate::Saturation,
    why: &str,
) {
    match borrowed {
        Err(crate::LaneError::Saturated { cause: got, .. }) if got == cause => {}
        other => panic!("{why}: {:?}", other.map(|_| ())),
    }
}

/// An exclusive lane's `connections` and `per_principal` hold over the whole cluster, not per
/// master: three masters never lend more than one server would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_lanes_ceiling_and_shares_hold_over_every_master() {
    let mut config = crate::LanesConfig::default();
    config.blocking.connections = Some(2);
    config.blocking.per_principal = Some(1);
    config.blocking.acquire_timeout = Some(Duration::from_millis(300));
    let (_cluster, lanes) = cluster_lanes(config).await;
    let [a, b, c] = one_slot_per_master();
    let tenant = tollgate_model::Tenant {
        principal: "tenant".into(),
        uid: 1000,
    };
    let neighbour = tollgate_model::Tenant {
        principal: "tenant".into(),
        uid: 1001,
    };
    let borrow = |route: &crate::Route, who: Option<tollgate_model::Tenant>| {
        let (lanes, route) = (&lanes, route.clone());
        async move {
            lanes
                .borrow_at(
                    route,
                    crate::Exclusive::Blocking,
                    crate::Protocol::Resp2,
                    who.as_ref(),
                )
                .await
        }
    };
    let on_a = borrow(&a, None).await.expect("the first connection");
    let on_b = borrow(&b, None).await.expect("the second connection");
    assert_saturated(
        borrow(&c, None).await,
        crate::Saturation::WaitExpired,
        "a third master lent a third connection past the ceiling of 2",
    );
    drop(on_a);
    let on_c = borrow(&c, None)
        .await
        .expect("a connection given back is lent again");
    drop((on_b, on_c));

    let mine = borrow(&a, Some(tenant.clone()))
        .await
        .expect("the tenant's share");
    assert_saturated(
        borrow(&b, Some(tenant.clone())).await,
        crate::Saturation::PrincipalShare,
        "a tenant took a second connection on another master past its share of 1",
    );
    // Another OS user of the same principal has a share of its own.
    let other = borrow(&b, Some(neighbour)).await;
    assert!(other.is_ok(), "another user's share is its own");
    drop((mine, other));
    lanes.close(Duration::from_secs(5)).await;
}

/// A multiplexed lane's `in_flight` holds over the whole cluster: with one command in flight
/// allowed, a command to a second master waits for the first master's reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multiplexed_lanes_in_flight_ceiling_holds_over_every_master() {
    let mut config = crate::LanesConfig::default();
    config.regular.in_flight = Some(1);
    let (cluster, lanes) = cluster_lanes(config).await;
    let [a, b, _] = one_slot_per_master();
    let channel = lanes.multiplexed(crate::Multiplexed::Regular).unwrap();
    let ping = || {
        let mut command = BytesMut::new();
        tollgate_resp::encode_command(&["PING"], &mut command);
        command.freeze()
    };
    // Both masters' connections open before the pause.
    for route in [&a, &b] {
        let reply = channel.send_to(route.clone(), ping()).await.unwrap();
        assert_eq!(&reply.bytes()[..], b"+PONG\r\n");
    }
    let paused = cluster.master_of(0);
    assert_eq!(cluster.inline(paused, "CLIENT PAUSE 600 ALL"), "+OK\r\n");
    let started = tokio::time::Instant::now();
    let held = channel.send_to(a, ping());
    // Time for the first master's driver to take the one in-flight permit and write the PING
    // (queued at once above), so that the second master's PING comes after it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiting = channel.send_to(b, ping());
    let (held, waiting) = tokio::join!(
        async {
            held.await.unwrap();
            started.elapsed()
        },
        async {
            waiting.await.unwrap();
            started.elapsed()
        }
    );
    assert!(
        held >= Duration::from_millis(400),
        "the paused master answered in {held:?}"
    );
    // Both replies are ready at the same moment once the pause ends; which future is polled
    // first is the join's business, so the second is only asked to have waited for the pause.
    assert!(
        waiting >= Duration::from_millis(400),
        "the second master's command was in flight beside the first's: answered after \
         {waiting:?}, the paused master's after {held:?}"
    );
    lanes.close(Duration::from_secs(5)).await;
}

/// `config` with every lane logged in as testkit's admin (Redis's `default` user is off on its
/// nodes).
fn as_testkit_admin(cluster: &RedisCluster, mut config: crate::LanesConfig) -> crate::LanesConfig {
    let file = cluster.node(0).admin_password_file();
    for lane in tollgate_model::Lane::ALL {
        let overrides = config.overrides_mut(lane);
        overrides.user = Some(tollgate_testkit::ADMIN_USER.to_owned());
        overrides.password_file = Some(file.clone());
    }
    config.leases.user = Some(tollgate_testkit::ADMIN_USER.to_owned());
    config.leases.password_file = Some(file);
    config
}

/// testkit's admin, as a lane's credentials.
fn admin() -> Credentials {
    Credentials {
        user: tollgate_testkit::ADMIN_USER.to_owned(),
        password: tollgate_testkit::admin_password().to_owned(),
    }
}
