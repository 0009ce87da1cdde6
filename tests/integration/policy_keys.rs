//! The built-in catalog's keys are Redis's keys: argument vectors generated for every command and
//! subcommand from a live redis-server's `COMMAND DOCS` (support/command_docs.rs), each described
//! by the catalog and by that server's `COMMAND GETKEYSANDFLAGS`, must name the same keys with the
//! same read/write flags. `TOLLGATE_KEYS_CASES` sets the vectors per command (default 24).
//!
//! Where Redis cannot say, the catalog says more, never less ([`STRICTER`]): there it must name
//! every key Redis names (with at least its flags), and the fixed cases below show what the
//! command really does on that server.
//!
//! How Redis's flags read: RO, RW and `access` read; RW, OW, RM, `update`, `insert` and `delete`
//! write. A key Redis names without flags comes from a key procedure that gives none (`+1` as
//! numkeys, which the command itself refuses): only its name is compared. A catalog key with no
//! access is a shard channel (SPUBLISH's), which Redis's `not_key` specs keep out of GETKEYS.

use std::collections::BTreeSet;

use bytes::Bytes;
use tempfile::TempDir;
use tollgate_policy::{Admission, Decision, DenyCause, Descriptor, PolicyConfig};
use tollgate_testkit::RedisServer;

use tollgate_resp::Frame;

use crate::policy_support::{admission, caller, fuel_limits, root};
use crate::support::command_docs::{self, Generator, Rng};
use crate::support::daemon::TestDaemon;
use crate::support::raw::{text, RawClient};

/// Commands whose keys Redis's `COMMAND GETKEYS` cannot fully name, and why the catalog names more.
const STRICTER: &[(&str, &str)] = &[
    (
        "SORT",
        "BY and GET take patterns that reach keys no one can name before the sort runs; they \
         count as read keys. Every STORE counts; Redis names the last",
    ),
    (
        "SORT_RO",
        "BY and GET take patterns that reach keys no one can name before the sort runs",
    ),
    (
        "GEORADIUS",
        "Redis stores to the last STORE or STOREDIST, its key spec names the first: all count",
    ),
    (
        "GEORADIUSBYMEMBER",
        "Redis stores to the last STORE or STOREDIST, its key spec names the first: all count",
    ),
    (
        "XREADGROUP",
        "the key spec looks for STREAMS from argv[4], as if GROUP came first; the command finds \
         it past its options, so a group named STREAMS misleads the spec: both count",
    ),
];

/// How a key is used: (read, write), or `None` when Redis gave no flags.
type Use = Option<(bool, bool)>;

/// Every key of one answer, as (name, use), sorted.
type Keys = Vec<(Vec<u8>, Use)>;

/// What the live server says of one argv.
enum Theirs {
    Keys(Keys),
    /// `The command has no key arguments`: the catalog must name none either.
    Keyless,
    /// Redis refuses to say (`Invalid arguments specified for command`, or the arity).
    Refused,
}

struct Sides {
    _dir: TempDir,
    admission: Admission,
    _server: RedisServer,
    connection: redis::Connection,
}

/// A policy that admits every command, so that every descriptor reaches the test.
fn sides() -> Sides {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("all.yaml");
    std::fs::write(
        &policy,
        "principals:\n  keys: { any: true }\nrules:\n  - id: all\n    commands: [\"@slow\", \"@fast\"]\n    allow: the key differential test describes every command\n",
    )
    .unwrap();
    let admission = admission(&PolicyConfig {
        files: vec![policy],
        limits: fuel_limits(),
        ..PolicyConfig::default()
    });
    let server = RedisServer::start();
    let connection = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    Sides {
        _dir: dir,
        admission,
        _server: server,
        connection,
    }
}

impl Sides {
    /// The catalog's descriptor of `argv`; `None` for the server-wide commands the host refuses
    /// whatever the policy says (FLUSHALL, SWAPDB: they name no key), and for an argv of the
    /// wrong arity, which the host refuses before reading keys (Redis's GETKEYS refuses it too).
    fn descriptor(&self, argv: &[Vec<u8>]) -> Option<std::sync::Arc<Descriptor>> {
        let argv: Vec<Bytes> = argv.iter().map(|a| Bytes::from(a.clone())).collect();
        match self.admission.admit(&caller("keys"), &argv) {
            Decision::Admitted { descriptor, .. } => Some(descriptor),
            Decision::Denied(denial)
                if denial.cause == DenyCause::Reserved
                    && matches!(denial.command.as_str(), "FLUSHALL" | "SWAPDB") =>
            {
                None
            }
            Decision::Denied(denial) if denial.cause == DenyCause::WrongArity => None,
            Decision::Denied(denial) => panic!("{}: {denial}", show(&argv)),
        }
    }

