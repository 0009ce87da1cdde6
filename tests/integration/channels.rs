//! Channels confined like keys (issue 30): rules' `channels:` globs, compile errors at
//! file:line:column, admission of PUBLISH / SUBSCRIBE / PSUBSCRIBE / PUBSUB by the tenants
//! example, and end to end through the daemon with two real OS users: acme's own channels work (a
//! subscriber hears its message), globex's are refused with the policy's words, `PSUBSCRIBE *` and
//! `PSUBSCRIBE acme*` are refused, `PUBSUB CHANNELS` shows acme none of globex's channels, and a
//! script of acme's may publish only on acme's channels (Redis refuses the rest: its scope user's
//! `&` patterns).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tollgate::config::SocketMode;
use tollgate_policy::{Admission, Decision, PolicyConfig};

use crate::identity::{os_user, redis_cli, repository_policy, run_as, OsUser};
use crate::policy_support::{admission, argv, caller, config, denial, fuel_limits};
use crate::support::daemon::TestDaemon;

fn load_error(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, text).unwrap();
    match Admission::load(&config(&[&path], vec![]), &mut Registry::default()) {
        Ok(_) => panic!("policy compiled:\n{text}"),
        Err(error) => error
            .to_string()
            .replace(&path.display().to_string(), "bad.yaml"),
    }
}

fn loads(text: &str) -> Admission {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("good.yaml");
    std::fs::write(&path, text).unwrap();
    admission(&PolicyConfig {
        files: vec![path],
        limits: fuel_limits(),
        ..PolicyConfig::default()
    })
}

const HEAD: &str = "principals:\n  acme: { uids: [2001] }\nrules:\n";

#[test]
fn channel_rules_fail_to_compile_at_file_line_and_column() {
    let cases = [
        (
            "  - id: r\n    commands: [PUBLISH]\n    channels: [\"acme:[x\"]\n    allow: x\n",
            "bad.yaml:6:16: error: bad glob `acme:[x`: `[` is never closed (at byte 5)",
        ),
        (
            "  - id: r\n    commands: [PUBLISH]\n    channels: []\n    allow: x\n",
            "bad.yaml:6:15: error: `channels` is empty",
        ),
        (
            "  - id: r\n    leases: [\"acme:*\"]\n    channels: [\"acme:*\"]\n    allow: x\n",
            "bad.yaml:6:15: error: rule `r`: `channels` apply to commands, not leases",
        ),
        // Keys never confine channels: a keyed rule that names pub/sub is refused where it does.
        (
            "  - id: r\n    commands: [GET, \"@pubsub\"]\n    keys: [\"acme:*\"]\n    allow: x\n",
            "bad.yaml:5:21: error: rule `r`: `@pubsub` reaches commands that name channels",
        ),
        (
            "  - id: r\n    commands: [GET, publish]\n    keys: [\"acme:*\"]\n    allow: x\n",
            "bad.yaml:5:21: error: rule `r`: `publish` reaches commands that name channels",
        ),
    ];
    for (rules, expected) in cases {
        let error = load_error(&format!("{HEAD}{rules}"));
        assert!(
            error.starts_with(expected),
            "expected {expected}\n got {error}"
        );
    }
}

/// The accident tenants policies had: keys confined by one rule, channels left open by another.
#[test]
fn a_key_confined_principal_gets_no_channel_unconfined_by_accident() {
    let yaml = format!(
        "{HEAD}  - id: acme-keys\n    principals: [acme]\n    commands: [GET]\n    keys: [\"acme:*\"]\n    allow: x\n\
         \x20 - id: chat\n    commands: [PING, \"@pubsub\"]\n    allow: y\n"
    );
    let error = load_error(&yaml);
    assert!(
        error.contains(
            "bad.yaml:10:22: error: rule `chat` grants PUBLISH on every channel to `acme`, whose \
             keys rule `acme-keys` confines: give it `channels:` globs"
        ),
        "{error}"
    );
    // Said on purpose, it compiles: `channels: ["*"]`.
    let on_purpose = yaml.replace("    allow: y\n", "    channels: [\"*\"]\n    allow: y\n");
    let admission = loads(&on_purpose);
    assert!(matches!(
        admission.admit(&caller("acme"), &argv("PUBLISH anything hi")),
        Decision::Admitted { .. }
    ));
    // A keyed rule that reaches pub/sub only through `*` does not match channels at all.
    let star = format!(
        "{HEAD}  - id: acme-all\n    principals: [acme]\n    commands: [\"*\"]\n    keys: [\"acme:*\"]\n    allow: x\n"
    );
    let admission = loads(&star);
    let refused = denial(admission.admit(&caller("acme"), &argv("PUBLISH acme:chan hi")));
    assert_eq!(refused.rule, "default-deny");
}

