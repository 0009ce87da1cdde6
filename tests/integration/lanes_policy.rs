//! The lanes' ACL users follow the policy: what a policy admits Redis runs (SORT, RESTORE, a
//! script calling KEYS), what it no longer admits after a reload Redis refuses too (asked with
//! `ACL DRYRUN`), scripts run inside transactions under the default policy, and an external
//! Redis's lane users are checked against the policy.

use prometheus_client::registry::Registry;
use tollgate_lanes::{Endpoint, LaneGrants, Lanes, Topology};
use tollgate_policy::PolicyConfig;
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::{default_grants, grants_for, lane_users, tempdir, TestDaemon};
use crate::support::raw::{text, RawClient};

const ALLOW_ALL: &str = "principals:\n  me: { any: true }\nrules:\n  - id: all\n    commands: [\"*\"]\n    allow: everything\n";
const NO_SORT: &str = "principals:\n  me: { any: true }\nrules:\n  - id: no-sort\n    commands: [SORT, SORT_RO]\n    deny: narrowed\n  - id: all\n    commands: [\"*\"]\n    allow: everything\n";

/// An embedded daemon whose policy is the file `policy` holding `text`.
async fn embedded_with(text: &str) -> (TestDaemon, std::path::PathBuf, tempfile::TempDir) {
    let files = tempdir();
    let policy = files.path().join("policy.yaml");
    std::fs::write(&policy, text).unwrap();
    let dir = tempdir();
    let mut config = TestDaemon::config(dir.path());
    config.policy.files = vec![policy.clone()];
    config.admin.reload_interval = std::time::Duration::from_millis(1);
    (TestDaemon::start_config(dir, config).await, policy, files)
}

/// A reply as text, integers as their digits.
fn shown(frame: &Frame) -> String {
    match frame {
        Frame::Integer(n) => n.to_string(),
        other => text(other),
    }
}

fn strings(frame: &Frame) -> Vec<String> {
    match frame {
        Frame::Array(items) => items.iter().map(shown).collect(),
        other => panic!("not an array: {other:?}"),
    }
}

