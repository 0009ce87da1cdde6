//! Multi-key commands as large as the front door takes (`resp.max_arguments`), through a daemon
//! and a real Redis: the built-in catalog and YAML guard judge them (their budget grows with the
//! arguments) under the default policy and under one that allows everything, and Redis answers
//! them. An operator's module stays bounded by its own budget per call.

use std::time::Duration;

use bytes::BytesMut;
use tollgate::config::RespConfig;
use tollgate_policy::{ModuleConfig, ModuleLimits};
use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

const ALLOW_EVERYTHING: &str = r#"
principals:
  everyone: { any: true }
rules:
  - id: everything
    commands: ["*"]
    allow: every command
"#;

/// Commands this large take a while on a loaded machine: the bound is generous, the point is
/// that they are answered at all.
const PATIENCE: Duration = Duration::from_secs(180);

/// `name` followed by `args`, as one RESP array.
fn command(name: &str, args: impl ExactSizeIterator<Item = String>) -> BytesMut {
    let mut out = BytesMut::new();
    out.extend_from_slice(
        format!("*{}\r\n${}\r\n{name}\r\n", args.len() + 1, name.len()).as_bytes(),
    );
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

async fn call(client: &mut RawClient, bytes: &[u8]) -> Frame {
    client.write(bytes).await;
    client
        .read_within(PATIENCE)
        .await
        .expect("an answer in time")
        .expect("the connection stays open")
}

/// MSET, MGET, EXISTS and DEL, each with `resp.max_arguments` words in all (MSET one fewer, to
/// pair its keys and values), answered as Redis answers them.
async fn at_the_limit(daemon: &TestDaemon) {
    let words = RespConfig::default().max_arguments;
    let keys = words - 1;
    let key = |i: usize| format!("k{i}");
    let mut client = RawClient::connect(&daemon.resp_socket()).await;

    let pairs = (words - 2) / 2;
    let mset = command(
        "MSET",
        (0..pairs * 2).map(|i| {
            if i % 2 == 0 {
                key(i / 2)
            } else {
                "v".to_owned()
            }
        }),
    );
    assert_eq!(text(&call(&mut client, &mset).await), "OK");

    let mget = command("MGET", (0..keys).map(key));
    match call(&mut client, &mget).await {
        Frame::Array(values) => {
            assert_eq!(values.len(), keys);
            assert_eq!(values[0], Frame::Bulk("v".into()));
            assert_eq!(values[pairs - 1], Frame::Bulk("v".into()));
            assert_eq!(values[pairs], Frame::Null);
        }
        other => panic!("MGET of {keys} keys answered {}", text(&other)),
    }

    let exists = command("EXISTS", (0..keys).map(key));
    assert_eq!(
        call(&mut client, &exists).await,
        Frame::Integer(pairs as i64)
    );
    let del = command("DEL", (0..keys).map(key));
    assert_eq!(call(&mut client, &del).await, Frame::Integer(pairs as i64));
    assert_eq!(
        call(&mut client, &exists).await,
        Frame::Integer(0),
        "DEL deleted them all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_commands_at_the_argument_limit_are_answered_under_the_default_policy() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    at_the_limit(&daemon).await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_commands_at_the_argument_limit_are_answered_under_a_policy_allowing_all() {
    let redis = RedisServer::start();
    let policy = redis.dir().join("everything.yaml");
    std::fs::write(&policy, ALLOW_EVERYTHING).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy]).await;
    at_the_limit(&daemon).await;
    daemon.stop().await;
}

/// The spinning guard spins on any command whose first key is `hostile`: however many arguments
/// the command has, it gets the module's own budget and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_module_is_cut_off_at_its_own_budget_however_large_the_command() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.policy.modules = vec![ModuleConfig::WithConfig {
            path: tollgate_policy::built_component("hostile"),
            config: "spin".into(),
            limits: ModuleLimits::default(),
        }];
    })
    .await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    let keys = RespConfig::default().max_arguments / 4;
    let mget = command(
        "MGET",
        std::iter::once("hostile".to_owned())
            .chain((1..keys).map(|i| format!("k{i}")))
            .collect::<Vec<_>>()
            .into_iter(),
    );
    assert_eq!(
        text(&call(&mut client, &mget).await),
        "NOPERM tollgate: rule sandbox denies MGET: module hostile ran out of its budget (fuel or deadline)"
    );
    // Its commands of ordinary size are still judged (the built-ins allow, it allows).
    assert_eq!(text(&client.call(&["SET", "fine", "v"]).await), "OK");
    daemon.stop().await;
}
