//! Following a cluster's redirects, so that a client never sees one: `MOVED` (the slot has a new
//! owner: ask for a fresh map, send again there), `ASK` (the slot is being migrated and this key
//! is already on the target: send there once, after `ASKING`), `TRYAGAIN` and `CLUSTERDOWN` (a
//! migration or a failover in progress: wait a little and send again), and a master that cannot
//! be reached (a failover will name another: ask for a fresh map, wait, send again). At most
//! [`MAX_REDIRECTS`] redirects, and waits for `redis.cluster.retry_for` in all; what still fails
//! is a typed error, never a hang.
//!
//! Each of these means Redis did not run the command, so sending it again cannot run it twice; a
//! command that may have run (its connection lost after it was written) is never sent again.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tollgate_model::{Lane, Multiplexed, Protocol, Tenant};

use super::nodes::ClusterLanes;
use super::redirect::{redirect, Redirect};
use crate::budget::Budget;
use crate::error::{CallError, LaneError};
use crate::exclusive::Borrowed;
use crate::multiplex::{NodeChannel, NodeSend};
use crate::reply::Reply;
use crate::route::Route;
use crate::{Endpoint, Exclusive};

/// `MOVED` and `ASK` redirects followed for one command before the last is given up on.
pub(crate) const MAX_REDIRECTS: usize = 5;

/// The longest pause between attempts while the cluster is busy: a wait doubles from 10 ms.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// One command's attempts so far, and what the next one is.
struct Attempts {
    redirects: usize,
    /// Since when the command has been waiting for the cluster (`TRYAGAIN`, `CLUSTERDOWN`, a
    /// master that cannot be reached), and how many pauses it took.
    waiting: Option<(Instant, u32)>,
    /// How long it may wait in all (`redis.cluster.retry_for`).
    window: Duration,
}

/// What to do after an attempt.
enum Then {
    /// The caller's reply.
    Reply(Reply),
    /// Send again to this node; after `ASKING` when asked.
    Send { node: Endpoint, asking: Asking },
    /// Pause, then send again where the map then says.
    Pause(Duration),
    /// Give up with this error.
    Fail(CallError),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Asking {
    No,
    Yes,
}

impl Attempts {
    fn new(window: Duration) -> Attempts {
        Attempts {
            redirects: 0,
            waiting: None,
            window,
        }
    }

    /// After the reply `reply` from `node`.
    fn after_reply(&mut self, lanes: &ClusterLanes, reply: Reply, node: &Endpoint) -> Then {
        let Some(redirect) = reply
            .is_error()
            .then(|| redirect(reply.bytes(), node))
            .flatten()
        else {
            return Then::Reply(reply);
        };
        let (to, asking) = match redirect {
            Redirect::Moved { to, .. } => {
                lanes.refresh_soon();
                (to, Asking::No)
            }
            Redirect::Ask { to, .. } => (to, Asking::Yes),
            Redirect::TryAgain => return self.pause(&reply_text(&reply)),
            Redirect::ClusterDown => {
                lanes.refresh_soon();
                return self.pause(&reply_text(&reply));
            }
        };
        self.redirects += 1;
        if self.redirects > MAX_REDIRECTS {
            return Then::Fail(CallError::NotSent(LaneError::Redirected {
                redirects: MAX_REDIRECTS,
                last: reply_text(&reply),
            }));
        }
        Then::Send { node: to, asking }
    }

    /// After `error` from a send. Only a command that was not sent is sent again: one that may
    /// have run never is.
    fn after_error(&mut self, lanes: &ClusterLanes, error: CallError) -> Then {
        match error {
            // The node's lanes were closed under the command (the map stopped naming it) while
            // the cluster's go on: nothing was sent, so it goes where the map says now.
            CallError::NotSent(LaneError::Closed) if lanes.is_open() => {
                self.pause("the node's lanes closed")
            }
            CallError::NotSent(LaneError::Unavailable { reason }) => {
                // The master may be gone; a failover names a new one in the next map.
                lanes.refresh_soon();
                match self.pause(&reason) {
                    Then::Fail(_) => {
                        Then::Fail(CallError::NotSent(LaneError::Unavailable { reason }))
                    }
                    then => then,
                }
            }
            error => {
                if matches!(error, CallError::Indeterminate { .. }) {
                    lanes.refresh_soon();
                }
                Then::Fail(error)
            }
        }
    }

