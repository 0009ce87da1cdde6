//! Scopes against Redis itself: the Redis users the policy's scopes become let a script's
//! command touch exactly the keys the policy would admit it on, checked key by key with
//! `ACL DRYRUN` on a real server. Keys are generated from the pieces that make globs hard
//! (escapes, classes, `?`, `*`, bytes past `\x7f`, whitespace, NUL) and the reserved prefix
//! `tollgate:`; `TOLLGATE_SCOPE_KEYS` sets how many (default 1,500, a few seconds).

use std::io::{Read, Write};

use bytes::BytesMut;
use tollgate::scope_users::scope_user;
use tollgate_policy::Decision;
use tollgate_resp::{encode_command, parse, Frame, Limits};
use tollgate_testkit::RedisServer;

use crate::policy_support::{admission, caller, config};

const POLICY: &str = r#"
principals:
  app: { uids: [4101] }
  wide: { uids: [4102] }
rules:
  - id: read-only
    commands: ["@write"]
    keys: ["ro:*", "x\\*y*", "é*"]
    deny: read only
  - id: app-keys
    principals: [app]
    commands: [GET, SET]
    keys: ["ro:*", "rw:*", "t*", "[a-c]?:*", "\\**", "q?", "x\\*y*", "[^t-z]x*", "é*", "[]]*", "[\\]-a]b", "?\x7f\u0080*"]
    allow: app's keys
  - id: wide-keys
    principals: [wide]
    commands: [GET, SET]
    allow: every key
  - id: scripts
    commands: [EVAL, PING]
    allow: scripts
"#;

/// Pieces keys are made of.
const FRAGMENTS: &[&[u8]] = &[
    b"t",
    b"to",
    b"tollgate:",
    b"tollgate",
    b"tollgat",
    b"ro:",
    b"rw:",
    b"x*y",
    b"x",
    b"*",
    b"?",
    b"[",
    b"]",
    b"\\",
    b"^",
    b"-",
    b"a",
    b"b",
    b"c",
    b"q",
    b":",
    "é".as_bytes(),
    b"\xc3",
    b"\x7f",
    b"\x80",
    b"\xff",
    b" ",
    b"\t",
    b"\x00",
    b"z",
];

fn keys(count: usize) -> Vec<Vec<u8>> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut keys: Vec<Vec<u8>> = FRAGMENTS.iter().map(|f| f.to_vec()).collect();
    while keys.len() < count {
        let parts = 1 + (next() % 4) as usize;
        let key: Vec<u8> = (0..parts)
            .flat_map(|_| {
                FRAGMENTS[(next() % FRAGMENTS.len() as u64) as usize]
                    .iter()
                    .copied()
            })
            .collect();
        keys.push(key);
    }
    keys.truncate(count);
    keys
}

/// Sends every command at once and reads every reply.
fn pipeline(redis: &RedisServer, commands: &[Vec<Vec<u8>>]) -> Vec<Frame> {
    let mut stream = redis.connect();
    let mut out = BytesMut::new();
    for argv in commands {
        encode_command(argv, &mut out);
    }
    stream.write_all(&out).expect("write to redis");
    let mut replies = Vec::with_capacity(commands.len());
    let mut read = BytesMut::new();
    let mut chunk = vec![0u8; 64 * 1024];
    while replies.len() < commands.len() {
        match parse(&mut read, &Limits::default()).expect("a reply") {
            Some(frame) => replies.push(frame),
            None => {
                let n = stream.read(&mut chunk).expect("read from redis");
                assert!(n > 0, "redis hung up");
                read.extend_from_slice(&chunk[..n]);
            }
        }
    }
    replies
}

fn shown(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}

