//! The only `bindgen!` of the host: Rust types for `wit/policy.wit`. The guard world reuses the
//! catalog world's `types`, so a descriptor the catalog returns goes to the guards as it is.

pub mod catalog {
    wasmtime::component::bindgen!({
        world: "catalog-module",
        path: "../../wit",
    });
}

pub mod guard {
    wasmtime::component::bindgen!({
        world: "guard-module",
        path: "../../wit",
        with: {
            "tollgate:policy/types": super::catalog::tollgate::policy::types,
        },
    });
}

pub use catalog::tollgate::policy::types::{
    Access, Argv, Batch, Batched, Caller, Categories, Command, CommandFlags, Descriptor, KeyAccess,
    Lane, Verdict,
};
