//! Admission through the real catalog and YAML guard components: descriptors, key positions that
//! move (EVAL, XREAD, SORT), lanes, the default policy's decisions, leases, principals, explain.

use bytes::Bytes;
use tollgate_model::Lane;
use tollgate_policy::{
    Decision, DecisionLogConfig, DenyCause, KeyRendering, ModuleConfig, ModuleLimits, PolicyConfig,
};

use crate::policy_support::{admission, argv, caller, config, denial, fuel_limits, root};

fn default_admission() -> tollgate_policy::Admission {
    admission(&PolicyConfig {
        limits: fuel_limits(),
        ..PolicyConfig::default()
    })
}

/// (descriptor name, lane, keys) of an admitted command.
fn admitted(admission: &tollgate_policy::Admission, line: &str) -> (String, Lane, Vec<String>) {
    let argv = argv(line);
    match admission.admit(&caller("local"), &argv) {
        Decision::Admitted {
            descriptor, lane, ..
        } => {
            let keys = descriptor
                .keys(&argv)
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            (descriptor.name.clone(), lane, keys)
        }
        Decision::Denied(denial) => panic!("{line}: {denial}"),
    }
}

#[test]
fn key_positions_follow_each_call() {
    let admission = default_admission();
    let cases: &[(&str, &str, Lane, &[&str])] = &[
        ("get a", "GET", Lane::Regular, &["a"]),
        ("MSET a 1 b 2", "MSET", Lane::Regular, &["a", "b"]),
        ("EVAL s 2 k1 k2 arg", "EVAL", Lane::Script, &["k1", "k2"]),
        ("EVAL s 0 arg", "EVAL", Lane::Script, &[]),
        (
            "XREAD COUNT 1 STREAMS s1 s2 0 0",
            "XREAD",
            Lane::Regular,
            &["s1", "s2"],
        ),
        (
            "XREAD BLOCK 10 STREAMS s1 0",
            "XREAD",
            Lane::Blocking,
            &["s1"],
        ),
        ("BLPOP q1 q2 0", "BLPOP", Lane::Blocking, &["q1", "q2"]),
        (
            "SORT s BY w_* GET o_* STORE dst",
            "SORT",
            Lane::Regular,
            &["s", "w_*", "o_*", "dst"],
        ),
        (
            "LMOVE src dst LEFT RIGHT",
            "LMOVE",
            Lane::Regular,
            &["src", "dst"],
        ),
        ("MULTI", "MULTI", Lane::Transaction, &[]),
        ("SUBSCRIBE news", "SUBSCRIBE", Lane::Pubsub, &[]),
        ("client list", "CLIENT|LIST", Lane::Admin, &[]),
        ("INFO", "INFO", Lane::Admin, &[]),
        ("WAIT 1 0", "WAIT", Lane::Blocking, &[]),
        // Repeats with other arguments: answers the host reuses must not carry the old keys,
        // and answers that depend on more than argc are not reused.
        ("GET b", "GET", Lane::Regular, &["b"]),
        ("CLIENT INFO", "CLIENT|INFO", Lane::Regular, &[]),
        ("EVAL s 1 k1 k2 arg", "EVAL", Lane::Script, &["k1"]),
        (
            "XREAD COUNT 1 STREAMS s1 0",
            "XREAD",
            Lane::Regular,
            &["s1"],
        ),
    ];
    for &(line, name, lane, keys) in cases {
        let (got_name, got_lane, got_keys) = admitted(&admission, line);
        assert_eq!((got_name.as_str(), got_lane), (name, lane), "{line}");
        assert_eq!(got_keys, keys, "{line}");
    }
}

#[test]
fn the_default_policy_denies_dangerous_commands_with_reasons() {
    let admission = default_admission();
    for (line, rule) in [
        ("FLUSHALL", "no-wipe"),
        ("flushdb async", "no-wipe"),
        ("KEYS *", "no-keys"),
        ("CONFIG SET maxmemory 1", "no-reconfigure"),
        ("DEBUG SLEEP 0", "no-stop"),
        ("SHUTDOWN", "no-stop"),
        ("MONITOR", "no-monitor"),
    ] {
        let denial = denial(admission.admit(&caller("local"), &argv(line)));
        assert_eq!(
            (denial.rule.as_str(), denial.cause),
            (rule, DenyCause::Rule),
            "{line}"
        );
        assert!(
            denial
                .to_string()
                .starts_with(&format!("rule {rule} denies ")),
            "{denial}"
        );
        assert!(!denial.reason.is_empty());
    }
}

