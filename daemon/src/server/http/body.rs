//! JSON in and out: request bodies are capped and strictly typed, replies always carry `outcome`,
//! and every error becomes a JSON body with the right status.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::HttpResponse;
use crate::quotas::Throttled;

/// The largest request body the API reads.
pub const BODY_LIMIT: usize = 64 * 1024;

/// Why a request could not be served; each maps to a status and a JSON body.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("no such endpoint: {0}")]
    NotFound(String),
    #[error("method {method} not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("request body larger than {BODY_LIMIT} bytes")]
    BodyTooLarge,
    #[error("invalid request body: {message}")]
    BadRequest {
        /// The offending field, when one can be named.
        field: Option<String>,
        message: String,
    },
    /// The policy refused the caller (a rule denied it, or none allowed it).
    #[error("rule {rule} denies this: {reason}")]
    Denied { rule: String, reason: String },
    /// Not the policy but who the caller is: an unmapped peer under `identity.unmapped: refuse`,
    /// or a non-administrator asking for an administrator's endpoint.
    #[error("{reason}")]
    Forbidden { reason: String },
    /// Asked again too soon (a policy reload within `admin.reload_interval`).
    #[error("{reason}")]
    RateLimited {
        reason: String,
        retry_after_secs: u64,
    },
    #[error("{reason}")]
    Unavailable {
        reason: String,
        retry_after_secs: u64,
    },
    /// Past a rate of one of the policy's quotas.
    #[error("{0}")]
    Throttled(Throttled),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Denied { .. } | ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::RateLimited { .. } | ApiError::Throttled(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn outcome(&self) -> &'static str {
        match self {
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::BodyTooLarge => "body_too_large",
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::Denied { .. } => "denied",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::Throttled(_) => "throttled",
            ApiError::Unavailable { .. } => "unavailable",
            ApiError::Internal(_) => "internal_error",
        }
    }

    pub fn into_response(self) -> HttpResponse {
        let mut body = serde_json::json!({ "outcome": self.outcome(), "error": self.to_string() });
        match &self {
            ApiError::BadRequest {
                field: Some(field), ..
            } => body["field"] = serde_json::Value::from(field.as_str()),
            ApiError::Denied { rule, .. } => body["rule"] = serde_json::Value::from(rule.as_str()),
            ApiError::Forbidden { reason } | ApiError::RateLimited { reason, .. } => {
                body["reason"] = serde_json::Value::from(reason.as_str());
            }
            ApiError::Throttled(throttled) => {
                body["quota"] = serde_json::Value::from(&*throttled.quota);
                body["limit"] = serde_json::Value::from(throttled.limit.as_str());
                body["retry_after_ms"] =
                    serde_json::Value::from(throttled.retry_ms().map(|ms| ms as u64));
            }
            _ => {}
        }
        let mut response = json(self.status(), &body);
        if let ApiError::Unavailable {
            retry_after_secs, ..
        }
        | ApiError::RateLimited {
            retry_after_secs, ..
        } = self
        {
            response
                .headers_mut()
                .insert(RETRY_AFTER, retry_after_secs.into());
        }
        // No `Retry-After` when no time can be promised (every held lease is kept alive).
        if let Some(secs) = match &self {
            ApiError::Throttled(throttled) => throttled.retry_after_secs(),
            _ => None,
        } {
            response.headers_mut().insert(RETRY_AFTER, secs.into());
        }
        response
    }
}

/// Serialises `body` as the JSON reply.
pub fn json<T: Serialize>(status: StatusCode, body: &T) -> HttpResponse {
    let bytes = serde_json::to_vec(body).expect("API replies always serialise");
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)).boxed_unsync())
        .expect("a static status and header always build a response")
}

/// Reads a JSON body of at most [`BODY_LIMIT`] bytes into `T`; unknown fields are rejected by `T`.
pub async fn read_json<T: DeserializeOwned>(request: Request<Incoming>) -> Result<T, ApiError> {
    let collected = Limited::new(request.into_body(), BODY_LIMIT)
        .collect()
        .await
        .map_err(|error| {
            if error.is::<http_body_util::LengthLimitError>() {
                ApiError::BodyTooLarge
            } else {
                ApiError::BadRequest {
                    field: None,
                    message: format!("cannot read body: {error}"),
                }
            }
        })?;
    decode_json(&collected.to_bytes())
}

/// Decodes a request body into `T`: a typed [`ApiError::BadRequest`] naming the offending field
/// for anything else, whatever the bytes (the fuzz suite feeds it hostile ones).
pub fn decode_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        let parent = (path != ".").then_some(path);
        let field = match (unknown_field(&inner), parent) {
            // serde_path_to_error already ends the path with the unknown field itself.
            (Some(name), Some(parent))
                if parent == name || parent.ends_with(&format!(".{name}")) =>
            {
                Some(parent)
            }
            (Some(name), Some(parent)) => Some(format!("{parent}.{name}")),
            (Some(name), None) => Some(name),
            (None, parent) => parent,
        };
        ApiError::BadRequest {
            field,
            message: inner.to_string(),
        }
    })
}

/// serde reports an unknown field at the parent's path; name the field itself.
fn unknown_field(error: &serde_json::Error) -> Option<String> {
    let message = error.to_string();
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest[..rest.find('`')?].to_owned())
}

/// A plain-text reply (Prometheus exposition).
pub fn text(status: StatusCode, content_type: &'static str, body: String) -> HttpResponse {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)).boxed_unsync())
        .expect("a static status and header always build a response")
}
