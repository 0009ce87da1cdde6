//! The HTTP/JSON API on a Unix socket (hyper, HTTP/1.1): the router and the pieces every handler
//! shares — who is calling, JSON replies that always carry `outcome`, bounded JSON request bodies,
//! and errors.
//!
//! Each area of the API has its own module with a `handle` function; `route` only dispatches.

mod body;
mod health;
mod lanes;
mod leases;
mod policy;
mod throttle;

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

pub use body::{json, read_json, text, ApiError, BODY_LIMIT};
pub use throttle::Throttle;

use tollgate_model::Caller;

use crate::runtime::Shared;
use crate::server::peer::{self, PeerCredentials};
use crate::server::socket;

/// Boxed so that a handler may stream (the lease events); JSON replies are one full chunk.
pub type HttpResponse = Response<UnsyncBoxBody<Bytes, Infallible>>;

/// Serves HTTP on `listener` until `stop` is cancelled, then lets in-flight requests finish.
pub async fn serve(listener: UnixListener, shared: Arc<Shared>, stop: CancellationToken) {
    let graceful = GracefulShutdown::new();
    while let Some(stream) = socket::accept_until(&listener, &stop, "http").await {
        let shared = shared.clone();
        // Who is calling: read once per connection, handed to every request on it.
        let peer = peer::peer_credentials(&stream).ok();
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            let shared = shared.clone();
            if let Some(peer) = peer {
                request.extensions_mut().insert(peer);
            }
            async move { Ok::<_, Infallible>(route(request, &shared).await) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "HTTP connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
}

async fn route(request: Request<Incoming>, shared: &Shared) -> HttpResponse {
    let path = request.uri().path().to_owned();
    let outcome = match path.as_str() {
        "/healthz" | "/readyz" | "/metrics" => health::handle(request, shared).await,
        "/v1/lanes" => lanes::handle(request, shared).await,
        leases if leases.starts_with("/v1/leases/") => leases::handle(request, shared).await,
        policy if policy.starts_with("/v1/policy") => policy::handle(request, shared).await,
        _ => Err(ApiError::NotFound(path)),
    };
    outcome.unwrap_or_else(ApiError::into_response)
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
fn caller_of(request: &Request<Incoming>, shared: &Shared) -> Result<Caller, ApiError> {
    shared
        .identities
        .caller(peer_of(request)?)
        .map_err(|refused| ApiError::Forbidden {
            reason: refused.to_string(),
        })
}

/// A JSON reply with the given status.
pub fn reply(status: StatusCode, body: serde_json::Value) -> HttpResponse {
    json(status, &body)
}
