//! The reserved keyspace is only as safe as every ACL user Redis has: a server (a cluster's node, a
//! Sentinel group's master or replica) with an enabled user the daemon did not make that could
//! touch `tollgate:*` — a stock `default` with no password, say — is refused at start with the
//! server and the user named, unless `redis.trusted_users` names it (then it is a warning). And the
//! sentinels themselves can be locked: the daemon logs in to them.

use tollgate::runtime::StartError;
use tollgate::Daemon;
use tollgate_lanes::{Endpoint, ReachError, RedisConfig, SentinelAuth, Splitting};
use tollgate_testkit::{RedisCluster, RedisServer};

use crate::lanes_sentinel::{wait_until, Deployment};
use crate::support::daemon::{lane_users, tempdir, trusting_testkit, TestDaemon};
use crate::support::raw::{text, RawClient};

/// Starts a daemon on `redis` with the daemon's users in place on `nodes`; its error, if refused.
async fn start_on(redis: RedisConfig, nodes: &[&RedisServer]) -> Result<Daemon, StartError> {
    let dir = tempdir();
    let mut config = TestDaemon::config(dir.path());
    config.redis = Some(redis);
    config.lanes = lane_users(nodes, dir.path()).await;
    let started = Daemon::start(config).await;
    // The sockets live in `dir`: keep it as long as the daemon.
    std::mem::forget(dir);
    started
}

fn standalone(redis: &RedisServer) -> RedisConfig {
    RedisConfig::standalone(Endpoint::Unix(redis.socket().to_owned()))
}

