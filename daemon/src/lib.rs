//! Tollgate: a local daemon between applications and Redis. This library is the whole daemon; the
//! `tollgate` binary only parses the command line and calls [`cli::main`].
//!
//! # Layout
//!
//! `ARCHITECTURE.md` at the repository's root follows a command and a lease call file by file;
//! `docs/design.md` holds the rules the code relies on. In this crate:
//!
//! - [`runtime`] starts every part in order and stops them in reverse; [`services`] is what it
//!   lends both listeners (lanes, lease service, admission, identities, lane users).
//! - [`server`] holds the listeners: `server::resp` (the Redis protocol: one session per
//!   connection, split into classify, plan, schedule and I/O) and `server::http` (hyper: health,
//!   lanes, policy, leases), and what both share (peer credentials, identity, connection limits,
//!   socket files).
//! - [`reload`] is the one policy reload (SIGHUP, `systemctl reload`, HTTP); [`systemd`] takes
//!   the sockets systemd passes and tells it when the daemon is ready, reloading or stopping.
//! - [`lane_acl`] keeps the lanes' Redis ACL users cut to the active policy.
//! - [`tracking`] is `CLIENT TRACKING` for the daemon's own clients: the pure core (Redis 7.0's
//!   semantics, unit-tested), not yet wired into the sessions (issue 29).
//! - [`embedded`] and [`supervisor`] run the private redis-server of the embedded default;
//!   [`runtime_dir`] checks the files it and the sockets live in; [`readiness`] answers `/readyz`.
//! - [`config`] reads the YAML configuration (errors at file:line:column); [`logging`] and
//!   [`metrics`] are what the daemon reports.
//! - [`cli`] is the `tollgate` command: `serve`, `policy …`, `lease …`, `redis-acl`,
//!   `check-config`.
//!
//! The other crates: `tollgate-model` (shared vocabulary), `tollgate-resp` (RESP bytes),
//! `tollgate-policy` and `tollgate-policy-rules` (admission in the WASM sandbox), `tollgate-lanes`
//! (the only way to Redis), `tollgate-lease-api`, `tollgate-lease` and `tollgate-lease-client`
//! (leases: the wire types, the service, a client).

pub mod cli;
pub mod config;
pub mod embedded;
pub mod lane_acl;
pub mod logging;
pub mod metrics;
pub mod principal_gauges;
pub mod quotas;
pub mod readiness;
pub mod reload;
pub mod runtime;
pub mod runtime_dir;
pub mod scope_users;
pub mod server;
pub mod services;
pub mod supervisor;
pub mod systemd;
pub mod tracking;

pub use config::Config;
pub use runtime::Daemon;
