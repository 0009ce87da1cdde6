//! The one wasmtime `Engine` of the process and how a call is bounded: an epoch deadline (a
//! ticker thread advances the epoch every millisecond) or, in tests, fuel; plus a memory cap per
//! instance. The pooling allocator is used where the machine grants its address-space reservation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::config::{Budget, SandboxLimits};

/// How often the epoch advances; a deadline is rounded up to whole ticks.
const TICK: Duration = Duration::from_millis(1);
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
        let ticker =
            matches!(limits.budget(), Budget::Deadline(_)).then(|| Ticker::start(engine.clone()));
        Ok(Sandbox {
            engine,
            allocator,
            limits: limits.clone(),
            ticker,
        })
    }

    /// Arms a store for one call.
    pub fn arm<T>(&self, store: &mut wasmtime::Store<T>) {
        match self.limits.budget() {
            Budget::Deadline(deadline) => {
                // +1: the current tick may be about to end.
                let ticks = deadline.as_millis().div_ceil(TICK.as_millis()) as u64 + 1;
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

/// Advances the engine's epoch every [`TICK`] until stopped.
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Ticker {
    fn start(engine: Engine) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tollgate-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    engine.increment_epoch();
                }
            })
            .expect("the epoch ticker thread starts");
        Ticker { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}
