//! `/v1/policy`: the active generation (GET), a reload that keeps the running generation on any
//! error (POST `/v1/policy/reload`), and explain (POST `/v1/policy/explain`, the HTTP form of
//! `tollgate policy explain`).

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;
use tollgate_model::Caller;
use tollgate_policy::{Decision, PolicyError};

use super::{read_json, reply, ApiError, HttpResponse};
use crate::runtime::Shared;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplainRequest {
    principal: String,
    argv: Vec<String>,
}

pub async fn handle(request: Request<Incoming>, shared: &Shared) -> Result<HttpResponse, ApiError> {
    let path = request.uri().path().to_owned();
    match (request.method().clone(), path.as_str()) {
        (Method::GET, "/v1/policy") => Ok(reply(
            StatusCode::OK,
            serde_json::json!({ "outcome": "ok", "generation": shared.admission.generation() }),
        )),
        (Method::POST, "/v1/policy/reload") => reload(shared).await,
        (Method::POST, "/v1/policy/explain") => explain(read_json(request).await?, shared),
        (method, _)
            if ["/v1/policy", "/v1/policy/reload", "/v1/policy/explain"]
                .contains(&path.as_str()) =>
        {
            Err(ApiError::MethodNotAllowed {
                method: method.to_string(),
                path,
            })
        }
        _ => Err(ApiError::NotFound(path)),
    }
}

async fn reload(shared: &Shared) -> Result<HttpResponse, ApiError> {
    let admission = shared.admission.clone();
    // Compiling modules takes milliseconds of CPU: keep it off the async workers.
    let outcome = tokio::task::spawn_blocking(move || admission.reload())
        .await
        .map_err(|error| ApiError::Internal(format!("reload task failed: {error}")))?;
    Ok(match outcome {
        Ok(generation) => reply(
            StatusCode::OK,
            serde_json::json!({ "outcome": "reloaded", "generation": generation }),
        ),
        Err(error) => {
            let errors: Vec<String> = match &error {
                PolicyError::Compile(diagnostics) => {
                    diagnostics.iter().map(ToString::to_string).collect()
                }
                PolicyError::SelfTest(failures) => failures.clone(),
                other => vec![other.to_string()],
            };
            reply(
                StatusCode::UNPROCESSABLE_ENTITY,
                serde_json::json!({
                    "outcome": "rejected",
                    "errors": errors,
                    "generation": shared.admission.generation().number,
                }),
            )
        }
    })
}

fn explain(request: ExplainRequest, shared: &Shared) -> Result<HttpResponse, ApiError> {
    if request.argv.is_empty() {
        return Err(ApiError::BadRequest {
            field: Some("argv".into()),
            message: "argv must name a command".into(),
        });
    }
    let caller = Caller {
        principal: request.principal,
        uid: 0,
        gid: 0,
        pid: 0,
    };
    let (decision, steps) = shared.admission.explain(&caller, &request.argv);
    let body = match decision {
        Decision::Admitted {
            descriptor,
            lane,
            rule,
        } => serde_json::json!({
            "outcome": "admitted", "rule": rule, "lane": lane, "descriptor": *descriptor, "steps": steps,
        }),
        Decision::Denied(denial) => serde_json::json!({
            "outcome": "denied", "denial": denial, "steps": steps,
        }),
    };
    Ok(reply(StatusCode::OK, body))
}
