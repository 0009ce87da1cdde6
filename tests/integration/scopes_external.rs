//! Scopes on an external Redis, where the operator makes the scope users: `tollgate redis-acl`
//! prints them (their passwords in its directory), the daemon reads the passwords from
//! `lanes.scopes.passwords` and checks each user on the master before its principals' scripts
//! run as it. A scope user that is missing, or was widened to reach the reserved keyspace, is
//! never used: the scripts are refused, saying why, rather than run unconfined.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use tollgate_testkit::RedisServer;

use tollgate_lanes::{RedisConfig, Splitting};

use crate::cluster::{cluster, keys_on_every_master};
use crate::lanes_sentinel::Deployment;
use crate::scopes_daemon::{EVERYTHING_BUT_RO, REFUSED};
use crate::support::daemon::{tempdir, TestDaemon};
use crate::support::raw::{text, RawClient};

/// The config file of a daemon whose policy is `policy`, as `tollgate redis-acl --config` reads it.
fn config_file(dir: &Path, policy: &Path) -> std::path::PathBuf {
    let file = dir.join("tollgate.yaml");
    std::fs::write(
        &file,
        format!("policy:\n  files: [{:?}]\n", policy.display().to_string()),
    )
    .unwrap();
    file
}

/// One tenant: its keys are `mine:*`, and its scripts are held to them.
const MINE: &str = "principals:\n  me: { any: true }\nrules:\n\
    \x20 - id: mine\n    commands: [\"@read\", \"@write\", \"@keyspace\", \"@transaction\"]\n    \
    keys: [\"mine:*\"]\n    allow: its own keys\n\
    \x20 - id: scripts\n    commands: [\"@scripting\"]\n    allow: scripts in its scope\n\
    \x20 - id: transactions\n    commands: [MULTI, EXEC, DISCARD, UNWATCH]\n    allow: transactions\n";

/// The `ACL SETUSER` lines of the scope users `tollgate redis-acl` prints for the daemon config
/// `config`, their passwords written to `passwords`.
fn scope_lines(config: &Path, passwords: &Path) -> String {
    let acl = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["redis-acl", "--config"])
        .arg(config)
        .arg("--passwords")
        .arg(passwords)
        .output()
        .unwrap();
    assert!(acl.status.success(), "{acl:?}");
    String::from_utf8_lossy(&acl.stdout)
        .lines()
        .filter(|line| line.starts_with("\"ACL\" \"SETUSER\" \"tollgate-scope-"))
        .map(|line| format!("{line}\n"))
        .collect()
}

