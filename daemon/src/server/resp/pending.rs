//! One in-flight command of a session, as a future of the bytes to write back, and the session's
//! queue of them. Most commands are a reply already known or a multiplexed send, so those avoid a
//! heap allocation per command; the rare exclusive borrow is boxed.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::Stream;
use tollgate_lanes::{CallError, PubSub, Reply, Route, SendFuture};
use tollgate_model::{Exclusive, Multiplexed};
use tollgate_resp::Frame;

use super::amend::Amend;
use super::local::Voice;
use super::replies;
use super::slots::{Combine, Split};

/// A lane whose connections are lent to one command at a time (TRANSACTION's are pinned to a
/// session instead, see `transaction.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lent {
    Blocking,
    Admin,
}

impl Lent {
    pub fn lane(self) -> Exclusive {
        match self {
            Lent::Blocking => Exclusive::Blocking,
            Lent::Admin => Exclusive::Admin,
        }
    }
}

/// Where a command runs, which decides what may run beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Answered by the daemon; touches nothing in Redis.
    Local,
    /// Pipelined on this session's channel of a multiplexed lane.
    Multiplexed(Multiplexed),
    /// Alone on a borrowed BLOCKING or ADMIN connection.
    Exclusive,
    /// Awaited by the session itself, alone (a transaction's command, a subscription …).
    InPlace,
}

pub enum Pending {
    Ready(Option<(Class, Bytes)>),
    Multiplexed(Multiplexed, SendFuture),
    Exclusive(BoxFuture<'static, Bytes>),
    /// On a cluster, parts sent to several nodes on a multiplexed lane, merged into one reply.
    Gathered(Multiplexed, BoxFuture<'static, Bytes>),
    /// A reply the daemon corrects once it arrives (see [`Amend`]); rare, so boxed.
    Amended(Box<Amended>),
}

/// A command sent to several nodes of a cluster, and how their replies become the client's one.
pub struct Gather {
    pub parts: Vec<(Route, Bytes)>,
    pub merge: Merge,
    /// How the merged reply is corrected (the near cache's keys dropped first, say).
    pub amend: Option<super::amend::Amend>,
}

/// How the parts' replies, in part order, become the client's reply.
pub enum Merge {
    /// A split multi-key command's parts.
    Split(Split),
    /// A keyless command every master ran.
    Combine(Combine),
}

impl Merge {
    pub fn merge(&self, replies: Vec<Frame>) -> Bytes {
        match self {
            Merge::Split(split) => split.merge(replies),
            Merge::Combine(combine) => combine.combine(replies),
        }
    }
}

/// A part's outcome as a frame to merge: a failure to send or read it is its error reply.
pub fn part_frame(outcome: Result<Reply, CallError>) -> Frame {
    let failed = |reply: Bytes| {
        let text = reply.strip_prefix(b"-").unwrap_or(&reply).trim_ascii_end();
        Frame::Error(Bytes::copy_from_slice(text))
    };
    match outcome {
        Ok(reply) => reply
            .frame()
            .unwrap_or_else(|error| failed(replies::error(format!("ERR tollgate: {error}")))),
        Err(error) => failed(replies::call_failed(&error)),
    }
}

pub struct Amended {
    pub inner: Pending,
    /// Taken when the reply arrives.
    pub amend: Option<Amend>,
    pub pubsub: PubSub,
}

impl Pending {
    /// Where the command runs.
    pub fn class(&self) -> Class {
        match self {
            Pending::Ready(Some((class, _))) => *class,
            Pending::Ready(None) => Class::Local,
            Pending::Multiplexed(lane, _) | Pending::Gathered(lane, _) => Class::Multiplexed(*lane),
            Pending::Exclusive(_) => Class::Exclusive,
            Pending::Amended(amended) => amended.inner.class(),
        }
    }
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
            Pending::Gathered(lane, work) => work
                .as_mut()
                .poll(cx)
                .map(|reply| (Class::Multiplexed(*lane), reply)),
            Pending::Amended(amended) => {
                let (class, reply) = std::task::ready!(Pin::new(&mut amended.inner).poll(cx));
                let reply = match amended.amend.take() {
                    Some(amend) => amend.apply(reply, &amended.pubsub),
                    None => reply,
                };
                Poll::Ready((class, reply))
            }
        }
    }
}

/// A session's in-flight commands, answered strictly in the order sent (a silent one, after
/// `CLIENT REPLY OFF` or `SKIP`, answers with nothing to write). Only the oldest is polled:
/// no later reply may be written before it, and a multiplexed send needs no polling to progress (the
/// lane's driver does the work). So a reply that arrives early wakes nobody, and a pipeline costs
/// one wake-up per batch of replies rather than one per reply. An exclusive borrow, which does need
/// polling, is only ever queued behind answers already known (the session's barrier sees to that).
#[derive(Default)]
pub struct InOrder {
    queue: VecDeque<(Pending, Voice)>,
}

impl InOrder {
    pub fn push_back(&mut self, pending: Pending, voice: Voice) {
        self.queue.push_back((pending, voice));
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Answers the command owed on a borrowed connection with `reply` instead of waiting for it;
    /// the connection, dropped with its reply owed, is closed by its lane. Whether one was owed.
    pub fn answer_exclusive(&mut self, reply: Bytes) -> bool {
        let owed = self
            .queue
            .iter_mut()
            .find(|(pending, _)| matches!(pending, Pending::Exclusive(_)));
        match owed {
            Some((pending, _)) => {
                *pending = Pending::Ready(Some((Class::Exclusive, reply)));
                true
            }
            None => false,
        }
    }

    /// Where the oldest owed command runs.
    pub fn oldest(&self) -> Option<Class> {
        self.queue.front().map(|(pending, _)| pending.class())
    }
}

impl Stream for InOrder {
    type Item = (Class, Bytes);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let queue = &mut self.get_mut().queue;
        let Some((oldest, voice)) = queue.front_mut() else {
            return Poll::Ready(None);
        };
        let (class, reply) = std::task::ready!(Pin::new(oldest).poll(cx));
        let reply = voice.say(reply);
        queue.pop_front();
        Poll::Ready(Some((class, reply)))
    }
}
