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
