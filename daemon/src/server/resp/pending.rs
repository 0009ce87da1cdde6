//! One in-flight command of a session, as a future of the bytes to write back. Most commands are
//! a reply already known or a multiplexed send, so those avoid a heap allocation per command; the
//! rare exclusive borrow is boxed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use tollgate_lanes::SendFuture;
use tollgate_model::Lane;

use super::replies;

/// Where an in-flight command is, which decides what may run beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Answered by the daemon; touches nothing in Redis.
    Local,
    /// Pipelined on this session's channel of a multiplexed lane.
    Multiplexed(Lane),
    /// Alone on a borrowed BLOCKING or ADMIN connection.
    Exclusive,
}

pub enum Pending {
    Ready(Option<(Class, Bytes)>),
    Multiplexed(Lane, SendFuture),
    Exclusive(BoxFuture<'static, Bytes>),
}

impl Future for Pending {
    type Output = (Class, Bytes);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Pending::Ready(reply) => Poll::Ready(
                reply
                    .take()
                    .expect("a pending reply is polled once after it is ready"),
            ),
            Pending::Multiplexed(lane, sent) => Pin::new(sent).poll(cx).map(|outcome| {
                let reply = match outcome {
                    Ok(reply) => reply.into_bytes(),
                    Err(error) => replies::call_failed(&error),
                };
                (Class::Multiplexed(*lane), reply)
            }),
            Pending::Exclusive(work) => work
                .as_mut()
                .poll(cx)
                .map(|reply| (Class::Exclusive, reply)),
        }
    }
}
