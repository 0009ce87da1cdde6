//! `tollgate policy replay` and `tollgate policy unused` on decision logs: real traffic through
//! the daemon (a real redis-server) with the decision log on, replayed against a changed policy,
//! reports exactly the changes the daemon itself makes once it runs the changed policy; a log's
//! malformed lines are counted by number, never fatal; the rules `unused` lists are exactly those
//! no logged decision names; the reports have reviewed snapshots.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use tollgate_policy::classes::replay::{Replayer, Unused};
use tollgate_policy::{DecisionLogConfig, KeyRendering};
use tollgate_testkit::RedisServer;

use crate::policy_support::{admission, config, root, snapshot_settings};
use crate::support::daemon::{tempdir, TestDaemon};

const OLD: &str = r#"principals:
  me: { any: true }
rules:
  - id: no-flush
    commands: [FLUSHALL, FLUSHDB]
    deny: wipes every key
  - id: locked
    commands: ["@write"]
    keys: ["app:locked:*"]
    deny: locked keys are read-only
  - id: app
    commands: ["@read", "@write", "@keyspace"]
    keys: ["app:*"]
    allow: the application's keys
  - id: connection
    commands: ["@connection"]
    allow: housekeeping
  - id: scripts
    commands: [EVAL]
    allow: nobody runs scripts here
"#;

/// Locked keys become writable, and the application loses every write but DEL's: the same globs,
/// so keys logged as classes of [`OLD`] replay exactly.
const NEW: &str = r#"principals:
  me: { any: true }
rules:
  - id: no-flush
    commands: [FLUSHALL, FLUSHDB]
    deny: wipes every key
  - id: locked-writes
    commands: ["@write"]
    keys: ["app:locked:*"]
    allow: locked keys are writable now
  - id: app
    commands: ["@read", "@keyspace"]
    keys: ["app:*"]
    allow: the application reads its keys, and deletes them
  - id: connection
    commands: ["@connection"]
    allow: housekeeping
"#;

/// Commands sent, each this many times.
const TRAFFIC: &[(&str, usize)] = &[
    ("SET app:1 v", 5),
    ("GET app:1", 4),
    ("SET app:locked:1 v", 3),
    ("GET app:locked:1", 2),
    ("DEL app:1 app:locked:2", 2),
    ("GET other:1", 3),
    ("FLUSHALL", 1),
    ("PING", 2),
    ("MSET app:2 a app:3 b", 2),
    ("SET tollgate:x v", 1),
];

async fn send(connection: &mut redis::aio::MultiplexedConnection) {
    for (line, times) in TRAFFIC {
        for _ in 0..*times {
            let words: Vec<&str> = line.split_whitespace().collect();
            let mut command = redis::cmd(words[0]);
            for word in &words[1..] {
                command.arg(*word);
            }
            let _: redis::RedisResult<redis::Value> = command.query_async(connection).await;
        }
    }
}

fn logged(path: &Path, at_least: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines.len() >= at_least {
            return lines;
        }
        assert!(Instant::now() < deadline, "{} lines logged", lines.len());
        std::thread::sleep(Duration::from_millis(50));
    }
}

type Decided = (bool, String);

