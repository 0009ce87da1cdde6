//! Decision tables of every policy under policies/ (found by walking the directory, so a new
//! policy gets a snapshot without code) and the catalog, as insta snapshots in snapshots/. CI runs
//! with INSTA_UPDATE=no: a changed decision fails until the new snapshot is reviewed and accepted.

use std::path::{Path, PathBuf};

use tollgate_policy::{review, PolicyConfig};

use crate::policy_support::{admission, config, fuel_limits, root, snapshot_settings};

/// Every `*.yaml` under policies/, except the guest modules' tree.
fn policy_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() && path.file_name().is_some_and(|n| n != "modules") {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join("policies"), &mut out);
    out
}

#[test]
fn every_policy_has_a_reviewed_decision_table() {
    let files = policy_files();
    assert!(files.len() >= 4, "found only {files:?}");
    for file in files {
        let name = file
            .strip_prefix(root().join("policies"))
            .unwrap()
            .with_extension("")
            .to_string_lossy()
            .replace('/', "__");
        let admission = admission(&config(&[&file], vec![]));
        let table = review::table(&admission.current());
        snapshot_settings().bind(|| {
            insta::assert_snapshot!(format!("policy__{name}"), table.to_string());
        });
    }
}

#[test]
fn the_catalog_has_a_reviewed_snapshot() {
    let admission = admission(&PolicyConfig {
        limits: fuel_limits(),
        ..PolicyConfig::default()
    });
    let catalog = review::catalog(&admission.current());
    snapshot_settings().bind(|| insta::assert_snapshot!("catalog", catalog));
}

#[test]
fn every_policy_passes_its_own_tests() {
    for file in policy_files() {
        // Building runs the policy's tests as the self-test; this makes the failure name the file.
        let admission = admission(&config(&[&file], vec![]));
        assert!(admission.current().test_failures().is_empty());
        assert!(
            !admission.current().files()[0].tests.is_empty(),
            "{} has no tests: section",
            file.display()
        );
    }
}

/// `tollgate policy diff` of the default and read-only policies exits 2, and the witness of each
/// row of its plan (a fold of classes that changed alike), replayed through `tollgate policy
/// explain --against`, shows the old and the new verdict the row claims.
#[test]
fn the_diffs_witnesses_replay_through_explain() {
    let old = root().join("policies/default.yaml");
    let new = root().join("policies/examples/read-only.yaml");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .output()
            .unwrap()
    };
    let (old_arg, new_arg) = (old.to_str().unwrap(), new.to_str().unwrap());
    let diffed = run(&["policy", "diff", "--json", old_arg, new_arg]);
    assert_eq!(diffed.status.code(), Some(2), "decisions changed");
    let diff: serde_json::Value = serde_json::from_slice(&diffed.stdout).unwrap();
    let rows = diff["rows"].as_array().unwrap();
    let plan = diff["plan"].as_array().unwrap();
    assert!(!plan.is_empty());
    // Every changed class is in one row of the plan.
    let folded: usize = plan
        .iter()
        .map(|f| f["rows"].as_array().unwrap().len())
        .sum();
    assert_eq!(folded, rows.len());
    for fold in plan {
        let witness = &fold["witness"];
        let argv = witness["argv"]
            .as_array()
            .unwrap_or_else(|| panic!("a witness with no argv: {fold}"));
        let uid = witness["uid"].to_string();
        let gid = witness["gid"].to_string();
        let mut args = vec![
            "policy",
            "explain",
            "--policy",
            old_arg,
            "--against",
            new_arg,
            "--uid",
            &uid,
            "--gid",
            &gid,
            "--",
        ];
        args.extend(argv.iter().map(|a| a.as_str().unwrap()));
        let explained = run(&args);
        assert!(explained.status.success(), "{args:?}");
        let text = String::from_utf8(explained.stdout).unwrap();
        let verdicts: Vec<&str> = text.lines().filter(|l| l.starts_with("=> ")).collect();
        assert_eq!(verdicts.len(), 2, "{text}");
        for (line, side) in verdicts.iter().zip(["old", "new"]) {
            let rule = fold[side]["rule"].as_str().unwrap();
            let expected = if fold[side]["allowed"].as_bool().unwrap() {
                format!("=> admitted by {rule} ")
            } else {
                format!("rule {rule} denies")
            };
            assert!(
                line.contains(&expected),
                "{side}: {line} (expected {expected}) for {args:?}"
            );
        }
    }
    assert!(plan.len() >= 10, "only {} rows in the plan", plan.len());
    // The plan a reviewer reads fits a screen.
    let plain = run(&["policy", "diff", old_arg, new_arg]);
    let lines = String::from_utf8(plain.stdout).unwrap().lines().count();
    assert!(lines <= 40, "{lines} lines");
    let same = run(&["policy", "diff", old_arg, old_arg]);
    assert_eq!(same.status.code(), Some(0));
}
