//! The Redis-protocol front door: any Redis client on the RESP Unix socket. Each connection is a
//! [`session`]; every command it sends is admitted by the policy, then travels on its lane.

mod amend;
mod budget;
mod clients;
mod deadline;
mod keyspace;
mod lease;
mod lease_watch;
mod local;
mod monitor;
mod pending;
mod queued;
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

use self::clients::Clients;
use self::monitor::Monitors;
use crate::config::RespConfig;
use crate::server::identity::Identities;
use crate::server::limits::ConnectionLimits;
use crate::server::socket;

/// Where the front door sends an admitted command, by its canonical name (`CLIENT|SETNAME`) and
/// the lane admission named: the lane-ACL derivation asks this rather than knowing the routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The daemon answers it itself; it never reaches Redis.
    Answered,
    /// On the lane's shared subscriber connection (SUBSCRIBE and the like); never in a transaction.
    Subscription,
    /// On this lane's connections, or on the TRANSACTION connection while the session holds one.
    Lane(tollgate_lanes::Lane),
    /// A whole-keyspace command: never sent as it is; the daemon serves it with these commands
    /// on REGULAR (see `keyspace.rs`), and refuses it inside a transaction.
    ServedWith(&'static [&'static str]),
}

impl Route {
    pub fn of(name: &str, admitted_on: tollgate_lanes::Lane) -> Route {
        use tollgate_lanes::Lane;
        let (command, sub) = match name.split_once('|') {
            Some((command, sub)) => (command, Some(sub.as_bytes())),
            None => (name, None),
        };
        if let Some(whole) = keyspace::Whole::of(name) {
            return Route::ServedWith(whole.served_with());
        }
        match local::Local::of(command.as_bytes(), sub) {
            // Forwarded to its lane once admitted (and answered locally where Redis refuses).
            Some(local::Local::ConfigGet) => {}
            Some(_) => return Route::Answered,
            None => {}
        }
        if session::subscription_command(command.as_bytes()).is_some() {
            return Route::Subscription;
        }
        Route::Lane(match admitted_on {
            // PUBLISH and the PUBSUB introspection commands are ordinary requests.
            Lane::Pubsub => Lane::Regular,
            lane => lane,
        })
    }
}

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
    deadlines: deadline::Deadlines,
    limits: Limits,
    /// Every client's held bytes together (`resp.budgets.total`).
    pool: Arc<budget::Pool>,
    next_client_id: AtomicU64,
    /// The live sessions, as `CLIENT LIST` shows them.
    clients: Arc<Clients>,
    /// Sessions in `MONITOR`, and the stream of commands they see.
    monitors: Arc<Monitors>,
    /// The socket's path, which `CLIENT LIST` shows as each session's address.
    socket: String,
}

impl FrontDoor {
    pub fn new(
        admission: Admission,
        identities: Identities,
        lanes: Lanes,
        leases: LeaseService,
        config: RespConfig,
        connections: ConnectionLimits,
        socket: String,
    ) -> Self {
        Self {
            admission,
            identities,
            lanes,
            leases,
            connections,
            limits: config.limits(),
            deadlines: deadline::Deadlines::new(config.command_timeout, &config.command_deadlines),
            pool: budget::Pool::new(&config.budgets),
            config,
            next_client_id: AtomicU64::new(1),
            clients: Arc::default(),
            monitors: Arc::default(),
            socket,
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
