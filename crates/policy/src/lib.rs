//! Admission: catalogs classify a command, guards judge it, all inside the wasmtime sandbox.

mod config;

pub use config::PolicyConfig;
