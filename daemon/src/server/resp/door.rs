//! Whether a connection gets a session: its peer's credentials, its place under `limits:`, its
//! principal. A peer past a cap, or one the identity map refuses, is answered with one error, then
//! closed, so that its client reads why.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use tollgate_model::Caller;

use super::clients::Registration;
use super::front::FrontDoor;
use super::replies;
use crate::server::identity::Refused;
use crate::server::limits::{Permit, TooMany};
use crate::server::peer::peer_credentials;

/// How long a connection turned away for a limit is drained before it is closed.
const TURN_AWAY_DRAIN: Duration = Duration::from_secs(1);
/// How long a refused peer is waited for to send its first command, which the refusal answers.
const REFUSED_WAIT: Duration = Duration::from_secs(5);
/// How much of that first command is read.
const FIRST_READ: usize = 16 * 1024;

/// A connection let in.
pub struct Entered {
    /// Held for the session's life: its place under `limits:`.
    pub permit: Permit,
    pub caller: Caller,
    /// The session in the listener's list (`CLIENT LIST`).
    pub me: Registration,
}

/// Lets `stream`'s peer in as client `id`, or answers why not and closes the connection.
pub async fn enter(
    stream: UnixStream,
    front: &FrontDoor,
    stop: &CancellationToken,
    id: u64,
) -> Option<(UnixStream, Entered)> {
    let peer = match peer_credentials(&stream) {
        Ok(peer) => peer,
        Err(error) => {
            tracing::warn!(%error, "cannot read peer credentials; closing");
            return None;
        }
    };
    let permit = match front.connections.admit(peer, &front.services.identities) {
        Ok(permit) => permit,
        Err(too_many) => {
            turn_away(stream, &too_many).await;
            return None;
        }
    };
    let span = tracing::Span::current();
    span.record("uid", peer.uid).record("pid", peer.pid);
    let caller = match front.services.identities.caller(peer) {
        Ok(caller) => caller,
        Err(refused) => {
            refuse(stream, &refused, stop).await;
            return None;
        }
    };
    span.record("principal", tracing::field::display(&caller.principal));
    let admin = front.services.identities.admin(peer, "").is_ok();
    let me = front.clients.register(id, &caller, admin, &front.socket);
    Some((stream, Entered { permit, caller, me }))
}

/// Answers a refused peer with `-NOPERM` naming why, then closes. The refusal waits (boundedly) for
/// the first command so that the client reads it as that command's reply rather than finding the
/// connection closed before it could send.
async fn refuse(mut stream: UnixStream, refused: &Refused, stop: &CancellationToken) {
    tracing::warn!(
        uid = refused.uid,
        gid = refused.gid,
        "refusing an unmapped peer"
    );
    let mut first = BytesMut::with_capacity(FIRST_READ);
    tokio::select! {
        _ = tokio::time::timeout(REFUSED_WAIT, stream.read_buf(&mut first)) => {}
        () = stop.cancelled() => {}
    }
    let reply = replies::error(format!("NOPERM tollgate: {refused}"));
    // The peer may be gone already; there is nothing else to tell it.
    let _ = stream.write_all(&reply).await;
    let _ = stream.shutdown().await;
}

/// Answers a connection past a cap of `limits:` with an error, at once (like Redis past its
/// `maxclients`), then closes it. What the client sent meanwhile is read and dropped for a moment,
/// so that the close does not reset the connection before the client reads the error.
async fn turn_away(mut stream: UnixStream, too_many: &TooMany) {
    let reply = replies::error(format!("ERR tollgate: {too_many}"));
    // The peer may be gone already; there is nothing else to tell it.
    let _ = stream.write_all(&reply).await;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(TURN_AWAY_DRAIN, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}
