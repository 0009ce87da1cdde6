//! Helpers for the integration tests: the daemon in-process on temporary sockets, and the real binary.

pub mod daemon;
pub mod raw;
