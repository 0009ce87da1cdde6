//! `GET /v1/lanes`: each lane's ceilings and live figures (the same numbers as `/metrics`) as JSON.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use super::{json, only_get, ApiError, HttpResponse};
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
    only_get(&request)?;
    let reply = LanesReply {
        outcome: "ok",
        status: shared.lanes.status(),
    };
    Ok(json(StatusCode::OK, &reply))
}
