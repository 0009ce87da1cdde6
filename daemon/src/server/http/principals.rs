//! `GET /v1/principals` (administrators only): what each user of each principal (a principal and
//! one OS uid: the unit every pooled resource is shared by) holds now — RESP sessions, bytes held
//! against `resp.budgets`, admission time spent and waited for, commands outstanding on the
//! multiplexed lanes, lease watchdogs and holder watches. A user appears while it has a RESP
//! session or holds a watchdog or a watch. Then, per principal (quotas hold principals, not
//! users), each policy quota's limits and what it admitted and refused.
//!
//! `/metrics` shows the same per principal (`principal_gauges.rs`, set at each scrape): summed
//! over the principal's users, since a label per uid would make the series unbounded, and only
//! for principals with something held, so the label set is the principals in use.

use std::collections::BTreeMap;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use tollgate_lease::UserPlaces;

use super::{admin_only, json, only_get, ApiError, HttpResponse};
use crate::principal_gauges::PrincipalSums;
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
    /// Commands of its RESP sessions outstanding on REGULAR and SCRIPT (in flight or queued).
    in_flight: usize,
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
    for (tenant, _, [regular, script]) in shared.flights.census() {
        row(&mut rows, &tenant.principal, tenant.uid).in_flight = regular + script;
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

/// Sets `/metrics`' per-principal gauges from the censuses now (at each scrape).
pub fn refresh_gauges(shared: &Services) {
    let mut sums: BTreeMap<String, PrincipalSums> = BTreeMap::new();
    for row in rows(shared) {
        let sum = sums.entry(row.principal.clone()).or_default();
        sum.resp_sessions += row.resp_sessions;
        sum.bytes_held += row.bytes_held;
        sum.admission_seconds += row.admission_ms / 1e3;
        sum.in_flight += row.in_flight;
        sum.watchdogs += row.watchdogs;
        sum.watches += row.watches;
    }
    let leases_held = shared
        .quotas
        .states(&shared.leases)
        .into_iter()
        .filter_map(|(principal, state)| Some((state.quota, principal, state.leases_held?)))
        .collect::<Vec<_>>();
    shared.principal_gauges.set(sums, leases_held);
}
