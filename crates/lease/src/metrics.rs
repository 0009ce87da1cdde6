//! Lease metrics for `/metrics`: outcomes per call, watchdog renewals and losses.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Serialize;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    call: &'static str,
    outcome: String,
}

#[derive(Clone)]
pub struct LeaseMetrics {
    outcomes: Family<OutcomeLabel, Counter>,
    renewals: Counter,
    losses: Counter,
}

impl LeaseMetrics {
    pub fn register(registry: &mut Registry) -> LeaseMetrics {
        let metrics = LeaseMetrics {
            outcomes: Family::default(),
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

    /// Counts `outcome` (any outcome type: its `outcome` tag is the label).
    pub fn outcome<O: Serialize>(&self, call: &'static str, outcome: &O) {
        let name = serde_json::to_value(outcome)
            .ok()
            .and_then(|value| value["outcome"].as_str().map(str::to_owned))
            .unwrap_or_default();
        self.outcomes
            .get_or_create(&OutcomeLabel {
                call,
                outcome: name,
            })
            .inc();
    }

    pub fn watchdog_renewal(&self) {
        self.renewals.inc();
    }

    pub fn watchdog_loss(&self) {
        self.losses.inc();
    }
}
