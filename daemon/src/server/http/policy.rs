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

use super::{admin_only, caller_of, peer_of, read_json, reply, ApiError, HttpResponse};
use crate::reload::{ReloadError, Trigger};
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
            serde_json::json!({
                "outcome": "ok",
                "generation": shared.admission.generation(),
                "loaded_at": humantime::format_rfc3339_seconds(shared.reloader.loaded_at()).to_string(),
            }),
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
    admin_only(&request, shared, "reloading the policy")?;
    // The same reload as SIGHUP's: one throttle, one lock, one order of steps (crate::reload).
    Ok(match shared.reloader.reload(Trigger::Http).await {
        Ok(generation) => reply(
            StatusCode::OK,
            serde_json::json!({ "outcome": "reloaded", "generation": generation }),
        ),
        Err(refused @ ReloadError::Throttled { throttled, .. }) => {
            return Err(ApiError::RateLimited {
                reason: refused.to_string(),
                retry_after_secs: throttled.retry_after_secs(),
            })
        }
        Err(ReloadError::Failed(reason)) => return Err(ApiError::Internal(reason)),
        Err(ReloadError::Rejected(error)) => {
            let errors: Vec<String> = match &error {
                PolicyError::Compile(diagnostics) => {
                    diagnostics.iter().map(ToString::to_string).collect()
                }
                PolicyError::SelfTest(failures) => failures.clone(),
                PolicyError::Invariants(checked) => checked
                    .iter()
                    .filter(|c| !c.holds())
                    .map(ToString::to_string)
                    .collect(),
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
            "outcome": "admitted", "rule": &*rule, "lane": lane, "descriptor": *descriptor, "steps": steps,
        }),
        Decision::Denied(denial) => serde_json::json!({
            "outcome": "denied", "denial": denial, "steps": steps,
        }),
    };
    Ok(reply(StatusCode::OK, answer))
}