/// `lines` run by `redis-cli` on the server at `socket`, as testkit's administrator.
fn apply(socket: &Path, lines: &str) {
    let mut cli = Command::new("redis-cli")
        .arg("-s")
        .arg(socket)
        .args(["--user", tollgate_testkit::ADMIN_USER, "--pass"])
        .arg(tollgate_testkit::admin_password())
        .arg("--no-auth-warning")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    cli.stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    let output = cli.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && printed.lines().all(|line| line == "OK"),
        "{printed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_an_external_redis_the_scope_users_redis_acl_prints_confine_scripts() {
    let redis = RedisServer::start();
    let files = tempdir();
    let policy = files.path().join("policy.yaml");
    std::fs::write(&policy, MINE).unwrap();
    let passwords = files.path().join("acl");
    let lines = scope_lines(&config_file(files.path(), &policy), &passwords);
    assert_eq!(lines.lines().count(), 1, "one scope: {lines}");
    let user = lines.split('"').nth(5).expect("the user's name").to_owned();
    assert!(passwords.join(format!("{user}.password")).is_file());
    apply(redis.socket(), &lines);
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.policy.files = vec![policy.clone()];
        config.lanes.scopes.passwords = Some(passwords.clone());
        config.admin.reload_interval = std::time::Duration::from_millis(1);
    })
    .await;

    // The script runs as the scope user: Redis refuses a key outside its rule,
    // and the refusal names the rule; its own keys are the script's.
    let words = "(tollgate: scope of rule mine does not include that key)";
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let reply = client
        .call(&["EVAL", "return redis.call('SET', 'other:1', 'x')", "0"])
        .await;
    assert!(
        text(&reply).contains(REFUSED) && text(&reply).ends_with(words),
        "{reply:?}"
    );
    let reply = client
        .call(&["EVAL", "return redis.call('SET', 'mine:1', 'x')", "0"])
        .await;
    assert_eq!(text(&reply), "OK");
    assert!(redis.inline("EXISTS other:1").starts_with(":0"));
    assert!(
        redis
            .inline("CLIENT LIST")
            .contains(&format!(" user={user} ")),
        "the script ran on a connection of the scope user"
    );
    // Inside MULTI too.
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    assert_eq!(
        text(
            &client
                .call(&["EVAL", "return redis.call('SET', 'other:2', 'x')", "0"])
                .await
        ),
        "QUEUED"
    );
    let exec = format!("{:?}", client.call(&["EXEC"]).await);
    assert!(exec.contains(REFUSED) && exec.contains(words), "{exec}");
    assert!(redis.inline("EXISTS other:2").starts_with(":0"));

    // Widened by hand to reach the reserved keyspace: after a reload the daemon checks it again
    // and no longer uses it.
    apply(
        redis.socket(),
        &format!("ACL SETUSER {user} \"(~tollgate:* +get +set)\"\n"),
    );
    let reloaded = daemon.post("/v1/policy/reload", "{}").await;
    assert_eq!(reloaded.status, 200, "{reloaded:?}");
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let reply = client
        .call(&["EVAL", "return redis.call('SET', 'mine:2', 'x')", "0"])
        .await;
    assert!(
        text(&reply).starts_with(&format!(
            "NOPERM tollgate: the scripts of me run as the scope user {user}, which is not \
             ready on this Redis"
        )),
        "{reply:?}"
    );
    assert!(redis.inline("EXISTS mine:2").starts_with(":0"));

    // Deleted: missing, and refused the same way.
    apply(redis.socket(), &lines);
    assert!(redis
        .inline(&format!("ACL DELUSER {user}"))
        .starts_with(":1"));
    let reloaded = daemon.post("/v1/policy/reload", "{}").await;
    assert_eq!(reloaded.status, 200, "{reloaded:?}");
    let reply = client
        .call(&["EVAL", "return redis.call('SET', 'mine:3', 'x')", "0"])
        .await;
    assert!(
        text(&reply).contains("is not ready on this Redis"),
        "{reply:?}"
    );
    // Plain commands are served as ever.
    assert_eq!(text(&client.call(&["SET", "mine:4", "x"]).await), "OK");
    daemon.stop().await;
}

/// Without `lanes.scopes.passwords` the daemon has no scope users on an external Redis: a scoped
/// principal's scripts are refused, saying why, rather than run unconfined on the SCRIPT lane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_an_external_redis_without_scope_users_a_scoped_principals_scripts_are_refused() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, EVERYTHING_BUT_RO).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.policy.files = vec![path.clone()];
    })
    .await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let reply = client
        .call(&["EVAL", "return redis.call('SET', 'ro:1', 'x')", "0"])
        .await;
    assert!(
        text(&reply).starts_with("NOPERM tollgate: the scripts of local run as the scope user")
            && text(&reply).contains("lanes.scopes.passwords"),
        "{reply:?}"
    );
    assert!(
        redis.inline("EXISTS ro:1").starts_with(":0"),
        "the script never ran"
    );
    // In a transaction too: its connection is the TRANSACTION lane's, which no scope confines.
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    let queued = client
        .call(&["EVAL", "return redis.call('SET', 'ro:1', 'x')", "0"])
        .await;
    assert!(
        text(&queued).starts_with("NOPERM tollgate: rule scope denies EVAL"),
        "{queued:?}"
    );
    assert!(text(&client.call(&["EXEC"]).await).starts_with("EXECABORT"));
    // Plain commands are served as ever.
    assert_eq!(text(&client.call(&["SET", "rw:1", "x"]).await), "OK");
    daemon.stop().await;
}