fn decided(line: &serde_json::Value) -> Decided {
    (
        line["decision"] == "admitted",
        line["rule"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_real_traffic_reports_the_changes_the_daemon_makes_under_the_new_policy() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let policy = dir.path().join("policy.yaml");
    let old = dir.path().join("old.yaml");
    let new = dir.path().join("new.yaml");
    let log = dir.path().join("decisions.jsonl");
    std::fs::write(&policy, OLD).unwrap();
    std::fs::write(&old, OLD).unwrap();
    std::fs::write(&new, NEW).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.policy.files = vec![policy.clone()];
        config.policy.decision_log = Some(DecisionLogConfig {
            path: log.clone(),
            keys: KeyRendering::Digest,
        });
    })
    .await;
    let client = redis::Client::open(format!("unix://{}", daemon.resp_socket().display())).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    send(&mut connection).await;
    // What the daemon answers itself (PING) is not admitted, so not logged: every other command
    // is, denied ones included. Waiting for exactly that many (not a lower bound, which a slow
    // writer on a loaded machine could meet one line early) leaves nothing still to come.
    let sent: usize = TRAFFIC
        .iter()
        .filter(|(line, _)| *line != "PING")
        .map(|(_, n)| n)
        .sum();
    let before = logged(&log, sent).len();
    assert_eq!(before, sent, "one line per admitted or refused command");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(logged(&log, 1).len(), before, "the log still grows");

    // The same traffic through the daemon running the new policy.
    std::fs::write(&policy, NEW).unwrap();
    let reloaded = daemon.post("/v1/policy/reload", "").await;
    assert_eq!(reloaded.status, 200, "{:?}", reloaded.json());
    send(&mut connection).await;
    let lines = logged(&log, 2 * before);
    daemon.stop().await;
    assert_eq!(lines.len(), 2 * before);
    let (first, second) = lines.split_at(before);
    let mut really: BTreeMap<(Decided, Decided), u64> = BTreeMap::new();
    for (a, b) in first.iter().zip(second) {
        assert_eq!(a["command"], b["command"]);
        assert_eq!(
            a["regions"], b["regions"],
            "the same globs, the same classes"
        );
        assert_eq!(
            (a["generation"].as_u64(), b["generation"].as_u64()),
            (Some(1), Some(2))
        );
        if decided(a) != decided(b) {
            *really.entry((decided(a), decided(b))).or_default() += 1;
        }
    }
    assert!(really.len() >= 3, "{really:?}");

    // The replay of the first run against the new policy says the same, change by change.
    let first_run = dir.path().join("first.jsonl");
    let text: String = first.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&first_run, text).unwrap();
    let replay = |args: &[&Path]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
        command
            .args(["policy", "replay", "--json", "--log"])
            .arg(&first_run);
        command.arg("--against").arg(args[0]);
        if let Some(old) = args.get(1) {
            command.arg("--policy").arg(old);
        }
        command.output().unwrap()
    };
    for with_old in [false, true] {
        let run = if with_old {
            replay(&[&new, &old])
        } else {
            replay(&[&new])
        };
        assert_eq!(
            run.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
        assert_eq!(report["requests"].as_u64(), Some(before as u64));
        assert_eq!(report["malformed"], 0);
        assert_eq!(report["unclassified"], 0);
        assert_eq!(report["inexact"], 0);
        assert_eq!(report["disagree"], 0);
        let mut reported: BTreeMap<(Decided, Decided), u64> = BTreeMap::new();
        for group in report["groups"].as_array().unwrap() {
            let verdict = |v: &serde_json::Value| {
                (
                    v["allowed"].as_bool().unwrap(),
                    v["rule"].as_str().unwrap().to_owned(),
                )
            };
            *reported
                .entry((verdict(&group["old"]), verdict(&group["new"])))
                .or_default() += group["requests"].as_u64().unwrap();
        }
        assert_eq!(reported, really, "with the old policy: {with_old}");
        let total: u64 = really.values().sum();
        assert_eq!(report["changed"].as_u64(), Some(total));
    }
    // Against the policy it ran under, nothing changes.
    let same = replay(&[&old, &old]);
    assert_eq!(same.status.code(), Some(0));
}

/// A log line as the daemon writes it (`keys: digest`): fixed times, so reports are stable.
fn line(
    ts_ms: u64,
    tenant: &str,
    command: &str,
    regions: &[&str],
    decision: &str,
    rule: &str,
) -> String {
    serde_json::json!({
        "ts_ms": ts_ms,
        "principal": tenant,
        "uid": if tenant == "acme" { 2001 } else { 2002 },
        "gid": 100,
        "pid": 7,
        "command": command,
        "lane": "regular",
        "keys": regions.iter().map(|_| "0123456789abcdef").collect::<Vec<_>>(),
        "regions": regions,
        "decision": decision,
        "rule": rule,
        "module": if decision == "denied" { "yaml-guard:tenants.yaml" } else { "" },
        "cause": if decision == "denied" { Some("rule") } else { None },
        "generation": 1,
        "latency_ns": 900,
    })
    .to_string()
}

/// A recorded day of the tenants example: acme and globex reading and writing their keys and the
/// shared ones, taking leases (not logged), a few refusals, and two lines a broken writer left.
fn recorded_day() -> String {
    let day = 1_764_633_600_000; // 2025-12-02T00:00:00Z
    let mut out = Vec::new();
    for i in 0..40u64 {
        // Every 36 minutes, the tenants taking turns.
        let ts = day + i * 36 * 60_000;
        let (tenant, other) = if i % 2 == 0 {
            ("acme", "globex")
        } else {
            ("globex", "acme")
        };
        let own = format!("{tenant}:x");
        let theirs = format!("{other}:x");
        let rule = format!("{tenant}-keys");
        out.push(line(ts, tenant, "GET", &[&own], "admitted", &rule));
        out.push(line(ts, tenant, "SET", &[&own], "admitted", &rule));
        out.push(line(ts, tenant, "GET", &["shared:x"], "admitted", &rule));
        if i % 5 == 0 {
            out.push(line(
                ts,
                tenant,
                "SET",
                &["shared:x"],
                "denied",
                "shared-is-read-only",
            ));
            out.push(line(
                ts,
                tenant,
                "GET",
                &[&theirs],
                "denied",
                "default-deny",
            ));
        }
        if i % 8 == 0 {
            out.push(line(ts, tenant, "PING", &[], "admitted", "connection"));
        }
    }
    out.insert(7, "{\"ts_ms\": 1, \"truncated".to_owned());
    out.insert(30, "not json at all".to_owned());
    out.join("\n") + "\n"
}

