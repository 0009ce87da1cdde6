//! The wasmtime host: the engine and call budget ([`engine`]), compiled modules with pools of
//! ready instances ([`module`]), and the typed catalog and guard calls built on them.

pub mod bindings;
mod calls;
mod engine;
mod module;

pub use calls::{Catalog, Guard, ARG_PREFIX};
pub use engine::{Allocator, Sandbox};
pub use module::Fault;
