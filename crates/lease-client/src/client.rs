//! Raw lease calls against the daemon: each returns the typed outcome, with indeterminate calls
//! retried a bounded number of times with the very same attempt (safe: the scripts recognise it).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use rand::distr::{Alphanumeric, SampleString};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tollgate_lease_api::api::HolderEvent;
use tollgate_lease_api::api::{AcquireRequest, InspectRequest, ReleaseRequest, RenewRequest};
use tollgate_lease_api::{
    AcquireOutcome, Attempt, InspectOutcome, OutcomeClass, ReleaseOutcome, RenewOutcome, Resource,
};

use crate::error::ClientError;
use crate::events::Events;
use crate::transport::{Transport, TransportError};

/// Retries of an indeterminate call unless [`LeaseClient::with_retries`] says otherwise.
const DEFAULT_RETRIES: u32 = 3;
/// First pause before a retry; doubles each time.
const RETRY_BACKOFF: Duration = Duration::from_millis(20);

/// How the client makes each outcome type's answer for a call that was not sent or whose reply
/// was lost (its name and class come from [`tollgate_lease_api::Outcome`]).
pub trait Retried: DeserializeOwned + tollgate_lease_api::Outcome {
    fn not_sent(reason: String) -> Self;
    fn reply_lost(reason: String) -> Self;
}

macro_rules! mutating_outcome {
    ($type:ident) => {
        impl Retried for $type {
            fn not_sent(reason: String) -> Self {
                $type::Unavailable { reason }
            }
            fn reply_lost(reason: String) -> Self {
                $type::Indeterminate { reason }
            }
        }
    };
}
mutating_outcome!(AcquireOutcome);
mutating_outcome!(RenewOutcome);
mutating_outcome!(ReleaseOutcome);

impl Retried for InspectOutcome {
    fn not_sent(reason: String) -> Self {
        InspectOutcome::Unavailable { reason }
    }
    // Inspect changes nothing, so a lost reply only means the answer is unknown.
    fn reply_lost(reason: String) -> Self {
        InspectOutcome::Unavailable { reason }
    }
}

/// A call's outcome and when the request that produced it was sent (validity counts from there).
pub struct Answer<O> {
    pub outcome: O,
    pub sent_at: Instant,
}

#[derive(Clone)]
pub struct LeaseClient {
    transport: Arc<Transport>,
    retries: u32,
}

impl LeaseClient {
    /// A client of the daemon listening on `socket` (its HTTP socket).
    pub fn new(socket: &Path) -> LeaseClient {
        LeaseClient {
            transport: Arc::new(Transport::new(socket)),
            retries: DEFAULT_RETRIES,
        }
    }

    /// How often an indeterminate call is repeated with the same attempt before it is reported.
    pub fn with_retries(mut self, retries: u32) -> LeaseClient {
        self.retries = retries;
        self
    }

    /// A fresh attempt: a random owner token and operation id, made before anything is sent.
    pub fn new_attempt() -> Attempt {
        let mut rng = rand::rng();
        Attempt {
            owner: Alphanumeric.sample_string(&mut rng, 24),
            operation_id: Alphanumeric.sample_string(&mut rng, 16),
        }
    }

    pub async fn acquire_raw(
        &self,
        resource: &Resource,
        request: &AcquireRequest,
    ) -> Result<Answer<AcquireOutcome>, ClientError> {
        self.call(Method::POST, &path(resource, "acquire"), request)
            .await
    }

    pub async fn renew_raw(
        &self,
        resource: &Resource,
        request: &RenewRequest,
    ) -> Result<Answer<RenewOutcome>, ClientError> {
        self.call(Method::POST, &path(resource, "renew"), request)
            .await
    }

    pub async fn release_raw(
        &self,
        resource: &Resource,
        request: &ReleaseRequest,
    ) -> Result<Answer<ReleaseOutcome>, ClientError> {
        self.call(Method::POST, &path(resource, "release"), request)
            .await
    }