#[test]
fn unknown_commands_and_subcommands_are_denied_by_the_catalog() {
    let admission = default_admission();
    for line in ["NOSUCHCOMMAND x", "CLIENT NOSUCHSUB", "GET\u{0}"] {
        let denial = denial(admission.admit(&caller("local"), &argv(line)));
        assert_eq!(denial.cause, DenyCause::UnknownCommand, "{line}");
        assert_eq!(denial.module, "catalog");
    }
    let empty = denial(admission.admit(&caller("local"), &[] as &[&[u8]]));
    assert_eq!(empty.cause, DenyCause::Malformed);
}

#[test]
fn a_large_value_crosses_into_the_sandbox_as_a_bounded_prefix() {
    let echo = ModuleConfig::WithConfig {
        path: tollgate_policy::built_component("hostile"),
        config: "echo".into(),
        limits: ModuleLimits::default(),
    };
    let admission = admission(&config(&[], vec![echo]));
    let value = Bytes::from(vec![b'v'; 1 << 20]);
    let argv = vec![Bytes::from_static(b"SET"), Bytes::from_static(b"k"), value];
    let denial = denial(admission.admit(&caller("local"), &argv));
    assert_eq!(denial.rule, "echo");
    // Everything that crossed: "SET", "k" and the value's first 64 bytes.
    assert_eq!(
        denial.reason,
        format!("keys=1 args=64/{} bytes={}", 1 << 20, 3 + 1 + 64)
    );
}

#[test]
fn principals_come_from_uid_then_gid_then_any() {
    let tenants = root().join("policies/examples/tenants.yaml");
    let admission = admission(&config(&[&tenants], vec![]));
    assert_eq!(admission.principal_for(2001, 0).as_deref(), Some("acme"));
    assert_eq!(
        admission.principal_for(2002, 2001).as_deref(),
        Some("globex")
    );
    assert_eq!(admission.principal_for(4242, 4242), None);

    let read_only = root().join("policies/examples/read-only.yaml");
    let admission = crate::policy_support::admission(&config(&[&read_only], vec![]));
    assert_eq!(admission.principal_for(1000, 3000).as_deref(), Some("app"));
    assert_eq!(
        admission.principal_for(5, 3000).as_deref(),
        Some("reporting")
    );
    assert_eq!(
        default_admission().principal_for(4242, 4242).as_deref(),
        Some("local")
    );
}

#[test]
fn tenants_stay_inside_their_prefix_and_their_leases() {
    let tenants = root().join("policies/examples/tenants.yaml");
    let admission = admission(&config(&[&tenants], vec![]));
    let acme = caller("acme");
    assert!(matches!(
        admission.admit(&acme, &argv("SET acme:1 v")),
        Decision::Admitted { .. }
    ));
    let mixed = denial(admission.admit(&acme, &argv("MSET acme:1 v globex:1 v")));
    assert_eq!(
        (mixed.rule.as_str(), mixed.cause),
        ("default-deny", DenyCause::NoRule)
    );
    assert!(matches!(
        admission.admit_lease(&acme, "acme:nightly"),
        Decision::Admitted { .. }
    ));
    assert_eq!(
        denial(admission.admit_lease(&acme, "globex:nightly")).cause,
        DenyCause::NoRule
    );
}

#[test]
fn an_operator_guard_runs_after_the_yaml_guard_and_its_deny_wins() {
    let prefix = ModuleConfig::Path(tollgate_policy::built_component("key-prefix"));
    let admission = admission(&config(&[], vec![prefix]));
    let alice = caller("alice");
    assert!(matches!(
        admission.admit(&alice, &argv("SET alice:1 v")),
        Decision::Admitted { .. }
    ));
    let outside = denial(admission.admit(&alice, &argv("SET bob:1 v")));
    assert_eq!(
        (outside.rule.as_str(), outside.module.as_str()),
        ("key-prefix", "key-prefix")
    );
    assert_eq!(outside.reason, "key `bob:1` is outside `alice:*`");
    // The YAML guard still decides first: FLUSHALL names no key but the default policy denies it.
    assert_eq!(
        denial(admission.admit(&alice, &argv("FLUSHALL"))).rule,
        "no-wipe"
    );
}

