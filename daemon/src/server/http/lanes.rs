//! `GET /v1/lanes`: each lane's ceilings and live figures (the same numbers as `/metrics`) as JSON.

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use super::{json, ApiError, HttpResponse};
use crate::services::Services;

#[derive(serde::Serialize)]
struct LanesReply {
    outcome: &'static str,
    #[serde(flatten)]
    status: tollgate_lanes::LanesStatus,
}

pub async fn handle(
    request: Request<Incoming>,
    shared: &Services,
) -> Result<HttpResponse, ApiError> {
    if request.method() != Method::GET {
        return Err(ApiError::MethodNotAllowed {
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
        });
    }
    let reply = LanesReply {
        outcome: "ok",
        status: shared.lanes.status(),
    };
    Ok(json(StatusCode::OK, &reply))
}
