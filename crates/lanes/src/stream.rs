//! A byte stream to Redis over a Unix socket or TCP, with a non-blocking liveness probe for idle
//! connections.

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

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

impl Stream {
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
