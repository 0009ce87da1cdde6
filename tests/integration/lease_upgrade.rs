//! Upgrades that keep leases: a daemon on lease key layout 2 that finds leases an earlier daemon
//! took under layout 1 (fixture keys written as that daemon wrote them) refuses to start, naming
//! the keys and what to do, instead of ignoring them; once they are gone it starts, and the old
//! layout's fence counters (which nothing reads any more) neither block it nor are touched.

use sha2::{Digest, Sha256};
use tollgate::Daemon;
use tollgate_lanes::{Endpoint, RedisConfig};
use tollgate_testkit::RedisServer;

use crate::support::daemon::{lane_users, tempdir, trusting_testkit, TestDaemon};

/// Layout 1's keys for `resource`: the lease hash and its per-resource fence counter.
fn layout_1(resource: &str) -> (String, String) {
    let digest = hex::encode(Sha256::digest(resource.as_bytes()));
    (
        format!("tollgate:lease:{{{digest}}}"),
        format!("tollgate:lease:{{{digest}}}:fence"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_the_previous_layout_are_refused_loudly_never_ignored() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let mut config = TestDaemon::config(dir.path());
    config.redis = Some(trusting_testkit(RedisConfig::standalone(Endpoint::Unix(
        redis.socket().to_owned(),
    ))));
    config.lanes = lane_users(&[&redis], dir.path()).await;
    let database = config.lanes.leases.database;

    // What a layout-1 daemon left: a held lease (with its TTL) and its resource's fence counter.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (lease, fence) = layout_1("orders:42");
    let _: () = redis::pipe()
        .cmd("SELECT")
        .arg(database)
        .ignore()
        .cmd("HSET")
        .arg(&lease)
        .arg("owner")
        .arg("old-daemon")
        .arg("fence")
        .arg(7)
        .cmd("PEXPIRE")
        .arg(&lease)
        .arg(600_000)
        .cmd("SET")
        .arg(&fence)
        .arg(7)
        .query_async(&mut conn)
        .await
        .unwrap();

    let refused = match Daemon::start(config.clone()).await {
        Ok(daemon) => {
            daemon.shutdown().await;
            panic!("the daemon started over a lease of the previous layout");
        }
        Err(error) => error.to_string(),
    };
    assert!(refused.contains(&lease), "names the key: {refused}");
    assert!(refused.contains("layout 1"), "{refused}");
    assert!(
        refused.contains("expires in"),
        "says when it expires: {refused}"
    );
    assert!(
        refused.contains("Stop every tollgate daemon of the earlier version"),
        "{refused}"
    );

    // The lease ran out (here: deleted, as the message allows once no old daemon runs): the
    // daemon starts, and the old fence counter is left as it was.
    let _: () = redis::pipe()
        .cmd("SELECT")
        .arg(database)
        .ignore()
        .cmd("DEL")
        .arg(&lease)
        .query_async(&mut conn)
        .await
        .unwrap();
    let daemon = Daemon::start(config)
        .await
        .expect("starts once the old lease is gone");
    let (old_fence,): (Option<i64>,) = redis::pipe()
        .cmd("SELECT")
        .arg(database)
        .ignore()
        .cmd("GET")
        .arg(&fence)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(old_fence, Some(7));
    daemon.shutdown().await;
}
