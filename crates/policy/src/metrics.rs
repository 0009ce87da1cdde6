//! Prometheus metrics of admission: decisions by outcome and cause, module faults by module and
//! cause, reloads, and the active generation.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::decision::{Decision, DenyCause};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    outcome: &'static str,
    cause: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabels {
    module: String,
    cause: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    outcome: &'static str,
}

#[derive(Clone, Default)]
pub struct PolicyMetrics {
    decisions: Family<DecisionLabels, Counter>,
    /// Handles into `decisions`, so the hot path increments without hashing labels.
    admitted: Counter,
    denied: Vec<(DenyCause, Counter)>,
    faults: Family<FaultLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    generation: Gauge,
    /// Decision-log lines dropped because the writer fell behind.
    pub log_dropped: Counter,
}

impl PolicyMetrics {
    pub fn register(registry: &mut Registry) -> PolicyMetrics {
        let mut metrics = PolicyMetrics::default();
        metrics.admitted = metrics
            .decisions
            .get_or_create(&DecisionLabels {
                outcome: "admitted",
                cause: "",
            })
            .clone();
        // Every cause's counter exists (and costs no lookup) from the start.
        metrics.denied = DenyCause::ALL
            .iter()
            .map(|&cause| {
                let labels = DecisionLabels {
                    outcome: "denied",
                    cause: cause.as_str(),
                };
                (cause, metrics.decisions.get_or_create(&labels).clone())
            })
            .collect();
        let registry = registry.sub_registry_with_prefix("policy");
        registry.register(
            "decisions",
            "Admission decisions by outcome and cause",
            metrics.decisions.clone(),
        );
        registry.register(
            "module_faults",
            "Module calls that trapped, ran out of time or memory, or answered malformed",
            metrics.faults.clone(),
        );
        registry.register(
            "reloads",
            "Policy reloads by outcome",
            metrics.reloads.clone(),
        );
        registry.register(
            "generation",
            "The active policy generation",
            metrics.generation.clone(),
        );
        metrics
    }

    pub fn decided(&self, decision: &Decision) {
        let Decision::Denied(denial) = decision else {
            self.admitted.inc();
            return;
        };
        if let Some((_, counter)) = self.denied.iter().find(|(cause, _)| *cause == denial.cause) {
            counter.inc();
        }
        if denial.cause.is_fault() {
            self.faults
                .get_or_create(&FaultLabels {
                    module: denial.module.clone(),
                    cause: denial.cause.as_str(),
                })
                .inc();
        }
    }

    pub fn reloaded(&self, generation: Option<u64>) {
        let outcome = match generation {
            Some(number) => {
                self.generation.set(number as i64);
                "ok"
            }
            None => "failed",
        };
        self.reloads.get_or_create(&ReloadLabels { outcome }).inc();
    }
}
