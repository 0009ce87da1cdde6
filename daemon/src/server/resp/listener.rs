//! The RESP listener: accepts connections and runs one [`session`] task for each, in its span.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tollgate_lanes::turn_clock::Turns;
use tracing::Instrument;

use super::front::FrontDoor;
use super::session;
use crate::server::socket;

/// Accepts clients until `stop`, then waits for every session to answer what it already read.
pub async fn serve(listener: UnixListener, front: Arc<FrontDoor>, stop: CancellationToken) {
    let sessions = TaskTracker::new();
    let mut acceptor = socket::Acceptor::new(listener, "resp");
    while let Some(stream) = acceptor.accept_until(&stop).await {
        let id = front.next_client_id.fetch_add(1, Ordering::Relaxed);
        // Every line a session logs names its client, and once known its peer and principal.
        let span = tracing::info_span!(
            "resp",
            client = id,
            uid = tracing::field::Empty,
            pid = tracing::field::Empty,
            principal = tracing::field::Empty
        );
        // Boxed: the session's future is about 10 KiB, and unboxed it was copied three times per
        // connection (into the task cell, its stage, out again): ~30,000 instructions a client.
        let session = Box::pin(session::run(stream, front.clone(), stop.clone(), id));
        // Each poll of a session is one turn of its clock: the commands it queues then share one
        // reading (tollgate_lanes::turn_clock).
        sessions.spawn(Turns::new(session).instrument(span));
    }
    sessions.close();
    sessions.wait().await;
}
