//! One component compiled once, and a pool of ready instances of it so that a decision costs a
//! call, not an instantiation. An instance that faults (trap, deadline, memory cap) is dropped and
//! the next call gets a fresh one: the fault never reaches another caller.

use std::sync::Arc;

use parking_lot::Mutex;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Store, Trap};

use super::bindings::{catalog, guard};
use super::engine::Sandbox;
use crate::decision::DenyCause;

/// Idle instances kept per module; more are created under load and dropped on return.
const MAX_IDLE: usize = 64;

/// What each instance's store holds: the module's config bytes and its memory accounting.
pub struct HostState {
    config: Arc<[u8]>,
    memory_cap: usize,
    hit_memory_cap: bool,
}

impl wasmtime::ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Refusing (rather than trapping here) lets the guest's allocator fail as it would on any
        // machine; the flag tells the host why the trap that follows happened.
        self.hit_memory_cap |= desired > self.memory_cap;
        Ok(desired <= self.memory_cap)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// The `types` interface has no functions; the guard world still imports it.
impl catalog::tollgate::policy::types::Host for HostState {}

impl guard::tollgate::policy::config::Host for HostState {
    fn get(&mut self) -> Vec<u8> {
        self.config.to_vec()
    }
}

/// Why a call produced no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub cause: DenyCause,
    pub detail: String,
}

impl Fault {
    pub fn malformed(detail: impl Into<String>) -> Fault {
        Fault {
            cause: DenyCause::Malformed,
            detail: detail.into(),
        }
    }
}

/// The two worlds a module can implement.
pub trait Kind {
    type Pre;
    type Bindings;
    fn prepare(sandbox: &Sandbox, component: &Component) -> wasmtime::Result<Self::Pre>;
    fn instantiate(
        pre: &Self::Pre,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<Self::Bindings>;
}

pub struct CatalogKind;

impl Kind for CatalogKind {
    type Pre = catalog::CatalogModulePre<HostState>;
    type Bindings = catalog::CatalogModule;

    fn prepare(sandbox: &Sandbox, component: &Component) -> wasmtime::Result<Self::Pre> {
        let linker = Linker::new(&sandbox.engine);
        catalog::CatalogModulePre::new(linker.instantiate_pre(component)?)
    }

    fn instantiate(
        pre: &Self::Pre,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<Self::Bindings> {
        pre.instantiate(store)
    }
}

pub struct GuardKind;

impl Kind for GuardKind {
    type Pre = guard::GuardModulePre<HostState>;
    type Bindings = guard::GuardModule;

    fn prepare(sandbox: &Sandbox, component: &Component) -> wasmtime::Result<Self::Pre> {
        let mut linker = Linker::new(&sandbox.engine);
        guard::GuardModule::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)?;
        guard::GuardModulePre::new(linker.instantiate_pre(component)?)
    }

    fn instantiate(
        pre: &Self::Pre,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<Self::Bindings> {
        pre.instantiate(store)
    }
}

struct Ready<B> {
    store: Store<HostState>,
    bindings: B,
}

/// A compiled component with its pool of instances.
pub struct Module<K: Kind> {
    pub name: String,
    sandbox: Arc<Sandbox>,
    pre: K::Pre,
    config: Arc<[u8]>,
    idle: Mutex<Vec<Ready<K::Bindings>>>,
}

impl<K: Kind> Module<K> {
    /// Compiles `bytes` (a component) and links it; instances are created on first use.
    pub fn compile(
        sandbox: Arc<Sandbox>,
        name: impl Into<String>,
        bytes: &[u8],
        config: Arc<[u8]>,
    ) -> wasmtime::Result<Module<K>> {
        let component = Component::new(&sandbox.engine, bytes)?;
        let pre = K::prepare(&sandbox, &component)?;
        Ok(Module {
            name: name.into(),
            sandbox,
            pre,
            config,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Runs `f` on a ready instance under the call budget. On any error the instance is dropped.
    pub fn call<R>(
        &self,
        f: impl FnOnce(&K::Bindings, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, Fault> {
        let mut ready = match self.idle.lock().pop() {
            Some(ready) => ready,
            None => self.instantiate()?,
        };
        self.sandbox.arm(&mut ready.store);
        match f(&ready.bindings, &mut ready.store) {
            Ok(answer) => {
                let mut idle = self.idle.lock();
                if idle.len() < MAX_IDLE {
                    idle.push(ready);
                }
                Ok(answer)
            }
            Err(error) => Err(classify(&error, ready.store.data())),
        }
    }

    fn instantiate(&self) -> Result<Ready<K::Bindings>, Fault> {
        let state = HostState {
            config: self.config.clone(),
            memory_cap: self.sandbox.limits.memory_bytes(),
            hit_memory_cap: false,
        };
        let mut store = Store::new(&self.sandbox.engine, state);
        store.limiter(|state| state);
        store.epoch_deadline_trap();
        self.sandbox.arm(&mut store);
        match K::instantiate(&self.pre, &mut store) {
            Ok(bindings) => Ok(Ready { store, bindings }),
            Err(error) => {
                let mut fault = classify(&error, store.data());
                fault.detail = format!("cannot instantiate: {}", fault.detail);
                Err(fault)
            }
        }
    }
}

fn classify(error: &wasmtime::Error, state: &HostState) -> Fault {
    let cause = match error.downcast_ref::<Trap>() {
        _ if state.hit_memory_cap => DenyCause::OutOfMemory,
        Some(Trap::OutOfFuel | Trap::Interrupt) => DenyCause::Deadline,
        _ => DenyCause::Trap,
    };
    Fault {
        cause,
        detail: format!("{error:#}"),
    }
}
