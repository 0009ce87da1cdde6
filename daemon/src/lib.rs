//! Tollgate: a local daemon between applications and Redis. This library is the whole daemon; the
//! `tollgate` binary only parses the command line and calls [`cli::main`].

pub mod cli;
pub mod config;
pub mod embedded;
pub mod lane_acl;
pub mod logging;
pub mod metrics;
pub mod readiness;
pub mod runtime;
pub mod runtime_dir;
pub mod server;
pub mod services;
pub mod supervisor;

pub use config::Config;
pub use runtime::Daemon;
