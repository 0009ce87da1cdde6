//! Hostile modules: each misbehaviour ends in a deny that names its cause, the faulty instance
//! is replaced, and the next command is served normally.

use std::time::Duration;

use tollgate_policy::{
    Decision, DenyCause, ModuleConfig, ModuleLimits, PolicyConfig, SandboxLimits,
};

use crate::policy_support::{admission, argv, caller, config, denial};

fn hostile(mode: &str) -> ModuleConfig {
    ModuleConfig::WithConfig {
        path: tollgate_policy::built_component("hostile"),
        config: mode.into(),
        limits: ModuleLimits::default(),
    }
}

/// The hostile module misbehaves on the key `hostile` and allows anything else.
fn assert_fault_then_recovery(config: &PolicyConfig, cause: DenyCause) {
    assert_fault_then_recovery_after(config, cause, Duration::ZERO);
}

/// The same, after `quiet` without calls (long enough for the epoch ticker to go to sleep).
fn assert_fault_then_recovery_after(config: &PolicyConfig, cause: DenyCause, quiet: Duration) {
    let admission = admission(config);
    std::thread::sleep(quiet);
    let who = caller("local");
    for _ in 0..2 {
        let denial = denial(admission.admit(&who, &argv("GET hostile")));
        assert_eq!(
            (denial.cause, denial.module.as_str()),
            (cause, "hostile"),
            "{denial}"
        );
        assert_eq!(denial.rule, "sandbox");
        match admission.admit(&who, &argv("GET fine")) {
            Decision::Admitted { rule, .. } => assert_eq!(&*rule, "data"),
            Decision::Denied(denial) => {
                panic!("the next command was not served normally: {denial}")
            }
        }
    }
}

#[test]
fn an_infinite_loop_runs_out_of_fuel() {
    assert_fault_then_recovery(&config(&[], vec![hostile("spin")]), DenyCause::Deadline);
}

/// A spinning guard under a 20 ms epoch deadline, the wall-clock backstop, with fuel out of reach.
fn spin_under_a_deadline() -> PolicyConfig {
    PolicyConfig {
        modules: vec![hostile("spin")],
        limits: SandboxLimits {
            deadline: Duration::from_millis(20),
            fuel: u64::MAX,
            ..SandboxLimits::default()
        },
        ..PolicyConfig::default()
    }
}

#[test]
fn an_infinite_loop_hits_the_epoch_deadline() {
    assert_fault_then_recovery(&spin_under_a_deadline(), DenyCause::Deadline);
}

#[test]
fn an_infinite_loop_hits_the_epoch_deadline_after_the_ticker_slept() {
    let config = spin_under_a_deadline();
    // The ticker sleeps after 100 ms without calls; the first call must wake it. Were it not
    // woken, the loop would spin forever: a watchdog turns that into a failure.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        assert_fault_then_recovery_after(&config, DenyCause::Deadline, Duration::from_millis(400));
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the spinning module was stopped and the next command served");
}

#[test]
fn a_memory_bomb_hits_the_memory_cap() {
    assert_fault_then_recovery(&config(&[], vec![hostile("bomb")]), DenyCause::OutOfMemory);
}

#[test]
fn a_trap_is_a_deny() {
    assert_fault_then_recovery(&config(&[], vec![hostile("trap")]), DenyCause::Trap);
}

#[test]
fn a_huge_answer_is_malformed() {
    assert_fault_then_recovery(&config(&[], vec![hostile("huge")]), DenyCause::Malformed);
}

#[test]
fn a_fault_in_a_pipeline_refuses_only_the_command_that_caused_it() {
    let admission = admission(&config(&[], vec![hostile("trap")]));
    let commands = [argv("GET fine"), argv("GET hostile"), argv("SET other v")];
    let refs: Vec<&[bytes::Bytes]> = commands.iter().map(Vec::as_slice).collect();
    let decisions = admission.admit_all(&caller("local"), &refs);
    assert!(
        matches!(decisions[0], Decision::Admitted { .. }),
        "{:?}",
        decisions[0]
    );
    assert_eq!(denial(decisions[1].clone()).cause, DenyCause::Trap);
    assert!(
        matches!(decisions[2], Decision::Admitted { .. }),
        "{:?}",
        decisions[2]
    );
}