    fn ours(&self, argv: &[Vec<u8>]) -> Keys {
        let Some(descriptor) = self.descriptor(argv) else {
            return Keys::new();
        };
        let mut keys: Keys = descriptor
            .keys
            .iter()
            .filter(|key| key.read || key.write)
            .map(|key| (argv[key.position].clone(), Some((key.read, key.write))))
            .collect();
        keys.sort();
        keys
    }

    fn theirs(&mut self, argv: &[Vec<u8>]) -> Theirs {
        // GETKEYS needs an argument after the name; a name alone has no room for keys.
        if argv.len() == 1 {
            return Theirs::Keyless;
        }
        let mut command = redis::cmd("COMMAND");
        command.arg("GETKEYSANDFLAGS");
        for arg in argv {
            command.arg(&arg[..]);
        }
        let reply: Vec<(Vec<u8>, Vec<String>)> = match command.query(&mut self.connection) {
            Ok(reply) => reply,
            Err(error) => {
                let said = error.to_string();
                if said.contains("no key arguments") {
                    return Theirs::Keyless;
                }
                if said.contains("Invalid arguments") || said.contains("Invalid number of") {
                    return Theirs::Refused;
                }
                panic!("{}: COMMAND GETKEYSANDFLAGS failed: {said}", show(argv));
            }
        };
        let mut keys: Keys = reply
            .into_iter()
            .map(|(key, flags)| (key, redis_use(&flags)))
            .collect();
        keys.sort();
        Theirs::Keys(keys)
    }

    /// Runs a command line on the server itself.
    fn cli(&mut self, line: &str) -> redis::Value {
        let argv = words(line);
        let mut command = redis::cmd(std::str::from_utf8(&argv[0]).unwrap());
        for arg in &argv[1..] {
            command.arg(&arg[..]);
        }
        command
            .query(&mut self.connection)
            .unwrap_or_else(|error| panic!("{line:?}: {error}"))
    }
}

fn redis_use(flags: &[String]) -> Use {
    let has = |names: &[&str]| flags.iter().any(|f| names.contains(&f.as_str()));
    let read = has(&["RO", "RW", "access"]);
    let write = has(&["RW", "OW", "RM", "update", "insert", "delete"]);
    (read || write).then_some((read, write))
}

/// Whether the catalog's keys answer Redis's: equal, or for a [`STRICTER`] command a superset
/// (every key of Redis's, with at least its flags). Flagless keys of Redis's compare by name.
fn agrees(name: &str, ours: &Keys, theirs: &Keys) -> bool {
    let stricter = STRICTER.iter().any(|(command, _)| *command == name);
    let flagless = theirs.iter().any(|(_, used)| used.is_none());
    if !stricter && !flagless {
        return ours == theirs;
    }
    if !stricter && ours.len() != theirs.len() {
        return false;
    }
    let mut left: Vec<&(Vec<u8>, Use)> = ours.iter().collect();
    theirs.iter().all(|(key, used)| {
        let covers = |(our_key, our_use): &&(Vec<u8>, Use)| {
            our_key == key
                && match (used, our_use) {
                    (None, _) => true,
                    (Some((r, w)), Some((our_r, our_w))) => (!r || *our_r) && (!w || *our_w),
                    (Some(_), None) => false,
                }
        };
        match left.iter().position(covers) {
            Some(at) => {
                left.remove(at);
                true
            }
            None => false,
        }
    })
}

fn show<A: AsRef<[u8]>>(argv: &[A]) -> String {
    argv.iter()
        .map(|a| format!("{:?}", String::from_utf8_lossy(a.as_ref())))
        .collect::<Vec<_>>()
        .join(" ")
}

