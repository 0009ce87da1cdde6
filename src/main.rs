//! The `tollgate` binary: everything lives in the `tollgate` library (daemon/); this only hands over
//! the command line. It sits in the root package so the integration tests can run the real binary.

fn main() -> std::process::ExitCode {
    tollgate::cli::main()
}