#[test]
fn a_pipeline_that_spins_on_some_commands_refuses_those_and_answers_the_others() {
    let admission = admission(&config(&[], vec![hostile("spin")]));
    let lines = [
        "GET fine",
        "GET hostile",
        "SET other v",
        "GET hostile",
        "GET hostile",
        "GET last",
    ];
    let commands: Vec<_> = lines.iter().map(|line| argv(line)).collect();
    let refs: Vec<&[bytes::Bytes]> = commands.iter().map(Vec::as_slice).collect();
    let decisions = admission.admit_all(&caller("local"), &refs);
    for (line, decision) in lines.iter().zip(decisions) {
        match decision {
            Decision::Admitted { rule, .. } => {
                assert!(!line.contains("hostile"), "{line} was admitted by {rule}")
            }
            Decision::Denied(denial) => {
                assert!(line.contains("hostile"), "{line} was refused: {denial}");
                assert_eq!(
                    (denial.cause, denial.module.as_str()),
                    (DenyCause::Deadline, "hostile")
                );
            }
        }
    }
}

#[test]
fn a_pipeline_that_spins_on_every_command_refuses_each_for_the_budget() {
    let admission = admission(&config(&[], vec![hostile("spin")]));
    let commands = vec![argv("GET hostile"); 64];
    let refs: Vec<&[bytes::Bytes]> = commands.iter().map(Vec::as_slice).collect();
    for decision in admission.admit_all(&caller("local"), &refs) {
        assert_eq!(denial(decision).cause, DenyCause::Deadline);
    }
}

#[test]
fn a_module_of_its_own_limits_runs_under_them() {
    // One unit of fuel cannot answer anything: the module's own limit, not the common one, applies.
    let starved = ModuleConfig::WithConfig {
        path: tollgate_policy::built_component("hostile"),
        config: "behave".into(),
        limits: ModuleLimits {
            fuel: Some(1),
            ..ModuleLimits::default()
        },
    };
    let error = match tollgate_policy::Admission::load(
        &config(&[], vec![starved]),
        &mut prometheus_client::registry::Registry::default(),
    ) {
        Ok(_) => panic!("a module with one unit of fuel passed its self-test"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("hostile"), "{error}");
    assert!(error.contains("deadline"), "{error}");
}

#[test]
fn a_batch_answered_with_too_few_verdicts_is_judged_again_one_by_one() {
    let admission = admission(&config(&[], vec![hostile("short")]));
    let commands = [argv("GET a"), argv("GET b"), argv("SET c v")];
    let refs: Vec<&[bytes::Bytes]> = commands.iter().map(Vec::as_slice).collect();
    for decision in admission.admit_all(&caller("local"), &refs) {
        match decision {
            Decision::Admitted { rule, .. } => assert_eq!(&*rule, "data"),
            Decision::Denied(denial) => panic!("the retry one by one was not made: {denial}"),
        }
    }
}

#[test]
fn faults_and_decisions_are_counted_in_metrics() {
    let mut registry = prometheus_client::registry::Registry::default();
    let admission =
        tollgate_policy::Admission::load(&config(&[], vec![hostile("trap")]), &mut registry)
            .unwrap();
    let who = caller("local");
    admission.admit(&who, &argv("GET hostile"));
    admission.admit(&who, &argv("GET fine"));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        r#"policy_module_faults_total{module="hostile",cause="trap"} 1"#,
        r#"policy_decisions_total{outcome="denied",cause="trap"} 1"#,
        r#"policy_decisions_total{outcome="admitted",cause=""} 1"#,
        "policy_generation 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
}
