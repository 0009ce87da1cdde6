//! One component compiled once, and a pool of ready instances of it so that a decision costs a
//! call, not an instantiation. An instance that faults (trap, deadline, memory cap) is dropped and
//! the next call gets a fresh one: the fault never reaches another caller.

use std::sync::Arc;

use parking_lot::Mutex;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Store, Trap};

use super::bindings::{catalog, guard};
use super::engine::{Budget, Sandbox, Scaling};
use crate::config::SandboxLimits;
use crate::decision::DenyCause;

/// Idle instances kept per module; more are created under load and dropped on return.
const MAX_IDLE: usize = 64;

/// What each instance's store holds: the module's config bytes and its memory accounting.
pub struct HostState {
    config: Arc<[u8]>,
    /// The current call's cap (its budget's memory).
    memory_cap: usize,
    hit_memory_cap: bool,
    /// The largest the instance's memory has grown to (what `module bench` reports; an instance
    /// grown past what its module may hold idle is not kept).
    grown_to: usize,
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
        let fits = desired <= self.memory_cap;
        self.hit_memory_cap |= !fits;
        if fits {
            self.grown_to = self.grown_to.max(desired);
        }
        Ok(fits)
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
    /// A first call made as the instance is created, so that what the module reads once per
    /// instance (the YAML guard's compiled policy) is read under the load budget, not in the
    /// first decision's.
    fn warm(_bindings: &Self::Bindings, _store: &mut Store<HostState>) -> wasmtime::Result<()> {
        Ok(())
    }
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

    /// `PING` from a caller of no principal: its verdict does not matter.
    fn warm(bindings: &Self::Bindings, store: &mut Store<HostState>) -> wasmtime::Result<()> {
        use super::bindings::{Argv, Caller, Categories, Command, CommandFlags, Lane};
        let who = Caller {
            principal: String::new(),
            uid: 0,
            gid: 0,
            pid: 0,
        };
        let ping = Command {
            lane: Lane::Regular,
            categories: Categories::empty(),
            traits: CommandFlags::empty(),
            argv: Argv {
                bytes: b"PING".to_vec(),
                spans: vec![4, 4, 0],
            },
        };
        bindings
            .tollgate_policy_guard()
            .call_admit(store, &who, &ping)
            .map(drop)
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
    scaling: Scaling,
    pre: K::Pre,
    config: Arc<[u8]>,
    idle: Mutex<Vec<Ready<K::Bindings>>>,
}

impl<K: Kind> Module<K> {
    /// Compiles `bytes` (a component) and links it; instances are created on first use, and
    /// every call runs under `limits`, scaled to the command as `scaling` says.
    pub fn compile(
        sandbox: Arc<Sandbox>,
        name: impl Into<String>,
        bytes: &[u8],
        config: Arc<[u8]>,
        limits: SandboxLimits,
        scaling: Scaling,
    ) -> wasmtime::Result<Module<K>> {
        let component = super::artifacts::compile(&sandbox.engine, bytes)?;
        let pre = K::prepare(&sandbox, &component)?;
        Ok(Module {
            name: name.into(),
            sandbox,
            limits,
            scaling,
            pre,
            config,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The budget of one call of this module.
    pub fn budget(&self) -> Budget {
        Budget::of(&self.limits)
    }

    /// The budget of creating an instance (and its first call, see [`Kind::warm`]).
    fn loading(&self) -> Budget {
        self.budget().loading(self.scaling, self.config.len())
    }

    /// The budget of one call of this module on `args` arguments of `bytes` bytes.
    pub fn budget_for(&self, args: usize, bytes: usize) -> Budget {
        self.budget().scaled(self.scaling, args, bytes)
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
        // Beyond the call's own cap, what the instance was allowed for its config at creation.
        let loaded = self.loading().memory.saturating_sub(self.budget().memory);
        ready.store.data_mut().memory_cap = budget.memory.saturating_add(loaded);
        let answer = f(&ready.bindings, &mut ready.store);
        let fuel = budget
            .fuel
            .saturating_sub(ready.store.get_fuel().unwrap_or(0));
        let memory = ready.store.data().grown_to;
        let answer = match answer {
            Ok(answer) => {
                // An instance a large command grew past what its module may hold idle is not kept:
                // memory never shrinks, and idle instances hold what they grew to.
                if ready.store.data().grown_to <= self.loading().memory {
                    let mut idle = self.idle.lock();
                    if idle.len() < MAX_IDLE {
                        idle.push(ready);
                    }
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
            grown_to: 0,
        };
        let mut store = Store::new(&self.sandbox.engine, state);
        store.limiter(|state| state);
        store.epoch_deadline_trap();
        let budget = self.loading();
        self.sandbox.arm(&mut store, budget);
        store.data_mut().memory_cap = budget.memory;
        let ready = K::instantiate(&self.pre, &mut store).and_then(|bindings| {
            if self.scaling == Scaling::WithArguments {
                K::warm(&bindings, &mut store)?;
            }
            Ok(bindings)
        });
        match ready {
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