/// A decision in a line: its rule and lane, or its denial.
fn summary(decision: &Decision) -> String {
    match decision {
        Decision::Admitted { rule, lane, .. } => format!("admitted by {rule} on {lane:?}"),
        Decision::Denied(denial) => format!("denied: {denial}"),
    }
}

/// `lines` admitted together as one pipeline of `caller`, each decision asserted equal to the
/// same command admitted alone (`label` prefixes the failure message); the decisions.
fn decided_together_as_alone(
    admission: &tollgate_policy::Admission,
    caller: &tollgate_model::Caller,
    lines: &[&str],
    label: &str,
) -> Vec<Decision> {
    let argvs: Vec<Vec<Bytes>> = lines.iter().map(|line| argv(line)).collect();
    let refs: Vec<&[Bytes]> = argvs.iter().map(Vec::as_slice).collect();
    let together = admission.admit_all(caller, &refs);
    assert_eq!(together.len(), lines.len());
    for ((line, argv), decided) in lines.iter().zip(&argvs).zip(&together) {
        assert_eq!(
            summary(decided),
            summary(&admission.admit(caller, argv)),
            "{label}{line}"
        );
    }
    together
}

#[test]
fn a_pipeline_admitted_together_is_decided_as_each_command_alone() {
    let prefix = ModuleConfig::Path(tollgate_policy::built_component("key-prefix"));
    let admission = admission(&config(&[], vec![prefix]));
    let alice = caller("alice");
    // Allowed, denied by each guard, unknown, empty, keys at moving positions: every way through.
    let lines = [
        "SET alice:1 v",
        "SET bob:1 v",
        "FLUSHALL",
        "MSET alice:a 1 alice:b 2",
        "NOSUCHCOMMAND x",
        "",
        "EVAL return 2 alice:k bob:k",
        "GET alice:1",
    ];
    let together = decided_together_as_alone(&admission, &alice, &lines, "");
    assert!(matches!(together[0], Decision::Admitted { .. }));
    assert_eq!(denial(together[1].clone()).rule, "key-prefix");
    assert_eq!(denial(together[2].clone()).rule, "no-wipe");
    assert_eq!(denial(together[6].clone()).rule, "key-prefix");
}

/// Runs of one command whose verdicts the YAML guard keeps are decided once per run
/// (`kept_decision`): every command of a run still meets the reserved keyspace on its own keys,
/// and a run broken by another command, or by a denied one, is decided as each command alone.
#[test]
fn runs_of_one_command_are_decided_as_each_command_alone() {
    let admission = admission(&config(&[], vec![]));
    let alice = caller("alice");
    let lines = [
        "GET a",
        "GET b",
        "GET tollgate:x",
        "GET c",
        "SET a 1",
        "SET tollgate:y 1",
        "SET b 2",
        "FLUSHALL",
        "FLUSHALL",
        "GET d",
        "GET tollgate:z",
    ];
    // Twice: the first batch meets an empty memory, the second the verdicts the first kept.
    for round in 0..2 {
        let label = format!("round {round}: ");
        let together = decided_together_as_alone(&admission, &alice, &lines, &label);
        for at in [0, 1, 3, 4, 6, 9] {
            assert!(
                matches!(together[at], Decision::Admitted { .. }),
                "round {round}: {}",
                lines[at]
            );
        }
        for at in [2, 5, 10] {
            assert_eq!(
                denial(together[at].clone()).cause,
                DenyCause::Reserved,
                "round {round}: {}",
                lines[at]
            );
        }
        assert_eq!(denial(together[7].clone()).rule, "no-wipe");
        assert_eq!(denial(together[8].clone()).rule, "no-wipe");
    }
}

