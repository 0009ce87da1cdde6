//! The one wasmtime `Engine` of the process and how a call is bounded: by fuel (the guest's own
//! work, whatever the machine's load) and by an epoch deadline as the wall-clock backstop (a
//! ticker thread advances the epoch ten times per shortest deadline while calls are being made,
//! and sleeps when none are); plus a memory cap per instance. The pooling allocator is used
//! where the machine grants its address-space reservation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::config::SandboxLimits;

/// A deadline is cut into this many ticks of the epoch, so a call overruns it by at most a tenth.
/// Finer ticks cost wake-ups: at one per millisecond, the ticker thread was 3% of the daemon's CPU
/// under load, on the cores Redis and the clients share.
const TICKS_PER_DEADLINE: u32 = 10;
/// The finest tick, whatever the deadline.
const MIN_TICK: Duration = Duration::from_millis(1);
/// With no call for this long (and at least two deadlines), the ticker sleeps until the next call.
const IDLE_AFTER: Duration = Duration::from_millis(100);
/// Instances the pooling allocator reserves room for, across all modules and generations.
const POOLED_INSTANCES: u32 = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Allocator {
    Pooling,
    OnDemand,
}

/// What one call may spend: guest work, wall time until the epoch backstop interrupts it, and the
/// linear memory its instance may grow to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub fuel: u64,
    pub deadline: Duration,
    pub memory: usize,
}

/// What a built-in module's call may spend per argument of the command, beyond its budget: the
/// built-in catalog and YAML guard do work linear in the arguments (a catalog describe spends
/// about 150 fuel per key of an MGET, a YAML guard decision about 60 plus its key globs'), so the
/// largest command the front door takes (`resp.max_arguments`) is judged, not refused for its size.
/// Four times what was measured, for key globs and slower machines.
const FUEL_PER_ARG: u64 = 2_000;
/// Wall time per argument: lowering and lifting the arguments, the guest's work, a loaded machine.
const DEADLINE_PER_ARG: Duration = Duration::from_micros(5);
/// Memory per argument (its place in the spans, the key positions answered, their growth) and per
/// byte of arguments (copied into the guest, and once more while an answer is lowered).
const MEMORY_PER_ARG: usize = 96;
const MEMORY_PER_BYTE: usize = 2;

/// How a module's budget meets the size of the command it is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scaling {
    /// An operator's module: its budget per call, whatever the command. A module whose work grows
    /// faster than the arguments, or that loops, is cut off there.
    Fixed,
    /// The built-in catalog and YAML guard, whose work is linear in the arguments (tested at
    /// `resp.max_arguments`): their budget plus a share per argument and per byte.
    WithArguments,
}

impl Budget {
    pub fn of(limits: &SandboxLimits) -> Budget {
        Budget {
            fuel: limits.fuel,
            deadline: limits.deadline,
            memory: limits.memory_bytes(),
        }
    }

    /// This budget for a call on `args` arguments of `bytes` bytes in all, under `scaling`.
    pub fn scaled(self, scaling: Scaling, args: usize, bytes: usize) -> Budget {
        match scaling {
            Scaling::Fixed => self,
            Scaling::WithArguments => self.plus(
                FUEL_PER_ARG.saturating_mul(args as u64),
                DEADLINE_PER_ARG.saturating_mul(wire(args)),
                MEMORY_PER_ARG
                    .saturating_mul(args)
                    .saturating_add(MEMORY_PER_BYTE.saturating_mul(bytes)),
            ),
        }
    }
}

/// What a built-in module may spend per byte of its config as an instance is created: the YAML
/// guard parses its compiled policy then (about 40 fuel per byte of JSON was measured), once per
/// instance, so that no decision pays for it however large the policy (up to
/// `policy.max_file_bytes`).
const LOAD_FUEL_PER_BYTE: u64 = 200;
const LOAD_DEADLINE_PER_BYTE: Duration = Duration::from_nanos(500);
/// The parsed policy beside its bytes.
const LOAD_MEMORY_PER_BYTE: usize = 8;

