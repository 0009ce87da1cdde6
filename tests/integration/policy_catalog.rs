//! The built-in catalog against a live redis-server: it must know every command and subcommand
//! the server knows, and resolve the same keys as the server's own `COMMAND GETKEYS`.

use std::collections::BTreeSet;

use bytes::Bytes;
use tollgate_policy::{Decision, PolicyConfig};
use tollgate_testkit::RedisServer;

use crate::policy_support::{admission, caller, fuel_limits};

fn names_the_server_knows(connection: &mut redis::Connection) -> BTreeSet<String> {
    let info: Vec<redis::Value> = redis::cmd("COMMAND").arg("INFO").query(connection).unwrap();
    let mut names = BTreeSet::new();
    for entry in &info {
        collect(entry, &mut names);
    }
    names
}

/// A COMMAND INFO entry: [name, arity, flags, first, last, step, categories, tips, keyspecs, subs].
fn collect(entry: &redis::Value, names: &mut BTreeSet<String>) {
    let redis::Value::Array(fields) = entry else {
        panic!("COMMAND INFO entry is not an array: {entry:?}")
    };
    let name: String = redis::from_redis_value_ref(&fields[0]).unwrap();
    names.insert(name.to_ascii_uppercase());
    if let Some(redis::Value::Array(subcommands)) = fields.get(9) {
        for sub in subcommands {
            collect(sub, names);
        }
    }
}

#[test]
fn the_catalog_knows_every_command_of_the_live_server() {
    let server = RedisServer::start();
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let live = names_the_server_knows(&mut connection);
    assert!(
        live.len() > 200,
        "COMMAND INFO listed only {} commands",
        live.len()
    );

    let admission = admission(&PolicyConfig {
        limits: fuel_limits(),
        ..PolicyConfig::default()
    });
    let known: BTreeSet<String> = admission.current().catalog().map(|d| d.name).collect();
    let missing: Vec<&String> = live.difference(&known).collect();
    assert!(
        missing.is_empty(),
        "the catalog lacks {missing:?}: run scripts/gen-catalog.py"
    );
}

#[test]
fn key_positions_agree_with_command_getkeys() {
    let server = RedisServer::start();
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let admission = admission(&PolicyConfig {
        limits: fuel_limits(),
        ..PolicyConfig::default()
    });
    let lines = [
        "GET a",
        "SET a v EX 10",
        "MSET a 1 b 2 c 3",
        "MGET a b c",
        "EVAL s 2 k1 k2 x y",
        "EVALSHA 0123 1 k1 x",
        "FCALL f 2 k1 k2 x",
        "XREAD COUNT 2 STREAMS s1 s2 0 0",
        "XREADGROUP GROUP g c STREAMS s1 >",
        "ZUNIONSTORE dst 2 z1 z2 WEIGHTS 1 2",
        "LMOVE src dst LEFT RIGHT",
        "BLMPOP 0 2 l1 l2 LEFT",
        "GEORADIUS g 0 0 1 km STORE dst",
        "MIGRATE host 6379 k1 0 5000",
        "OBJECT ENCODING k",
        "MEMORY USAGE k",
        "BITOP AND dst s1 s2",
        "RENAME a b",
        "SINTERCARD 2 s1 s2 LIMIT 1",
        "XADD s * f v",
        "PFMERGE dst h1 h2",
    ];
    for line in lines {
        let args: Vec<&str> = line.split(' ').collect();
        let argv: Vec<Bytes> = args.iter().map(|a| Bytes::from(a.to_string())).collect();
        let ours: Vec<String> = match admission.admit(&caller("local"), &argv) {
            Decision::Admitted { descriptor, .. } => descriptor
                .keys(&argv)
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect(),
            Decision::Denied(denial) => panic!("{line}: {denial}"),
        };
        let mut getkeys = redis::cmd("COMMAND");
        getkeys.arg("GETKEYS");
        for arg in &args {
            getkeys.arg(*arg);
        }
        let theirs: Vec<String> = getkeys
            .query(&mut connection)
            .unwrap_or_else(|error| panic!("{line}: {error}"));
        assert_eq!(ours, theirs, "{line}");
    }
}
