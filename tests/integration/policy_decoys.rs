//! Key semantics through the RESP socket, against a real redis-server: a deny rule with `keys:`
//! refuses a command when any of its keys matches, so a decoy key beside a protected one
//! (`DEL decoy protected:1`, `MSET decoy 1 protected:1 2`) is refused and writes nothing; an allow
//! rule still needs every key. And the compiler refuses key-constrained rules that allow scripts.

use tollgate_resp::Frame;
use tollgate_testkit::RedisServer;

use crate::policy_support::root;
use crate::support::daemon::{tempdir, TestDaemon};
use crate::support::raw::{text, RawClient};

/// Writes to `protected:*` are denied; everything else of the data categories is allowed, and an
/// allow rule on `app:*` lets the other principal touch only its keys.
const PROTECTED: &str = r#"principals:
  me: { any: true }
rules:
  - id: protected
    commands: ["@write"]
    keys: ["protected:*"]
    deny: protected keys are written by the operator only
  - id: data
    commands: ["@read", "@write", "@keyspace", "@connection"]
    allow: data
"#;

fn refused_by(reply: &Frame, rule: &str) -> bool {
    matches!(reply, Frame::Error(_)) && text(reply).contains(&format!("rule {rule} denies"))
}

#[tokio::test]
async fn a_decoy_key_does_not_dodge_a_deny_rule_and_nothing_is_written() {
    let redis = RedisServer::start();
    assert!(redis.inline("SET protected:1 original").contains("OK"));
    let dir = tempdir();
    let policy = dir.path().join("protected.yaml");
    std::fs::write(&policy, PROTECTED).unwrap();
    let daemon =
        TestDaemon::start_with(&redis, |config| config.policy.files = vec![policy.clone()]).await;
    let mut client = RawClient::connect(&daemon.resp_socket()).await;

    for argv in [
        &["DEL", "decoy", "protected:1"][..],
        &["DEL", "protected:1", "decoy"],
        &["UNLINK", "a", "b", "protected:1"],
        &["MSET", "decoy", "1", "protected:1", "2"],
        &["MSET", "protected:1", "2", "decoy", "1"],
        &["RENAME", "decoy", "protected:1"],
    ] {
        let reply = client.call(argv).await;
        assert!(
            refused_by(&reply, "protected"),
            "{argv:?} got {}",
            text(&reply)
        );
    }
    // Nothing reached Redis: the protected key is intact and no decoy was written.
    assert!(redis.inline("GET protected:1").contains("original"));
    assert!(redis.inline("EXISTS decoy").contains(":0"));

    // The same commands without the protected key go through: the rule is about that key.
    let reply = client.call(&["MSET", "decoy", "1", "other", "2"]).await;
    assert_eq!(text(&reply), "OK");
    let reply = client.call(&["DEL", "decoy", "other"]).await;
    assert_eq!(reply, Frame::Integer(2));
    // Reading the protected key is not a write: allowed by `data`.
    let reply = client.call(&["GET", "protected:1"]).await;
    assert_eq!(text(&reply), "original");
    daemon.stop().await;
}

/// The tenants example with `@scripting` added to acme's rule, and the same with the acceptance.
fn tenants_with_scripting(accept: bool) -> String {
    let text = std::fs::read_to_string(root().join("policies/examples/tenants.yaml")).unwrap();
    let from = "    commands: [\"@read\", \"@write\", \"@keyspace\", \"@transaction\"]\n    keys: [\"acme:*\", \"shared:*\"]\n";
    assert!(text.contains(from), "tenants.yaml changed shape");
    let to = format!(
        "    commands: [\"@read\", \"@write\", \"@keyspace\", \"@transaction\", \"@scripting\"]\n    keys: [\"acme:*\", \"shared:*\"]\n{}",
        if accept {
            "    scripts: unconstrained\n"
        } else {
            ""
        }
    );
    text.replacen(from, &to, 1)
}

