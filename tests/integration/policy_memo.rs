//! The YAML guards' remembered verdicts (crates/policy/src/verdict_memo.rs) never change a
//! decision: a generation that has judged other commands first decides each command exactly as
//! one that meets it first. The attack is a key-dependent verdict kept and reused: acme's
//! `GET acme:1` admitted, then `GET globex:1` admitted from memory. Two admissions of one policy
//! judge the same commands in opposite orders, one at a time and as pipelines, and every
//! decision must agree, and agree with what the rules say for the cases named here.

use tollgate_policy::{Admission, Decision};

use crate::policy_support::{admission, argv, caller, config, root};

/// Commands whose verdicts depend on their keys for some principals and not for others.
const COMMANDS: &[&str] = &[
    "GET acme:1",
    "GET globex:1",
    "GET shared:motd",
    "SET shared:motd x",
    "SET acme:1 x",
    "SET globex:1 x",
    "DEL acme:1 globex:1",
    "MSET acme:1 a shared:x b",
    "MGET acme:1 acme:2",
    "FLUSHALL",
    "DBSIZE",
    "PING",
    "EVAL x 0",
    "CLIENT SETNAME n",
    "MULTI",
];

const PRINCIPALS: &[&str] = &["acme", "globex", "uid:4242"];

fn summary(decision: &Decision) -> String {
    match decision {
        Decision::Admitted { rule, .. } => format!("admitted by {rule}"),
        Decision::Denied(denial) => format!("denied by {} ({:?})", denial.rule, denial.cause),
    }
}

/// Every (principal, command) decision, judged one at a time in `order`, twice over: the second
/// pass meets a memory the first pass filled.
fn one_at_a_time(admission: &Admission, order: &[&str]) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    for _ in 0..2 {
        for principal in PRINCIPALS {
            for line in order {
                let decision = admission.admit(&caller(principal), &argv(line));
                seen.push((format!("{principal} {line}"), summary(&decision)));
            }
        }
    }
    seen.sort();
    seen.dedup();
    seen
}

/// The same, each principal's commands as one pipeline.
fn pipelined(admission: &Admission, order: &[&str]) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    for _ in 0..2 {
        for principal in PRINCIPALS {
            let argvs: Vec<_> = order.iter().map(|line| argv(line)).collect();
            let refs: Vec<&[_]> = argvs.iter().map(Vec::as_slice).collect();
            let decisions = admission.admit_all(&caller(principal), &refs);
            for (line, decision) in order.iter().zip(&decisions) {
                seen.push((format!("{principal} {line}"), summary(decision)));
            }
        }
    }
    seen.sort();
    seen.dedup();
    seen
}

#[test]
fn remembered_verdicts_decide_as_the_guard_does_in_any_order() {
    let tenants = root().join("policies/examples/tenants.yaml");
    let forward: Vec<&str> = COMMANDS.to_vec();
    let backward: Vec<&str> = COMMANDS.iter().rev().copied().collect();
    let ahead = one_at_a_time(&admission(&config(&[&tenants], vec![])), &forward);
    let behind = one_at_a_time(&admission(&config(&[&tenants], vec![])), &backward);
    // dedup leaves one row per (principal, command) only if both passes agreed.
    assert_eq!(ahead.len(), PRINCIPALS.len() * COMMANDS.len(), "{ahead:#?}");
    assert_eq!(ahead, behind);
    let piped = pipelined(&admission(&config(&[&tenants], vec![])), &backward);
    assert_eq!(ahead, piped);

    let decided = |who: &str, line: &str| {
        ahead
            .iter()
            .find(|(asked, _)| asked == &format!("{who} {line}"))
            .map(|(_, decision)| decision.clone())
            .unwrap()
    };
    assert_eq!(decided("acme", "GET acme:1"), "admitted by acme-keys");
    assert!(decided("acme", "GET globex:1").starts_with("denied by default-deny"));
    assert_eq!(decided("globex", "GET globex:1"), "admitted by globex-keys");
    assert!(decided("acme", "SET shared:motd x").starts_with("denied by shared-is-read-only"));
    assert!(decided("acme", "FLUSHALL").starts_with("denied by no-whole-keyspace"));
    assert_eq!(decided("uid:4242", "PING"), "admitted by connection");
    assert!(decided("uid:4242", "GET acme:1").starts_with("denied by default-deny"));
}
