//! The two waits of an HTTP connection, both on hyper's header-read timer: a client that has begun
//! a request must finish its headers within `limits.http_header_timeout`, and a keep-alive
//! connection waiting for its next request is closed after `limits.http_idle_timeout`.
//!
//! hyper arms that timer whenever it starts waiting for a request head, before any byte of it has
//! come, so on its own one timeout would bound both waits alike. Here each connection gets its own
//! timer, which learns from the connection's reads when the first byte of the head arrived.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::config::LimitsConfig;

/// How long each wait may last.
#[derive(Debug, Clone, Copy)]
pub struct Waits {
    pub header: Duration,
    pub idle: Duration,
}

impl Waits {
    pub fn new(limits: &LimitsConfig) -> Self {
        Waits {
            header: limits.http_header_timeout,
            idle: limits.http_idle_timeout,
        }
    }
}

/// Where one connection is in its wait for a request head.
#[derive(Clone)]
struct Wait(Arc<Mutex<WaitState>>);

struct WaitState {
    since: Instant,
    first_byte: Option<Instant>,
}

impl Wait {
    fn state(&self) -> MutexGuard<'_, WaitState> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn deadline(&self, waits: Waits) -> Instant {
        let state = self.state();
        match state.first_byte {
            Some(at) => at + waits.header,
            None => state.since + waits.idle,
        }
    }
}

/// A connection whose reads tell its timer when a request head begins.
pub struct Watched<S> {
    inner: S,
    wait: Wait,
}

/// hyper's timer for one connection (see the module header).
pub struct HeadTimer {
    wait: Wait,
    waits: Waits,
}

/// Wraps one accepted connection; serve it with the returned timer.
pub fn watch<S>(stream: S, waits: Waits) -> (Watched<S>, HeadTimer) {
    let wait = Wait(Arc::new(Mutex::new(WaitState {
        since: Instant::now(),
        first_byte: None,
    })));
    (
        Watched {
            inner: stream,
            wait: wait.clone(),
        },
        HeadTimer { wait, waits },
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let mut state = self.wait.state();
            state.first_byte.get_or_insert_with(Instant::now);
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        hyper_util::rt::TokioTimer::new().sleep(duration)
    }

    /// hyper asks for this only when it starts waiting for a request head (and through the
    /// default `reset`, each time it starts again): the wait begins now, with no byte yet.
    fn sleep_until(&self, _deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        {
            let mut state = self.wait.state();
            state.since = Instant::now();
            state.first_byte = None;
        }
        let deadline = self.wait.deadline(self.waits);
        Box::pin(HeadWait {
            wait: self.wait.clone(),
            waits: self.waits,
            sleep: Box::pin(tokio::time::sleep_until(deadline.into())),
        })
    }
}

/// Fires at the idle deadline, or at the header deadline once a byte of the head has come. hyper
/// polls it after every read that leaves the head unfinished, so it sees the first byte at once.
struct HeadWait {
    wait: Wait,
    waits: Waits,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Future for HeadWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = tokio::time::Instant::from(self.wait.deadline(self.waits));
        if self.sleep.deadline() != deadline {
            self.sleep.as_mut().reset(deadline);
        }
        self.sleep.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for HeadWait {}
