//! The `tollgate` binary: everything lives in the `tollgate` library (daemon/); this only hands over
//! the command line. It sits in the root package so the integration tests can run the real binary.

/// mimalloc rather than glibc's malloc: a request allocates a few small, short-lived blocks (a
/// reply's channel, a verdict's rule name, a run's vectors), freed on another task soon after;
/// glibc's arena locking and consolidation were 6-7% of the daemon's cycles on pipelined GETs
/// (BENCHMARKS.md, "Per-request breakdown").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tollgate::cli::main()
}
