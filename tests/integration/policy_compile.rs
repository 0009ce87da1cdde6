//! The YAML compiler's diagnostics point at file:line:column, and a policy with an error never
//! becomes active: reload keeps the running generation and returns the errors.

use std::path::Path;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use tollgate_policy::compile::{self, CatalogCommand, CatalogIndex};
use tollgate_policy::{Admission, Category, Decision, PolicyError};

use crate::policy_support::{admission, argv, caller, config};

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

const HEAD: &str = "principals:\n  app: { uids: [1000] }\nrules:\n";

/// `uid:<n>` is what the daemon calls a peer no principal maps: a principal named so would give
/// its rules to that uid.
#[test]
fn a_principal_may_not_be_named_like_an_unmapped_uid() {
    let error = load_error("principals:\n  \"uid:995\": { uids: [2001] }\nrules: []\n");
    assert!(
        error.contains("bad.yaml:2:14: error: principal names beginning with `uid:` are reserved"),
        "{error}"
    );
}

#[test]
fn errors_name_file_line_and_column() {
    let cases = [
        (
            "  - id: r\n    commands: [GET, \"@nope\"]\n    allow: x\n",
            "bad.yaml:5:21: error: unknown category `@nope`",
        ),
        (
            "  - id: r\n    principals: [app, bob]\n    commands: [GET]\n    allow: x\n",
            "bad.yaml:5:23: error: unknown principal `bob`",
        ),
        (
            "  - id: r\n    commands: [GET]\n    keys: [\"app:[x\"]\n    allow: x\n",
            "bad.yaml:6:12: error: bad glob `app:[x`: `[` is never closed (at byte 4)",
        ),
        (
            "  - id: r\n    commands: [GETT]\n    allow: x\n",
            "bad.yaml:5:16: error: unknown command `GETT`",
        ),
        (
            "  - id: r\n    commands: [GET]\n    allow: x\n    deny: y\n",
            "bad.yaml:4:7: error: rule `r` needs exactly one of `allow: <reason>` or `deny: <reason>`",
        ),
        (
            "  - id: r\n    commands: [GET]\n    lanes: [express]\n    allow: x\n",
            "bad.yaml:6:13: error: unknown lane `express`",
        ),
        ("  - id: r\n    comands: [GET]\n    allow: x\n", "bad.yaml:5:5: error: rules[0]: unknown field `comands`"),
    ];
    for (rules, expected) in cases {
        let error = load_error(&format!("{HEAD}{rules}"));
        assert!(
            error.starts_with(expected),
            "expected `{expected}`, got:\n{error}"
        );
    }
}

#[test]
fn a_rule_an_earlier_rule_covers_is_a_warning_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shadow.yaml");
    let text = format!(
        "{HEAD}  - id: reads\n    commands: [\"@read\"]\n    allow: x\n  - id: get\n    principals: [app]\n    commands: [GET]\n    deny: y\n"
    );
    std::fs::write(&path, text).unwrap();
    let admission = admission(&config(&[&path], vec![]));
    let warnings = &admission.generation().files[0].warnings;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].ends_with(":7:7: warning: rule `get` can never match: rule `reads` before it matches everything it does"),
        "{}",
        warnings[0]
    );
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_broken_policy_never_becomes_active_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    let allow_get = format!("{HEAD}  - id: get\n    commands: [GET]\n    allow: reads\n");
    write(&path, &allow_get);
    let admission = admission(&config(&[&path], vec![]));
    assert_eq!(admission.generation().number, 1);

    write(
        &path,
        &format!("{HEAD}  - id: get\n    commands: [\"@nope\"]\n    allow: reads\n"),
    );
    match admission.reload() {
        Err(PolicyError::Compile(diagnostics)) => {
            assert_eq!((diagnostics[0].line, diagnostics[0].column), (5, 16))
        }
        other => panic!("reload of a broken policy: {other:?}"),
    }
    assert_eq!(admission.generation().number, 1);
    assert!(matches!(
        admission.admit(&caller("app"), &argv("GET k")),
        Decision::Admitted { .. }
    ));

    // A policy whose own tests fail is refused too.
    let failing =
        format!("{allow_get}tests:\n  - {{ principal: app, command: GET k, expect: deny }}\n");
    write(&path, &failing);
    assert!(matches!(admission.reload(), Err(PolicyError::SelfTest(_))));
    assert_eq!(admission.generation().number, 1);

    write(
        &path,
        &format!("{HEAD}  - id: set\n    commands: [SET]\n    allow: writes\n"),
    );
    assert_eq!(admission.reload().unwrap().number, 2);
    assert!(matches!(
        admission.admit(&caller("app"), &argv("GET k")),
        Decision::Denied(_)
    ));
    assert!(matches!(
        admission.admit(&caller("app"), &argv("SET k v")),
        Decision::Admitted { .. }
    ));
}

