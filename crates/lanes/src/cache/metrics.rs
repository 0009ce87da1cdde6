//! What `/metrics` shows of the near cache: `tollgate_cache_{hits,misses,fills,invalidations,
//! evictions}_total`, `tollgate_cache_bytes` and `tollgate_cache_entries`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::store::{Cause, Filled, Store};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

pub(super) struct CacheMetrics {
    pub(super) hits: Counter,
    pub(super) misses: Counter,
    fills: Family<OutcomeLabel, Counter>,
    invalidations: Family<CauseLabel, Counter>,
    evictions: Counter,
    bytes: Gauge,
    entries: Gauge,
}

impl CacheMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = CacheMetrics {
            hits: Counter::default(),
            misses: Counter::default(),
            fills: Family::default(),
            invalidations: Family::default(),
            evictions: Counter::default(),
            bytes: Gauge::default(),
            entries: Gauge::default(),
        };
        let r = registry;
        r.register(
            "hits",
            "Reads answered from the near cache",
            metrics.hits.clone(),
        );
        r.register(
            "misses",
            "Reads of cacheable keys sent to Redis to fill the cache",
            metrics.misses.clone(),
        );
        r.register(
            "fills",
            "Replies of fill reads, by outcome (kept, raced: invalidated while in flight, \
             too_large, too_old)",
            metrics.fills.clone(),
        );
        r.register(
            "invalidations",
            "Entries dropped, by cause (redis, write, read, flush, connection)",
            metrics.invalidations.clone(),
        );
        r.register(
            "evictions",
            "Entries evicted to stay under cache.max_bytes",
            metrics.evictions.clone(),
        );
        r.register(
            "bytes",
            "Bytes the cache holds (values, keys and bookkeeping)",
            metrics.bytes.clone(),
        );
        r.register(
            "entries",
            "Entries the cache holds",
            metrics.entries.clone(),
        );
        metrics
    }

    pub(super) fn filled(&self, filled: Filled) {
        let outcome = match filled {
            Filled::Kept { evicted } => {
                self.evictions.inc_by(evicted as u64);
                "kept"
            }
            Filled::Raced => "raced",
            Filled::TooLarge => "too_large",
            Filled::TooOld => "too_old",
        };
        self.fills.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    pub(super) fn invalidated(&self, cause: Cause, entries: u64) {
        let label = CauseLabel {
            cause: cause.label(),
        };
        self.invalidations.get_or_create(&label).inc_by(entries);
    }

    pub(super) fn sizes(&self, store: &Store) {
        self.bytes.set(store.bytes() as i64);
        self.entries.set(store.len() as i64);
    }
}