impl Budget {
    /// This budget with `fuel`, `deadline` and `memory` more (each saturating).
    fn plus(self, fuel: u64, deadline: Duration, memory: usize) -> Budget {
        Budget {
            fuel: self.fuel.saturating_add(fuel),
            deadline: self.deadline.saturating_add(deadline),
            memory: self.memory.saturating_add(memory),
        }
    }

    /// This budget for creating an instance whose config is `config` bytes long, under `scaling`.
    pub fn loading(self, scaling: Scaling, config: usize) -> Budget {
        match scaling {
            Scaling::Fixed => self,
            Scaling::WithArguments => self.plus(
                LOAD_FUEL_PER_BYTE.saturating_mul(config as u64),
                LOAD_DEADLINE_PER_BYTE.saturating_mul(wire(config)),
                LOAD_MEMORY_PER_BYTE.saturating_mul(config),
            ),
        }
    }
}

fn wire(args: usize) -> u32 {
    u32::try_from(args).unwrap_or(u32::MAX)
}

/// One budget shared out among several calls, as they are made: each gets an even share of the
/// fuel left and the wall time left, and what a call does not spend stays for the others. However
/// the calls behave, together they spend at most the one budget.
pub struct Shared {
    fuel: u64,
    until: Instant,
    /// Each call's cap: memory is not spent, an instance holds it.
    memory: usize,
    calls_left: usize,
}

impl Shared {
    pub fn new(budget: Budget, calls: usize) -> Shared {
        Shared {
            fuel: budget.fuel,
            until: Instant::now() + budget.deadline,
            memory: budget.memory,
            calls_left: calls.max(1),
        }
    }

    /// The next call's share, or `None` once the fuel or the time is spent: that call is not
    /// worth making.
    pub fn next(&self) -> Option<Budget> {
        let share = Budget {
            fuel: self.fuel / self.calls_left as u64,
            deadline: self.until.saturating_duration_since(Instant::now()),
            memory: self.memory,
        };
        (share.fuel > 0 && !share.deadline.is_zero()).then_some(share)
    }

    /// The call given [`Shared::next`] spent `fuel`.
    pub fn spent(&mut self, fuel: u64) {
        self.fuel = self.fuel.saturating_sub(fuel);
        self.calls_left = self.calls_left.saturating_sub(1).max(1);
    }
}

/// The engine, its ticker, and how stores are armed for a call.
pub struct Sandbox {
    pub engine: Engine,
    pub allocator: Allocator,
    tick: Duration,
    /// Always running; taken only to stop it.
    ticker: Option<Ticker>,
}

impl Sandbox {
    /// An engine for calls under any of `limits` (the common limits and each module's): the
    /// epoch ticks for the shortest deadline. The pool's memories may grow as far as wasm32 lets
    /// them (its default): each call's cap is the store's limiter's, which a built-in module's
    /// call on a large command raises ([`Scaling::WithArguments`]).
    pub fn new(
        limits: impl IntoIterator<Item = SandboxLimits>,
    ) -> Result<Sandbox, wasmtime::Error> {
        let limits: Vec<SandboxLimits> = limits.into_iter().collect();
        let deadlines = limits.iter().map(|l| l.deadline);
        let default = SandboxLimits::default().deadline;
        let shortest = deadlines.clone().min().unwrap_or(default);
        let longest = deadlines.max().unwrap_or(default);
        let (engine, allocator) = match Engine::new(&config(true)) {
            Ok(engine) => (engine, Allocator::Pooling),
            Err(error) => {
                tracing::info!(%error, "pooling allocator unavailable; instances are allocated on demand");
                (Engine::new(&config(false))?, Allocator::OnDemand)
            }
        };
        let tick = tick_for(shortest);
        let ticker = Ticker::start(engine.clone(), tick, longest);
        Ok(Sandbox {
            engine,
            allocator,
            tick,
            ticker: Some(ticker),
        })
    }

    /// Arms a store for one call under `budget`.
    pub fn arm<T>(&self, store: &mut wasmtime::Store<T>, budget: Budget) {
        if let Some(ticker) = &self.ticker {
            ticker.calling();
        }
        // +1: the current tick may be about to end.
        let ticks = budget.deadline.as_micros().div_ceil(self.tick.as_micros()) as u64 + 1;
        store.set_epoch_deadline(ticks);
        store
            .set_fuel(budget.fuel)
            .expect("every engine consumes fuel");
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(ticker) = self.ticker.take() {
            ticker.stop();
        }
    }
}

