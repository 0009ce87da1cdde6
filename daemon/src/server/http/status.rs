//! `GET /v1/status`: everything `tollgate status` shows on one screen, in one request — readiness
//! and why not, Redis (mode, and each master's version or why it did not answer), the client
//! lanes, leases kept and waited for, the policy's generation and when it was loaded, and the
//! budgets and limits in force.

use bytes::BytesMut;
use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use tollgate_lanes::{Exclusive, Lanes, Protocol, Route};
use tollgate_resp::Frame;

use super::{only_get, reply, ApiError, HttpResponse};
use crate::services::Services;

pub async fn handle(
    request: Request<Incoming>,
    shared: &Services,
) -> Result<HttpResponse, ApiError> {
    only_get(&request)?;
    let (reasons, nodes) = tokio::join!(shared.readiness.problems(), nodes(&shared.lease_lanes));
    let generation = shared.admission.generation();
    Ok(reply(
        StatusCode::OK,
        serde_json::json!({
            "outcome": "ok",
            "ready": reasons.is_empty(),
            "reasons": reasons,
            "redis": { "mode": shared.redis_mode, "nodes": nodes },
            "lanes": shared.lanes.status(),
            "leases": shared.leases.census(),
            "policy": {
                "generation": generation.number,
                "loaded_at": humantime::format_rfc3339_seconds(shared.reloader.loaded_at()).to_string(),
                "files": generation.files.iter().map(|file| file.path.display().to_string()).collect::<Vec<_>>(),
                "modules": generation.modules.len(),
                "reload_interval": humantime::format_duration(shared.reloader.interval()).to_string(),
            },
            "limits": shared.settings,
        }),
    ))
}

/// Each master `lanes` reach, with the version its `HELLO` gives, or why it gave none.
async fn nodes(lanes: &Lanes) -> Vec<serde_json::Value> {
    let masters = match lanes.masters().await {
        Ok(masters) => masters,
        Err(error) => {
            return vec![serde_json::json!({ "reachable": false, "error": error.to_string() })]
        }
    };
    let mut nodes = Vec::with_capacity(masters.len());
    for master in masters {
        let node = match &master {
            Route::Node(endpoint) => endpoint.to_string(),
            _ => "master".to_owned(),
        };
        nodes.push(match version(lanes, master).await {
            Ok(version) => {
                serde_json::json!({ "node": node, "reachable": true, "version": version })
            }
            Err(error) => serde_json::json!({ "node": node, "reachable": false, "error": error }),
        });
    }
    nodes
}

/// `HELLO`'s `version` on the master `route` leads to, through the ADMIN lane.
async fn version(lanes: &Lanes, route: Route) -> Result<String, String> {
    let mut conn = lanes
        .borrow_at(route, Exclusive::Admin, Protocol::Resp2, None)
        .await
        .map_err(|error| error.to_string())?;
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(&["HELLO"], &mut out);
    let reply = conn.send(out.freeze()).await;
    conn.release().await;
    let frame = reply
        .map_err(|error| error.to_string())?
        .frame()
        .map_err(|error| error.to_string())?;
    let Frame::Array(fields) = frame else {
        return Err(format!("unexpected HELLO reply {frame:?}"));
    };
    fields
        .chunks(2)
        .find(|pair| {
            pair[0]
                .as_bytes()
                .is_some_and(|name| name.as_ref() == b"version")
        })
        .and_then(|pair| pair.get(1)?.as_bytes())
        .map(|version| String::from_utf8_lossy(version).into_owned())
        .ok_or_else(|| "HELLO named no version".to_owned())
}
