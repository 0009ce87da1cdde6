//! `/v1/leases/{resource}/…`: acquire, renew, release and inspect (POST, JSON), the watchdog's
//! events as a stream of JSON lines (`GET …/events?owner=…&operation_id=…`), and the resource's
//! holder changes as another (`GET …/holders`, leader election's observe; see `watch.rs`; 503 for
//! a resource held as a semaphore or read/write lease, which cannot be watched). The caller is the
//! peer of the Unix socket; its principal and uid are bound into every owner, and the policy's
//! `lease` rules admit it per resource (403 naming the rule otherwise). Statuses follow
//! docs/design.md ("Leases"): 200, 409 contended/conflict/shape_conflict, 503 unavailable with
//! Retry-After, 502 indeterminate, 400 bad input, 429 when the caller already runs
//! `leases.max_watchdogs_per_uid` watchdogs (or the daemon its `leases.max_watchdogs`).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use tollgate_lease::api::{AcquireRequest, InspectRequest, ReleaseRequest, RenewRequest};
use tollgate_lease::watch::WatchRefused;
use tollgate_lease::{
    Attempt, Holder, Identity, InvalidRequest, LeaseService, Outcome, OutcomeClass, Resource,
};
use tollgate_model::Caller;
use tollgate_policy::Decision;

use super::{caller_of, json, read_json, ApiError, HttpResponse};
use crate::quotas::LeaseKey;
use crate::server::resp::lease_watch;
use crate::services::Services;

/// Seconds a caller is told to wait after `unavailable` (Redis unreachable, nothing sent).
const UNAVAILABLE_RETRY_SECS: u64 = 1;

pub async fn handle(
    request: Request<Incoming>,
    shared: &Services,
) -> Result<HttpResponse, ApiError> {
    let path = request.uri().path().to_owned();
    let rest = path.strip_prefix("/v1/leases/").unwrap_or_default();
    let (name, action) = rest.split_once('/').unwrap_or((rest, ""));
    let resource = Resource::parse(name).map_err(|error| ApiError::BadRequest {
        field: Some("resource".into()),
        message: error.to_string(),
    })?;
    let caller = caller_of(&request, shared)?;
    if let Decision::Denied(denial) = shared.admission.admit_lease(&caller, resource.as_str()) {
        return Err(ApiError::Denied {
            rule: denial.rule,
            reason: denial.reason,
        });
    }
    // After the policy: a request it refuses is refused for that, and takes nothing.
    let admin = shared.identities.is_admin(caller.uid, caller.gid);
    let mut meters = shared.quotas.meters(&caller.principal, admin);
    let sent = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    meters
        .admit(&shared.quotas, sent)
        .map_err(ApiError::Throttled)?;
    let identity = Identity::from(&caller);
    let leases = &shared.leases;
    let answered = match (request.method().clone(), action) {
        (Method::POST, "acquire") => {
            let body: AcquireRequest = read_json(request).await?;
            let holder = match body.watchdog {
                true => Some(Holder::process(caller.pid).map_err(|error| {
                    ApiError::Internal(format!("cannot watch process {}: {error}", caller.pid))
                })?),
                false => None,
            };
            let key = || LeaseKey::new(&identity, &resource, &body.attempt);
            let hold = meters
                .hold_lease((&shared.quotas, leases), key, body.ttl)
                .map_err(ApiError::Throttled)?;
            let kept = holder.is_some();
            let acquired = leases.acquire(&identity, &resource, &body, holder).await;
            match &acquired {
                Ok(outcome) => hold.settle(outcome, kept),
                Err(_) => hold.unsent(),
            }
            Ok(respond(&acquired.map_err(invalid)?))
        }
        (Method::POST, "renew") => {
            let body: RenewRequest = read_json(request).await?;
            let outcome = leases
                .renew(&identity, &resource, &body)
                .await
                .map_err(invalid)?;
            let key = || LeaseKey::new(&identity, &resource, &body.attempt);
            meters.lease_renewed(key, &outcome);
            Ok(respond(&outcome))
        }
        (Method::POST, "release") => {
            let body: ReleaseRequest = read_json(request).await?;
            let outcome = leases
                .release(&identity, &resource, &body)
                .await
                .map_err(invalid)?;
            let key = || LeaseKey::new(&identity, &resource, &body.attempt);
            meters.lease_released(key, &outcome);
            Ok(respond(&outcome))
        }
        (Method::POST, "inspect") => {
            let body: InspectRequest = read_json(request).await?;
            let outcome = leases
                .inspect(&identity, &resource, body.attempt.as_ref())
                .await
                .map_err(invalid)?;
            Ok(respond(&outcome))
        }
        (Method::GET, "events") => events(leases, &identity, &resource, request.uri().query()),
        (Method::GET, "holders") => holders(shared, &caller, &identity, &resource).await,
        (method, "acquire" | "renew" | "release" | "inspect" | "events" | "holders") => {
            Err(ApiError::MethodNotAllowed {
                method: method.to_string(),
                path,
            })
        }
        _ => Err(ApiError::NotFound(path)),
    };
    // A reply's bytes are owed once it is made (a stream's, line by line, are not counted).
    if let Ok(response) = &answered {
        if let Some(bytes) = hyper::body::Body::size_hint(response.body()).exact() {
            meters.owe(&shared.quotas, bytes as usize);
        }
    }
    answered
}