fn tenants() -> Admission {
    admission(&PolicyConfig {
        files: vec![repository_policy("examples/tenants.yaml")],
        limits: fuel_limits(),
        ..PolicyConfig::default()
    })
}

#[test]
fn the_tenants_example_confines_each_tenant_to_its_channels() {
    let admission = tenants();
    let admitted = |principal: &str, line: &str| {
        matches!(
            admission.admit(&caller(principal), &argv(line)),
            Decision::Admitted { .. }
        )
    };
    for line in [
        "PUBLISH acme:news hi",
        "SUBSCRIBE acme:a acme:b",
        "PSUBSCRIBE acme:*",
        "PSUBSCRIBE acme:[ab]*",
        "PSUBSCRIBE acme:?",
        "SPUBLISH acme:news hi",
        "SSUBSCRIBE acme:shard",
        "PUBSUB CHANNELS acme:*",
        "PUBSUB NUMSUB acme:a acme:b",
        "UNSUBSCRIBE globex:news",
    ] {
        assert!(admitted("acme", line), "acme: {line}");
    }
    for line in [
        "PUBLISH globex:news hi",
        "SUBSCRIBE acme:a globex:b",
        "PSUBSCRIBE *",
        "PSUBSCRIBE acme*",
        "PSUBSCRIBE acme?*",
        "PSUBSCRIBE acme:* *",
        "PSUBSCRIBE acme:[]]",
        "SPUBLISH globex:news hi",
        "SPUBLISH shared:news hi",
        "PUBSUB CHANNELS",
        "PUBSUB CHANNELS *",
        "PUBSUB NUMPAT",
        "PUBSUB NUMSUB acme:a globex:b",
    ] {
        assert!(!admitted("acme", line), "acme: {line}");
    }
    let refused = denial(admission.admit(&caller("acme"), &argv("PUBLISH globex:news hi")));
    assert_eq!(
        (refused.rule.as_str(), refused.command.as_str()),
        ("default-deny", "PUBLISH")
    );
    assert!(admitted("globex", "PUBLISH globex:news hi"));
    assert!(!admitted("globex", "PSUBSCRIBE acme:*"));
    // A channel longer than the prefix of an argument that crosses into the sandbox crosses
    // whole: what decides is its end.
    let long = format!("acme:{}", "x".repeat(200));
    assert!(admitted("acme", &format!("PUBLISH {long} hi")));
    let sneaky = format!("acme:{}", "x".repeat(100));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ends.yaml");
    std::fs::write(
        &path,
        format!(
            "{HEAD}  - id: ends\n    commands: [PUBLISH]\n    channels: [\"acme:*:public\"]\n    allow: x\n"
        ),
    )
    .unwrap();
    let ends = admission_of(&path);
    let judged = |channel: String| {
        matches!(
            ends.admit(&caller("acme"), &argv(&format!("PUBLISH {channel} hi"))),
            Decision::Admitted { .. }
        )
    };
    assert!(judged(format!("{sneaky}:public")));
    assert!(!judged(format!("{sneaky}:private")));
}

fn admission_of(path: &std::path::Path) -> Admission {
    admission(&PolicyConfig {
        files: vec![path.to_path_buf()],
        limits: fuel_limits(),
        ..PolicyConfig::default()
    })
}

/// The tenants example with each tenant mapped to a real OS user.
fn policy(acme: &OsUser, globex: &OsUser) -> String {
    std::fs::read_to_string(repository_policy("examples/tenants.yaml"))
        .unwrap()
        .replace("uids: [2001]", &format!("uids: [{}]", acme.uid))
        .replace("uids: [2002]", &format!("uids: [{}]", globex.uid))
}

/// What `redis-cli` printed for `argv` sent as `user`.
async fn run(daemon: &TestDaemon, user: &OsUser, argv: &[&str]) -> String {
    redis_cli(user, daemon, argv).await.trim_end().to_owned()
}

/// A subscriber as `user`: subscribes with `argv`, then prints everything it reads until it has
/// seen `until` or 10 s passed.
const SUBSCRIBER: &str = r#"
import socket, sys, time
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
args = sys.argv[3:]
sock.sendall(("*%d\r\n" % len(args) + "".join("$%d\r\n%s\r\n" % (len(a), a) for a in args)).encode())
sock.settimeout(0.5)
seen = b""
deadline = time.time() + 10
while sys.argv[2].encode() not in seen and time.time() < deadline:
    try:
        chunk = sock.recv(65536)
        if not chunk:
            break
        seen += chunk
    except socket.timeout:
        pass
sys.stdout.write(seen.decode(errors="replace"))
"#;

