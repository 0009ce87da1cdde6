//! `/healthz` (the process answers), `/readyz` (Redis answers and a policy is loaded) and `/metrics`.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use super::{only_get, reply, text, ApiError, HttpResponse};
use crate::services::Services;

pub async fn handle(
    request: Request<Incoming>,
    shared: &Services,
) -> Result<HttpResponse, ApiError> {
    only_get(&request)?;
    let path = request.uri().path();
    Ok(match path {
        "/healthz" => reply(StatusCode::OK, serde_json::json!({ "outcome": "ok" })),
        "/readyz" => {
            let not_ready = shared.readiness.problems().await;
            if not_ready.is_empty() {
                reply(StatusCode::OK, serde_json::json!({ "outcome": "ready" }))
            } else {
                let mut response = reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({ "outcome": "not_ready", "reasons": not_ready }),
                );
                response
                    .headers_mut()
                    .insert(hyper::header::RETRY_AFTER, 1.into());
                response
            }
        }
        _ => {
            super::principals::refresh_gauges(shared);
            text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                shared.metrics.encode(),
            )
        }
    })
}