    pub async fn inspect(
        &self,
        resource: &Resource,
        attempt: Option<&Attempt>,
    ) -> Result<InspectOutcome, ClientError> {
        let request = InspectRequest {
            attempt: attempt.cloned(),
        };
        let answer = self
            .call(Method::POST, &path(resource, "inspect"), &request)
            .await?;
        Ok(answer.outcome)
    }

    /// The watchdog's events for the lease `attempt` holds on `resource`, as they happen.
    pub async fn events(
        &self,
        resource: &Resource,
        attempt: &Attempt,
    ) -> Result<Events, ClientError> {
        let path = format!(
            "/v1/leases/{resource}/events?owner={}&operation_id={}",
            attempt.owner, attempt.operation_id
        );
        self.stream(&path).await
    }

    /// Who holds `resource` now, then every change (new holder with its fence and value, release,
    /// expiry): leader election's observe.
    pub async fn holders(&self, resource: &Resource) -> Result<Events<HolderEvent>, ClientError> {
        self.stream(&format!("/v1/leases/{resource}/holders")).await
    }

    async fn stream<T: DeserializeOwned>(&self, path: &str) -> Result<Events<T>, ClientError> {
        let response = self.transport.stream(path).await?;
        if response.status() != StatusCode::OK {
            let status = response.status();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .map(|collected| collected.to_bytes())
                .unwrap_or_default();
            return Err(rejected(status, &body));
        }
        Ok(Events::new(response.into_body()))
    }

    async fn call<R: Serialize, O: Retried>(
        &self,
        method: Method,
        path: &str,
        request: &R,
    ) -> Result<Answer<O>, ClientError> {
        let body = serde_json::to_vec(request).expect("lease requests always serialise");
        let mut backoff = RETRY_BACKOFF;
        let mut tries = 0;
        loop {
            let sent_at = Instant::now();
            let outcome = match self
                .transport
                .call(method.clone(), path, body.clone())
                .await
            {
                Ok((status, reply)) => decode::<O>(status, &reply)?,
                Err(TransportError::NotSent(reason)) => O::not_sent(reason),
                Err(TransportError::Indeterminate(reason)) => O::reply_lost(reason),
            };
            if outcome.class() != OutcomeClass::Indeterminate || tries == self.retries {
                return Ok(Answer { outcome, sent_at });
            }
            tries += 1;
            tracing::debug!(path, tries, "indeterminate; retrying with the same attempt");
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
}

fn path(resource: &Resource, action: &str) -> String {
    format!("/v1/leases/{resource}/{action}")
}

/// Statuses whose bodies are outcomes; anything else is a refusal of the request itself.
fn decode<O: Retried>(status: StatusCode, body: &[u8]) -> Result<O, ClientError> {
    match status.as_u16() {
        200 | 409 | 502 | 503 => serde_json::from_slice(body).map_err(|error| {
            ClientError::BadReply(format!("{error}: {}", String::from_utf8_lossy(body)))
        }),
        _ => Err(rejected(status, body)),
    }
}

fn rejected(status: StatusCode, body: &[u8]) -> ClientError {
    let parsed: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    ClientError::Rejected {
        status: status.as_u16(),
        field: parsed["field"].as_str().map(str::to_owned),
        message: parsed["error"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_are_fresh_and_valid() {
        let a = LeaseClient::new_attempt();
        let b = LeaseClient::new_attempt();
        assert_ne!(a, b);
        assert_eq!(a.validate(), Ok(()));
    }

    #[test]
    fn statuses_sort_outcomes_from_refusals() {
        let contended: AcquireOutcome = decode(
            StatusCode::CONFLICT,
            br#"{"outcome":"contended","retry_after_ms":40}"#,
        )
        .unwrap();
        assert_eq!(
            contended,
            AcquireOutcome::Contended {
                retry_after: Duration::from_millis(40)
            }
        );
        let refused = decode::<AcquireOutcome>(
            StatusCode::BAD_REQUEST,
            br#"{"outcome":"bad_request","error":"ttl out of range","field":"ttl_ms"}"#,
        )
        .unwrap_err();
        assert!(
            matches!(refused, ClientError::Rejected { status: 400, field: Some(ref f), .. } if f == "ttl_ms")
        );
    }
}
