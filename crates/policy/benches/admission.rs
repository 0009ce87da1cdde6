//! One admission decision (catalog + YAML guard, in the sandbox) for typical commands, side by
//! side with the same compiled policy evaluated natively in Rust (a hash-map catalog and
//! `CompiledPolicy::evaluate`), so the sandbox's cost reads as a ratio.
//!
//! A second group decides a pipeline of sixteen GETs: in one `admit_all` (one call into the guard
//! for all of them, as the RESP front door does for a pipeline), one `admit` at a time, and
//! natively.
//!
//! `cargo bench -p tollgate-policy --bench admission` prints p50/p99 per command first (timed one
//! decision at a time, so each sample includes ~20 ns of `Instant::now`), then criterion's runs.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput};
use prometheus_client::registry::Registry;
use tollgate_model::{Caller, Lane};
use tollgate_policy::{Admission, Decision, Descriptor, PolicyConfig};
use tollgate_policy_rules::{Channels, CompiledPolicy, Outcome, Request, Subject};

const COMMANDS: &[(&str, &[&[u8]])] = &[
    ("GET", &[b"GET", b"user:1000"]),
    ("SET-100B", &[b"SET", b"user:1000", &[b'v'; 100]]),
    ("HSET", &[b"HSET", b"session:42", b"field", b"value"]),
    ("EVAL", &[b"EVAL", b"return 1", b"2", b"k1", b"k2", b"arg"]),
    (
        "MSET-10",
        &[
            b"MSET", b"k1", b"v", b"k2", b"v", b"k3", b"v", b"k4", b"v", b"k5", b"v", b"k6", b"v",
            b"k7", b"v", b"k8", b"v", b"k9", b"v", b"k10", b"v",
        ],
    ),
    ("FLUSHALL-denied", &[b"FLUSHALL"]),
];

/// Commands in the pipeline group.
const PIPELINE: usize = 16;

/// The native baseline: the same catalog data in a hash map and the same compiled policy.
struct Native {
    catalog: HashMap<String, Descriptor>,
    policy: CompiledPolicy,
}

impl Native {
    fn admit(&self, caller: &Caller, argv: &[Bytes]) -> bool {
        let name = String::from_utf8_lossy(&argv[0]).to_ascii_uppercase();
        let Some(descriptor) = self.catalog.get(&name) else {
            return false;
        };
        let keys: Vec<&Bytes> = match name.as_str() {
            // EVAL's keys move; resolve them as the catalog module does.
            "EVAL" => {
                let n: usize = std::str::from_utf8(&argv[2]).unwrap().parse().unwrap();
                argv[3..3 + n].iter().collect()
            }
            _ => descriptor.keys(argv).collect(),
        };
        let lane = Lane::ALL
            .iter()
            .position(|l| *l == descriptor.lane)
            .unwrap() as u8;
        let request = Request {
            principal: &caller.principal,
            subject: Subject::Command {
                name: &descriptor.name,
                categories: descriptor.categories,
                lane,
                keys: &keys,
                channels: Channels::none(),
            },
        };
        matches!(
            self.policy.evaluate(&request),
            Outcome::Allow(_) | Outcome::AuditDeny(_)
        )
    }
}

fn setup() -> (Admission, Native, Caller) {
    let admission = Admission::load(&PolicyConfig::default(), &mut Registry::default())
        .expect("the default policy loads");
    let generation = admission.current();
    let native = Native {
        catalog: generation.catalog().map(|d| (d.name.clone(), d)).collect(),
        policy: generation.files()[0].policy.clone(),
    };
    let caller = Caller {
        principal: "local".into(),
        uid: 1000,
        gid: 1000,
        pid: 1,
    };
    (admission, native, caller)
}

fn argv(parts: &[&[u8]]) -> Vec<Bytes> {
    parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (
        samples[samples.len() / 2],
        samples[samples.len() * 99 / 100],
    )
}

