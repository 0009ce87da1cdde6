//! The `tollgate` binary: everything lives in the library; this only hands over the command line.

fn main() -> std::process::ExitCode {
    tollgate::cli::main()
}