/// On a 3-master cluster the operator makes the scope users on every node; a scoped principal's
/// script runs on its scope's pool of the node of its keys' slot, and inside MULTI on the pinned
/// connection there, logged in as the scope user: Redis refuses a key outside the scope on
/// every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_scope_users_confine_scripts_on_every_master() {
    let cluster = cluster().await;
    let files = tempdir();
    let policy = files.path().join("policy.yaml");
    std::fs::write(&policy, MINE).unwrap();
    let passwords = files.path().join("acl");
    let lines = scope_lines(&config_file(files.path(), &policy), &passwords);
    let user = lines.split('"').nth(5).expect("the user's name").to_owned();
    for node in cluster.nodes() {
        apply(node.socket(), &lines);
    }
    let daemon = TestDaemon::start_cluster_with(&cluster, Splitting::Refuse, |config| {
        config.policy.files = vec![policy.clone()];
        config.lanes.scopes.passwords = Some(passwords.clone());
    })
    .await;
    let words = "(tollgate: scope of rule mine does not include that key)";
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    // A hash tag on each master: `mine:{t}` and `other:{t}` share its slot.
    for tag in keys_on_every_master(&cluster, "tag", 1) {
        let mine = format!("mine:{{{tag}}}");
        let reply = client
            .call(&["EVAL", "return redis.call('SET', KEYS[1], 'x')", "1", &mine])
            .await;
        assert_eq!(text(&reply), "OK", "{mine}");
        let reach = "return redis.call('GET', 'other:{' .. ARGV[1] .. '}')";
        let reply = client.call(&["EVAL", reach, "1", &mine, &tag]).await;
        assert!(
            text(&reply).contains(REFUSED) && text(&reply).ends_with(words),
            "{tag}: {reply:?}"
        );
        // Queued in MULTI, on the transaction's connection on that master.
        assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
        let write = "return redis.call('SET', 'other:{' .. ARGV[1] .. '}', 'x')";
        assert_eq!(
            text(&client.call(&["EVAL", write, "1", &mine, &tag]).await),
            "QUEUED"
        );
        let exec = format!("{:?}", client.call(&["EXEC"]).await);
        assert!(
            exec.contains(REFUSED) && exec.contains(words),
            "{tag}: {exec}"
        );
    }
    // Each master ran the scripts on connections of the scope user, and holds no `other:` key.
    for master in cluster.masters() {
        let list = cluster.inline(master, "CLIENT LIST");
        assert!(list.contains(&format!(" user={user} ")), "{list}");
        assert!(
            cluster.inline(master, "KEYS other:*").starts_with("*0"),
            "master {master}"
        );
    }
    daemon.stop().await;
}

/// A scope user the master has but its replica lacks is not ready: a failover would promote a
/// server where its principals' scripts could not log in (Redis does not replicate ACLs). Once
/// the replica has it too, a reload makes it ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_user_missing_on_a_sentinel_replica_is_not_used_until_it_is_made_there() {
    let deployment = Deployment::start();
    let files = tempdir();
    let policy = files.path().join("policy.yaml");
    std::fs::write(&policy, MINE).unwrap();
    let passwords = files.path().join("acl");
    let lines = scope_lines(&config_file(files.path(), &policy), &passwords);
    apply(deployment.master.socket(), &lines);
    let daemon = TestDaemon::start_redis_with(
        RedisConfig::sentinel("mymaster", vec![deployment.sentinel.endpoint()]),
        &[&deployment.master, &deployment.replica],
        |config| {
            config.policy.files = vec![policy.clone()];
            config.lanes.scopes.passwords = Some(passwords.clone());
            config.admin.reload_interval = std::time::Duration::from_millis(1);
        },
    )
    .await;
    let eval = [
        "EVAL",
        "return redis.call('SET', KEYS[1], 'x')",
        "1",
        "mine:1",
    ];
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let reply = client.call(&eval).await;
    assert!(
        text(&reply).contains("is not ready on this Redis"),
        "{reply:?}"
    );
    assert!(deployment.master.inline("EXISTS mine:1").starts_with(":0"));

    apply(deployment.replica.socket(), &lines);
    let reloaded = daemon.post("/v1/policy/reload", "{}").await;
    assert_eq!(reloaded.status, 200, "{reloaded:?}");
    assert_eq!(text(&client.call(&eval).await), "OK");
    daemon.stop().await;
}
