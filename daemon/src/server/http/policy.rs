//! `/v1/policy`: the active generation (GET), a reload that keeps the running generation on any
//! error (POST `/v1/policy/reload`), and explain (POST `/v1/policy/explain`, the HTTP form of
//! `tollgate policy explain`).
//!
//! Reloading changes the daemon and costs a compile of every module, so it is for administrators
//! only and spaced out by `admin.reload_interval`. Explain tells what a principal may do: anyone
//! may ask about their own principal, only administrators about another's.

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;
use tollgate_model::Caller;
use tollgate_policy::{Decision, PolicyError};

use super::{caller_of, peer_of, read_json, reply, ApiError, HttpResponse};
use crate::services::Services;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplainRequest {
    principal: String,
    argv: Vec<String>,
}

pub async fn handle(
    request: Request<Incoming>,
    shared: &Services,
) -> Result<HttpResponse, ApiError> {
    let path = request.uri().path().to_owned();
    match (request.method().clone(), path.as_str()) {
        (Method::GET, "/v1/policy") => Ok(reply(
            StatusCode::OK,
            serde_json::json!({ "outcome": "ok", "generation": shared.admission.generation() }),
        )),
        (Method::POST, "/v1/policy/reload") => reload(request, shared).await,
        (Method::POST, "/v1/policy/explain") => explain(request, shared).await,
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

async fn reload(request: Request<Incoming>, shared: &Services) -> Result<HttpResponse, ApiError> {
    shared
        .identities
        .admin(peer_of(&request)?, "reloading the policy")
        .map_err(|not_admin| ApiError::Forbidden {
            reason: not_admin.to_string(),
        })?;
    let _claim = shared
        .reloads
        .claim()
        .map_err(|throttled| ApiError::RateLimited {
            reason: format!(
                "the policy was reloaded moments ago; reloads are at least {} apart (admin.reload_interval)",
                humantime::format_duration(shared.reloads.interval())
            ),
            retry_after_secs: throttled.retry_after_secs(),
        })?;
    let admission = shared.admission.clone();
    // Compiling modules takes milliseconds of CPU or more: keep it off the async workers. The
    // claim is held until the compile ends, so reloads never overlap.
    let outcome = tokio::task::spawn_blocking(move || admission.reload())
        .await
        .map_err(|error| ApiError::Internal(format!("reload task failed: {error}")))?;
    if outcome.is_ok() {
        // Answered once Redis backs the new policy, so a client that saw the reload sees it.
        shared.lane_users.follow(&shared.admission).await;
    }
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

async fn explain(request: Request<Incoming>, shared: &Services) -> Result<HttpResponse, ApiError> {
    let peer = peer_of(&request)?;
    let own = caller_of(&request, shared);
    let body: ExplainRequest = read_json(request).await?;
    if body.argv.is_empty() {
        return Err(ApiError::BadRequest {
            field: Some("argv".into()),
            message: "argv must name a command".into(),
        });
    }
    let caller = match own {
        // One's own principal, with one's own credentials.
        Ok(caller) if caller.principal == body.principal => caller,
        own => {
            let action = format!("explaining what principal `{}` may do", body.principal);
            shared
                .identities
                .admin(peer, &action)
                .map_err(|not_admin| {
                    // Say who the caller is instead, so that it can ask about itself.
                    let reason = match own {
                        Ok(caller) => {
                            format!("{not_admin}; your principal is `{}`", caller.principal)
                        }
                        Err(refused) => format!("{not_admin}; {refused}"),
                    };
                    ApiError::Forbidden { reason }
                })?;
            Caller {
                principal: body.principal,
                uid: 0,
                gid: 0,
                pid: 0,
            }
        }
    };
    let (decision, steps) = shared.admission.explain(&caller, &body.argv);
    let answer = match decision {
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
    Ok(reply(StatusCode::OK, answer))
}
