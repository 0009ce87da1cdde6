//! Lease metrics for `/metrics`: outcomes per call, watchdog renewals and losses.

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::outcome::Outcome;

/// More (call, outcome) pairs than the lease API has; past it, lookups go to the family.
const MOST_SEEN: usize = 64;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    call: &'static str,
    outcome: &'static str,
}

#[derive(Clone)]
pub struct LeaseMetrics {
    outcomes: Family<OutcomeLabel, Counter>,
    /// The counters of `outcomes` already looked up: a handful of (call, outcome) pairs, found by
    /// the names' addresses in a short list rather than by hashing the label set into the family
    /// on every lease call (about 430 instructions a call, callgrind). Each is the family's own
    /// counter (a clone shares its value).
    seen: Arc<Mutex<Vec<(OutcomeLabel, Counter)>>>,
    renewals: Counter,
    losses: Counter,
}

impl LeaseMetrics {
    pub fn register(registry: &mut Registry) -> LeaseMetrics {
        let metrics = LeaseMetrics {
            outcomes: Family::default(),
            seen: Arc::default(),
            renewals: Counter::default(),
            losses: Counter::default(),
        };
        registry.register(
            "lease_outcomes",
            "Lease calls by call and outcome",
            metrics.outcomes.clone(),
        );
        registry.register(
            "lease_watchdog_renewals",
            "Renewals the watchdog confirmed",
            metrics.renewals.clone(),
        );
        registry.register(
            "lease_watchdog_losses",
            "Leases the watchdog found lost",
            metrics.losses.clone(),
        );
        metrics
    }

    /// Counts `outcome`, labelled with its name as on the wire.
    pub fn outcome<O: Outcome>(&self, call: &'static str, outcome: &O) {
        let label = OutcomeLabel {
            call,
            outcome: outcome.name(),
        };
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let same = |known: &OutcomeLabel| {
            std::ptr::eq(known.call, label.call) && std::ptr::eq(known.outcome, label.outcome)
        };
        if let Some((_, counter)) = seen.iter().find(|(known, _)| same(known)) {
            counter.inc();
            return;
        }
        // The same names at other addresses (another codegen unit's copy) still count as one
        // label: the family is keyed by the text.
        let counter = self.outcomes.get_or_create(&label).clone();
        counter.inc();
        if seen.len() < MOST_SEEN {
            seen.push((label, counter));
        }
    }

    pub fn watchdog_renewal(&self) {
        self.renewals.inc();
    }

    pub fn watchdog_loss(&self) {
        self.losses.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{AcquireOutcome, ReleaseOutcome};

    fn exposition(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn each_outcome_is_counted_once_under_its_label() {
        let mut registry = Registry::default();
        let metrics = LeaseMetrics::register(&mut registry);
        for _ in 0..3 {
            metrics.outcome("release", &ReleaseOutcome::Released);
        }
        metrics.outcome("acquire", &AcquireOutcome::Conflict);
        metrics.outcome("release", &ReleaseOutcome::NotOwner);
        metrics
            .clone()
            .outcome("release", &ReleaseOutcome::Released);
        let text = exposition(&registry);
        assert!(
            text.contains(r#"lease_outcomes_total{call="release",outcome="released"} 4"#),
            "{text}"
        );
        assert!(text.contains(r#"lease_outcomes_total{call="acquire",outcome="conflict"} 1"#));
        assert!(text.contains(r#"lease_outcomes_total{call="release",outcome="not_owner"} 1"#));
    }
}
