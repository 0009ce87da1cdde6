//! A byte stream to Redis over a Unix socket or TCP, with a non-blocking liveness probe for idle
//! connections and, over a Unix socket, the kernel's word on which uid the server runs as.

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tollgate_resp::Frame;

use crate::reply::reply_limits;
use crate::Endpoint;

pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// What an idle connection's socket says when probed without blocking.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Nothing to read: the peer is (as far as we can tell) there and silent, as it should be.
    Quiet,
    /// The peer closed the connection or the socket failed.
    Gone,
    /// Bytes arrived that nobody asked for: the connection is out of step.
    Unexpected,
}

/// Why a fresh connection is closed before anything is sent on it: the server is not who it must be.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UntrustedServer {
    #[error("the server runs as uid {found}, not uid {expected}; nothing sent")]
    WrongUid { found: u32, expected: u32 },
    #[error("cannot learn which uid the server runs as ({0}); nothing sent")]
    Unknown(io::Error),
    #[error("a server over TCP cannot show it runs as uid {expected}; nothing sent")]
    OverTcp { expected: u32 },
}

/// Why a one-off request on a raw stream got no reply frame.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExchangeError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Protocol(#[from] tollgate_resp::ProtocolError),
    #[error("connection closed")]
    Closed,
}

impl Stream {
    /// Writes `argv` as one command and reads one reply frame: the few exchanges made outside any
    /// lane (asking sentinels, provisioning ACL users). `read` keeps bytes that arrived past it.
    pub(crate) async fn exchange(
        &mut self,
        read: &mut BytesMut,
        argv: &[&str],
    ) -> Result<Frame, ExchangeError> {
        let mut out = BytesMut::new();
        tollgate_resp::encode_command(argv, &mut out);
        self.write_all(&out).await?;
        self.next_frame(read).await
    }

    /// The next whole frame, reading as needed.
    pub(crate) async fn next_frame(&mut self, read: &mut BytesMut) -> Result<Frame, ExchangeError> {
        loop {
            if let Some(frame) = tollgate_resp::parse(read, &reply_limits())? {
                return Ok(frame);
            }
            if self.read_buf(read).await? == 0 {
                return Err(ExchangeError::Closed);
            }
        }
    }

    pub(crate) async fn connect(endpoint: &Endpoint) -> io::Result<Stream> {
        Ok(match endpoint {
            Endpoint::Unix(path) => Stream::Unix(UnixStream::connect(path).await?),
            Endpoint::Tcp { host, port } => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
        })
    }

    /// Checks that the server runs as `expected`. The uid is the one the kernel recorded when the
    /// server started listening (`SO_PEERCRED`), so a socket file swapped for another process's, or
    /// anything else at that path, cannot pass.
    pub(crate) fn check_server_uid(&self, expected: u32) -> Result<(), UntrustedServer> {
        let Stream::Unix(stream) = self else {
            return Err(UntrustedServer::OverTcp { expected });
        };
        let found = stream.peer_cred().map_err(UntrustedServer::Unknown)?.uid();
        if found != expected {
            return Err(UntrustedServer::WrongUid { found, expected });
        }
        Ok(())
    }

    /// Peeks at the socket itself. tokio's `try_read` would answer from the reactor's readiness
    /// cache, which may not have seen the peer's close yet.
    pub(crate) fn probe(&self) -> Probe {
        let fd = match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        };
        let mut byte = [0u8; 1];
        match recv(fd, &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Err(Errno::EAGAIN) => Probe::Quiet,
            Ok(0) | Err(_) => Probe::Gone,
            Ok(_) => Probe::Unexpected,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_servers_uid_comes_from_the_kernel() {
        let (ours, _peer) = UnixStream::pair().unwrap();
        let stream = Stream::Unix(ours);
        let uid = nix::unistd::geteuid().as_raw();
        stream.check_server_uid(uid).unwrap();
        let stranger = uid.wrapping_add(1);
        let refused = stream.check_server_uid(stranger).unwrap_err();
        assert!(
            matches!(refused, UntrustedServer::WrongUid { found, expected }
                if found == uid && expected == stranger),
            "{refused}"
        );
    }
}
