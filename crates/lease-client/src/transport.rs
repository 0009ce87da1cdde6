//! HTTP/1.1 over the daemon's Unix socket (hyper's client connection + hyper-util's tokio I/O), with
//! a small pool of idle connections. Every failure is sorted by whether the request left: a
//! request that never reached the daemon is [`TransportError::NotSent`] and safe to repeat blindly;
//! one that did is [`TransportError::Indeterminate`].

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

/// Idle connections kept for reuse; more concurrent calls open more and close the surplus.
const IDLE_CONNECTIONS: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("daemon unreachable, request not sent: {0}")]
    NotSent(String),
    #[error("request sent, reply lost: {0}")]
    Indeterminate(String),
}

pub struct Transport {
    socket: PathBuf,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Transport {
    pub fn new(socket: &Path) -> Transport {
        Transport {
            socket: socket.to_owned(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Sends one request and reads its whole reply.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Bytes), TransportError> {
        let mut sender = match self.pooled() {
            Some(sender) => sender,
            None => self.connect().await?,
        };
        let request = build(method, path, body);
        let response = sender
            .try_send_request(request)
            .await
            .map_err(|mut error| match error.take_message() {
                Some(_) => TransportError::NotSent(error.into_error().to_string()),
                None => TransportError::Indeterminate(error.into_error().to_string()),
            })?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|error| TransportError::Indeterminate(error.to_string()))?
            .to_bytes();
        self.give_back(sender);
        Ok((status, body))
    }

    /// Opens a dedicated connection for a streaming response (the events stream).
    pub async fn stream(&self, path: &str) -> Result<Response<Incoming>, TransportError> {
        let mut sender = self.connect().await?;
        sender
            .send_request(build(Method::GET, path, Vec::new()))
            .await
            .map_err(|error| TransportError::Indeterminate(error.to_string()))
    }

    fn pooled(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().expect("pool lock is never poisoned");
        while let Some(sender) = idle.pop() {
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    fn give_back(&self, sender: SendRequest<Full<Bytes>>) {
        let mut idle = self.idle.lock().expect("pool lock is never poisoned");
        if idle.len() < IDLE_CONNECTIONS {
            idle.push(sender);
        }
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, TransportError> {
        let not_sent = |error: &dyn std::fmt::Display| {
            TransportError::NotSent(format!("{}: {error}", self.socket.display()))
        };
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|error| not_sent(&error))?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| not_sent(&error))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "lease client connection ended");
            }
        });
        Ok(sender)
    }
}

fn build(method: Method, path: &str, body: Vec<u8>) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, "tollgate")
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a path and static headers always build a request")
}