/// `count` rules, each allowing GET on keys of its own, in flow style (about 80 bytes a rule).
fn many_rules(count: usize) -> String {
    let mut text = String::from(HEAD);
    for i in 0..count {
        text.push_str(&format!(
            "  - {{ id: r{i}, principals: [app], commands: [GET, MGET], keys: [\"k:{i}:*\"], allow: x }}\n"
        ));
    }
    text
}

#[test]
fn a_policy_of_fifty_thousand_rules_compiles_when_the_size_cap_allows_it() {
    let text = many_rules(50_000);
    let command = |categories: &[Category]| CatalogCommand {
        categories: categories.iter().copied().collect(),
        scripting: false,
        keyed: true,
    };
    let catalog = CatalogIndex {
        commands: [
            (
                "GET".to_owned(),
                command(&[Category::Read, Category::String]),
            ),
            (
                "MGET".to_owned(),
                command(&[Category::Read, Category::String]),
            ),
        ]
        .into_iter()
        .collect(),
    };
    // Unoptimised test builds read YAML some twenty times slower than a release build; the
    // deadline is not what this test is about.
    let deadline = Instant::now() + Duration::from_secs(600);
    let compiled = compile::compile(Path::new("many.yaml"), &text, &catalog, deadline)
        .unwrap_or_else(|errors| panic!("{}", errors[0]));
    assert_eq!(compiled.policy.rules.len(), 50_000);
    assert!(compiled.warnings.is_empty(), "{}", compiled.warnings[0]);

    // Loaded into admission (with the size cap raised), it either decides by its rules or is
    // refused naming the file: the YAML guard reads the compiled policy inside its first call's
    // budget, and 50,000 rules may not fit in it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.yaml");
    write(&path, &text);
    let mut config = config(&[&path], vec![]);
    config.max_file_bytes = text.len() as u64;
    config.compile_deadline = Duration::from_secs(600);
    match Admission::load(&config, &mut Registry::default()) {
        Ok(admission) => {
            assert!(matches!(
                admission.admit(&caller("app"), &argv("GET k:49999:x")),
                Decision::Admitted { ref rule, .. } if &**rule == "r49999"
            ));
            assert!(matches!(
                admission.admit(&caller("app"), &argv("MGET k:1:x k:2:x")),
                Decision::Denied(_)
            ));
        }
        Err(error) => assert!(
            error.to_string().contains("yaml-guard:many.yaml"),
            "{error}"
        ),
    }
}

/// As many rules as the default size cap (1 MiB) holds, some 11 000: the YAML guard reads the
/// compiled policy as an instance is created, under a budget for its size, so the self-test's
/// probe and every decision are judged within their own budget, by the last rule as by the first.
#[test]
fn a_policy_as_large_as_the_size_cap_loads_and_decides_by_its_last_rule() {
    let cap = tollgate_policy::PolicyConfig::default().max_file_bytes as usize;
    let mut rules = 0;
    while many_rules(rules + 100).len() <= cap {
        rules += 100;
    }
    let text = many_rules(rules);
    assert!(text.len() > cap - 20_000 && rules > 10_000, "{rules} rules");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.yaml");
    write(&path, &text);
    let admission = Admission::load(&config(&[&path], vec![]), &mut Registry::default())
        .unwrap_or_else(|error| panic!("{error}"));
    let last = rules - 1;
    let decision = admission.admit(&caller("app"), &argv(&format!("GET k:{last}:x")));
    assert!(
        matches!(&decision, Decision::Admitted { rule, .. } if **rule == *format!("r{last}")),
        "{decision:?}"
    );
    let decision = admission.admit(&caller("app"), &argv("GET elsewhere"));
    assert!(
        matches!(&decision, Decision::Denied(denial) if denial.rule == "default-deny"),
        "{decision:?}"
    );
}

#[test]
fn a_policy_file_over_the_size_cap_is_refused_naming_the_file_and_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    let text = many_rules(50_000);
    write(&path, &text);
    // The default cap: 1 MiB.
    let error = match Admission::load(&config(&[&path], vec![]), &mut Registry::default()) {
        Ok(_) => panic!("a {} byte policy was read", text.len()),
        Err(error) => error,
    };
    assert!(
        matches!(error, PolicyError::TooLarge { max: 1048576, .. }),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        format!(
            "{}: {} bytes, more than policy.max_file_bytes (1048576): split the policy or raise the limit",
            path.display(),
            text.len()
        )
    );
}