#[test]
fn redis_lets_a_scopes_user_touch_exactly_the_keys_the_policy_admits() {
    let count = std::env::var("TOLLGATE_SCOPE_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_500);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scopes.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let admission = admission(&config(&[&path], Vec::new()));
    let generation = admission.current();
    let redis = RedisServer::start();
    let keys = keys(count);
    let mut checked = 0;
    for principal in ["app", "wide"] {
        let scope = generation
            .scopes()
            .of(principal)
            .unwrap_or_else(|| panic!("{principal} runs EVAL under a keyed rule: scoped"));
        let user = scope_user(scope);
        let mut setuser: Vec<Vec<u8>> = ["ACL", "SETUSER", &user.name, "reset", "on", "nopass"]
            .iter()
            .map(|word| word.as_bytes().to_vec())
            .collect();
        setuser.extend(user.acl_rules().into_iter().map(String::into_bytes));
        let reply = pipeline(&redis, &[setuser]);
        assert_eq!(
            reply,
            [Frame::Simple("OK".into())],
            "ACL SETUSER {}",
            user.name
        );

        let mut commands = Vec::new();
        let mut asked = Vec::new();
        for key in keys.iter().filter(|key| !key.is_empty()) {
            for verb in ["GET", "SET"] {
                let mut argv = vec![verb.as_bytes().to_vec(), key.clone()];
                if verb == "SET" {
                    argv.push(b"v".to_vec());
                }
                let mut dryrun = vec![
                    b"ACL".to_vec(),
                    b"DRYRUN".to_vec(),
                    user.name.clone().into_bytes(),
                ];
                dryrun.extend(argv.iter().cloned());
                commands.push(dryrun);
                asked.push(argv);
            }
        }
        let replies = pipeline(&redis, &commands);
        let who = caller(principal);
        let mut wrong = Vec::new();
        let mut allowed = [0usize; 2];
        for (argv, reply) in asked.iter().zip(&replies) {
            let redis_allows = *reply == Frame::Simple("OK".into());
            let policy_admits = matches!(generation.admit(&who, argv), Decision::Admitted { .. });
            allowed[usize::from(redis_allows)] += 1;
            if redis_allows != policy_admits {
                wrong.push(format!(
                    "{principal} {} {}: redis {reply:?}, policy admits: {policy_admits}",
                    String::from_utf8_lossy(&argv[0]),
                    shown(&argv[1])
                ));
            }
            checked += 1;
        }
        assert!(
            wrong.is_empty(),
            "{} disagreements, first: {:#?}",
            wrong.len(),
            &wrong[..wrong.len().min(12)]
        );
        // Neither answer is rare: the keys test both sides of the patterns.
        assert!(
            allowed[0] * 20 > asked.len() && allowed[1] * 20 > asked.len(),
            "{principal}: {allowed:?}"
        );
        // The reserved keyspace is out of reach whatever the policy says.
        let reserved = pipeline(
            &redis,
            &[["ACL", "DRYRUN", &user.name, "GET", "tollgate:lease:x"]
                .iter()
                .map(|w| w.as_bytes().to_vec())
                .collect()],
        );
        assert_ne!(reserved, [Frame::Simple("OK".into())]);
    }
    assert!(checked >= 4 * (count - 1), "{checked}");
}

/// A scope user for the pool test: PING and GET on `prefix*`.
fn pool_user(name: &str, prefix: &str) -> tollgate_lanes::ScopeUser {
    tollgate_lanes::ScopeUser {
        name: name.to_owned(),
        root: ["PING".to_owned()].into(),
        selectors: vec![tollgate_lanes::ScopeSelector {
            commands: ["GET".to_owned()].into(),
            patterns: vec![format!("{prefix}*").into_bytes()],
            read_only: true,
            channels: false,
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_pools_log_in_as_their_users_and_past_the_maximum_one_more_is_refused() {
    use tollgate_lanes::{LaneError, Lanes, Topology};

    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = crate::lanes::endpoint(redis.socket());
    let mut base = tollgate_lanes::LanesConfig::default();
    base.scopes.max = 1;
    let provisioned = tollgate_lanes::provision(
        std::slice::from_ref(&endpoint),
        Some(&crate::support::daemon::testkit_admin()),
        dir.path(),
        &base,
        &crate::support::daemon::default_grants(),
    )
    .await
    .unwrap();
    let logins = provisioned
        .users
        .set_scopes(
            &endpoint,
            ["tollgate-scope-a", "tollgate-scope-b"]
                .iter()
                .zip(["a:", "b:"])
                .map(|(name, prefix)| (name.to_string(), pool_user(name, prefix).acl_rules()))
                .collect(),
        )
        .await
        .unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let lanes = Lanes::open(
        &Topology::Standalone(endpoint.clone()),
        &provisioned.config,
        &mut registry,
    )
    .unwrap();
    let get = |key: &str| crate::lanes::cmd(&["GET", key]);

    // A's pool logs in as A: its key patterns hold.
    let a = lanes
        .scoped_speaking(&logins[0], tollgate_model::Protocol::Resp2)
        .unwrap();
    let mine = a.send(get("a:1")).await.unwrap();
    assert!(!mine.is_error(), "{mine:?}");
    let other = a.send(get("b:1")).await.unwrap();
    assert!(other.is_error(), "{other:?}");
    assert_eq!(lanes.scope_pools(), 1);

    // One pool at most: B is refused while A is held, naming the setting.
    match lanes.scoped_speaking(&logins[1], tollgate_model::Protocol::Resp2) {
        Err(LaneError::Scope { user, reason }) => {
            assert_eq!(user, "tollgate-scope-b");
            assert!(reason.contains("lanes.scopes.max"), "{reason}");
        }
        Err(error) => panic!("{error}"),
        Ok(_) => panic!("a second scope's pool opened past lanes.scopes.max = 1"),
    }
    // Once no one holds A, B takes its place.
    drop(a);
    let b = lanes
        .scoped_speaking(&logins[1], tollgate_model::Protocol::Resp2)
        .unwrap();
    assert!(!b.send(get("b:1")).await.unwrap().is_error());
    assert_eq!(lanes.scope_pools(), 1);

    // Scopes set again without A: A's user is gone from Redis.
    provisioned
        .users
        .set_scopes(
            &endpoint,
            vec![(
                "tollgate-scope-b".to_owned(),
                pool_user("tollgate-scope-b", "b:").acl_rules(),
            )],
        )
        .await
        .unwrap();
    let gone = redis.inline("ACL GETUSER tollgate-scope-a");
    assert!(matches!(gone.trim_end(), "$-1" | "*-1"), "{gone}");
    assert!(
        !b.send(get("b:2")).await.unwrap().is_error(),
        "B kept its password and connection"
    );
    lanes.close(std::time::Duration::from_secs(1)).await;
}

/// The scopes of the tenants example, as `tollgate policy scopes` prints them: a change to the
/// policy that changes what Redis holds scripts to shows up in this snapshot.
#[test]
fn the_tenants_scopes_have_a_reviewed_snapshot() {
    let tenants = crate::policy_support::root().join("policies/examples/tenants.yaml");
    let generation = admission(&config(&[&tenants], Vec::new())).current();
    let text = tollgate::scope_users::render(&generation);
    crate::policy_support::snapshot_settings().bind(|| {
        insta::assert_snapshot!("scopes__tenants", text);
    });
}