#[test]
fn a_key_constrained_rule_that_allows_scripts_confines_them_to_a_scope_unless_accepted() {
    let dir = tempdir();
    let path = dir.path().join("tenants.yaml");
    std::fs::write(&path, tenants_with_scripting(false)).unwrap();
    let config = crate::policy_support::config(&[&path], vec![]);
    let admission = crate::policy_support::admission(&config);
    let generation = admission.current();
    // acme's scripts run as its scope's Redis user, which holds them to acme-keys' globs.
    let scope = generation
        .scopes()
        .of("acme")
        .expect("acme's scripts are confined");
    assert_eq!(scope.rules, ["acme-keys"]);
    assert!(scope.allows("GET", &[b"shared:motd"]));
    assert!(!scope.allows("SET", &[b"shared:motd"]));
    assert!(!scope.allows("GET", &[b"globex:1"]));
    // globex's scripts (allowed by tenant-scripts) are held to globex-keys' globs.
    assert_eq!(
        generation.scopes().of("globex").unwrap().rules,
        ["globex-keys"]
    );

    std::fs::write(&path, tenants_with_scripting(true)).unwrap();
    let admission = crate::policy_support::admission(&config);
    // Accepted, acme's scripts reach any key (outside the reserved keyspace), and the rule
    // allows the script as it says: EVAL with an acme key is admitted.
    assert!(admission.current().scopes().of("acme").is_none());
    let decision = admission.admit(
        &crate::policy_support::caller("acme"),
        &crate::policy_support::argv("EVAL x 1 acme:x"),
    );
    assert!(
        matches!(decision, tollgate_policy::Decision::Admitted { ref rule, .. } if &**rule == "acme-keys"),
        "{decision:?}"
    );
}

#[test]
fn every_way_a_keyed_allow_rule_can_reach_scripts_scopes_them() {
    // One principal per way of writing a rule (one policy: loading a policy is the slow part).
    // Every way to a command that runs code scopes its principal; SCRIPT and FUNCTION LOAD name no
    // key, so a keyed rule never matches them (`@write` reaches FUNCTION LOAD), and neither does a
    // deny rule: those principals run no script at all. A rule without `keys:` that allows
    // scripts leaves nothing to confine when no rule with keys applies to its principal.
    let cases = [
        ("[GET, EVAL]", "allow", true, true),
        ("[EVALSHA_RO]", "allow", true, true),
        ("[FCALL]", "allow", true, true),
        ("[\"*\"]", "allow", true, true),
        ("[\"@slow\"]", "allow", true, true),
        ("[SCRIPT]", "allow", true, false),
        ("[FUNCTION LOAD]", "allow", true, false),
        ("[\"@write\"]", "allow", true, false),
        ("[EVAL]", "deny", true, false),
        ("[EVAL, SCRIPT]", "allow", false, false),
    ];
    let mut policy = String::from("principals:\n");
    for at in 0..cases.len() {
        policy.push_str(&format!("  p{at}: {{ uids: [{}] }}\n", 1000 + at));
    }
    policy.push_str("rules:\n");
    for (at, (commands, action, keyed, _)) in cases.iter().enumerate() {
        let keys = if *keyed {
            "    keys: [\"app:*\"]\n"
        } else {
            ""
        };
        policy.push_str(&format!(
            "  - id: r{at}\n    principals: [p{at}]\n    commands: {commands}\n{keys}    {action}: x\n"
        ));
    }
    let dir = tempdir();
    let path = dir.path().join("scripts.yaml");
    std::fs::write(&path, policy).unwrap();
    let admission =
        crate::policy_support::admission(&crate::policy_support::config(&[&path], vec![]));
    let generation = admission.current();
    for (at, (commands, action, _, scoped)) in cases.iter().enumerate() {
        let scope = generation.scopes().of(&format!("p{at}"));
        assert_eq!(scope.is_some(), *scoped, "{action} {commands}: {scope:?}");
        if let Some(scope) = scope {
            assert!(scope.allows("GET", &[b"app:1"]) || !commands.contains("GET"));
            assert!(!scope.allows("GET", &[b"other:1"]), "{commands}");
        }
    }
    // Accepting unconstrained scripts where the rule grants none is a warning at the field.
    let path = dir.path().join("unconstrained.yaml");
    std::fs::write(
        &path,
        "principals:\n  app: { uids: [1000] }\nrules:\n  - id: r\n    commands: [GET]\n    keys: [\"app:*\"]\n    scripts: unconstrained\n    allow: x\n",
    )
    .unwrap();
    let admission =
        crate::policy_support::admission(&crate::policy_support::config(&[&path], vec![]));
    let warnings = &admission.generation().files[0].warnings;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].ends_with(
            ":7:14: warning: rule `r`: `scripts: unconstrained` has no effect: the rule does not \
             allow scripts"
        ),
        "{}",
        warnings[0]
    );
}
