//! What Tollgate's guest modules share, and what an operator's module may use too: a global
//! allocator suited to a decision's short-lived allocations ([`SizeClasses`]) and a view of the
//! packed `argv` record of `wit/policy.wit` ([`Args`]).
//!
//! The WIT types themselves are generated inside each module (`wit_bindgen::generate!`), so this
//! crate works on their fields rather than on the types.

mod alloc;
mod args;

pub use alloc::SizeClasses;
pub use args::{Args, KeyUse};
