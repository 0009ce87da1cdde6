//! `GET /v1/principals` (administrators only): what each user of each principal (a principal and
//! one OS uid: the unit every pooled resource is shared by) holds now — RESP sessions, bytes held
//! against `resp.budgets`, admission time spent and waited for, lease watchdogs and holder
//! watches. A user appears while it has a RESP session or holds a watchdog or a watch. Then, per
//! principal (quotas hold principals, not users), each policy quota's limits and what it admitted
//! and refused.
//!
//! `/metrics` shows the same per principal ([`PrincipalGauges`], refreshed at each scrape): summed
//! over the principal's users, since a label per uid would make the series unbounded, and only
//! for principals with something held, so the label set is the principals in use.

use std::collections::BTreeMap;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use tollgate_lease::UserPlaces;

use super::{admin_only, json, only_get, ApiError, HttpResponse};
use crate::quotas::QuotaState;
use crate::server::resp::admission_clock::AdmissionTime;
use crate::services::Services;

/// One user of one principal, as the reply lists it.
#[derive(Debug, Default, serde::Serialize)]
struct Row {
    principal: String,
    uid: u32,
    resp_sessions: usize,
    bytes_held: usize,
    admission_ms: f64,
    admission_waited_ms: f64,
    watchdogs: usize,
    watches: usize,
}

#[derive(serde::Serialize)]
struct PrincipalsReply {
    outcome: &'static str,
    principals: Vec<Row>,
    quotas: Vec<QuotaRow>,
}

/// One principal under one quota.
#[derive(Debug, serde::Serialize)]
struct QuotaRow {
    principal: String,
    #[serde(flatten)]
    state: QuotaState,
}

pub async fn handle(
    request: Request<Incoming>,
    shared: &Services,
) -> Result<HttpResponse, ApiError> {
    only_get(&request)?;
    admin_only(&request, shared, "listing every user's shares")?;
    let reply = PrincipalsReply {
        outcome: "ok",
        principals: rows(shared),
        quotas: quota_rows(shared),
    };
    Ok(json(StatusCode::OK, &reply))
}

/// The three censuses merged by user, in principal and uid order.
fn rows(shared: &Services) -> Vec<Row> {
    let mut rows: BTreeMap<(String, u32), Row> = BTreeMap::new();
    for (tenant, sessions, bytes) in shared.pool.census() {
        let row = row(&mut rows, &tenant.principal, tenant.uid);
        row.resp_sessions = sessions;
        row.bytes_held = bytes;
    }
    for (tenant, _, time) in shared.admission_clocks.census() {
        let AdmissionTime { spent, waited } = time;
        let row = row(&mut rows, &tenant.principal, tenant.uid);
        row.admission_ms = millis(spent);
        row.admission_waited_ms = millis(waited);
    }
    for (user, places) in shared.leases.places_by_user() {
        let UserPlaces { watchdogs, watches } = places;
        let row = row(&mut rows, &user.principal, user.uid);
        row.watchdogs = watchdogs;
        row.watches = watches;
    }
    rows.into_values().collect()
}

/// Each principal a quota has held, in principal and quota order.
fn quota_rows(shared: &Services) -> Vec<QuotaRow> {
    let mut rows: Vec<QuotaRow> = shared
        .quotas
        .states(&shared.leases)
        .into_iter()
        .map(|(principal, state)| QuotaRow { principal, state })
        .collect();
    rows.sort_by(|a, b| (&a.principal, &a.state.quota).cmp(&(&b.principal, &b.state.quota)));
    rows
}

/// The row of one user, made empty on first sight.
fn row<'a>(rows: &'a mut BTreeMap<(String, u32), Row>, principal: &str, uid: u32) -> &'a mut Row {
    rows.entry((principal.to_owned(), uid))
        .or_insert_with(|| Row {
            principal: principal.to_owned(),
            uid,
            ..Row::default()
        })
}

fn millis(duration: std::time::Duration) -> f64 {
    (duration.as_secs_f64() * 1e6).round() / 1e3
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrincipalLabel {
    principal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaPrincipalLabels {
    quota: String,
    principal: String,
}

/// `/v1/principals`' census as gauges per principal, set afresh at each scrape.
pub struct PrincipalGauges {
    sessions: Family<PrincipalLabel, Gauge>,
    bytes_held: Family<PrincipalLabel, Gauge>,
    admission_seconds: Family<PrincipalLabel, Gauge<f64, AtomicU64>>,
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

    /// Sets every gauge from the censuses now; principals with nothing held drop out.
    pub fn refresh(&self, shared: &Services) {
        let mut sums: BTreeMap<String, Row> = BTreeMap::new();
        for row in rows(shared) {
            let sum = sums.entry(row.principal.clone()).or_default();
            sum.resp_sessions += row.resp_sessions;
            sum.bytes_held += row.bytes_held;
            sum.admission_ms += row.admission_ms;
            sum.watchdogs += row.watchdogs;
            sum.watches += row.watches;
        }
        for family in [
            &self.sessions,
            &self.bytes_held,
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
                .set(sum.admission_ms / 1e3);
            self.watchdogs
                .get_or_create(&label)
                .set(gauge(sum.watchdogs));
            self.watches.get_or_create(&label).set(gauge(sum.watches));
        }
        for (principal, state) in shared.quotas.states(&shared.leases) {
            if let Some(held) = state.leases_held {
                self.leases_held
                    .get_or_create(&QuotaPrincipalLabels {
                        quota: state.quota,
                        principal,
                    })
                    .set(gauge(held));
            }
        }
    }
}