    /// A pause before the next attempt, while the window lasts.
    fn pause(&mut self, last: &str) -> Then {
        let (since, pauses) = self.waiting.get_or_insert_with(|| (Instant::now(), 0));
        if since.elapsed() >= self.window {
            return Then::Fail(CallError::NotSent(LaneError::Redirected {
                redirects: self.redirects,
                last: format!("still busy after {:?}: {last}", self.window),
            }));
        }
        *pauses += 1;
        let pause = Duration::from_millis(10 << (*pauses).min(5)).min(MAX_PAUSE);
        Then::Pause(pause)
    }
}

fn reply_text(reply: &Reply) -> String {
    String::from_utf8_lossy(reply.bytes().trim_ascii_end()).into_owned()
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
        // A node the map stopped naming had its lanes closed; sent there again, it gets new ones.
        pipes.retain(|(_, pipe)| pipe.is_open());
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
            let mut attempts = Attempts::new(channel.lanes.retry_for());
            let (mut node, mut sent) = match first {
                Some(first) => first,
                None => {
                    let node = channel.lanes.target(&route).await?;
                    let sent = channel.send_on(&node, &command, Asking::No, deadline);
                    (node, sent)
                }
            };
            loop {
                let then = match sent {
                    Ok(sent) => match sent.await {
                        Ok(reply) => attempts.after_reply(&channel.lanes, reply, &node),
                        Err(error) => attempts.after_error(&channel.lanes, error),
                    },
                    Err(error) => attempts.after_error(&channel.lanes, CallError::NotSent(error)),
                };
                let asking = match then {
                    Then::Reply(reply) => return Ok(reply),
                    Then::Fail(error) => return Err(error),
                    Then::Send { node: to, asking } => {
                        node = to;
                        asking
                    }
                    Then::Pause(pause) => {
                        tokio::time::sleep(pause).await;
                        node = channel.lanes.target(&route).await?;
                        Asking::No
                    }
                };
                sent = channel.send_on(&node, &command, asking, deadline);
            }
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
    tenant: Option<&Tenant>,
    command: Bytes,
    deadline: Option<Duration>,
) -> Result<Reply, CallError> {
    let mut attempts = Attempts::new(lanes.retry_for());
    let mut node = lanes.target(&route).await?;
    let mut asking = Asking::No;
    loop {
        let then = match lent_once(
            lanes, &node, asking, lane, protocol, tenant, &command, deadline,
        )
        .await
        {
            Ok(reply) => attempts.after_reply(lanes, reply, &node),
            Err(error) => attempts.after_error(lanes, error),
        };
        match then {
            Then::Reply(reply) => return Ok(reply),
            Then::Fail(error) => return Err(error),
            Then::Send {
                node: to,
                asking: ask,
            } => {
                node = to;
                asking = ask;
            }
            Then::Pause(pause) => {
                tokio::time::sleep(pause).await;
                node = lanes.target(&route).await?;
                asking = Asking::No;
            }
        }
    }
}

/// One attempt of [`run_lent`] on `node`.
#[allow(clippy::too_many_arguments)]
async fn lent_once(
    lanes: &ClusterLanes,
    node: &Endpoint,
    asking: Asking,
    lane: Exclusive,
    protocol: Protocol,
    tenant: Option<&Tenant>,
    command: &Bytes,
    deadline: Option<Duration>,
) -> Result<Reply, CallError> {
    let mut conn: Borrowed = lanes.node(node)?.borrow(lane, protocol, tenant).await?;
    if asking == Asking::Yes {
        conn.send(Bytes::from_static(crate::multiplex::ASKING))
            .await?;
    }
    let reply = conn.send_within(command.clone(), deadline).await;
    conn.release().await;
    reply
}