/// Decisions timed per command and side; `ADMISSION_SAMPLES` lowers it for runs under valgrind.
fn samples() -> usize {
    std::env::var("ADMISSION_SAMPLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200_000)
}

/// Timing is split into rounds that visit every command and both sides in turn, so a slow
/// stretch of a shared machine lands on all of them alike instead of on one command's block.
const ROUNDS: usize = 20;

fn print_percentiles(admission: &Admission, native: &Native, caller: &Caller) {
    let per_round = samples().div_ceil(ROUNDS);
    let commands: Vec<(&str, Vec<Bytes>)> = COMMANDS
        .iter()
        // `ADMISSION_ONLY=GET` times one command (for runs under valgrind).
        .filter(|(name, _)| std::env::var("ADMISSION_ONLY").map_or(true, |only| only == *name))
        .map(|(name, parts)| (*name, argv(parts)))
        .collect();
    for (name, argv) in &commands {
        let sandboxed = native.admit(caller, argv);
        let decided = matches!(admission.admit(caller, argv), Decision::Admitted { .. });
        assert_eq!(
            sandboxed, decided,
            "{name}: the sandbox and the native evaluation disagree"
        );
    }
    let time = |samples: &mut Vec<Duration>, f: &dyn Fn()| {
        samples.extend((0..per_round).map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        }))
    };
    let mut sandbox = vec![Vec::new(); commands.len()];
    let mut natively = vec![Vec::new(); commands.len()];
    for _ in 0..ROUNDS {
        for (i, (_, argv)) in commands.iter().enumerate() {
            time(&mut sandbox[i], &|| {
                black_box(admission.admit(caller, black_box(argv)));
            });
            time(&mut natively[i], &|| {
                black_box(native.admit(caller, black_box(argv)));
            });
        }
    }
    println!(
        "{:<16} {:>12} {:>12} {:>12} {:>12} {:>8}",
        "command", "sandbox p50", "sandbox p99", "native p50", "native p99", "p50 x"
    );
    for (i, (name, _)) in commands.iter().enumerate() {
        let (sp50, sp99) = percentiles(std::mem::take(&mut sandbox[i]));
        let (np50, np99) = percentiles(std::mem::take(&mut natively[i]));
        println!(
            "{name:<16} {sp50:>12?} {sp99:>12?} {np50:>12?} {np99:>12?} {:>8.1}",
            sp50.as_nanos() as f64 / np50.as_nanos().max(1) as f64
        );
    }
}

fn main() {
    let (admission, native, caller) = setup();
    print_percentiles(&admission, &native, &caller);
    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("admission");
    for (name, parts) in COMMANDS {
        let argv = argv(parts);
        group.bench_with_input(BenchmarkId::new("sandbox", name), &argv, |b, argv| {
            b.iter(|| admission.admit(&caller, black_box(argv)))
        });
        group.bench_with_input(BenchmarkId::new("native", name), &argv, |b, argv| {
            b.iter(|| native.admit(&caller, black_box(argv)))
        });
    }
    group.finish();

    let pipeline: Vec<Vec<Bytes>> = (0..PIPELINE)
        .map(|i| argv(&[b"GET", format!("user:{i}").as_bytes()]))
        .collect();
    let argvs: Vec<&[Bytes]> = pipeline.iter().map(Vec::as_slice).collect();
    let mut group = criterion.benchmark_group("pipeline_of_16_gets");
    group.throughput(Throughput::Elements(PIPELINE as u64));
    group.bench_function("sandbox_together", |b| {
        b.iter(|| admission.admit_all(&caller, black_box(&argvs)))
    });
    group.bench_function("sandbox_one_by_one", |b| {
        b.iter(|| {
            for argv in &argvs {
                black_box(admission.admit(&caller, black_box(argv)));
            }
        })
    });
    group.bench_function("native", |b| {
        b.iter(|| {
            for argv in &argvs {
                black_box(native.admit(&caller, black_box(argv)));
            }
        })
    });
    group.finish();
    criterion.final_summary();
}
