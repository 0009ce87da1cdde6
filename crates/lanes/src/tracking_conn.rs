//! A RESP3 connection of the REGULAR lane's user with `CLIENT TRACKING` on, as the near cache
//! (default mode, its fills read on it: `cache/tracking.rs`) and the invalidation feed (BCAST:
//! `invalidations.rs`) open theirs, and why one could not be opened or was lost.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tollgate_model::Protocol;
use tollgate_resp::ProtocolError;

use crate::conn::{hello, Conn, ConnError};
use crate::connector::{Connector, DialError};

/// Why a tracking connection could not be opened or was lost.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Lost {
    #[error(transparent)]
    Dial(#[from] DialError),
    #[error("{0}")]
    Conn(#[from] ConnError),
    #[error("redis refused `{command}`: {reply}")]
    Refused {
        command: &'static str,
        reply: String,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
    #[error("connection closed by redis")]
    Eof,
    #[error("a reply arrived that no read asked for")]
    OutOfStep,
    #[error("the master moved (Sentinel): the old one's values may lag the new one's")]
    Moved,
    #[error("no reply within {0:?}")]
    Timeout(Duration),
}

/// A connection named `name` (`CLIENT LIST` on Redis), speaking RESP3, after `tracking`
/// (`CLIENT TRACKING ON …`, `what` naming it in an error) was accepted.
pub(crate) async fn open(
    connector: &Connector,
    name: &str,
    what: &'static str,
    tracking: &[&[u8]],
) -> Result<Conn, Lost> {
    let mut conn = connector.connect(Protocol::Resp3).await?;
    let setup: [(&'static str, Bytes); 2] = [
        ("HELLO", hello(None, Some(name), Protocol::Resp3)),
        (what, command(tracking)),
    ];
    for (command, bytes) in setup {
        let reply = conn.call(&bytes).await?;
        if reply.is_error() {
            return Err(Lost::Refused {
                command,
                reply: String::from_utf8_lossy(reply.bytes()).trim().to_owned(),
            });
        }
    }
    Ok(conn)
}

/// `argv` as a RESP command.
pub(crate) fn command(argv: &[&[u8]]) -> Bytes {
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(argv, &mut out);
    out.freeze()
}