/// `ACL DRYRUN` of `user` running `argv`, asked of the embedded server directly.
async fn dryrun(daemon: &TestDaemon, user: &str, argv: &[&str]) -> Frame {
    let mut redis = crate::support::daemon::embedded_admin(daemon.dir()).await;
    let mut line = vec!["ACL", "DRYRUN", user];
    line.extend_from_slice(argv);
    redis.call(&line).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sort_restore_and_a_script_calling_keys_are_answered_by_redis_when_the_policy_allows_them()
{
    let (daemon, _policy, _files) = embedded_with(ALLOW_ALL).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        shown(&client.call(&["RPUSH", "list", "3", "1", "2"]).await),
        "3"
    );
    assert_eq!(
        strings(&client.call(&["SORT", "list"]).await),
        ["1", "2", "3"]
    );
    assert_eq!(
        strings(&client.call(&["SORT_RO", "list", "DESC"]).await),
        ["3", "2", "1"]
    );
    let dumped = client.call(&["DUMP", "list"]).await;
    let Frame::Bulk(payload) = dumped else {
        panic!("DUMP: {dumped:?}");
    };
    let mut restore = RawClient::connect(&daemon.resp_socket()).await;
    let payload = payload.to_vec();
    // RESTORE's payload is binary: sent as raw RESP.
    let mut wire = b"*4\r\n$7\r\nRESTORE\r\n$6\r\ncopied\r\n$1\r\n0\r\n".to_vec();
    wire.extend_from_slice(format!("${}\r\n", payload.len()).as_bytes());
    wire.extend_from_slice(&payload);
    wire.extend_from_slice(b"\r\n");
    restore.write(&wire).await;
    assert_eq!(text(&restore.read().await), "OK");
    assert_eq!(
        strings(&client.call(&["LRANGE", "copied", "0", "-1"]).await),
        ["3", "1", "2"]
    );
    let keys = client
        .call(&["EVAL", "return redis.call('KEYS', 'cop*')", "0"])
        .await;
    assert_eq!(strings(&keys), ["copied"]);
    let flushed = client.call(&["FLUSHDB"]).await;
    assert_eq!(text(&flushed), "OK");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_narrows_the_policy_narrows_the_lane_users() {
    let (daemon, policy, _files) = embedded_with(ALLOW_ALL).await;
    for user in ["tollgate-regular", "tollgate-transaction"] {
        let allowed = dryrun(&daemon, user, &["SORT", "list"]).await;
        assert_eq!(text(&allowed), "OK", "{user} before the reload");
    }

    std::fs::write(&policy, NO_SORT).unwrap();
    let reloaded = daemon.post("/v1/policy/reload", "").await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.body);

    for user in [
        "tollgate-regular",
        "tollgate-transaction",
        "tollgate-script",
    ] {
        let refused = dryrun(&daemon, user, &["SORT", "list"]).await;
        assert!(
            matches!(&refused, Frame::Bulk(reason) if reason.starts_with(b"This user has no permissions to run the 'sort' command")),
            "{user} after the reload: {refused:?}"
        );
        let still = dryrun(&daemon, user, &["GET", "list"]).await;
        assert_eq!(text(&still), "OK", "{user} lost GET");
    }
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let denied = text(&client.call(&["SORT", "list"]).await);
    assert!(denied.contains("no-sort"), "{denied}");
    // A script calling SORT is refused by Redis itself now.
    let script = text(
        &client
            .call(&["EVAL", "return redis.call('SORT', 'list')", "0"])
            .await,
    );
    assert!(script.contains("can't run this command"), "{script}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_default_still_refuses_flushall_and_keys_by_policy_and_redis() {
    let daemon = TestDaemon::start_embedded().await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let flushall = text(&client.call(&["FLUSHALL"]).await);
    assert!(
        flushall.contains("rule no-wipe denies FLUSHALL"),
        "{flushall}"
    );
    let keys = text(
        &client
            .call(&["EVAL", "return redis.call('KEYS', '*')", "0"])
            .await,
    );
    assert!(keys.contains("can't run this command"), "{keys}");
    for user in [
        "tollgate-regular",
        "tollgate-script",
        "tollgate-transaction",
    ] {
        let refused = dryrun(&daemon, user, &["FLUSHALL"]).await;
        assert!(matches!(refused, Frame::Bulk(_)), "{user}: {refused:?}");
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_and_evalsha_run_inside_multi_and_after_watch_on_the_embedded_default() {
    let daemon = TestDaemon::start_embedded().await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let script = "return redis.call('INCR', KEYS[1])";
    let sha = text(&client.call(&["SCRIPT", "LOAD", script]).await);
    assert_eq!(sha.len(), 40, "{sha}");

    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    assert_eq!(
        text(&client.call(&["EVAL", script, "1", "counter"]).await),
        "QUEUED"
    );
    assert_eq!(
        text(&client.call(&["EVALSHA", &sha, "1", "counter"]).await),
        "QUEUED"
    );
    assert_eq!(strings(&client.call(&["EXEC"]).await), ["1", "2"]);

    assert_eq!(text(&client.call(&["WATCH", "counter"]).await), "OK");
    assert_eq!(
        shown(&client.call(&["EVALSHA", &sha, "1", "counter"]).await),
        "3"
    );
    assert_eq!(
        shown(&client.call(&["EVAL", script, "1", "other"]).await),
        "1"
    );
    assert_eq!(text(&client.call(&["MULTI"]).await), "OK");
    assert_eq!(
        text(&client.call(&["EVAL", script, "1", "other"]).await),
        "QUEUED"
    );
    // WATCH saw the script change `counter` on this very connection: Redis aborts, as it would.
    let exec = client.call(&["EXEC"]).await;
    assert!(matches!(exec, Frame::Null | Frame::NullArray), "{exec:?}");
    daemon.stop().await;
}

/// The lease lanes of `lanes` (users already on `redis`), for `check_grants`.
fn lease_lanes(redis: &RedisServer, lanes: &tollgate_lanes::LanesConfig) -> Lanes {
    let topology = Topology::Standalone(Endpoint::Unix(redis.socket().to_owned()));
    Lanes::open_leases(&topology, lanes, &mut Registry::default()).expect("lease lanes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_redis_lane_user_too_narrow_or_too_wide_for_the_policy_is_named() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let lanes = lane_users(&[&redis], dir.path()).await;
    let leases = lease_lanes(&redis, &lanes);

    let matching = tollgate_lanes::check_grants(&leases, &lanes, &default_grants())
        .await
        .expect("checked");
    assert_eq!(matching, [], "the default policy's users match it");

    let files = tempdir();
    let policy = files.path().join("all.yaml");
    std::fs::write(&policy, ALLOW_ALL).unwrap();
    let allow_all = grants_for(&PolicyConfig {
        files: vec![policy],
        ..PolicyConfig::default()
    });
    let narrow = tollgate_lanes::check_grants(&leases, &lanes, &allow_all)
        .await
        .expect("checked");
    let regular = narrow
        .iter()
        .find(|m| m.lane == tollgate_lanes::Lane::Regular)
        .expect("the regular user is too narrow for allow-all");
    assert!(
        regular.too_narrow.iter().any(|c| c == "acl|whoami"),
        "{regular}"
    );
    assert!(regular.too_wide.is_empty(), "{regular}");
    assert!(
        regular.to_string().contains("`tollgate-regular`")
            && regular.to_string().contains("too narrow"),
        "{regular}"
    );

    // A policy that admits nothing: the default policy's users are too wide for it.
    let mut nothing = LaneGrants::default();
    for (name, arity) in default_grants().known() {
        nothing.know(name, arity);
    }
    let wide = tollgate_lanes::check_grants(&leases, &lanes, &nothing)
        .await
        .expect("checked");
    let regular = wide
        .iter()
        .find(|m| m.lane == tollgate_lanes::Lane::Regular)
        .expect("the regular user is too wide for a policy that admits nothing");
    assert!(regular.too_wide.iter().any(|c| c == "get"), "{regular}");
    leases.close(std::time::Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_redis_daemon_serves_what_its_own_policy_allows() {
    let redis = RedisServer::start();
    let files = tempdir();
    let policy = files.path().join("all.yaml");
    std::fs::write(&policy, ALLOW_ALL).unwrap();
    // The test daemon provisions the users from the daemon's own policy, as `redis-acl --config`.
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.policy.files = vec![policy.clone()];
    })
    .await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(text(&client.call(&["SET", "k", "v"]).await), "OK");
    assert_eq!(strings(&client.call(&["KEYS", "k"]).await), ["k"]);
    daemon.stop().await;
}

const NO_COMMAND_DOCS: &str = "principals:\n  me: { any: true }\nrules:\n  - id: no-docs\n    commands: [COMMAND|DOCS]\n    deny: narrowed\n  - id: all\n    commands: [\"*\"]\n    allow: everything\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_command_is_granted_without_the_subcommands_the_policy_refuses() {
    let (daemon, _policy, _files) = embedded_with(NO_COMMAND_DOCS).await;
    for user in ["tollgate-regular", "tollgate-transaction"] {
        assert_eq!(
            text(&dryrun(&daemon, user, &["COMMAND"]).await),
            "OK",
            "{user}"
        );
        assert_eq!(
            text(&dryrun(&daemon, user, &["COMMAND", "COUNT"]).await),
            "OK",
            "{user}"
        );
        // Redis's `+command` grants every subcommand: the one the policy refuses is taken back.
        let docs = dryrun(&daemon, user, &["COMMAND", "DOCS", "get"]).await;
        assert!(
            matches!(&docs, Frame::Bulk(reason) if reason.starts_with(b"This user has no permissions to run the 'command|docs' command")),
            "{user}: {docs:?}"
        );
    }
    // A lane that is granted neither does not get the bare form either.
    let admin = dryrun(&daemon, "tollgate-admin", &["COMMAND"]).await;
    assert!(matches!(&admin, Frame::Bulk(_)), "{admin:?}");

    let mut redis = crate::support::daemon::embedded_admin(daemon.dir()).await;
    let count = shown(&redis.call(&["COMMAND", "COUNT"]).await);
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let Frame::Array(commands) = client.call(&["COMMAND"]).await else {
        panic!("COMMAND through the daemon is not an array");
    };
    assert_eq!(commands.len().to_string(), count);
    assert_eq!(shown(&client.call(&["COMMAND", "COUNT"]).await), count);
    let denied = text(&client.call(&["COMMAND", "DOCS", "get"]).await);
    assert!(denied.contains("no-docs"), "{denied}");
    daemon.stop().await;
}
