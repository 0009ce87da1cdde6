//! The one wasmtime `Engine` of the process and how a call is bounded: an epoch deadline (a
//! ticker thread advances the epoch ten times per deadline while calls are being made, and sleeps
//! when none are) or, in tests, fuel; plus a memory cap per instance. The pooling allocator is used
//! where the machine grants its address-space reservation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::config::{Budget, SandboxLimits};

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

/// The engine, its ticker, and the per-call budget every store is armed with.
pub struct Sandbox {
    pub engine: Engine,
    pub allocator: Allocator,
    pub limits: SandboxLimits,
    ticker: Option<Ticker>,
}

impl Sandbox {
    pub fn new(limits: &SandboxLimits) -> Result<Sandbox, wasmtime::Error> {
        let (engine, allocator) = match Engine::new(&config(limits, true)) {
            Ok(engine) => (engine, Allocator::Pooling),
            Err(error) => {
                tracing::info!(%error, "pooling allocator unavailable; instances are allocated on demand");
                (Engine::new(&config(limits, false))?, Allocator::OnDemand)
            }
        };
        let ticker = match limits.budget() {
            Budget::Deadline(deadline) => Some(Ticker::start(engine.clone(), deadline)),
            Budget::Fuel(_) => None,
        };
        Ok(Sandbox {
            engine,
            allocator,
            limits: limits.clone(),
            ticker,
        })
    }

    /// Arms a store for one call.
    pub fn arm<T>(&self, store: &mut wasmtime::Store<T>) {
        if let Some(ticker) = &self.ticker {
            ticker.calling();
        }
        match self.limits.budget() {
            Budget::Deadline(deadline) => {
                let tick = tick_for(deadline);
                // +1: the current tick may be about to end.
                let ticks = deadline.as_micros().div_ceil(tick.as_micros()) as u64 + 1;
                store.set_epoch_deadline(ticks);
            }
            Budget::Fuel(fuel) => store
                .set_fuel(fuel)
                .expect("fuel is enabled whenever the budget is fuel"),
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(ticker) = self.ticker.take() {
            ticker.stop();
        }
    }
}

fn config(limits: &SandboxLimits, pooling: bool) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    match limits.budget() {
        Budget::Deadline(_) => config.epoch_interruption(true),
        Budget::Fuel(_) => config.consume_fuel(true),
    };
    if pooling {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(POOLED_INSTANCES)
            .total_core_instances(POOLED_INSTANCES * 4)
            .total_memories(POOLED_INSTANCES * 2)
            .total_tables(POOLED_INSTANCES * 4)
            .max_memory_size(limits.memory_bytes());
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

/// How often the epoch advances for calls bounded by `deadline`.
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

impl Ticker {
    fn start(engine: Engine, deadline: Duration) -> Ticker {
        let shared = Arc::new(TickerState {
            stop: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            idle: AtomicBool::new(false),
        });
        let state = shared.clone();
        // A call armed before a look at `busy` has run past its deadline by the next look: the
        // ticker keeps ticking at least that long after the last call.
        let tick = tick_for(deadline);
        let window = IDLE_AFTER.max(deadline * 2);
        let ticks_per_look = (window.as_micros() / tick.as_micros()).max(1) as u64;
        let thread = std::thread::Builder::new()
            .name("tollgate-epoch".into())
            .spawn(move || {
                let mut ticks = 0u64;
                while !state.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(tick);
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

    #[test]
    fn the_ticker_sleeps_without_calls_and_wakes_for_the_next() {
        let limits = SandboxLimits {
            deadline: Duration::from_millis(5),
            ..SandboxLimits::default()
        };
        let sandbox = Sandbox::new(&limits).unwrap();
        let ticker = sandbox
            .ticker
            .as_ref()
            .expect("a deadline budget has a ticker");
        let waited = std::time::Instant::now();
        while !ticker.is_idle() {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "never went idle"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut store = wasmtime::Store::new(&sandbox.engine, ());
        sandbox.arm(&mut store);
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