#[test]
fn explain_shows_every_modules_answer() {
    let prefix = ModuleConfig::Path(tollgate_policy::built_component("key-prefix"));
    let admission = admission(&config(&[], vec![prefix]));
    let (decision, steps) = admission.explain(&caller("alice"), &argv("GET bob:1"));
    assert_eq!(denial(decision).rule, "key-prefix");
    let summary: Vec<String> = steps
        .iter()
        .map(|s| {
            format!(
                "{} {} {}",
                s.module,
                s.verdict,
                s.rule.as_deref().unwrap_or("-")
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            "catalog describe GET",
            "yaml-guard:default.yaml allow data",
            "key-prefix deny key-prefix"
        ]
    );
}

#[test]
fn audit_mode_reports_the_deny_and_lets_the_command_through() {
    let audit = root().join("policies/examples/audit.yaml");
    let admission = admission(&config(&[&audit], vec![]));
    match admission.admit(&caller("everyone"), &argv("EVAL return 0")) {
        Decision::Admitted { rule, .. } => assert_eq!(&*rule, "audit:no-scripts"),
        Decision::Denied(denial) => panic!("audit mode denied: {denial}"),
    }
}

#[test]
fn the_decision_log_has_a_json_line_per_decision_with_key_digests() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let admission = admission(&PolicyConfig {
        limits: fuel_limits(),
        decision_log: Some(DecisionLogConfig {
            path: path.clone(),
            keys: KeyRendering::Digest,
        }),
        ..PolicyConfig::default()
    });
    admission.admit(&caller("local"), &argv("GET secret:1"));
    admission.admit(&caller("local"), &argv("FLUSHALL"));
    admission.admit(&caller("local"), &argv("GET tollgate:lease:x"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let lines: Vec<serde_json::Value> = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= 3 || std::time::Instant::now() > deadline {
            break text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(lines.len(), 3, "{lines:?}");
    let (get, flush) = (&lines[0], &lines[1]);
    assert_eq!(
        (get["command"].as_str(), get["decision"].as_str()),
        (Some("GET"), Some("admitted"))
    );
    assert_eq!(
        (get["rule"].as_str(), get["generation"].as_u64()),
        (Some("data"), Some(1))
    );
    let digest = get["keys"][0].as_str().unwrap();
    assert_eq!(digest.len(), 16);
    assert_ne!(digest, "secret:1");
    assert!(get["latency_ns"].as_u64().unwrap() > 0);
    assert_eq!(
        (get["uid"].as_u64(), get["pid"].as_u64()),
        (Some(1000), Some(u64::from(std::process::id())))
    );
    assert_eq!(
        (flush["decision"].as_str(), flush["rule"].as_str()),
        (Some("denied"), Some("no-wipe"))
    );
    assert_eq!(flush["cause"].as_str(), Some("rule"));
    // What a replay needs, for admitted and denied commands alike: the peer's gid, the lane,
    // when, and each key's class under the policy's globs as a witness key, never the key.
    assert_eq!(get["gid"].as_u64(), Some(1000));
    assert_eq!(get["lane"].as_str(), Some("regular"));
    assert!(get["ts_ms"].as_u64().unwrap() > 1_700_000_000_000);
    assert_eq!(get["regions"], serde_json::json!(["x"]));
    assert_eq!(flush["lane"].as_str(), Some("regular"), "{flush}");
    let reserved = &lines[2];
    assert_eq!(
        (reserved["decision"].as_str(), reserved["rule"].as_str()),
        (Some("denied"), Some("reserved"))
    );
    assert_eq!(reserved["regions"], serde_json::json!(["tollgate:x"]));
    assert_eq!(reserved["keys"][0].as_str().unwrap().len(), 16);
}

#[test]
fn an_operator_catalog_describes_commands_the_built_in_one_does_not_know() {
    let json = "JSON.SET doc $ {}";
    let plain = default_admission();
    assert_eq!(
        denial(plain.admit(&caller("local"), &argv(json))).cause,
        DenyCause::UnknownCommand
    );

    let admission = admission(&PolicyConfig {
        catalogs: vec![tollgate_policy::built_component("json-catalog")],
        limits: fuel_limits(),
        ..PolicyConfig::default()
    });
    let (name, lane, keys) = admitted(&admission, json);
    assert_eq!(
        (name.as_str(), lane, keys),
        ("JSON.SET", Lane::Regular, vec!["doc".to_owned()])
    );
    // The built-in catalog still answers first for core commands.
    let (decision, steps) = admission.explain(&caller("local"), &argv("GET k"));
    assert!(matches!(decision, Decision::Admitted { .. }));
    assert_eq!(steps[0].module, "catalog");
    let (_, steps) = admission.explain(&caller("local"), &argv("JSON.GET doc"));
    assert_eq!(steps[0].module, "json-catalog");
    assert!(admission.current().catalog().any(|d| d.name == "JSON.DEL"));
}
