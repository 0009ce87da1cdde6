//! The Redis-protocol front door: any Redis client on the RESP Unix socket. Each connection is a
//! [`session`]; every command it sends is admitted by the policy, then travels on its lane.

mod deadline;
mod lease;
mod local;
mod pending;
mod replies;
mod session;
mod subscriptions;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tollgate_lanes::Lanes;
use tollgate_lease::LeaseService;
use tollgate_policy::Admission;
use tollgate_resp::Limits;

use crate::config::RespConfig;
use crate::server::identity::Identities;
use crate::server::limits::ConnectionLimits;
use crate::server::socket;

/// What every session shares.
pub struct FrontDoor {
    pub admission: Admission,
    pub identities: Identities,
    pub lanes: Lanes,
    /// `LEASE …` commands are served by the same lease service as the HTTP API.
    pub leases: LeaseService,
    /// How many connections this listener holds (`limits:`).
    connections: ConnectionLimits,
    config: RespConfig,
    limits: Limits,
    next_client_id: AtomicU64,
}

impl FrontDoor {
    pub fn new(
        admission: Admission,
        identities: Identities,
        lanes: Lanes,
        leases: LeaseService,
        config: RespConfig,
        connections: ConnectionLimits,
    ) -> Self {
        Self {
            admission,
            identities,
            lanes,
            leases,
            connections,
            limits: config.limits(),
            config,
            next_client_id: AtomicU64::new(1),
        }
    }
}

/// Accepts clients until `stop`, then waits for every session to answer what it already read.
pub async fn serve(listener: UnixListener, front: Arc<FrontDoor>, stop: CancellationToken) {
    let sessions = TaskTracker::new();
    let mut acceptor = socket::Acceptor::new(listener, "resp");
    while let Some(stream) = acceptor.accept_until(&stop).await {
        let id = front.next_client_id.fetch_add(1, Ordering::Relaxed);
        sessions.spawn(session::run(stream, front.clone(), stop.clone(), id));
    }
    sessions.close();
    sessions.wait().await;
}

/// A command from its words, for unit tests.
#[cfg(test)]
fn argv(words: &str) -> Vec<&[u8]> {
    words.split_whitespace().map(str::as_bytes).collect()
}
