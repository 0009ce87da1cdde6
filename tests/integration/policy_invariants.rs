//! Invariants in the policy file, proven over every request class: each policy under policies/
//! states some and they hold; hand-written bad changes (a glob widened into another tenant's keys
//! or channels, a principal added to an ops rule, a deny rule removed) each break a named one, at its own
//! line:column, with a witness that `tollgate policy explain` confirms and `tollgate policy check`
//! exits 2 on; a reload that would break one is refused and the old generation keeps deciding,
//! in the library and in the daemon over its RESP socket.

use std::process::Command;

use prometheus_client::registry::Registry;
use tollgate_policy::{Admission, Decision, PolicyError};
use tollgate_testkit::RedisServer;

use crate::policy_support::{admission, argv, caller, config, root};
use crate::support::daemon::{tempdir, TestDaemon};

fn tollgate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn every_policy_states_invariants_that_hold() {
    let mut files = vec![root().join("policies/default.yaml")];
    let mut examples: Vec<_> = std::fs::read_dir(root().join("policies/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    examples.sort();
    files.extend(examples);
    assert!(files.len() >= 5, "{files:?}");
    for file in files {
        let admission = admission(&config(&[&file], vec![]));
        let generation = admission.current();
        let checked = generation.invariants();
        assert!(
            !checked.is_empty(),
            "{} states no invariant",
            file.display()
        );
        for invariant in checked {
            assert!(invariant.holds(), "{invariant}");
            assert!(invariant.complete, "{invariant}");
            assert!(
                invariant.classes > 0,
                "{invariant}: speaks of no request at all"
            );
        }
        let text = file.to_str().unwrap();
        let run = tollgate(&["policy", "check", text]);
        assert_eq!(run.status.code(), Some(0), "{}", file.display());
    }
}

/// `text` without its `tests:` section: a change that breaks an invariant usually changes the
/// expectations too, and here the invariants alone are to catch it.
fn without_tests(text: &str) -> String {
    text.lines()
        .filter(|line| !line.starts_with("tests:") && !line.starts_with("  - { principal:"))
        .map(|line| format!("{line}\n"))
        .collect()
}

/// The 1-based line of `  - id: {id}` in `text`.
fn line_of(text: &str, id: &str) -> usize {
    let wanted = format!("  - id: {id}");
    1 + text
        .lines()
        .position(|line| line == wanted)
        .unwrap_or_else(|| panic!("no `{wanted}`"))
}

#[test]
fn bad_changes_break_a_named_invariant_with_a_witness_explain_confirms() {
    struct Case {
        what: &'static str,
        policy: &'static str,
        change: fn(&str) -> String,
        invariant: &'static str,
        rule: &'static str,
    }
    fn cut(text: &str, from: &str, to: &str) -> String {
        let (a, b) = (text.find(from).unwrap(), text.find(to).unwrap());
        format!("{}{}", &text[..a], &text[b..])
    }
    let cases = [
        Case {
            what: "a glob widened into another tenant's keys",
            policy: "policies/examples/tenants.yaml",
            change: |t| {
                t.replacen(
                    r#"keys: ["acme:*", "shared:*"]"#,
                    r#"keys: ["*", "shared:*"]"#,
                    1,
                )
            },
            invariant: "acme-never-writes-globex",
            rule: "acme-keys",
        },
        Case {
            what: "a principal added to an ops rule",
            policy: "policies/examples/operator.yaml",
            change: |t| t.replacen("principals: [ops]", "principals: [ops, app]", 1),
            invariant: "app-never-on-admin-lane",
            rule: "ops-diagnostics",
        },
        Case {
            what: "a tenant's channel glob widened to every channel",
            policy: "policies/examples/tenants.yaml",
            change: |t| t.replacen(r#"channels: ["acme:*"]"#, r#"channels: ["*"]"#, 1),
            invariant: "acme-stays-off-globex-channels",
            rule: "acme-channels",
        },
        Case {
            what: "a deny rule removed",
            policy: "policies/examples/tenants.yaml",
            change: |t| cut(t, "  # A deny rule with `keys:`", "  - id: acme-keys"),
            invariant: "shared-stays-read-only",
            rule: "acme-keys",
        },
        Case {
            what: "the default policy's wipe rule removed",
            policy: "policies/default.yaml",
            change: |t| cut(t, "  - id: no-wipe", "  - id: no-keys"),
            invariant: "nobody-wipes",
            rule: "data",
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    for case in cases {
        let original = std::fs::read_to_string(root().join(case.policy)).unwrap();
        let changed = without_tests(&(case.change)(&original));
        assert_ne!(
            changed,
            without_tests(&original),
            "{}: no change",
            case.what
        );
        let path = dir.path().join("changed.yaml");
        std::fs::write(&path, &changed).unwrap();
        // Unchanged but for its tests, the policy keeps its invariants.
        let kept = dir.path().join("kept.yaml");
        std::fs::write(&kept, without_tests(&original)).unwrap();
        admission(&config(&[&kept], vec![]));

        let checked = match Admission::load(&config(&[&path], vec![]), &mut Registry::default()) {
            Err(PolicyError::Invariants(checked)) => checked,
            Err(other) => panic!("{}: {other}", case.what),
            Ok(_) => panic!("{}: the changed policy loaded", case.what),
        };
        let broken: Vec<_> = checked.iter().filter(|c| !c.holds()).collect();
        assert_eq!(broken.len(), 1, "{}: {broken:#?}", case.what);
        let broken = broken[0];
        assert_eq!(broken.id, case.invariant, "{}", case.what);
        // At the invariant's own position, as the YAML parser marks its mapping: the line of its
        // `- id:`, the column of the colon after `id` (as for rules, see policy_compile.rs).
        assert_eq!(
            (broken.line, broken.column),
            (line_of(&changed, case.invariant), 7),
            "{}",
            case.what
        );
        let witness = broken.witness.as_ref().unwrap();
        assert_eq!(witness.verdict.rule, case.rule, "{}", case.what);
        assert!(
            witness.verdict.allowed,
            "{}: a never broken by an admission",
            case.what
        );

        // `policy check` says so, exit status 2, and the witness replays through `explain`.
        let text = path.to_str().unwrap();
        let run = tollgate(&["policy", "check", text]);
        assert_eq!(run.status.code(), Some(2), "{}", case.what);
        let out = String::from_utf8(run.stdout).unwrap();
        let expected = format!(
            "{text}:{}:7: error: invariant `{}` does not hold: rule `{}` admits",
            broken.line, case.invariant, case.rule
        );
        assert!(out.contains(&expected), "{}: {out}", case.what);
        let argv = witness.witness.argv.as_ref().expect("a replayable witness");
        let (uid, gid) = (
            witness.witness.uid.to_string(),
            witness.witness.gid.to_string(),
        );
        let mut args = vec![
            "policy", "explain", "--policy", text, "--uid", &uid, "--gid", &gid, "--",
        ];
        args.extend(argv.iter().map(String::as_str));
        let explained = tollgate(&args);
        assert!(explained.status.success(), "{args:?}");
        let explained = String::from_utf8(explained.stdout).unwrap();
        assert!(
            explained.contains(&format!("=> admitted by {} ", case.rule)),
            "{}: {args:?}\n{explained}",
            case.what
        );
    }
}

#[test]
fn an_always_invariant_broken_by_a_denial_names_the_denying_rule() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ops.yaml");
    let text = "principals:\n  ops: { uids: [0] }\n  app: { uids: [1000] }\nrules:\n  - id: no-flush\n    commands: [FLUSHALL]\n    deny: nobody wipes\n  - id: ops\n    principals: [ops]\n    commands: [\"*\"]\n    allow: ops\ninvariants:\n  - id: ops-may-flush\n    always: { principals: [ops], commands: [FLUSHALL] }\n";
    std::fs::write(&path, text).unwrap();
    let Err(PolicyError::Invariants(checked)) =
        Admission::load(&config(&[&path], vec![]), &mut Registry::default())
    else {
        panic!("the policy loaded");
    };
    let broken = &checked[0];
    assert_eq!(
        (broken.id.as_str(), broken.line, broken.column),
        ("ops-may-flush", 13, 7)
    );
    let witness = broken.witness.as_ref().unwrap();
    assert!(!witness.verdict.allowed);
    assert_eq!(witness.verdict.rule, "no-flush");
    assert_eq!(
        witness.witness.argv.as_deref(),
        Some(&["FLUSHALL".to_owned()][..])
    );
    assert!(broken
        .to_string()
        .contains("rule `no-flush` denies `--principal ops -- FLUSHALL`"));
}

#[test]
fn a_malformed_invariant_is_a_compile_error_at_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    let head = "principals:\n  app: { uids: [1000] }\nrules:\n  - id: r\n    commands: [GET]\n    allow: x\ninvariants:\n";
    let cases = [
        (
            "  - id: i\n    never: { principals: [bob], commands: [GET] }\n",
            "bad.yaml:9:27: error: unknown principal `bob`",
        ),
        (
            "  - id: i\n    never: { commands: [GET] }\n    always: { commands: [GET] }\n",
            "bad.yaml:8:7: error: invariant `i` needs exactly one of `never: {...}` or `always: {...}`",
        ),
        (
            "  - id: i\n    never: { principals: [app] }\n",
            "bad.yaml:9:12: error: invariant `i` needs exactly one of `commands` or `leases`",
        ),
        (
            "  - id: i\n    never: { leases: [\"a:*\"], keys: [\"b\"] }\n",
            "bad.yaml:9:12: error: invariant `i`: `keys` and `lanes` apply to commands, not leases",
        ),
        (
            "  - id: i\n    never: { commands: [GET] }\n  - id: i\n    never: { commands: [SET] }\n",
            "bad.yaml:10:9: error: invariant id `i` is used twice",
        ),
        (
            "  - id: i\n    never: { leases: [\"a:*\"], channels: [\"b\"] }\n",
            "bad.yaml:9:41: error: invariant `i`: `channels` apply to commands, not leases",
        ),
        (
            "  - id: i\n    never: { commands: [PUBLISH], channels: [] }\n",
            "bad.yaml:9:45: error: `channels` is empty: invariant `i` would never match",
        ),
    ];
    for (invariants, expected) in cases {
        std::fs::write(&path, format!("{head}{invariants}")).unwrap();
        let error = match Admission::load(&config(&[&path], vec![]), &mut Registry::default()) {
            Err(error @ PolicyError::Compile(_)) => error.to_string(),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("compiled:\n{invariants}"),
        };
        let error = error.replace(&path.display().to_string(), "bad.yaml");
        assert!(
            error.starts_with(expected),
            "expected `{expected}`, got:\n{error}"
        );
    }
}

const KEEPS: &str = "principals:\n  me: { any: true }\nrules:\n  - id: no-flush\n    commands: [FLUSHALL, FLUSHDB]\n    deny: wipes every tenant's data\n  - id: data\n    commands: [\"@read\", \"@write\", \"@connection\"]\n    allow: data\ninvariants:\n  - id: nobody-flushes\n    never: { commands: [FLUSHALL, FLUSHDB] }\n";

/// [`KEEPS`] without its deny rule: `data` admits FLUSHALL.
fn breaks() -> String {
    KEEPS.replace("  - id: no-flush\n    commands: [FLUSHALL, FLUSHDB]\n    deny: wipes every tenant's data\n", "")
}

#[test]
fn a_reload_that_breaks_an_invariant_is_refused_and_the_old_generation_decides() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, KEEPS).unwrap();
    let admission = admission(&config(&[&path], vec![]));
    std::fs::write(&path, breaks()).unwrap();
    match admission.reload() {
        Err(PolicyError::Invariants(checked)) => {
            assert_eq!(checked.len(), 1);
            // Its position in the file as changed.
            assert_eq!((checked[0].line, checked[0].column), (8, 7));
            assert!(!checked[0].holds());
        }
        other => panic!("reload: {other:?}"),
    }
    assert_eq!(admission.generation().number, 1);
    assert!(matches!(
        admission.admit(&caller("me"), &argv("FLUSHALL")),
        Decision::Denied(ref d) if d.rule == "no-flush"
    ));
}

#[tokio::test]
async fn the_daemon_refuses_a_reload_that_breaks_an_invariant_and_keeps_serving_the_old_policy() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, KEEPS).unwrap();
    let daemon = TestDaemon::start_with(&redis, |config| {
        config.policy.files = vec![policy.clone()];
    })
    .await;
    let client = redis::Client::open(format!("unix://{}", daemon.resp_socket().display())).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let flush = || redis::cmd("FLUSHALL");

    std::fs::write(&policy, breaks()).unwrap();
    let refused = daemon.post("/v1/policy/reload", "").await;
    assert_eq!(refused.status, 422);
    let refused = refused.json();
    assert_eq!(refused["outcome"], "rejected");
    assert_eq!(refused["generation"], 1);
    let error = refused["errors"][0].as_str().unwrap();
    assert!(
        error.contains("policy.yaml:8:7: error: invariant `nobody-flushes` does not hold: rule `data` admits `--principal me -- FLUSHALL`"),
        "{error}"
    );
    let denied: redis::RedisResult<()> = flush().query_async(&mut connection).await;
    let denied = denied.unwrap_err().to_string();
    assert!(denied.contains("rule no-flush denies FLUSHALL"), "{denied}");
    let () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut connection)
        .await
        .expect("generation 1 still decides");
    daemon.stop().await;
}