#[test]
fn a_policy_nested_a_hundred_thousand_deep_is_refused_with_its_position() {
    let deep = 100_000;
    for (shape, text) in [
        (
            "flow",
            format!("{HEAD}  - id: {}{}\n", "[".repeat(deep), "]".repeat(deep)),
        ),
        ("block", format!("rules:\n{}x\n", "- ".repeat(deep))),
    ] {
        let error = load_error(&text);
        assert!(
            error.starts_with("bad.yaml:")
                && error.contains(": error: nesting deeper than 64 levels"),
            "{shape}: {}",
            &error[..error.len().min(300)]
        );
    }
}

#[test]
fn a_policy_past_the_compile_deadline_is_refused_at_the_rule_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slow.yaml");
    write(&path, &many_rules(10));
    let mut config = config(&[&path], vec![]);
    // A deadline already past when the first rule is checked.
    config.compile_deadline = Duration::ZERO;
    let error = match Admission::load(&config, &mut Registry::default()) {
        Ok(_) => panic!("compiled past its deadline"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains(
            ":4:5: error: compiling stopped at rule `r0` (1 of 10): the compile deadline"
        ),
        "{error}"
    );
}

/// A quota's mistakes are errors at their file:line:column, each of them, not the first only.
#[test]
fn quota_mistakes_name_file_line_and_column() {
    let text = "principals:\n  app: { uids: [1000] }\nrules: []\nquotas:\n  - id: q\n    principals: [app, bob]\n    commands_per_second: 10\n  - id: q\n    burst: 5\n    bytes_per_second: 1MiB\n  - id: none\n    principals: [app]\n  - id: zero\n    commands_per_second: 0\n  - id: none-held\n    leases: 0\n  - id: quick\n    script_time_limit: 1ms\n";
    let error = load_error(text);
    for expected in [
        "bad.yaml:6:23: error: unknown principal `bob`",
        "bad.yaml:8:9: error: quota id `q` is used twice",
        "bad.yaml:9:12: error: quota `q`: `burst` sizes the commands bucket; give `commands_per_second` too",
        "bad.yaml:11:7: error: quota `none` sets no limit",
        "bad.yaml:14:26: error: quota `zero`: `commands_per_second` is 0",
        "bad.yaml:16:13: error: quota `none-held`: `leases` is 0",
        "bad.yaml:18:24: error: quota `quick`: `script_time_limit` must be at least 10ms",
    ] {
        assert!(error.contains(expected), "expected `{expected}` in:\n{error}");
    }
    // A size with no unit the daemon knows is refused by the YAML reader, at its quota (serde_yaml
    // gives no position for a value).
    let error = load_error(
        "principals:\n  app: { uids: [1000] }\nrules: []\nquotas:\n  - id: size\n    bytes_per_second: 10 parsecs\n",
    );
    assert!(error.contains("bad.yaml:5:5:"), "{error}");
    assert!(error.contains("invalid size `10 parsecs`"), "{error}");
}

/// Redis's one namespace of scripts and function libraries is divided by the daemon for a
/// principal that an allow rule confines to keys (`namespace.rs`), so a rule may grant such a
/// principal `SCRIPT KILL`, `FUNCTION` or `@scripting` outright: it compiles, and the policy says
/// which principals are tenants of the namespace and which (no keys rule) keep it whole.
#[test]
fn a_key_confined_principal_may_be_granted_the_script_namespace_which_it_gets_divided() {
    let keyed = "  - id: app-keys\n    principals: [app]\n    commands: [GET]\n    keys: [\"app:*\"]\n    allow: x\n";
    for (commands, command) in [
        ("SCRIPT FLUSH", "SCRIPT FLUSH"),
        ("script kill", "SCRIPT KILL"),
        ("FUNCTION", "FUNCTION LOAD x"),
        ("\"@scripting\"", "FUNCTION FLUSH"),
    ] {
        let text =
            format!("{HEAD}{keyed}  - id: r\n    commands: [PING, {commands}]\n    allow: y\n");
        let admission = admission_of(&text);
        assert!(
            matches!(
                admission.admit(&caller("app"), &argv(command)),
                Decision::Admitted { .. }
            ),
            "{commands}"
        );
        let generation = admission.current();
        assert!(generation.confined_to_keys("app"), "{commands}");
        assert!(!generation.confined_to_keys("other"), "{commands}");
    }
}

/// The admission of a policy that compiles.
fn admission_of(text: &str) -> Admission {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("good.yaml");
    std::fs::write(&path, text).unwrap();
    admission(&config(&[&path], vec![]))
}
