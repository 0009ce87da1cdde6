//! Decision tables of every policy under policies/ (found by walking the directory, so a new
//! policy gets a snapshot without code) and the catalog, as insta snapshots in snapshots/. CI runs
//! with INSTA_UPDATE=no: a changed decision fails until the new snapshot is reviewed and accepted.

use std::path::{Path, PathBuf};

use tollgate_policy::{review, PolicyConfig};

use crate::policy_support::{admission, config, fuel_limits, root};

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

fn snapshot_settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(root().join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings
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
