//! The daemon's event streams (`GET /v1/leases/{resource}/events`, a watchdog's events, and
//! `…/holders`, the resource's holder changes): JSON lines read off a streaming body.

use std::marker::PhantomData;

use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use tollgate_lease_api::api::LeaseEvent;

use crate::error::ClientError;

pub struct Events<T = LeaseEvent> {
    body: Incoming,
    buffer: BytesMut,
    event: PhantomData<T>,
}

impl<T: DeserializeOwned> Events<T> {
    pub(crate) fn new(body: Incoming) -> Events<T> {
        Events {
            body,
            buffer: BytesMut::new(),
            event: PhantomData,
        }
    }

    /// The next event; `None` when the daemon ended the stream.
    pub async fn next(&mut self) -> Option<Result<T, ClientError>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line = self.buffer.split_to(end + 1);
                let line = &line[..end];
                if line.is_empty() {
                    continue;
                }
                return Some(
                    serde_json::from_slice(line)
                        .map_err(|error| ClientError::BadReply(format!("event: {error}"))),
                );
            }
            match self.body.frame().await? {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                Err(error) => return Some(Err(ClientError::BadReply(error.to_string()))),
            }
        }
    }
}
