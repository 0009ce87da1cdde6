//! Following a cluster's redirects, so that a client never sees one: `MOVED` (the slot has a new
//! owner: ask for a fresh map, send again there), `ASK` (the slot is being migrated and this key
//! is already on the target: send there once, after `ASKING`), `TRYAGAIN` and `CLUSTERDOWN` (a
//! migration or a failover in progress: wait a little and send again). At most
//! [`MAX_REDIRECTS`] times; what still fails is a typed error, never a hang.
//!
//! Each of these replies means Redis did not run the command, so sending it again cannot run it
//! twice.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tollgate_model::{Lane, Multiplexed, Protocol};

use super::nodes::ClusterLanes;
use super::redirect::{redirect, Redirect};
use crate::budget::Budget;
use crate::channel::Route;
use crate::error::{CallError, LaneError};
use crate::exclusive::Borrowed;
use crate::multiplex::{NodeChannel, NodeSend};
use crate::reply::Reply;
use crate::{Endpoint, Exclusive};

/// Redirects followed for one command before its last one is given up on.
pub(crate) const MAX_REDIRECTS: usize = 5;

/// The wait before sending again after `TRYAGAIN` or `CLUSTERDOWN`: 25 ms, doubling.
fn backoff(attempt: usize) -> Duration {
    Duration::from_millis(25 << attempt.min(4))
}

/// What a redirect asks of the next attempt.
enum Next {
    /// Send again to this node; after `ASKING` when `asking`.
    To { node: Endpoint, asking: Asking },
    /// Wait, then send again where the map then says.
    Wait(Duration),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Asking {
    No,
    Yes,
}

/// What to do after `reply` from `node`: `None` when it is the reply to give the caller.
fn next_after(
    lanes: &ClusterLanes,
    reply: &Reply,
    node: &Endpoint,
    attempt: usize,
) -> Option<Next> {
    if !reply.is_error() {
        return None;
    }
    Some(match redirect(reply.bytes(), node)? {
        Redirect::Moved { to, .. } => {
            lanes.refresh_soon();
            Next::To {
                node: to,
                asking: Asking::No,
            }
        }
        Redirect::Ask { to, .. } => Next::To {
            node: to,
            asking: Asking::Yes,
        },
        Redirect::TryAgain => Next::Wait(backoff(attempt)),
        Redirect::ClusterDown => {
            lanes.refresh_soon();
            Next::Wait(backoff(attempt))
        }
    })
}

/// The typed error for a command still redirected after [`MAX_REDIRECTS`].
fn gave_up(reply: &Reply) -> CallError {
    CallError::NotSent(LaneError::Redirected {
        redirects: MAX_REDIRECTS,
        last: String::from_utf8_lossy(reply.bytes().trim_ascii_end()).into_owned(),
    })
}

/// A lost or refused connection to a node may mean the node is gone: the map is asked again.
fn noted(lanes: &ClusterLanes, error: CallError) -> CallError {
    if matches!(
        error,
        CallError::NotSent(LaneError::Unavailable { .. }) | CallError::Indeterminate { .. }
    ) {
        lanes.refresh_soon();
    }
    error
}

/// A caller's channel on a multiplexed lane of every node it has sent to.
#[derive(Clone)]
pub(crate) struct ClusterChannel {
    lanes: Arc<ClusterLanes>,
    lane: Multiplexed,
    protocol: Protocol,
    budget: Option<Arc<dyn Budget>>,
    /// One connection per node, kept while commands are in flight so that their order holds.
    pipes: Arc<Mutex<Vec<(Endpoint, NodeChannel)>>>,
}

impl ClusterChannel {
    pub(crate) fn new(lanes: Arc<ClusterLanes>, lane: Multiplexed, protocol: Protocol) -> Self {
        ClusterChannel {
            lanes,
            lane,
            protocol,
            budget: None,
            pipes: Arc::default(),
        }
    }

    pub(crate) fn lane(&self) -> Lane {
        self.lane.into()
    }

    pub(crate) fn charged_to(mut self, budget: Arc<dyn Budget>) -> Self {
        for (_, pipe) in self.pipes.lock().iter_mut() {
            *pipe = pipe.clone().charged_to(budget.clone());
        }
        self.budget = Some(budget);
        self
    }

    pub(crate) fn repick(&mut self) {
        for (_, pipe) in self.pipes.lock().iter_mut() {
            pipe.repick();
        }
    }

