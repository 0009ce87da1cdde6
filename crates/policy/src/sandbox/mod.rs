//! The wasmtime host: the engine and call budget ([`engine`]), compiled modules with pools of
//! ready instances ([`module`]), the code of modules compiled before ([`artifacts`]), how
//! arguments cross into guests ([`packing`]), and the typed catalog and guard calls built on them.

mod artifacts;
pub mod bindings;
mod calls;
mod engine;
mod module;
mod packing;

pub use calls::{fits_arity, Catalog, Guard};
pub use engine::{Allocator, Sandbox, Scaling, Shared};
pub use module::{Called, Fault};
pub use packing::Lowered;