fn config(pooling: bool) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.consume_fuel(true);
    config.epoch_interruption(true);
    if pooling {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(POOLED_INSTANCES)
            .total_core_instances(POOLED_INSTANCES * 4)
            .total_memories(POOLED_INSTANCES * 2)
            .total_tables(POOLED_INSTANCES * 4);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

/// How often the epoch advances for calls bounded by `deadline` (the shortest of them).
fn tick_for(deadline: Duration) -> Duration {
    (deadline / TICKS_PER_DEADLINE).max(MIN_TICK)
}

/// Advances the engine's epoch every [`tick_for`] the deadline until stopped, and sleeps while
/// no call is made, so an idle daemon does not wake at all for it.
struct Ticker {
    shared: Arc<TickerState>,
    thread: JoinHandle<()>,
}

struct TickerState {
    stop: AtomicBool,
    /// A call was armed since the ticker last looked.
    busy: AtomicBool,
    /// The ticker sleeps until a call unparks it.
    idle: AtomicBool,
}

impl TickerState {
    fn new() -> TickerState {
        TickerState {
            stop: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            idle: AtomicBool::new(false),
        }
    }

    /// Waits one whole `tick`, or until stopped: `false` once stopped. Parked rather than asleep,
    /// so that [`Ticker::stop`] wakes it at once: a sleep held whoever dropped the sandbox (the
    /// daemon stopping, a `tollgate policy` command ending, every test that loads a policy) for up
    /// to a tick, a tenth of the longest deadline (a 60-second deadline made each drop wait six
    /// seconds). An early wake (an unpark
    /// meant for the idle park, or a spurious one) waits out the rest: a tick is never short, so
    /// no call is cut off before its deadline.
    fn wait_one(&self, tick: Duration) -> bool {
        let until = Instant::now() + tick;
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return false;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            std::thread::park_timeout(left);
        }
    }
}

impl Ticker {
    /// Ticks every `tick`; `longest` is the longest deadline a call may be armed with.
    fn start(engine: Engine, tick: Duration, longest: Duration) -> Ticker {
        let shared = Arc::new(TickerState::new());
        let state = shared.clone();
        // A call armed before a look at `busy` has run past its deadline by the next look: the
        // ticker keeps ticking at least that long after the last call.
        let window = IDLE_AFTER.max(longest * 2);
        let ticks_per_look = (window.as_micros() / tick.as_micros()).max(1) as u64;
        let thread = std::thread::Builder::new()
            .name("tollgate-epoch".into())
            .spawn(move || {
                let mut ticks = 0u64;
                while state.wait_one(tick) {
                    engine.increment_epoch();
                    ticks += 1;
                    if ticks.is_multiple_of(ticks_per_look)
                        && !state.busy.swap(false, Ordering::SeqCst)
                    {
                        state.idle.store(true, Ordering::SeqCst);
                        // A call between the swap and `idle` set `busy` without unparking.
                        if !state.busy.load(Ordering::SeqCst) && !state.stop.load(Ordering::SeqCst)
                        {
                            std::thread::park();
                        }
                        state.idle.store(false, Ordering::SeqCst);
                    }
                }
            })
            .expect("the epoch ticker thread starts");
        Ticker { shared, thread }
    }

    /// Called as a call is armed: marks the ticker busy, waking it if it sleeps. After the first
    /// call of a window this is one load of a flag that stays set.
    fn calling(&self) {
        let state = &self.shared;
        if !state.busy.load(Ordering::SeqCst) {
            state.busy.store(true, Ordering::SeqCst);
            if state.idle.load(Ordering::SeqCst) {
                self.thread.thread().unpark();
            }
        }
    }

    #[cfg(test)]
    fn is_idle(&self) -> bool {
        self.shared.idle.load(Ordering::SeqCst)
    }