fn invalid(error: InvalidRequest) -> ApiError {
    ApiError::BadRequest {
        field: Some(error.field.into()),
        message: error.message,
    }
}

/// The HTTP status of an outcome, from its class (docs/design.md, "Leases").
fn status(outcome: &impl Outcome) -> StatusCode {
    match outcome.class() {
        OutcomeClass::Done | OutcomeClass::Answered => StatusCode::OK,
        OutcomeClass::Conflict => StatusCode::CONFLICT,
        OutcomeClass::Limited => StatusCode::TOO_MANY_REQUESTS,
        OutcomeClass::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        OutcomeClass::Indeterminate => StatusCode::BAD_GATEWAY,
    }
}

fn respond<O: Serialize + Outcome>(outcome: &O) -> HttpResponse {
    let status = status(outcome);
    let mut response = json(status, outcome);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(RETRY_AFTER, UNAVAILABLE_RETRY_SECS.into());
    }
    response
}

/// The watchdog's events for one lease as JSON lines, until the watchdog stops.
fn events(
    leases: &LeaseService,
    identity: &Identity,
    resource: &Resource,
    query: Option<&str>,
) -> Result<HttpResponse, ApiError> {
    let attempt = attempt_from_query(query.unwrap_or_default())?;
    let receiver = leases
        .events(identity, resource, &attempt)
        .map_err(invalid)?
        .ok_or_else(|| {
            ApiError::NotFound(format!("no watchdog guards this lease on {resource}"))
        })?;
    let lines = futures::stream::unfold(receiver, |mut receiver| async move {
        loop {
            match receiver.recv().await {
                Ok(event) => return Some((event, receiver)),
                // A watcher that fell behind skips what it missed and reads on.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Ok(json_lines(lines))
}

/// The resource's holder changes as JSON lines, until the watch is interrupted or the client goes.
async fn holders(
    shared: &Services,
    caller: &Caller,
    identity: &Identity,
    resource: &Resource,
) -> Result<HttpResponse, ApiError> {
    // The most the watch may buffer for a reader that does not read, held in the byte budget
    // until the stream is dropped.
    let reserved =
        lease_watch::reserve(&shared.pool, caller).map_err(|reason| ApiError::RateLimited {
            reason,
            retry_after_secs: 1,
        })?;
    let receiver =
        shared
            .leases
            .watch(identity, resource)
            .await
            .map_err(|refused| match refused {
                WatchRefused::TooMany { limit } => ApiError::RateLimited {
                    reason: format!(
                        "this user of the principal already has {limit} holder watches open \
                     (leases.max_watches_per_uid), or the daemon has (leases.max_watches)"
                    ),
                    retry_after_secs: 1,
                },
                WatchRefused::Unavailable(error) => ApiError::Unavailable {
                    reason: error.to_string(),
                    retry_after_secs: UNAVAILABLE_RETRY_SECS,
                },
            })?;
    let lines = futures::stream::unfold(
        (receiver, reserved),
        |(mut receiver, reserved)| async move {
            receiver
                .recv()
                .await
                .map(|event| (event, (receiver, reserved)))
        },
    );
    Ok(json_lines(lines))
}

/// A stream of events as a streaming `application/x-ndjson` body, one JSON object a line.
fn json_lines<T: Serialize + Send + 'static>(
    events: impl futures::Stream<Item = T> + Send + 'static,
) -> HttpResponse {
    let lines = futures::StreamExt::map(events, |event| {
        let mut line = serde_json::to_vec(&event).expect("events always serialise");
        line.push(b'\n');
        Ok::<_, Infallible>(Frame::data(Bytes::from(line)))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "application/x-ndjson")
        .body(StreamBody::new(lines).boxed_unsync())
        .expect("a static status and header always build a response")
}

fn attempt_from_query(query: &str) -> Result<Attempt, ApiError> {
    let mut owner = None;
    let mut operation_id = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("owner", value)) => owner = Some(value.to_owned()),
            Some(("operation_id", value)) => operation_id = Some(value.to_owned()),
            _ => {
                return Err(ApiError::BadRequest {
                    field: Some(pair.split('=').next().unwrap_or_default().to_owned()),
                    message: "unknown query parameter".into(),
                })
            }
        }
    }
    let missing = |field: &str| ApiError::BadRequest {
        field: Some(field.to_owned()),
        message: "missing query parameter".into(),
    };
    Ok(Attempt {
        owner: owner.ok_or_else(|| missing("owner"))?,
        operation_id: operation_id.ok_or_else(|| missing("operation_id"))?,
    })
}

#[cfg(test)]
mod tests {
    use tollgate_lease::{AcquireOutcome, InspectOutcome, ReleaseOutcome, RenewOutcome};

    use super::*;

    #[test]
    fn the_events_attempt_comes_from_the_query() {
        let attempt = attempt_from_query("owner=o-1&operation_id=op:2").unwrap();
        assert_eq!(
            (attempt.owner.as_str(), attempt.operation_id.as_str()),
            ("o-1", "op:2")
        );
        let missing = attempt_from_query("owner=o-1").unwrap_err();
        assert!(
            matches!(missing, ApiError::BadRequest { field: Some(f), .. } if f == "operation_id")
        );
        let unknown = attempt_from_query("owner=o&operation_id=p&colour=red").unwrap_err();
        assert!(matches!(unknown, ApiError::BadRequest { field: Some(f), .. } if f == "colour"));
    }

    #[test]
    fn outcomes_map_to_designs_status_codes() {
        let unavailable = AcquireOutcome::Unavailable {
            reason: "down".into(),
        };
        assert_eq!(status(&unavailable), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status(&AcquireOutcome::Conflict), StatusCode::CONFLICT);
        let reshaped = AcquireOutcome::ShapeConflict {
            held_as: tollgate_lease::HeldAs::Semaphore,
            permits: Some(3),
        };
        assert_eq!(status(&reshaped), StatusCode::CONFLICT);
        assert_eq!(
            status(&AcquireOutcome::TooManyWatchdogs { limit: 2 }),
            StatusCode::TOO_MANY_REQUESTS
        );
        let lost = RenewOutcome::Indeterminate {
            reason: "cut".into(),
        };
        assert_eq!(status(&lost), StatusCode::BAD_GATEWAY);
        assert_eq!(status(&ReleaseOutcome::NotOwner), StatusCode::OK);
        assert_eq!(status(&InspectOutcome::Free), StatusCode::OK);
    }
}