/// A Python the other users can run (not one under root's home, as pyenv's shims are).
fn python() -> &'static str {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|path| std::path::Path::new(path).exists())
        .expect("a system python3 for the subscriber")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reaches_only_its_own_channels_end_to_end() {
    let (Some(acme), Some(globex)) = (os_user("tollgate-acme"), os_user("tollgate-globex")) else {
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("tollgate-channels")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("tenants.yaml");
    std::fs::write(&path, policy(&acme, &globex)).unwrap();
    let script = dir.path().join("subscriber.py");
    std::fs::write(&script, SUBSCRIBER).unwrap();
    let mut daemon_config = TestDaemon::config(dir.path());
    daemon_config.runtime_dir = Some(dir.path().join("run"));
    daemon_config.listen.mode = SocketMode(0o666);
    daemon_config.policy.files = vec![path.clone()];
    let daemon = TestDaemon::start_config(dir, daemon_config).await;
    let socket = daemon.resp_socket().display().to_string();
    let script = script.display().to_string();

    // globex listens on its own channel; acme can neither publish there nor subscribe to it.
    let subscribe = |user: OsUser, until: &'static str, argv: Vec<&'static str>| {
        let (socket, script) = (socket.clone(), script.clone());
        tokio::spawn(async move {
            let mut args = vec![script.as_str(), socket.as_str(), until];
            args.extend(argv);
            let output = run_as(&user, python(), &args).await;
            String::from_utf8_lossy(&output.stdout).into_owned()
        })
    };
    let globex_listens = subscribe(
        globex.clone(),
        "from-globex",
        vec!["SUBSCRIBE", "globex:chan"],
    );
    let acme_listens = subscribe(acme.clone(), "from-acme", vec!["SUBSCRIBE", "acme:chan"]);
    let acme_patterns = subscribe(acme.clone(), "from-acme", vec!["PSUBSCRIBE", "acme:*"]);
    for (argv, command) in [
        (&["PUBLISH", "globex:chan", "from-acme"][..], "PUBLISH"),
        (&["SUBSCRIBE", "globex:chan"], "SUBSCRIBE"),
        (&["PSUBSCRIBE", "*"], "PSUBSCRIBE"),
        // `acme*` matches `acmex`, which is not acme's.
        (&["PSUBSCRIBE", "acme*"], "PSUBSCRIBE"),
        (&["PUBSUB", "CHANNELS"], "PUBSUB"),
        (&["PUBSUB", "NUMPAT"], "PUBSUB"),
    ] {
        let refused = run(&daemon, &acme, argv).await;
        assert!(
            refused.contains(&format!("tollgate: rule default-deny denies {command}")),
            "{argv:?}: {refused}"
        );
    }
    // Its own: published until both subscribers heard it and left (a subscription takes a
    // moment to be made).
    let mut published = Vec::new();
    for _ in 0..80 {
        published.push(run(&daemon, &acme, &["PUBLISH", "acme:chan", "from-acme"]).await);
        if acme_listens.is_finished() && acme_patterns.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let heard = acme_listens.await.unwrap();
    assert!(heard.contains("from-acme"), "{heard} after {published:?}");
    let heard = acme_patterns.await.unwrap();
    assert!(
        heard.contains("pmessage") && heard.contains("from-acme"),
        "{heard} after {published:?}"
    );
    // PUBSUB CHANNELS with acme's own pattern lists acme's channels only: globex's subscriber
    // is still there and unseen.
    let listed = run(&daemon, &acme, &["PUBSUB", "CHANNELS", "acme:*"]).await;
    assert!(!listed.contains("globex"), "{listed}");
    let seen_by_globex = run(&daemon, &globex, &["PUBSUB", "CHANNELS", "globex:*"]).await;
    assert!(seen_by_globex.contains("globex:chan"), "{seen_by_globex}");
    assert_eq!(
        run(&daemon, &globex, &["PUBLISH", "globex:chan", "from-globex"]).await,
        "1"
    );
    let globex_heard = globex_listens.await.unwrap();
    assert!(globex_heard.contains("from-globex"), "{globex_heard}");
    assert!(!globex_heard.contains("from-acme"), "{globex_heard}");

    // A script of acme's runs as its scope user, whose channel patterns are acme's grants: Redis
    // refuses a PUBLISH elsewhere however the script names the channel.
    let eval = |body: &'static str| ["EVAL", body, "0"];
    for body in [
        "return redis.call('PUBLISH', 'globex:chan', 'x')",
        "return redis.call('PUBLISH', 'glo' .. 'bex:chan', 'x')",
        "return redis.call('PUBLISH', 'tollgate:chan', 'x')",
    ] {
        let refused = run(&daemon, &acme, &eval(body)).await;
        assert!(
            refused.contains("can't publish to the channel")
                && refused.ends_with(
                    "(tollgate: scope of rule acme-channels does not include that channel)"
                ),
            "{body}: {refused}"
        );
    }
    assert_eq!(
        run(
            &daemon,
            &acme,
            &eval("return redis.call('PUBLISH', 'acme:' .. 'chan', 'x')")
        )
        .await,
        "0"
    );
    daemon.stop().await;
}