    fn stop(self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Budget = Budget {
        fuel: 64_000,
        deadline: Duration::from_secs(60),
        memory: 1 << 20,
    };

    #[test]
    fn only_a_built_in_modules_budget_grows_with_the_command() {
        let fixed = BUDGET.scaled(Scaling::Fixed, 1_000_000, 16 << 20);
        assert_eq!(fixed, BUDGET);
        let small = BUDGET.scaled(Scaling::WithArguments, 2, 10);
        let large = BUDGET.scaled(Scaling::WithArguments, 1_000_000, 16 << 20);
        assert!(small.fuel < BUDGET.fuel + 10_000 && small.memory < BUDGET.memory + 1_000);
        assert_eq!(large.fuel, BUDGET.fuel + 1_000_000 * FUEL_PER_ARG);
        assert_eq!(large.deadline, BUDGET.deadline + Duration::from_secs(5));
        assert_eq!(
            large.memory,
            BUDGET.memory + 1_000_000 * MEMORY_PER_ARG + 2 * (16 << 20)
        );
    }

    #[test]
    fn calls_that_spend_their_whole_share_spend_one_budget_together() {
        let mut shared = Shared::new(BUDGET, 64);
        let mut spent = 0;
        for _ in 0..64 {
            let share = shared.next().expect("every call gets a share").fuel;
            shared.spent(share);
            spent += share;
        }
        assert!(spent <= BUDGET.fuel, "{spent} spent of {}", BUDGET.fuel);
    }

    #[test]
    fn what_a_call_does_not_spend_stays_for_the_calls_after_it() {
        let mut shared = Shared::new(BUDGET, 4);
        let fuel = |shared: &Shared| shared.next().map(|share| share.fuel);
        assert_eq!(fuel(&shared), Some(16_000));
        shared.spent(1_000);
        assert_eq!(fuel(&shared), Some(21_000), "63 000 left for three calls");
        shared.spent(21_000);
        shared.spent(0);
        assert_eq!(fuel(&shared), Some(42_000), "the last call gets all left");
        shared.spent(42_000);
        assert_eq!(fuel(&shared), None, "nothing is left for another call");
    }

    #[test]
    fn no_call_is_worth_making_once_the_time_is_spent() {
        let budget = Budget {
            deadline: Duration::ZERO,
            ..BUDGET
        };
        assert_eq!(Shared::new(budget, 2).next(), None);
    }

    #[test]
    fn a_ticker_stops_at_once_whatever_its_tick() {
        // A tick of an hour: waiting one out before stopping would hold the test that long.
        let engine = Engine::new(&config(false)).unwrap();
        let ticker = Ticker::start(engine, Duration::from_secs(3600), IDLE_AFTER);
        let (stopped, told) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            ticker.stop();
            let _ = stopped.send(());
        });
        told.recv_timeout(Duration::from_secs(30))
            .expect("stopping waited for the tick to end");
    }

    #[test]
    fn a_stray_wake_does_not_cut_a_tick_short() {
        let state = Arc::new(TickerState::new());
        let tick = Duration::from_millis(200);
        let waiting = state.clone();
        let waiter = std::thread::spawn(move || {
            let started = Instant::now();
            (waiting.wait_one(tick), started.elapsed())
        });
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(10));
            waiter.thread().unpark();
        }
        let (ticked, waited) = waiter.join().unwrap();
        assert!(ticked, "not stopped, so the tick ends");
        assert!(waited >= tick, "a tick of {tick:?} ended after {waited:?}");
    }

    #[test]
    fn the_ticker_sleeps_without_calls_and_wakes_for_the_next() {
        let limits = SandboxLimits {
            deadline: Duration::from_millis(5),
            ..SandboxLimits::default()
        };
        let sandbox = Sandbox::new([limits.clone()]).unwrap();
        let ticker = sandbox.ticker.as_ref().expect("a sandbox has a ticker");
        let waited = std::time::Instant::now();
        while !ticker.is_idle() {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "never went idle"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut store = wasmtime::Store::new(&sandbox.engine, ());
        sandbox.arm(&mut store, Budget::of(&limits));
        let waited = std::time::Instant::now();
        while ticker.is_idle() {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "a call did not wake it"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
