//! `Channel`: a caller's handle on a multiplexed lane (REGULAR or SCRIPT), whatever the topology.
//! On one server it is one pooled connection's [`NodeChannel`], so a caller's pipeline stays in
//! order. On a cluster it keeps one such connection per node it has sent to, sends each command to
//! the master of its [`Route`]'s slot, and follows the cluster's redirects (see `cluster::follow`)
//! before the caller sees a reply. A command of a caller refused `BUSY` while the daemon stopped a
//! script past its time limit is sent again (`resend`; on one server).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use tollgate_model::Lane;

use crate::budget::Budget;
use crate::cluster::ClusterChannel;
use crate::error::CallError;
use crate::multiplex::{NodeChannel, NodeSend};
use crate::reply::Reply;
use crate::resend::{self, Again};
use crate::route::Route;
use crate::script_limit::ScriptLimit;

/// A caller's handle on a multiplexed lane; cheap to clone (clones share its connections).
#[derive(Clone)]
pub struct Channel {
    way: Way,
    /// The deadline of a command sent without one of its own.
    default_deadline: Option<Duration>,
    /// How many commands were sent on the channel (and its clones): a command refused `BUSY` is
    /// sent again only if none was sent after it (`resend`).
    sent: Arc<AtomicU64>,
}

#[derive(Clone)]
enum Way {
    Node(NodeChannel),
    Cluster(ClusterChannel),
}

impl Channel {
    pub(crate) fn node(channel: NodeChannel, default_deadline: Option<Duration>) -> Channel {
        Channel {
            way: Way::Node(channel),
            default_deadline,
            sent: Arc::default(),
        }
    }

    pub(crate) fn cluster(channel: ClusterChannel, default_deadline: Option<Duration>) -> Channel {
        Channel {
            way: Way::Cluster(channel),
            default_deadline,
            sent: Arc::default(),
        }
    }

    pub fn lane(&self) -> Lane {
        match &self.way {
            Way::Node(channel) => channel.lane(),
            Way::Cluster(channel) => channel.lane(),
        }
    }

    /// Counts the replies to this channel's commands against `budget` while they wait to be taken.
    pub fn charged_to(self, budget: Arc<dyn Budget>) -> Channel {
        let way = match self.way {
            Way::Node(channel) => Way::Node(channel.charged_to(budget)),
            Way::Cluster(channel) => Way::Cluster(channel.charged_to(budget)),
        };
        Channel { way, ..self }
    }

    /// Watches the scripts sent on this channel (SCRIPT's): each one still running `limit.after`
    /// after Redis could start on it is stopped, and fails as [`CallError::ScriptStopped`].
    pub fn scripts_limited(self, limit: ScriptLimit) -> Channel {
        let way = match self.way {
            Way::Node(channel) => Way::Node(channel.scripts_limited(limit)),
            Way::Cluster(channel) => Way::Cluster(channel.scripts_limited(limit)),
        };
        Channel { way, ..self }
    }

    /// Moves the channel to the connections a new channel would get. Only for a caller with
    /// nothing in flight on it: commands sent on different connections may be answered out of
    /// order.
    pub fn repick(&mut self) {
        match &mut self.way {
            Way::Node(channel) => channel.repick(),
            Way::Cluster(channel) => channel.repick(),
        }
    }

    /// Queues `command` (one encoded command that touches no key, or whose keys a cluster's
    /// redirect will find) for writing now, with the lane's command timeout.
    pub fn send(&self, command: Bytes) -> SendFuture {
        self.send_routed(Route::Any, command, self.default_deadline)
    }

    /// [`Channel::send`] with the command's own deadline (`None`: none), counted from when Redis
    /// could start on it: when it is the oldest command its connection owes a reply to. Past it the
    /// connection is closed and every command written on it fails as indeterminate.
    pub fn send_within(&self, command: Bytes, deadline: Option<Duration>) -> SendFuture {
        self.send_routed(Route::Any, command, deadline)
    }

    /// [`Channel::send`] to where `route` leads.
    pub fn send_to(&self, route: Route, command: Bytes) -> SendFuture {
        self.send_routed(route, command, self.default_deadline)
    }

    /// [`Channel::send_within`] to where `route` leads. The command is queued now on the node the
    /// slot map names (when there is a map yet), so that a caller's commands are written in the
    /// order sent.
    pub fn send_routed(
        &self,
        route: Route,
        command: Bytes,
        deadline: Option<Duration>,
    ) -> SendFuture {
        let sequence = self.sent.fetch_add(1, Ordering::Relaxed) + 1;
        match &self.way {
            // The command is kept to be sent again only while a script runs that may be stopped.
            Way::Node(channel) if channel.script_watch().is_some_and(|watch| watch.busy()) => {
                let first = channel.send_within(command.clone(), deadline);
                let again = Again {
                    channel: channel.clone(),
                    command,
                    deadline,
                    sequence,
                    sent: self.sent.clone(),
                };
                SendFuture(Sending::Routed(Box::pin(resend::after_stop(first, again))))
            }
            Way::Node(channel) => SendFuture(Sending::Node(channel.send_within(command, deadline))),
            Way::Cluster(channel) => {
                SendFuture(Sending::Routed(channel.send_to(route, command, deadline)))
            }
        }
    }
}

/// The reply to one [`Channel::send`].
pub struct SendFuture(Sending);

enum Sending {
    Node(NodeSend),
    /// A send that may be sent again: a cluster's, where a redirect says, or one refused `BUSY`
    /// while a script is stopped (`resend`); boxed, as it holds the command until its reply is
    /// final.
    Routed(BoxFuture<'static, Result<Reply, CallError>>),
}

impl Future for SendFuture {
    type Output = Result<Reply, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Sending::Node(send) => Pin::new(send).poll(cx),
            Sending::Routed(send) => send.as_mut().poll(cx),
        }
    }
}