/// The users the refusal names, and the server it names them on.
fn named(error: &StartError) -> (String, Vec<(String, bool)>) {
    let StartError::Reach(ReachError::OtherUsers { server, users }) = error else {
        panic!("not refused for another user: {error}");
    };
    let users = users
        .iter()
        .map(|user| (user.name.clone(), user.open))
        .collect();
    (server.clone(), users)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_whose_default_user_is_open_is_refused_even_with_least_privilege_lane_users() {
    let redis = RedisServer::builder().open_default().start();
    let error = start_on(trusting_testkit(standalone(&redis)), &[&redis])
        .await
        .err()
        .expect("refused to start");
    let (_, users) = named(&error);
    assert_eq!(users, [("default".to_owned(), true)]);
    let message = error.to_string();
    assert!(
        message.contains("`default`")
            && message.contains("nopass")
            && message.contains("tollgate:*")
            && message.contains("redis.trusted_users"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_user_that_could_reach_the_keyspace_is_named_and_narrow_or_disabled_ones_are_not() {
    let redis = RedisServer::builder()
        .arg("--user")
        .args_of("flusher on >pw ~app:* +flushdb")
        .arg("--user")
        .args_of("fencer on >pw ~* +incrby")
        .arg("--user")
        .args_of("listener on nopass &* +subscribe")
        .arg("--user")
        .args_of("app on >pw ~app:* &app:* +@all -@dangerous -acl")
        .arg("--user")
        .args_of("ghost off nopass ~* +@all")
        .start();
    let error = start_on(trusting_testkit(standalone(&redis)), &[&redis])
        .await
        .err()
        .expect("refused to start");
    let (_, mut users) = named(&error);
    users.sort();
    assert_eq!(
        users,
        [
            ("fencer".to_owned(), false),
            ("flusher".to_owned(), false),
            ("listener".to_owned(), true),
        ],
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_named_in_trusted_users_is_accepted() {
    let redis = RedisServer::builder().open_default().start();
    let trusted = standalone(&redis).trusting([tollgate_testkit::ADMIN_USER, "default"]);
    let daemon = start_on(trusted, &[&redis]).await.expect("accepted");
    daemon.shutdown().await;
}

#[test]
fn check_config_warns_of_a_trusted_user_that_could_reach_the_keyspace() {
    let redis = RedisServer::builder().open_default().start();
    let dir = tempdir();
    let passwords = dir.path().join("acl");
    let tollgate = || std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
    let acl = tollgate()
        .args(["redis-acl", "--passwords"])
        .arg(&passwords)
        .output()
        .unwrap();
    // The daemon's users only, leaving `default` open: the operator chose to trust it.
    let users: String = String::from_utf8_lossy(&acl.stdout)
        .lines()
        .filter(|line| line.contains("\"tollgate-") && !line.contains("tollgate-root"))
        .map(|line| format!("{line}\n"))
        .collect();
    let mut cli = std::process::Command::new("redis-cli")
        .arg("-s")
        .arg(redis.socket())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut cli.stdin.take().unwrap(), users.as_bytes()).unwrap();
    assert!(cli.wait().unwrap().success());
    let lanes = tollgate()
        .args(["redis-acl", "--lanes-yaml", "--passwords"])
        .arg(&passwords)
        .output()
        .unwrap();
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(
        &file,
        format!(
            "redis:\n  address: unix:{}\n  trusted_users: [default, {}]\n{}",
            redis.socket().display(),
            tollgate_testkit::ADMIN_USER,
            String::from_utf8_lossy(&lanes.stdout)
        ),
    )
    .unwrap();
    let checked = tollgate().arg("check-config").arg(&file).output().unwrap();
    assert!(checked.status.success(), "{checked:?}");
    let logged = String::from_utf8_lossy(&checked.stderr);
    assert!(
        logged.contains("WARN") && logged.contains("`default`") && logged.contains("trusted_users"),
        "{logged}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_default_user_on_one_cluster_replica_is_refused_and_accepted_once_off() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(2, 1))
        .await
        .unwrap();
    let replica = cluster.replicas_of(cluster.masters()[1])[0];
    let open = "ACL SETUSER default on nopass ~* &* +@all";
    assert_eq!(cluster.inline(replica, open), "+OK\r\n");
    let seeds: Vec<Endpoint> = (cluster.addresses().iter())
        .map(|address| address.parse().unwrap())
        .collect();
    let nodes: Vec<Endpoint> = (cluster.nodes().iter())
        .map(|node| Endpoint::Unix(node.socket().to_owned()))
        .collect();
    let dir = tempdir();
    let mut config = TestDaemon::config(dir.path());
    config.redis = Some(trusting_testkit(RedisConfig::cluster(
        seeds,
        Splitting::Split,
    )));
    config.lanes = tollgate_lanes::provision(
        &nodes,
        Some(&crate::support::daemon::testkit_admin()),
        dir.path(),
        &config.lanes,
        &crate::support::daemon::default_grants(),
    )
    .await
    .unwrap()
    .config;
    let error = Daemon::start(config.clone())
        .await
        .err()
        .expect("refused to start");
    let (server, users) = named(&error);
    assert_eq!(users, [("default".to_owned(), true)]);
    assert_eq!(server, cluster.node(replica).address(), "{error}");

    // `tollgate redis-acl`'s last line, on that node.
    let off = "ACL SETUSER default off resetpass";
    assert_eq!(cluster.inline(replica, off), "+OK\r\n");
    let daemon = TestDaemon::start_config(dir, config).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["SET", "k", "v"]).await), "OK");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_default_user_on_a_sentinel_replica_is_refused() {
    let deployment = Deployment::start_with(|builder| builder.open_default(), None);
    let error = start_on(
        trusting_testkit(RedisConfig::sentinel(
            "mymaster",
            vec![deployment.sentinel.endpoint()],
        )),
        &[&deployment.master, &deployment.replica],
    )
    .await
    .err()
    .expect("refused to start");
    let (_, users) = named(&error);
    assert_eq!(users, [("default".to_owned(), true)]);

    // Off on the master only: the replica, which a failover would promote, still refuses.
    assert_eq!(
        deployment
            .master
            .inline("ACL SETUSER default off resetpass"),
        "+OK\r\n"
    );
    let error = start_on(
        trusting_testkit(RedisConfig::sentinel(
            "mymaster",
            vec![deployment.sentinel.endpoint()],
        )),
        &[&deployment.master, &deployment.replica],
    )
    .await
    .err()
    .expect("refused to start");
    let (server, _) = named(&error);
    assert!(server.starts_with("127.0.0.1:"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_logs_in_to_password_protected_sentinels_and_follows_a_failover() {
    let deployment = Deployment::start_with(|builder| builder, Some("sentinel-secret"));
    let sentinel = &deployment.sentinel;
    assert!(
        sentinel
            .ask_without_password("SENTINEL get-master-addr-by-name mymaster")
            .is_some_and(|reply| reply.starts_with("-NOAUTH")),
        "the sentinel is not locked"
    );
    let dir = tempdir();
    let password_file = dir.path().join("sentinel.password");
    std::fs::write(&password_file, "sentinel-secret\n").unwrap();
    let redis = RedisConfig::sentinel_as(
        "mymaster",
        vec![sentinel.endpoint()],
        SentinelAuth {
            user: None,
            password_file: Some(password_file),
        },
    );
    let daemon = TestDaemon::start_redis(redis, &[&deployment.master, &deployment.replica]).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["SET", "before", "1"]).await), "OK");
    assert_eq!(deployment.master.inline("GET before"), "$1\r\n1\r\n");

    assert_eq!(
        sentinel.ask("SENTINEL FAILOVER mymaster").as_deref(),
        Some("+OK\r\n")
    );
    let (master, replica) = (&deployment.master, &deployment.replica);
    // Past the whole failover (the old master demoted too), as in lanes_sentinel: until then a
    // write may still land on the old master, and a loaded machine may take seconds to get there.
    assert!(
        wait_until(std::time::Duration::from_secs(30), || replica
            .inline("ROLE")
            .contains("master")
            && master.inline("ROLE").contains("slave")),
        "the sentinel never completed the failover"
    );
    // The daemon learns the new master from the sentinel it logs in to; writes land there, on
    // the same client connection.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut attempt = 0;
    let last = loop {
        attempt += 1;
        let key = format!("after-{attempt}");
        let reply = client.call(&["SET", &key, "2"]).await;
        if text(&reply) == "OK" && replica.inline(&format!("GET {key}")) == "$1\r\n2\r\n" {
            break None;
        }
        if std::time::Instant::now() > deadline {
            break Some(reply);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(
        last, None,
        "no write reached the promoted replica; the last reply"
    );
    daemon.stop().await;
}
