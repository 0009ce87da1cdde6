//! `tollgate policy diff`'s work, less loading the policies: the exact request classes of two
//! generations, each class's witness judged under both, the changed ones folded into the plan.
//! Of the repository's example policies, and of generated policy pairs (the property test's
//! seeded generator, `tollgate_policy::classes::generated`) with hundreds of rules and globs.
//!
//! `cargo bench -p tollgate-policy --bench diff` prints each pair's size first (rules, distinct
//! key globs, classes, changed classes, plan rows), then criterion's runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use criterion::Criterion;
use prometheus_client::registry::Registry;
use tollgate_policy::classes::{diff, generated};
use tollgate_policy::{Admission, Generation, PolicyConfig, SandboxLimits};

fn load(path: &Path) -> Arc<Generation> {
    let config = PolicyConfig {
        files: vec![path.to_path_buf()],
        limits: SandboxLimits {
            deadline: Duration::from_secs(60),
            ..SandboxLimits::default()
        },
        ..PolicyConfig::default()
    };
    Admission::load(&config, &mut Registry::default())
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .current()
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// A generated policy written where `Admission::load` can read it.
fn generated(dir: &Path, seed: u64, rules: usize, prefixes: usize) -> Arc<Generation> {
    let path = dir.join(format!("generated-{seed}-{rules}.yaml"));
    std::fs::write(&path, generated::policy(seed, rules, prefixes)).unwrap();
    load(&path)
}

fn distinct_globs(generations: &[&Generation]) -> usize {
    let mut globs = std::collections::BTreeSet::new();
    for g in generations {
        for file in g.files() {
            for rule in &file.policy.rules {
                match &rule.target {
                    tollgate_policy_rules::Target::Commands {
                        keys: Some(keys), ..
                    } => globs.extend(keys.iter().cloned()),
                    tollgate_policy_rules::Target::Commands { keys: None, .. } => {}
                    tollgate_policy_rules::Target::Leases { resources } => {
                        globs.extend(resources.iter().cloned())
                    }
                }
            }
        }
    }
    globs.len()
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let default = load(&repo("policies/default.yaml"));
    let pairs: Vec<(String, Arc<Generation>, Arc<Generation>)> = vec![
        (
            "default->read-only".into(),
            default.clone(),
            load(&repo("policies/examples/read-only.yaml")),
        ),
        (
            "default->tenants".into(),
            default,
            load(&repo("policies/examples/tenants.yaml")),
        ),
        (
            "generated-200x40".into(),
            generated(dir.path(), 1, 200, 40),
            generated(dir.path(), 2, 200, 40),
        ),
        (
            "generated-500x60".into(),
            generated(dir.path(), 3, 500, 60),
            generated(dir.path(), 4, 500, 60),
        ),
    ];
    for (name, old, new) in &pairs {
        let rules: usize = [old, new]
            .iter()
            .flat_map(|g| g.files())
            .map(|f| f.policy.rules.len())
            .sum();
        let changed = diff::diff(old, new);
        println!(
            "{name}: {rules} rules, {} distinct globs, {} classes, {} changed, {} plan rows, complete {}",
            distinct_globs(&[old, new]),
            changed.classes,
            changed.rows.len(),
            changed.plan.len(),
            changed.complete
        );
    }
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    let mut group = criterion.benchmark_group("diff");
    for (name, old, new) in &pairs {
        group.bench_function(name.as_str(), |b| b.iter(|| diff::diff(old, new)));
    }
    group.finish();
    criterion.final_summary();
}