/// The tenants example, `shared-is-read-only` removed and acme's reads narrowed to its own keys.
fn tenants_changed() -> String {
    let text = std::fs::read_to_string(root().join("policies/examples/tenants.yaml")).unwrap();
    let a = text.find("  # A deny rule with `keys:`").unwrap();
    let b = text.find("  - id: acme-keys").unwrap();
    let text = format!("{}{}", &text[..a], &text[b..]);
    let text = text.replacen(r#"keys: ["acme:*", "shared:*"]"#, r#"keys: ["acme:*"]"#, 1);
    // Its own tests and invariants spoke of the old rules.
    let cut = text.find("\ntests:").unwrap();
    text[..cut].to_owned()
}

#[test]
fn a_replay_report_of_a_recorded_day_has_a_reviewed_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let changed = dir.path().join("tenants-new.yaml");
    std::fs::write(&changed, tenants_changed()).unwrap();
    let old_path = root().join("policies/examples/tenants.yaml");
    let old = admission(&config(&[&old_path], vec![])).current();
    let new = admission(&config(&[&changed], vec![])).current();
    let replayed = |old| {
        let mut replayer = Replayer::new(old, &new);
        replayer
            .read("day.jsonl", std::io::Cursor::new(recorded_day()))
            .unwrap();
        replayer.finish().0
    };
    let replay = replayed(Some(&*old));
    assert_eq!(replay.malformed, 2);
    let named: Vec<u64> = replay.malformed_at.iter().map(|p| p.line).collect();
    assert_eq!(named, [8, 31]);
    assert_eq!(
        replay.disagree, 0,
        "the day was logged under the old policy"
    );
    assert_eq!(replay.inexact, 0, "the change narrows globs, adds none");
    assert!(replay.changed());
    // Without the old policy the old decisions are the log's: the same changes here.
    let logged = replayed(None);
    assert_eq!(
        (logged.changed, logged.newly_allowed, logged.newly_denied),
        (replay.changed, replay.newly_allowed, replay.newly_denied)
    );
    let report =
        replay.render("tollgate policy explain --policy tenants.yaml --against tenants-new.yaml");
    snapshot_settings().bind(|| {
        insta::assert_snapshot!("replay__tenants__day", report);
        insta::assert_snapshot!(
            "replay__tenants__day.json",
            serde_json::to_string_pretty(&replay).unwrap()
        );
    });
}

/// A candidate with a glob that splits a class the day's keys were logged as: given the old
/// policy, the replay counts the requests it can decide only by their witness keys.
#[test]
fn a_replay_counts_requests_whose_logged_key_classes_the_candidate_splits() {
    let dir = tempfile::tempdir().unwrap();
    let old_path = root().join("policies/examples/tenants.yaml");
    let text = std::fs::read_to_string(&old_path).unwrap();
    let split = text.replacen(
        r#"keys: ["acme:*", "shared:*"]"#,
        r#"keys: ["acme:*", "shared:*", "globex:public:*"]"#,
        1,
    );
    let split = split[..split.find("\ntests:").unwrap()].to_owned();
    let changed = dir.path().join("tenants-split.yaml");
    std::fs::write(&changed, split).unwrap();
    let old = admission(&config(&[&old_path], vec![])).current();
    let new = admission(&config(&[&changed], vec![])).current();
    let mut replayer = Replayer::new(Some(&old), &new);
    let day = recorded_day();
    replayer
        .read("day.jsonl", std::io::Cursor::new(&day))
        .unwrap();
    let (replay, _) = replayer.finish();
    // Every request with a key logged as `globex:x`: globex's own GET and SET, and acme's
    // refused GETs of globex's keys.
    let expected = day.lines().filter(|l| l.contains("\"globex:x\"")).count() as u64;
    assert_eq!(replay.inexact, expected);
    assert!(expected >= 40);
    let report = replay.render("explain");
    assert!(
        report.contains(&format!(
            "inexact: {expected} requests logged with key classes the candidate splits"
        )),
        "{report}"
    );
}

#[test]
fn unused_lists_exactly_the_rules_no_logged_decision_names() {
    let path = root().join("policies/examples/tenants.yaml");
    let generation = admission(&config(&[&path], vec![])).current();
    let day = recorded_day();
    let mut replayer = Replayer::new(None, &generation);
    replayer
        .read("day.jsonl", std::io::Cursor::new(&day))
        .unwrap();
    let (replay, usage) = replayer.finish();
    let unused = usage.unused(&generation);
    // Checked against the log itself: the rules of the policy no line names.
    let named: std::collections::BTreeSet<String> = day
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|l| l["rule"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = generation.files()[0]
        .policy
        .rules
        .iter()
        .map(|r| r.id.clone())
        .filter(|id| !named.contains(id))
        .collect();
    assert_eq!(unused[0].rules, expected);
    assert!(unused[0].rules.contains(&"no-whole-keyspace".to_owned()));
    let report =
        Unused::render(&unused, &replay).replace(&path.display().to_string(), "tenants.yaml");
    snapshot_settings().bind(|| insta::assert_snapshot!("unused__tenants__day", report));
}