fn show_keys(keys: &Keys) -> String {
    keys.iter()
        .map(|(key, used)| {
            let used = match used {
                Some((true, true)) => "rw",
                Some((true, false)) => "r",
                Some((false, true)) => "w",
                _ => "-",
            };
            format!("{}:{used}", String::from_utf8_lossy(key))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn cases_per_command() -> usize {
    std::env::var("TOLLGATE_KEYS_CASES")
        .ok()
        .map(|n| n.parse().expect("TOLLGATE_KEYS_CASES is a number"))
        .unwrap_or(24)
}

#[test]
fn generated_argument_vectors_have_the_keys_redis_names() {
    let mut sides = sides();
    let docs: redis::Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .query(&mut sides.connection)
        .unwrap();
    let commands = command_docs::commands(&docs);
    assert!(
        commands.len() > 300,
        "COMMAND DOCS listed only {}",
        commands.len()
    );
    let mut rng = Rng::new(0x7011_6a7e);
    let per_command = cases_per_command();
    let (mut generated, mut compared, mut keyless, mut refused) = (0, 0, 0, 0);
    let mut covered = BTreeSet::new();
    let mut divergences = Vec::new();
    for command in commands.iter().filter(|c| !c.container) {
        for _ in 0..per_command {
            let argv = Generator::argv(&mut rng, command);
            generated += 1;
            let ours = sides.ours(&argv);
            let theirs = match sides.theirs(&argv) {
                Theirs::Refused => {
                    refused += 1;
                    continue;
                }
                Theirs::Keyless => {
                    keyless += 1;
                    Vec::new()
                }
                Theirs::Keys(keys) => keys,
            };
            compared += 1;
            covered.insert(command.name.clone());
            let name = sides.descriptor(&argv).map_or_else(
                || String::from_utf8_lossy(&argv[0]).to_ascii_uppercase(),
                |descriptor| descriptor.name.clone(),
            );
            if !agrees(&name, &ours, &theirs) {
                divergences.push(format!(
                    "{}\n    catalog: {}\n    redis:   {}",
                    show(&argv),
                    show_keys(&ours),
                    show_keys(&theirs)
                ));
            }
        }
    }
    let uncovered: Vec<&str> = commands
        .iter()
        .filter(|c| !c.container)
        .map(|c| c.name.as_str())
        .filter(|name| !covered.contains(*name))
        .collect();
    println!(
        "key differential: {generated} vectors generated for {} commands and subcommands; \
         {compared} compared ({keyless} of them keyless), {refused} refused by Redis; \
         {} commands covered; {} divergences",
        commands.len(),
        covered.len(),
        divergences.len()
    );
    assert!(
        divergences.is_empty(),
        "{} divergences:\n{}",
        divergences.len(),
        divergences.join("\n")
    );
    assert!(
        uncovered.is_empty(),
        "no vector of these was answered by Redis: {uncovered:?}"
    );
}

/// A command line's arguments, split at spaces; `''` is an empty argument.
fn words(line: &str) -> Vec<Vec<u8>> {
    line.split(' ')
        .map(|word| match word {
            "''" => Vec::new(),
            word => word.as_bytes().to_vec(),
        })
        .collect()
}

/// A fixed case: the catalog's keys for `line`, and what Redis's GETKEYSANDFLAGS says of it.
fn expect_keys(sides: &mut Sides, line: &str, expected: &str) {
    let argv = words(line);
    let ours = sides.ours(&argv);
    assert_eq!(show_keys(&ours), expected, "{}", show(&argv));
    let name = sides.descriptor(&argv).expect("admitted").name.clone();
    match sides.theirs(&argv) {
        Theirs::Keys(theirs) => assert!(
            agrees(&name, &ours, &theirs),
            "{}: catalog {} but redis {}",
            show(&argv),
            show_keys(&ours),
            show_keys(&theirs)
        ),
        Theirs::Keyless => assert!(ours.is_empty(), "{}", show(&argv)),
        Theirs::Refused => {}
    }
}

fn exists(sides: &mut Sides, key: &str) -> bool {
    matches!(sides.cli(&format!("EXISTS {key}")), redis::Value::Int(1))
}

#[test]
fn repeated_store_options_count_as_redis_runs_them() {
    let mut sides = sides();
    sides.cli("GEOADD acme:geo 15 37 m");
    // Redis stores to the LAST of STORE / STOREDIST: the catalog must name it.
    let runs = [
        (
            "GEORADIUS acme:geo 15 37 200 km STORE acme:out STORE globex:a",
            "acme:geo:r acme:out:w globex:a:w",
            "globex:a",
        ),
        (
            "georadius acme:geo 15 37 200 km store acme:out storedist globex:b",
            "acme:geo:r acme:out:w globex:b:w",
            "globex:b",
        ),
        (
            "GEORADIUS acme:geo 15 37 200 km STOREDIST acme:out STOREDIST globex:c",
            "acme:geo:r acme:out:w globex:c:w",
            "globex:c",
        ),
        (
            "GEORADIUSBYMEMBER acme:geo m 200 km STORE acme:out STORE globex:d",
            "acme:geo:r acme:out:w globex:d:w",
            "globex:d",
        ),
        (
            "GEORADIUSBYMEMBER acme:geo m 200 km STOREDIST acme:out STORE globex:e",
            "acme:geo:r acme:out:w globex:e:w",
            "globex:e",
        ),
        (
            "GEORADIUS acme:geo 15 37 200 km COUNT 1 STORE\0x globex:f",
            "acme:geo:r globex:f:w",
            "globex:f",
        ),
        (
            "SORT acme:list STORE acme:out STORE globex:g",
            "acme:list:r acme:out:w globex:g:w",
            "globex:g",
        ),
    ];
    sides.cli("RPUSH acme:list 1");
    for (line, keys, written) in runs {
        expect_keys(&mut sides, line, keys);
        sides.cli(line);
        assert!(
            exists(&mut sides, written),
            "{line:?}: Redis wrote no {written}"
        );
    }
}

#[test]
fn option_parsing_commands_name_the_keys_redis_uses() {
    let mut sides = sides();
    let cases = [
        // MIGRATE: argv[3], or every argument after the first KEYS option (AUTH takes one).
        ("MIGRATE h 1 k 0 5000", "k:rw"),
        ("MIGRATE h 1 '' 0 5000 KEYS a KEYS b", "KEYS:rw a:rw b:rw"),
        ("MIGRATE h 1 '' 0 5000 AUTH KEYS keys a", "a:rw"),
        ("MIGRATE h 1 '' 0 5000 AUTH2 u KEYS KEYS a", "a:rw"),
        // SET reads its key only with GET; BITFIELD writes unless every operation is a GET.
        ("SET k v", "k:w"),
        ("SET k v EX 10", "k:w"),
        ("SET k v get", "k:rw"),
        ("SET k v GET\0x", "k:rw"),
        ("SET k get", "k:w"),
        ("BITFIELD k GET u8 0", "k:r"),
        ("BITFIELD k GET u8 0 OVERFLOW SAT INCRBY u8 0 1", "k:rw"),
        ("BITFIELD k GET u8", "k:rw"),
        // Counts as COMMAND GETKEYS reads them (C's atoi, cut to an int).
        ("EVAL s 2 a b c", "a:rw b:rw"),
        ("EVAL s 3 a b", ""),
        ("EVAL s 0 a", ""),
        ("EVAL s 4294967297 a b", "a:rw"),
        ("ZUNIONSTORE d 2 a b WEIGHTS 1 2", "a:r b:r d:w"),
        ("LMPOP 2 a b LEFT COUNT 1", "a:rw b:rw"),
        ("SINTERCARD 2 a b LIMIT 1", "a:r b:r"),
        // Keywords as Redis compares them: up to the first NUL, any case.
        ("XREAD COUNT 1 streams\0x a b 0 0", "a:r b:r"),
        ("XREADGROUP GROUP g STREAMS STREAMS s 0", "s:r"),
        // Shard channels are no keys to Redis (not_key); the catalog keeps them unmarked.
        ("SPUBLISH chan m", ""),
    ];
    for (line, keys) in cases {
        expect_keys(&mut sides, line, keys);
    }
}

#[test]
fn xreadgroup_with_a_group_named_streams_reads_the_stream_the_command_reads() {
    let mut sides = sides();
    sides.cli("XADD real * f v");
    sides.cli("XGROUP CREATE real STREAMS 0");
    // The key spec searches STREAMS from argv[4] and finds the group's name; the command takes
    // COUNT's argument, then GROUP's two, then the STREAMS option: it reads `real`.
    let line = "XREADGROUP COUNT 1 GROUP STREAMS c STREAMS real >";
    let ours = sides.ours(&words(line));
    assert!(
        ours.iter()
            .any(|(key, used)| key == b"real" && *used == Some((true, false))),
        "the catalog does not name the stream read: {}",
        show_keys(&ours)
    );
    let read = sides.cli(line);
    assert!(
        format!("{read:?}").contains("real"),
        "XREADGROUP read no entry of `real`: {read:?}"
    );
}

#[test]
fn xread_blocks_only_with_block_as_redis_reads_it() {
    let sides = sides();
    for (line, lane) in [
        ("XREAD STREAMS s 0", "regular"),
        ("XREAD block 0 STREAMS s 0", "blocking"),
        ("XREAD BLOCK\0x 0 STREAMS s 0", "blocking"),
    ] {
        let descriptor = sides.descriptor(&words(line)).expect("admitted");
        assert_eq!(
            format!("{:?}", descriptor.lane).to_ascii_lowercase(),
            lane,
            "{line:?}"
        );
    }
}

#[tokio::test]
async fn a_name_with_a_nul_is_unknown_even_after_the_name_was_cached() {
    let redis = RedisServer::start();
    let daemon = TestDaemon::start(&redis).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    // Twice, so that SET's answer is kept and the next names would hit it if padding hid them.
    assert_eq!(text(&client.call(&["SET", "k", "first"]).await), "OK");
    assert_eq!(text(&client.call(&["set", "k", "first"]).await), "OK");
    for name in ["SET\0", "set\0\0", "SET\0X", "SET ", "\0SET"] {
        let reply = client.call(&[name, "k", name]).await;
        assert!(
            matches!(&reply, Frame::Error(e) if e.starts_with(b"ERR unknown command")),
            "{name:?}: {reply:?}"
        );
    }
    assert_eq!(text(&client.call(&["GET", "k"]).await), "first");
    assert!(
        redis.inline("GET k").contains("first"),
        "a NUL-named SET reached Redis"
    );
    daemon.stop().await;
}

#[tokio::test]
async fn a_tenant_cannot_store_to_another_tenants_key_by_repeating_store() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // The tenants example, with this test's process as acme.
    let tenants = std::fs::read_to_string(root().join("policies/examples/tenants.yaml")).unwrap();
    let acme = "  acme: { uids: [2001] }";
    assert!(
        tenants.contains(acme),
        "tenants.yaml no longer maps acme so"
    );
    let policy = dir.path().join("tenants.yaml");
    std::fs::write(&policy, tenants.replace(acme, "  acme: { any: true }")).unwrap();
    let daemon =
        TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy.clone()]).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;
    assert_eq!(
        client.call(&["GEOADD", "acme:geo", "15", "37", "m"]).await,
        Frame::Integer(1)
    );
    let georadius = ["GEORADIUS", "acme:geo", "15", "37", "200", "km"];
    for options in [
        &["STORE", "acme:out", "STORE", "globex:secret"][..],
        &["STORE", "acme:out", "STOREDIST", "globex:secret"],
        &["STOREDIST", "acme:out", "store", "globex:secret"],
        &["STORE\0x", "globex:secret"],
    ] {
        let argv: Vec<&str> = georadius.iter().chain(options).copied().collect();
        let reply = client.call(&argv).await;
        assert!(
            matches!(&reply, Frame::Error(e) if e.starts_with(b"NOPERM tollgate: rule ")),
            "{argv:?}: {reply:?}"
        );
    }
    let bymember = [
        "GEORADIUSBYMEMBER",
        "acme:geo",
        "m",
        "200",
        "km",
        "STORE",
        "acme:out",
        "STORE",
        "globex:secret",
    ];
    let reply = client.call(&bymember).await;
    assert!(matches!(&reply, Frame::Error(_)), "{reply:?}");
    assert!(
        redis.inline("EXISTS globex:secret").contains('0'),
        "a repeated STORE wrote another tenant's key"
    );
    // acme's own store still works.
    let argv: Vec<&str> = georadius
        .iter()
        .chain(&["STORE", "acme:out"])
        .copied()
        .collect();
    assert_eq!(client.call(&argv).await, Frame::Integer(1));
    daemon.stop().await;
}