/// An operator module is opaque to the classes: an invariant over classes it took part in holds
/// for their witnesses, and says it was sampled; one decided without it does not say so.
#[test]
fn an_invariant_an_operator_module_takes_part_in_says_it_was_sampled() {
    let path = root().join("policies/examples/tenants.yaml");
    let prefix =
        tollgate_policy::ModuleConfig::Path(tollgate_policy::built_component("key-prefix"));
    let admission = admission(&config(&[&path], vec![prefix]));
    let generation = admission.current();
    let checked = generation.invariants();
    let by_id = |id: &str| checked.iter().find(|c| c.id == id).unwrap();
    // acme's reads of its own keys are admitted only if key-prefix agrees.
    let reads = by_id("acme-reads-its-own");
    assert!(reads.holds());
    assert_eq!(reads.sampled, ["key-prefix"]);
    assert!(
        reads
            .to_string()
            .contains("[modules key-prefix took part: sampled only]"),
        "{reads}"
    );
    // Writes to shared keys are refused by the YAML guard, before the module is asked.
    let shared = by_id("shared-stays-read-only");
    assert!(shared.holds() && shared.sampled.is_empty(), "{shared}");
    // The module refuses `tollgate:x` for acme before the host would: its decision, sampled.
    let reserved = by_id("no-principal-reaches-tollgate");
    assert!(reserved.holds(), "{reserved}");
    assert_eq!(reserved.sampled, ["key-prefix"]);
}
