//! `/v1/principals`' census as Prometheus gauges per principal, set afresh at each scrape of
//! `/metrics` (`server::http::principals::refresh_gauges` sums the census): summed over a
//! principal's users, since a label per uid would make the series unbounded, and only for
//! principals with something held, so the label set is the principals in use.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrincipalLabel {
    principal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaPrincipalLabels {
    quota: String,
    principal: String,
}

/// What one principal's users hold together.
#[derive(Debug, Default)]
pub struct PrincipalSums {
    pub resp_sessions: usize,
    pub bytes_held: usize,
    pub admission_seconds: f64,
    pub in_flight: usize,
    pub watchdogs: usize,
    pub watches: usize,
}

/// The gauges, registered once at start-up.
pub struct PrincipalGauges {
    sessions: Family<PrincipalLabel, Gauge>,
    bytes_held: Family<PrincipalLabel, Gauge>,
    admission_seconds: Family<PrincipalLabel, Gauge<f64, AtomicU64>>,
    in_flight: Family<PrincipalLabel, Gauge>,
    watchdogs: Family<PrincipalLabel, Gauge>,
    watches: Family<PrincipalLabel, Gauge>,
    leases_held: Family<QuotaPrincipalLabels, Gauge>,
}

impl PrincipalGauges {
    pub fn register(registry: &mut Registry) -> PrincipalGauges {
        let gauges = PrincipalGauges {
            sessions: Family::default(),
            bytes_held: Family::default(),
            admission_seconds: Family::default(),
            in_flight: Family::default(),
            watchdogs: Family::default(),
            watches: Family::default(),
            leases_held: Family::default(),
        };
        registry.register(
            "principal_resp_sessions",
            "RESP sessions open, per principal (its users together)",
            gauges.sessions.clone(),
        );
        registry.register(
            "principal_bytes_held",
            "Bytes held in resp.budgets for the principal's clients and holder watches",
            gauges.bytes_held.clone(),
        );
        registry.register(
            "principal_admission_seconds",
            "Guard and catalog time spent for the principal's connected users",
            gauges.admission_seconds.clone(),
        );
        registry.register(
            "principal_in_flight",
            "Commands of the principal's RESP sessions outstanding on REGULAR and SCRIPT",
            gauges.in_flight.clone(),
        );
        registry.register(
            "principal_watchdogs",
            "Lease watchdogs running for the principal",
            gauges.watchdogs.clone(),
        );
        registry.register(
            "principal_watches",
            "Lease holder watches open for the principal",
            gauges.watches.clone(),
        );
        registry.register(
            "quota_leases_held",
            "Leases a principal holds at once under a quota with leases:",
            gauges.leases_held.clone(),
        );
        gauges
    }

    /// Every gauge from `sums` (by principal) and `leases_held` (quota, principal, count);
    /// principals left out drop out of the exposition.
    pub fn set(
        &self,
        sums: BTreeMap<String, PrincipalSums>,
        leases_held: Vec<(String, String, usize)>,
    ) {
        for family in [
            &self.sessions,
            &self.bytes_held,
            &self.in_flight,
            &self.watchdogs,
            &self.watches,
        ] {
            family.clear();
        }
        self.admission_seconds.clear();
        self.leases_held.clear();
        let gauge = |value: usize| i64::try_from(value).unwrap_or(i64::MAX);
        for (principal, sum) in sums {
            let label = PrincipalLabel { principal };
            self.sessions
                .get_or_create(&label)
                .set(gauge(sum.resp_sessions));
            self.bytes_held
                .get_or_create(&label)
                .set(gauge(sum.bytes_held));
            self.admission_seconds
                .get_or_create(&label)
                .set(sum.admission_seconds);
            self.in_flight
                .get_or_create(&label)
                .set(gauge(sum.in_flight));
            self.watchdogs
                .get_or_create(&label)
                .set(gauge(sum.watchdogs));
            self.watches.get_or_create(&label).set(gauge(sum.watches));
        }
        for (quota, principal, held) in leases_held {
            self.leases_held
                .get_or_create(&QuotaPrincipalLabels { quota, principal })
                .set(gauge(held));
        }
    }
}