    /// This caller's connection to `node`'s lane.
    fn pipe(&self, node: &Endpoint) -> Result<NodeChannel, LaneError> {
        let mut pipes = self.pipes.lock();
        if let Some((_, pipe)) = pipes.iter().find(|(at, _)| at == node) {
            return Ok(pipe.clone());
        }
        let mut pipe = self
            .lanes
            .node(node)?
            .multiplexed_speaking(self.lane, self.protocol)?;
        if let Some(budget) = &self.budget {
            pipe = pipe.charged_to(budget.clone());
        }
        pipes.push((node.clone(), pipe.clone()));
        Ok(pipe)
    }

    fn send_on(
        &self,
        node: &Endpoint,
        command: &Bytes,
        asking: Asking,
        deadline: Option<Duration>,
    ) -> Result<NodeSend, LaneError> {
        let pipe = self.pipe(node)?;
        Ok(match asking {
            Asking::No => pipe.send_within(command.clone(), deadline),
            Asking::Yes => pipe.send_asking(command, deadline),
        })
    }

    /// Queues `command` now on the node the map in hand names for `route`, and follows redirects
    /// once it is polled.
    pub(crate) fn send_to(
        &self,
        route: Route,
        command: Bytes,
        deadline: Option<Duration>,
    ) -> BoxFuture<'static, Result<Reply, CallError>> {
        let first = self.lanes.target_now(&route).map(|node| {
            let sent = self.send_on(&node, &command, Asking::No, deadline);
            (node, sent)
        });
        let channel = self.clone();
        Box::pin(async move {
            let (mut node, mut sent) = match first {
                Some(first) => first,
                None => {
                    let node = channel.lanes.target(&route).await?;
                    let sent = channel.send_on(&node, &command, Asking::No, deadline);
                    (node, sent)
                }
            };
            for attempt in 0.. {
                let reply = match sent {
                    Ok(sent) => sent.await.map_err(|error| noted(&channel.lanes, error))?,
                    Err(error) => return Err(noted(&channel.lanes, CallError::NotSent(error))),
                };
                let Some(next) = next_after(&channel.lanes, &reply, &node, attempt) else {
                    return Ok(reply);
                };
                if attempt + 1 >= MAX_REDIRECTS {
                    return Err(gave_up(&reply));
                }
                let asking = match next {
                    Next::To { node: to, asking } => {
                        node = to;
                        asking
                    }
                    Next::Wait(pause) => {
                        tokio::time::sleep(pause).await;
                        node = channel.lanes.target(&route).await?;
                        Asking::No
                    }
                };
                sent = channel.send_on(&node, &command, asking, deadline);
            }
            unreachable!("the loop returns within MAX_REDIRECTS attempts")
        })
    }
}

/// Borrows a connection of an exclusive lane on `route`'s node and runs `command` on it alone,
/// following redirects as [`ClusterChannel::send_to`] does; `principal`'s share is counted on
/// each node it borrows from.
pub(crate) async fn run_lent(
    lanes: &ClusterLanes,
    route: Route,
    lane: Exclusive,
    protocol: Protocol,
    principal: Option<&str>,
    command: Bytes,
    deadline: Option<Duration>,
) -> Result<Reply, CallError> {
    let mut node = lanes.target(&route).await?;
    let mut asking = Asking::No;
    for attempt in 0.. {
        let mut conn: Borrowed = lanes.node(&node)?.borrow(lane, protocol, principal).await?;
        if asking == Asking::Yes {
            let asked = conn
                .send(Bytes::from_static(b"*1\r\n$6\r\nASKING\r\n"))
                .await;
            if let Err(error) = asked {
                return Err(noted(lanes, error));
            }
        }
        let reply = conn.send_within(command.clone(), deadline).await;
        conn.release().await;
        let reply = reply.map_err(|error| noted(lanes, error))?;
        let Some(next) = next_after(lanes, &reply, &node, attempt) else {
            return Ok(reply);
        };
        if attempt + 1 >= MAX_REDIRECTS {
            return Err(gave_up(&reply));
        }
        match next {
            Next::To {
                node: to,
                asking: ask,
            } => {
                node = to;
                asking = ask;
            }
            Next::Wait(pause) => {
                tokio::time::sleep(pause).await;
                node = lanes.target(&route).await?;
                asking = Asking::No;
            }
        }
    }
    unreachable!("the loop returns within MAX_REDIRECTS attempts")
}
