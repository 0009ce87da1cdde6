//! The HTTP/JSON API on a Unix socket (hyper, HTTP/1.1): the router and the pieces every handler
//! shares — who is calling, JSON replies that always carry `outcome`, bounded JSON request bodies,
//! and errors.
//!
//! Each area of the API has its own module with a `handle` function; `route` only dispatches.

mod body;
mod cache;
mod health;
mod lanes;
mod leases;
mod policy;
mod principals;
mod status;
mod waits;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use body::{decode_json, json, read_json, text, ApiError, BODY_LIMIT};

use tollgate_model::Caller;

use crate::config::LimitsConfig;
use crate::server::limits::{ConnectionLimits, TooMany};
use crate::server::peer::{self, PeerCredentials};
use crate::server::socket;
use crate::services::Services;

/// Boxed so that a handler may stream (the lease events); JSON replies are one full chunk.
pub type HttpResponse = Response<UnsyncBoxBody<Bytes, Infallible>>;

/// Serves HTTP on `listener` until `stop` is cancelled, then lets in-flight requests finish.
/// A connection past `limits:` is answered 503 to its request, then closed; a client that takes
/// longer than `limits.http_header_timeout` to send a request's headers, or leaves its connection
/// idle for `limits.http_idle_timeout`, is disconnected ([`waits`]).
pub async fn serve(
    listener: UnixListener,
    shared: Arc<Services>,
    limits: &LimitsConfig,
    stop: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    let connections = ConnectionLimits::new(limits, "http");
    let waits = waits::Waits::new(limits);
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The deadline is the connection's own timer's to set; any value switches the timer on.
    builder.header_read_timeout(waits.idle);
    let mut acceptor = socket::Acceptor::new(listener, "http");
    while let Some(stream) = acceptor.accept_until(&stop).await {
        // Who is calling: read once per connection, handed to every request on it.
        let Ok(peer) = peer::peer_credentials(&stream) else {
            tracing::warn!("cannot read an HTTP peer's credentials; closing");
            continue;
        };
        let permit = match connections.admit(peer, &shared.identities) {
            Ok(permit) => permit,
            Err(too_many) => {
                tokio::spawn(turn_away(builder.clone(), stream, waits, too_many));
                continue;
            }
        };
        let (stream, timer) = waits::watch(stream, waits);
        let shared = shared.clone();
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            let shared = shared.clone();
            request.extensions_mut().insert(peer);
            let span = request_span(&request, peer, &shared);
            async move { Ok::<_, Infallible>(route(request, &shared).await) }.instrument(span)
        });
        let connection = builder
            .clone()
            .timer(timer)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "HTTP connection ended with an error");
            }
            drop(permit);
        });
    }
    graceful.shutdown().await;
}

/// Answers the one request of a connection past a limit with 503, then closes it.
async fn turn_away(
    mut builder: hyper::server::conn::http1::Builder,
    stream: tokio::net::UnixStream,
    waits: waits::Waits,
    too_many: TooMany,
) {
    let (stream, timer) = waits::watch(stream, waits);
    let service = hyper::service::service_fn(move |_request: Request<Incoming>| {
        let response = ApiError::Unavailable {
            reason: too_many.to_string(),
            retry_after_secs: 1,
        }
        .into_response();
        async move { Ok::<_, Infallible>(response) }
    });
    let connection = builder
        .keep_alive(false)
        .timer(timer)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(error) = connection.await {
        tracing::debug!(%error, "turned-away HTTP connection ended with an error");
    }
}

async fn route(request: Request<Incoming>, shared: &Services) -> HttpResponse {
    let path = request.uri().path().to_owned();
    let outcome = match path.as_str() {
        "/healthz" | "/readyz" | "/metrics" => health::handle(request, shared).await,
        "/v1/lanes" => lanes::handle(request, shared).await,
        "/v1/status" => status::handle(request, shared).await,
        "/v1/principals" => principals::handle(request, shared).await,
        "/v1/cache" => cache::handle(request, shared).await,
        leases if leases.starts_with("/v1/leases/") => leases::handle(request, shared).await,
        policy if policy.starts_with("/v1/policy") => policy::handle(request, shared).await,
        _ => Err(ApiError::NotFound(path)),
    };
    outcome.unwrap_or_else(ApiError::into_response)
}

/// Every line logged while a request is served names who sent it and what it asked for.
fn request_span(
    request: &Request<Incoming>,
    peer: PeerCredentials,
    shared: &Services,
) -> tracing::Span {
    let principal = shared
        .identities
        .caller(peer)
        .map(|caller| caller.principal)
        .unwrap_or_default();
    tracing::info_span!(
        "http",
        method = %request.method(),
        path = %request.uri().path(),
        uid = peer.uid,
        pid = peer.pid,
        principal = %principal
    )
}

/// 405 for anything but a `GET` (the read-only endpoints).
fn only_get(request: &Request<Incoming>) -> Result<(), ApiError> {
    if request.method() != hyper::Method::GET {
        return Err(ApiError::MethodNotAllowed {
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
        });
    }
    Ok(())
}

/// The kernel's credentials of the connection this request came on.
fn peer_of(request: &Request<Incoming>) -> Result<PeerCredentials, ApiError> {
    request
        .extensions()
        .get::<PeerCredentials>()
        .copied()
        .ok_or_else(|| ApiError::Internal("peer credentials missing".into()))
}

/// The caller behind the request, as every listener derives it; 403 for a refused peer.
fn caller_of(request: &Request<Incoming>, shared: &Services) -> Result<Caller, ApiError> {
    shared
        .identities
        .caller(peer_of(request)?)
        .map_err(|refused| ApiError::Forbidden {
            reason: refused.to_string(),
        })
}

/// Refuses (403) a request whose peer is not one of the daemon's administrators; `doing` says
/// what it asked for, in the refusal.
fn admin_only(request: &Request<Incoming>, shared: &Services, doing: &str) -> Result<(), ApiError> {
    shared
        .identities
        .admin(peer_of(request)?, doing)
        .map_err(|not_admin| ApiError::Forbidden {
            reason: not_admin.to_string(),
        })
}

/// A JSON reply with the given status.
pub fn reply(status: StatusCode, body: serde_json::Value) -> HttpResponse {
    json(status, &body)
}
