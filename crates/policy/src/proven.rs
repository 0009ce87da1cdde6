//! A generation made ready to decide: built (`generation.rs`), its invariants proven over its
//! request classes (`classes/`), refused when one breaks and they are enforced, and, for a decision
//! log that names keys by class, the key regions its lines use. It sits above both, which build on
//! the generation, so that neither the generation nor the errors it raises depend on the analyses.

use std::path::PathBuf;
use std::sync::Arc;

use crate::classes::{self, atoms::Atoms, Space};
use crate::compile::{Invariant, Must};
use crate::config::{Invariants, KeyRendering, PolicyConfig};
use crate::error::PolicyError;
use crate::generation::Generation;
use crate::invariants::{Broken, Checked};
use crate::sandbox::Sandbox;

/// [`Generation::build`], then the invariants and the decision log's key regions.
pub fn build(
    sandbox: &Arc<Sandbox>,
    config: &PolicyConfig,
    number: u64,
) -> Result<Generation, PolicyError> {
    let mut generation = Generation::build(sandbox, config, number)?;
    if config
        .decision_log
        .as_ref()
        .is_some_and(|log| log.keys == KeyRendering::Digest)
    {
        generation.key_regions = Some(Arc::new(Atoms::new(&classes::key_globs(
            generation.files().iter().map(|f| &f.policy.rules),
        ))));
    }
    let checked = check(&generation);
    if config.invariants == Invariants::Enforce && checked.iter().any(|c| !c.holds()) {
        return Err(PolicyError::Invariants(checked));
    }
    generation.invariants = checked;
    Ok(generation)
}

/// Every invariant of every file of `generation`, in file order, checked over its classes.
pub fn check(generation: &Generation) -> Vec<Checked> {
    let stated: Vec<(PathBuf, &Invariant)> = generation
        .files()
        .iter()
        .flat_map(|file| file.invariants.iter().map(|i| (file.path.clone(), i)))
        .collect();
    if stated.is_empty() {
        return Vec::new();
    }
    let selectors: Vec<_> = stated.iter().map(|(_, i)| i.selector.clone()).collect();
    let space = Space::with_selectors(&[generation], &selectors);
    let explain: String = std::iter::once("tollgate policy explain".to_owned())
        .chain(
            generation
                .files()
                .iter()
                .filter(|file| !file.path.starts_with("<built-in>"))
                .map(|file| format!("--policy {}", file.path.display())),
        )
        .collect::<Vec<_>>()
        .join(" ");
    stated
        .into_iter()
        .map(|(file, invariant)| {
            let mut checked = Checked {
                file,
                id: invariant.id.clone(),
                must: invariant.must,
                line: invariant.line,
                column: invariant.column,
                classes: 0,
                violations: 0,
                witness: None,
                sampled: Vec::new(),
                complete: space.complete(),
                explain: explain.clone(),
            };
            for class in &space.classes {
                if !space.selects(class, &invariant.selector, 0) {
                    continue;
                }
                checked.classes += 1;
                let verdict = &class.verdicts[0];
                for module in &verdict.sampled {
                    if !checked.sampled.contains(module) {
                        checked.sampled.push(module.clone());
                    }
                }
                let broken = match invariant.must {
                    Must::Never => verdict.allowed,
                    Must::Always => !verdict.allowed,
                };
                if broken {
                    checked.violations += 1;
                    checked.witness.get_or_insert_with(|| Broken {
                        witness: class.witness.clone(),
                        verdict: verdict.clone(),
                    });
                }
            }
            checked
        })
        .collect()
}
