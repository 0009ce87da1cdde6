//! Lease metrics for `/metrics`: outcomes per call, watchdog renewals and losses.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::outcome::Outcome;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    call: &'static str,
    outcome: &'static str,
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

    /// Counts `outcome`, labelled with its name as on the wire.
    pub fn outcome<O: Outcome>(&self, call: &'static str, outcome: &O) {
        self.outcomes
            .get_or_create(&OutcomeLabel {
                call,
                outcome: outcome.name(),
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
