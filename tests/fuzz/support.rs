//! The runner every target shares: a fixed seed and a bounded budget by default, both
//! overridable from the environment, and no regression files written into the tree.

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// The default seed: the same cases on every run, so a failure in CI reproduces locally.
const SEED: u64 = 0x7011_6a7e_f022_5eed;

/// Cases per target: `TOLLGATE_FUZZ_CASES`, else `default` (sized for a few seconds in CI).
fn cases(default: u32) -> u32 {
    std::env::var("TOLLGATE_FUZZ_CASES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn seed() -> u64 {
    std::env::var("TOLLGATE_FUZZ_SEED")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(SEED)
}

/// Runs `property` on `default_cases` inputs from `strategy` (or as many as the environment
/// asks); panics with the shrunk failing input and the seed that found it.
pub fn check<S: Strategy>(
    default_cases: u32,
    strategy: S,
    property: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let seed = seed();
    let mut bytes = [0u8; 32];
    for (at, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&seed.wrapping_add(at as u64).to_le_bytes());
    }
    let config = Config {
        cases: cases(default_cases),
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    if let Err(failure) = runner.run(&strategy, property) {
        panic!("{failure} (TOLLGATE_FUZZ_SEED={seed})");
    }
}
