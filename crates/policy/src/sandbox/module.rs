//! One component compiled once, and a pool of ready instances of it so that a decision costs a
//! call, not an instantiation. An instance that faults (trap, deadline, memory cap) is dropped and
//! the next call gets a fresh one: the fault never reaches another caller.

use std::sync::Arc;

use parking_lot::Mutex;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Store, Trap};

use super::bindings::{catalog, guard};
use super::engine::{Budget, Sandbox};
use crate::config::SandboxLimits;
use crate::decision::DenyCause;

/// Idle instances kept per module; more are created under load and dropped on return.
const MAX_IDLE: usize = 64;

/// What each instance's store holds: the module's config bytes and its memory accounting.
pub struct HostState {
    config: Arc<[u8]>,
    memory_cap: usize,
    hit_memory_cap: bool,
    /// The most linear memory the instance has been granted (what `module bench` reports).
    memory_peak: usize,
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
        if desired <= self.memory_cap {
            self.memory_peak = self.memory_peak.max(desired);
        }
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

/// A call's answer and the fuel it spent getting it (all of its budget's when it ran out).
pub struct Called<R> {
    pub answer: Result<R, Fault>,
    pub fuel: u64,
    /// The linear memory of the instance that answered (0 when none could be made).
    pub memory: usize,
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
    limits: SandboxLimits,
    pre: K::Pre,
    config: Arc<[u8]>,
    idle: Mutex<Vec<Ready<K::Bindings>>>,
}

impl<K: Kind> Module<K> {
    /// Compiles `bytes` (a component) and links it; instances are created on first use, and
    /// every call runs under `limits`.
    pub fn compile(
        sandbox: Arc<Sandbox>,
        name: impl Into<String>,
        bytes: &[u8],
        config: Arc<[u8]>,
        limits: SandboxLimits,
    ) -> wasmtime::Result<Module<K>> {
        let component = Component::new(&sandbox.engine, bytes)?;
        let pre = K::prepare(&sandbox, &component)?;
        Ok(Module {
            name: name.into(),
            sandbox,
            limits,
            pre,
            config,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The budget of one call of this module.
    pub fn budget(&self) -> Budget {
        Budget::of(&self.limits)
    }

    /// Runs `f` on a ready instance under the module's budget.
    pub fn call<R>(
        &self,
        f: impl FnOnce(&K::Bindings, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, Fault> {
        self.call_within(self.budget(), f).answer
    }

    /// Runs `f` on a ready instance under `budget`. On any error the instance is dropped.
    pub fn call_within<R>(
        &self,
        budget: Budget,
        f: impl FnOnce(&K::Bindings, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Called<R> {
        let ready = match self.idle.lock().pop() {
            Some(ready) => Ok(ready),
            None => self.instantiate(),
        };
        let mut ready = match ready {
            Ok(ready) => ready,
            Err(fault) => {
                return Called {
                    answer: Err(fault),
                    fuel: 0,
                    memory: 0,
                }
            }
        };
        self.sandbox.arm(&mut ready.store, budget);
        let answer = f(&ready.bindings, &mut ready.store);
        let fuel = budget
            .fuel
            .saturating_sub(ready.store.get_fuel().unwrap_or(0));
        let memory = ready.store.data().memory_peak;
        let answer = match answer {
            Ok(answer) => {
                let mut idle = self.idle.lock();
                if idle.len() < MAX_IDLE {
                    idle.push(ready);
                }
                Ok(answer)
            }
            Err(error) => Err(classify(&error, ready.store.data())),
        };
        Called {
            answer,
            fuel,
            memory,
        }
    }

    fn instantiate(&self) -> Result<Ready<K::Bindings>, Fault> {
        let state = HostState {
            config: self.config.clone(),
            memory_cap: self.limits.memory_bytes(),
            hit_memory_cap: false,
            memory_peak: 0,
        };
        let mut store = Store::new(&self.sandbox.engine, state);
        store.limiter(|state| state);
        store.epoch_deadline_trap();
        self.sandbox.arm(&mut store, self.budget());
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
