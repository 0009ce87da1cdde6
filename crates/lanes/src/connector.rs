//! Opens connections for one lane: dial, check who the server runs as when that is known (the
//! embedded server), authenticate as the lane's ACL user, and after a failure
//! refuse further attempts for an exponentially growing, jittered pause so that a Redis outage makes
//! callers fail fast with `Unavailable` instead of piling up connection attempts.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use rand::Rng;
use tokio::time::Instant;
use tollgate_model::Protocol;

use crate::conn::{hello, Conn, ConnError};
pub(crate) use crate::credentials::Credentials;
use crate::locator::{Locator, NoMaster};
use crate::metrics::LaneMetrics;
use crate::stream::{Stream, UntrustedServer};
use crate::Endpoint;

/// How long one connection attempt (dial plus HELLO) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// First pause after a failure; it doubles per consecutive failure up to `MAX_BACKOFF`.
const BASE_BACKOFF: Duration = Duration::from_millis(25);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Why a lane could not open a connection. Nothing was sent on it, so whatever waited for it may
/// be refused as "not sent".
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error(transparent)]
    NoMaster(#[from] NoMaster),
    /// The last attempt failed and the pause before the next one has not passed.
    #[error("{last} (next attempt in {retry_in:?})")]
    BackingOff { last: String, retry_in: Duration },
    #[error("redis at {endpoint}: {failure}")]
    Failed {
        endpoint: Endpoint,
        failure: DialFailure,
    },
}

/// What went wrong with one attempt to open a connection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialFailure {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Untrusted(#[from] UntrustedServer),
    #[error("{0}")]
    Handshake(#[from] ConnError),
    #[error("no answer within {CONNECT_TIMEOUT:?}")]
    Timeout,
    #[error("HELLO refused: {0}")]
    HelloRefused(String),
    #[error("SELECT refused: {0}")]
    SelectRefused(String),
}

pub(crate) struct Connector {
    locator: Arc<Locator>,
    /// The handshake per protocol, in [`Protocol::index`] order.
    hello: [Bytes; 2],
    /// `AUTH <user> <password>` of the lane's own user: what a lent connection that acted as
    /// another user sends to come back as the lane's (`None`: the lane logs in as no one, so it
    /// cannot come back, and is closed).
    reauth: Option<Bytes>,
    /// `SELECT <database>` after the handshake, for connections outside database 0.
    select: Option<Bytes>,
    /// The uid the server must run as; `None` for a server the daemon did not start.
    server_uid: Option<u32>,
    backoff: Mutex<Backoff>,
    metrics: LaneMetrics,
    /// What the server said of itself in its last handshake.
    identity: Mutex<Option<ServerIdentity>>,
}

/// What Redis says of itself in its `HELLO` reply, which the daemon's own `HELLO` repeats (client
/// libraries pick features by it: redis-py's client-side cache wants `redis` 7.4 or later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    pub server: String,
    pub version: String,
}

impl ServerIdentity {
    /// `server` and `version` of a `HELLO` reply (a map, or its pairs in an array in RESP2).
    fn of_hello(reply: &[u8]) -> Option<ServerIdentity> {
        let mut bytes = bytes::BytesMut::from(reply);
        let frame = tollgate_resp::parse(&mut bytes, &tollgate_resp::Limits::default()).ok()??;
        let pairs: Vec<(tollgate_resp::Frame, tollgate_resp::Frame)> = match frame {
            tollgate_resp::Frame::Map(pairs) => pairs,
            tollgate_resp::Frame::Array(items) => {
                let mut items = items.into_iter();
                std::iter::from_fn(|| Some((items.next()?, items.next()?))).collect()
            }
            _ => return None,
        };
        let field = |name: &str| {
            pairs.iter().find_map(|(key, value)| {
                let key = key.as_bytes()?;
                if !key.eq_ignore_ascii_case(name.as_bytes()) {
                    return None;
                }
                Some(String::from_utf8_lossy(value.as_bytes()?).into_owned())
            })
        };
        Some(ServerIdentity {
            server: field("server")?,
            version: field("version")?,
        })
    }
}

#[derive(Default)]
struct Backoff {
    failures: u32,
    retry_at: Option<Instant>,
    last_error: String,
    /// A connection was lost or an attempt failed since the last success: the next success is a reconnect.
    broken: bool,
}

impl Connector {
    /// A connector whose connections call themselves `name` (`CLIENT SETNAME`: `tollgate-<lane>`,
    /// so `CLIENT LIST` on Redis shows whose each connection is).
    pub(crate) fn new(
        name: &str,
        locator: Arc<Locator>,
        credentials: Option<Credentials>,
        database: Option<u32>,
        server_uid: Option<u32>,
        metrics: LaneMetrics,
    ) -> Self {
        let auth = credentials
            .as_ref()
            .map(|c| (c.user.as_str(), c.password.as_str()));
        Connector {
            locator,
            hello: Protocol::ALL.map(|protocol| hello(auth, Some(name), protocol)),
            reauth: auth.map(|(user, password)| {
                let mut out = bytes::BytesMut::new();
                tollgate_resp::encode_command(&["AUTH", user, password], &mut out);
                out.freeze()
            }),
            select: database.map(|database| {
                let mut out = bytes::BytesMut::new();
                tollgate_resp::encode_command(&["SELECT", &database.to_string()], &mut out);
                out.freeze()
            }),
            server_uid,
            backoff: Mutex::new(Backoff::default()),
            metrics,
            identity: Mutex::new(None),
        }
    }

