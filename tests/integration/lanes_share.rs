//! A principal's share of an exclusive lane (`lanes.<lane>.per_principal`): one principal whose
//! clients block in `BLPOP … 0` on every connection it may hold leaves the rest of the lane to
//! other principals, whose blocking commands run; its own clients past the share get `BUSY` naming
//! the share. The second principal is a second OS user (see `identity`).

use std::time::{Duration, Instant};

use tollgate_testkit::RedisServer;

use crate::front_door::redis_clients;
use crate::identity::{daemon_for_all, os_user, redis_cli, USER_B};
use crate::support::raw::{text, RawClient};

/// The BLOCKING lane's default ceiling.
const CONNECTIONS: usize = 32;
/// Three quarters of it: the default share.
const SHARE: usize = 24;

fn blocked(redis: &RedisServer) -> usize {
    redis_clients(redis)
        .iter()
        .filter(|client| client.contains(" flags=b"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_principal_on_every_blocking_connection_it_may_hold_leaves_the_lane_to_others() {
    let Some(b) = os_user(USER_B) else {
        return;
    };
    let redis = RedisServer::start();
    let policy = redis.dir().join("share.yaml");
    std::fs::write(
        &policy,
        format!(
            r#"
principals:
  workers: {{ uids: [{root}] }}
  other: {{ uids: [{b}] }}
rules:
  - id: queues
    commands: [BLPOP, LPUSH, "@connection"]
    allow: the share test
"#,
            root = nix::unistd::geteuid().as_raw(),
            b = b.uid
        ),
    )
    .expect("write the test policy");
    let daemon = daemon_for_all(&redis, |config| config.policy.files = vec![policy]).await;

    // As many clients of one principal as the lane has connections, each waiting forever.
    let mut workers = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut worker = RawClient::connect(&daemon.resp_socket()).await;
        worker.send(&["BLPOP", "jobs", "0"]).await;
        workers.push(worker);
    }
    let until = Instant::now() + Duration::from_secs(10);
    while blocked(&redis) < SHARE {
        assert!(Instant::now() < until, "{} blocked", blocked(&redis));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The other principal's blocking command runs on a connection the workers may not take.
    let popped = redis_cli(&b, &daemon, &["LPUSH", "theirs", "job"]).await;
    assert!(popped.trim() == "1", "{popped}");
    let popped = redis_cli(&b, &daemon, &["BLPOP", "theirs", "1"]).await;
    assert!(popped.contains("job"), "{popped}");

    // The workers past their share were told why, after the acquire timeout (2 s); the others
    // are still blocked.
    let replies = futures::future::join_all(
        workers
            .iter_mut()
            .map(|worker| worker.read_within(Duration::from_secs(5))),
    )
    .await;
    let mut refused = 0;
    for reply in replies.into_iter().filter_map(|reply| reply.ok()) {
        let reply = text(&reply.expect("the connection stays open"));
        assert!(
            reply.starts_with("BUSY")
                && reply.contains("BLOCKING saturated")
                && reply.contains("holds its whole share of the lane"),
            "{reply}"
        );
        refused += 1;
    }
    assert_eq!(refused, CONNECTIONS - SHARE);
    assert_eq!(blocked(&redis), SHARE);
    drop(workers);
    daemon.stop().await;
}
