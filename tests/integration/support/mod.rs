//! Helpers for the integration tests: the daemon in-process on temporary sockets, and the real binary.

pub mod command_docs;
pub mod daemon;
pub mod raw;
