//! `tollgate module bench [DIR|FILE.wasm]`: what a guard costs before it is loaded. A standard
//! mix of commands (reads, writes, multi-key commands, one key outside the caller's prefix, a
//! command without keys) is judged round after round, each command alone through `admit` and all
//! of them through one `admit-batch`, by the module and by the built-in YAML guard (the default
//! policy) in the same sandbox; printed are p50/p99 of wall time and fuel per call, and the
//! instance's memory. Wall times depend on the machine's load; fuel does not.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tollgate_policy::module_tests::{caller, ModuleTests};
use tollgate_policy::{CallCost, GuardProbe};

use super::{load, locate};

/// The mix: the principal is `local` (the default policy's), so the YAML guard runs its rules.
const MIX: &[&str] = &[
    "GET local:user:1",
    "SET local:user:1 v",
    "MGET local:a local:b local:c local:d",
    "HSET local:h f1 v1 f2 v2",
    "INCR local:counter",
    "EXPIRE local:user:1 60",
    "LPUSH local:queue a b c",
    "ZADD local:z 1 m1 2 m2",
    "DEL local:a local:b",
    "GET other:user:1",
    "EXISTS local:x",
    "PING",
];
const PRINCIPAL: &str = "local";

pub fn run(module: &Path, rounds: usize) -> Result<()> {
    let located = locate(module, None)?;
    let tests = located
        .tests
        .as_deref()
        .map(ModuleTests::read)
        .transpose()?;
    let started = Instant::now();
    let (generation, probe) = load(&located.component, tests.as_ref())?;
    let loaded = started.elapsed();
    let yaml = GuardProbe::new(generation.clone(), "yaml-guard:default.yaml")
        .context("the default policy's YAML guard")?;
    let argvs: Vec<Vec<String>> = MIX
        .iter()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect();
    let who = caller(PRINCIPAL);
    // The load asked the guard once (the generation's self-test): a first call on a fresh
    // instance is what a new generation's first command pays.
    let first = probe.admit(&who, &argvs[0]).1;
    println!(
        "{}: loaded (compiled and linked, with the built-in catalog and YAML guard) in {}; \
         size {} KiB; {} commands per round, {rounds} rounds",
        located.component.display(),
        ms(loaded),
        std::fs::metadata(&located.component)
            .map(|m| m.len() / 1024)
            .unwrap_or(0),
        MIX.len()
    );
    println!(
        "{:<28} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "guard / call", "p50", "p99", "fuel p50", "fuel p99", "memory"
    );
    for (label, guard) in [
        (probe.name().to_owned(), &probe),
        ("yaml-guard".into(), &yaml),
    ] {
        let mut alone = Vec::with_capacity(rounds * argvs.len());
        let mut batched = Vec::with_capacity(rounds);
        let refs: Vec<&[String]> = argvs.iter().map(Vec::as_slice).collect();
        for _ in 0..rounds {
            for argv in &argvs {
                alone.push(guard.admit(&who, argv).1);
            }
            batched.push(guard.admit_batch(&who, &refs).1);
        }
        row(&format!("{label} admit"), &alone);
        row(&format!("{label} admit-batch({})", MIX.len()), &batched);
    }
    println!(
        "first call after load: {} (fuel {})",
        us(first.elapsed),
        first.fuel
    );
    Ok(())
}

fn row(label: &str, costs: &[CallCost]) {
    let mut times: Vec<Duration> = costs.iter().map(|c| c.elapsed).collect();
    let mut fuel: Vec<u64> = costs.iter().map(|c| c.fuel).collect();
    times.sort_unstable();
    fuel.sort_unstable();
    let memory = costs.iter().map(|c| c.memory).max().unwrap_or(0);
    println!(
        "{:<28} {:>10} {:>10} {:>12} {:>12} {:>7} KiB",
        label,
        us(percentile(&times, 50)),
        us(percentile(&times, 99)),
        percentile(&fuel, 50),
        percentile(&fuel, 99),
        memory / 1024
    );
}

fn percentile<T: Copy + Default>(sorted: &[T], p: usize) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}
