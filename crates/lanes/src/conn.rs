//! One connection to Redis used by one party at a time: write a command, read exactly one reply frame.
//! It counts itself open while it lives and closed exactly once when dropped.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_model::Protocol;
use tollgate_resp::ProtocolError;

use crate::metrics::LaneMetrics;
use crate::reply::{reply_limits, Next, Reply, ReplyReader};
use crate::stream::{Probe, Stream};

pub(crate) struct Conn {
    stream: Stream,
    read: BytesMut,
    /// Where measuring the reply being read stopped, so a large reply is scanned once.
    replies: ReplyReader,
    /// Which master (see `Locator`) the connection was opened to, and where it is.
    generation: u64,
    endpoint: crate::Endpoint,
    protocol: Protocol,
    _tracked: Tracked,
}

/// Counts a connection in `lane_connections_open` while it lives.
pub(crate) struct Tracked(LaneMetrics);

impl Tracked {
    fn new(metrics: &LaneMetrics) -> Self {
        metrics.opened.inc();
        metrics.open.inc();
        Tracked(metrics.clone())
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.open.dec();
        self.0.closed.inc();
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Protocol(#[from] tollgate_resp::ProtocolError),
    #[error("connection closed by redis")]
    Eof,
    /// Redis answered the daemon's own command with an error.
    #[error("redis refused: {0}")]
    Refused(String),
}

impl Conn {
    pub(crate) fn new(
        stream: Stream,
        metrics: &LaneMetrics,
        generation: u64,
        endpoint: crate::Endpoint,
        protocol: Protocol,
    ) -> Self {
        Conn {
            stream,
            read: BytesMut::with_capacity(4096),
            replies: ReplyReader::new(reply_limits()),
            generation,
            endpoint,
            protocol,
            _tracked: Tracked::new(metrics),
        }
    }

    /// Writes `command` and reads its reply. Dropping the future midway leaves the connection out of
    /// step; the owner must then discard it (see `Borrowed`).
    pub(crate) async fn call(&mut self, command: &[u8]) -> Result<Reply, ConnError> {
        self.write(command).await?;
        self.read_reply().await
    }

    /// Writes `command` without reading its reply (the owner reads it later, in order).
    pub(crate) async fn write(&mut self, command: &[u8]) -> Result<(), ConnError> {
        Ok(self.stream.write_all(command).await?)
    }

    /// The next reply on the connection.
    pub(crate) async fn read_reply(&mut self) -> Result<Reply, ConnError> {
        loop {
            match self.replies.next(&mut self.read)? {
                Some(Next::Reply(reply)) => return Ok(reply),
                // Fails this connection's one borrower, who then drops the connection.
                Some(Next::TooLarge { limit }) => {
                    return Err(ProtocolError::FrameTooLarge { limit }.into())
                }
                None => {}
            }
            if self.stream.read_buf(&mut self.read).await? == 0 {
                return Err(ConnError::Eof);
            }
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// A span for the connection's life, naming its node: a driver runs each connection it opens
    /// in one, so its lines name the node it is on now (a field recorded on the driver's own
    /// long-lived span is appended again at every reconnect by the log formatter).
    pub(crate) fn span(&self) -> tracing::Span {
        tracing::info_span!("conn", node = %self.endpoint)
    }

    pub(crate) fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Makes the connection speak `protocol` (`HELLO 2|3`, which keeps its user and name).
    pub(crate) async fn switch(&mut self, protocol: Protocol) -> Result<(), ConnError> {
        let hello = hello(None, None, protocol);
        let reply = self.call(&hello).await?;
        if reply.is_error() {
            let text = String::from_utf8_lossy(reply.bytes()).trim().to_owned();
            return Err(ConnError::Refused(text));
        }
        self.protocol = protocol;
        Ok(())
    }

    /// Whether an idle connection can be lent again.
    pub(crate) fn probe(&self) -> Probe {
        if self.read.is_empty() {
            self.stream.probe()
        } else {
            Probe::Unexpected
        }
    }

    /// The stream, any bytes already read, and the open-count guard, for the multiplexed driver.
    pub(crate) fn into_parts(self) -> (Stream, BytesMut, Tracked) {
        (self.stream, self.read, self._tracked)
    }
}

/// `HELLO 2|3 [AUTH user password] [SETNAME tollgate-<lane>]`: one round trip to authenticate, set
/// the protocol of the clients the connection serves, and name the connection so `CLIENT LIST`
/// shows whose it is.
pub(crate) fn hello(user: Option<(&str, &str)>, name: Option<&str>, protocol: Protocol) -> Bytes {
    let mut argv: Vec<&[u8]> = vec![b"HELLO", protocol.version().as_bytes()];
    if let Some((user, password)) = user {
        argv.extend([b"AUTH".as_slice(), user.as_bytes(), password.as_bytes()]);
    }
    if let Some(name) = name {
        argv.extend([b"SETNAME".as_slice(), name.as_bytes()]);
    }
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(&argv, &mut out);
    out.freeze()
}