    /// What the server said of itself in the last handshake, once there was one.
    pub(crate) fn identity(&self) -> Option<ServerIdentity> {
        self.identity.lock().clone()
    }

    /// `AUTH` as the lane's own user, for a connection that acted as another.
    pub(crate) fn reauth(&self) -> Option<Bytes> {
        self.reauth.clone()
    }

    /// A fresh, authenticated connection speaking `protocol`, or why there is none (not sent).
    pub(crate) async fn connect(&self, protocol: Protocol) -> Result<Conn, DialError> {
        {
            let backoff = self.backoff.lock();
            if let Some(retry_at) = backoff.retry_at.filter(|at| *at > Instant::now()) {
                return Err(DialError::BackingOff {
                    last: backoff.last_error.clone(),
                    retry_in: retry_at - Instant::now(),
                });
            }
        }
        let (endpoint, generation) = self.locator.current()?;
        let attempt =
            tokio::time::timeout(CONNECT_TIMEOUT, self.dial(&endpoint, generation, protocol)).await;
        let result = attempt.unwrap_or(Err(DialFailure::Timeout));
        let mut backoff = self.backoff.lock();
        match result {
            Ok(conn) => {
                if backoff.broken {
                    tracing::info!("reconnected to redis");
                    self.metrics.reconnects.inc();
                }
                *backoff = Backoff::default();
                Ok(conn)
            }
            Err(failure) => {
                let error = DialError::Failed { endpoint, failure };
                tracing::warn!(%error, "cannot connect");
                backoff.failures = backoff.failures.saturating_add(1);
                backoff.broken = true;
                let pause = BASE_BACKOFF
                    .saturating_mul(1 << backoff.failures.min(16))
                    .min(MAX_BACKOFF);
                // Jitter keeps many lanes (and daemons) from retrying in lockstep.
                let pause = pause.mul_f64(rand::rng().random_range(0.5..=1.0));
                backoff.retry_at = Some(Instant::now() + pause);
                backoff.last_error = error.to_string();
                Err(error)
            }
        }
    }

    /// Why connections are being refused right now, during a backoff pause after a failure.
    pub(crate) fn outage(&self) -> Option<String> {
        let backoff = self.backoff.lock();
        backoff
            .retry_at
            .filter(|at| *at > Instant::now())
            .map(|_| backoff.last_error.clone())
    }

    /// Whether `conn` goes to the server that is master now.
    pub(crate) fn is_current(&self, conn: &Conn) -> bool {
        conn.generation() == self.locator.generation()
    }

    /// The master refused a write as a replica does (`-READONLY`): where it is is asked again now.
    pub(crate) fn refused_write(&self) {
        self.locator.refused_write();
    }

    /// Resolves once the master has moved away from the one of `generation`.
    pub(crate) async fn moved(&self, generation: u64) {
        self.locator.moved(generation).await
    }

    /// Notes that an established connection broke, so the next success counts as a reconnect.
    pub(crate) fn note_lost(&self) {
        self.backoff.lock().broken = true;
    }

    async fn dial(
        &self,
        endpoint: &crate::Endpoint,
        generation: u64,
        protocol: Protocol,
    ) -> Result<Conn, DialFailure> {
        let stream = Stream::connect(endpoint).await?;
        if let Some(uid) = self.server_uid {
            stream.check_server_uid(uid)?;
        }
        let mut conn = Conn::new(
            stream,
            &self.metrics,
            generation,
            endpoint.clone(),
            protocol,
        );
        let reply = conn.call(&self.hello[protocol.index()]).await?;
        if reply.is_error() {
            return Err(DialFailure::HelloRefused(error_text(&reply)));
        }
        if let Some(identity) = ServerIdentity::of_hello(reply.bytes()) {
            *self.identity.lock() = Some(identity);
        }
        if let Some(select) = &self.select {
            let reply = conn.call(select).await?;
            if reply.is_error() {
                return Err(DialFailure::SelectRefused(error_text(&reply)));
            }
        }
        Ok(conn)
    }
}

fn error_text(reply: &crate::Reply) -> String {
    let text = String::from_utf8_lossy(reply.bytes().trim_ascii_end()).into_owned();
    text.trim_start_matches('-').to_owned()
}

#[cfg(test)]
mod identity_tests {
    use super::ServerIdentity;

    #[test]
    fn a_hello_reply_names_its_server_and_version_in_either_protocol() {
        let resp3 = b"%3\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n$5\r\nproto\r\n:3\r\n";
        let resp2 = b"*4\r\n$6\r\nserver\r\n$6\r\nvalkey\r\n$7\r\nversion\r\n$5\r\n8.1.0\r\n";
        let identity = |server: &str, version: &str| ServerIdentity {
            server: server.into(),
            version: version.into(),
        };
        assert_eq!(
            ServerIdentity::of_hello(resp3),
            Some(identity("redis", "7.0.15"))
        );
        assert_eq!(
            ServerIdentity::of_hello(resp2),
            Some(identity("valkey", "8.1.0"))
        );
        assert_eq!(ServerIdentity::of_hello(b"+OK\r\n"), None);
    }
}
