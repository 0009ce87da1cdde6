//! The fuzz suite: seeded property tests over everything the daemon parses from outside — RESP
//! commands, Redis replies, HTTP request bodies, YAML policies and the config file. Inputs are
//! valid documents with mutations as well as random bytes, so the edges of each format are
//! reached, not only its first byte.
//!
//! Each target runs a bounded number of cases with a fixed seed in `cargo test`; set
//! `TOLLGATE_FUZZ_CASES` (cases per target) and `TOLLGATE_FUZZ_SEED` for a longer or different run
//! (README, "Fuzzing").

mod bodies;
mod commands;
mod config;
mod mutate;
mod policy;
mod replies;
mod support;
