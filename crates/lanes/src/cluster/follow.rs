//! Following a cluster's redirects, so that a client never sees one: `MOVED` (the slot has a new
//! owner: ask for a fresh map, send again there), `ASK` (the slot is being migrated and this key
//! is already on the target: send there once, after `ASKING`), `TRYAGAIN` and `CLUSTERDOWN` (a
//! migration or a failover in progress: wait a little and send again), and a master that cannot
//! be reached (a failover will name another: ask for a fresh map, wait, send again). At most
//! [`MAX_REDIRECTS`] redirects, and waits for `redis.cluster.retry_for` in all; what still fails
//! is a typed error, never a hang.
//!
//! Each of these means Redis did not run the command, so sending it again cannot run it twice; a
//! command that may have run (its connection lost after it was written) is never sent again. A
//! session's commands of one slot keep their order through all of it (`line`); every redirect and
//! re-send is counted in `cluster_redirects_total`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use tollgate_model::{Lane, Multiplexed, Protocol, Tenant};

use super::line::{Lines, Place};
use super::nodes::ClusterLanes;
use super::redirect::{redirect, Redirect};
use super::Slot;
use crate::budget::Budget;
use crate::error::{CallError, LaneError};
use crate::exclusive::Borrowed;
use crate::metrics::Redirected;
use crate::multiplex::{NodeChannel, NodeSend};
use crate::reply::Reply;
use crate::route::Route;
use crate::scope_pools::ScopeLogin;
use crate::script_limit::ScriptLimit;
use crate::{Endpoint, Exclusive};

/// `MOVED` and `ASK` redirects followed for one command before the last is given up on.
pub(crate) const MAX_REDIRECTS: usize = 5;

/// The longest pause between attempts while the cluster is busy: a wait doubles from 10 ms.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// One command's attempts so far, and what the next one is.
struct Attempts<'a> {
    lanes: &'a ClusterLanes,
    /// The lane and slot the redirects are counted under.
    lane: Lane,
    slot: Option<Slot>,
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

/// Whether a reply was waited for, or was already there when the command was first looked at (it
/// came while earlier commands of the session were being answered, and may be old news).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fresh {
    Yes,
    No,
    /// Waited for, but the command was sent longer than [`ASK_FRESH`] ago: the daemon was slow to
    /// look (a busy session, a loaded machine), and the answer may be as old.
    Slow,
}

/// How old an `ASK` may be and still be followed with `ASKING`: far less than two whole moves of
/// a slot (see docs/cluster.md, "What is left").
const ASK_FRESH: Duration = Duration::from_millis(10);

impl<'a> Attempts<'a> {
    fn new(lanes: &'a ClusterLanes, lane: Lane, route: &Route) -> Attempts<'a> {
        Attempts {
            lanes,
            lane,
            slot: match route {
                Route::Slot(slot) => Some(*slot),
                Route::Any | Route::Node(_) => None,
            },
            redirects: 0,
            waiting: None,
            window: lanes.retry_for(),
        }
    }

    fn count(&self, node: &Endpoint, kind: Redirected) {
        self.lanes.redirected(self.lane, node, kind, self.slot);
    }

    /// After the reply `reply` from `node`, for the command at `place` in its slot's line.
    fn after_reply(
        &mut self,
        reply: Reply,
        node: &Endpoint,
        fresh: Fresh,
        place: &mut Option<Place>,
    ) -> Then {
        let Some(redirect) = reply
            .is_error()
            .then(|| redirect(reply.bytes(), node))
            .flatten()
        else {
            return Then::Reply(reply);
        };
        // Commands of the slot sent at once after this one, which the node may have run already.
        let behind = place.as_mut().map_or(0, Place::redirected);
        let (to, asking) = match redirect {
            Redirect::Moved { to, .. } => {
                self.count(node, Redirected::Moved);
                self.lanes.refresh_soon();
                (to, Asking::No)
            }
            Redirect::Ask { to, .. } => {
                self.count(node, Redirected::Ask);
                match fresh {
                    Fresh::Yes => (to, Asking::Yes),
                    // An ASK is true only when given: the slot may have finished moving since,
                    // and moved back, with the key on the source again. `ASKING` on the importing
                    // node would then write a second copy of the key. Ask the source again.
                    // Not counted as a redirect: its answer is waited for, so this happens once.
                    Fresh::No => {
                        return Then::Send {
                            node: node.clone(),
                            asking: Asking::No,
                        }
                    }
                    // Counted: on a machine too slow for any answer to be fresh, the command ends
                    // with the typed error after MAX_REDIRECTS rather than asking for ever.
                    Fresh::Slow => (node.clone(), Asking::No),
                }
            }
            Redirect::TryAgain | Redirect::ClusterDown => {
                let kind = match redirect {
                    Redirect::TryAgain => Redirected::TryAgain,
                    _ => Redirected::ClusterDown,
                };
                self.count(node, kind);
                if kind == Redirected::ClusterDown {
                    self.lanes.refresh_soon();
                }
                // Later commands of the slot already sent may have run on this node (a key of a
                // multi-key command present, or the cluster up again): sent again after them, this
                // one would run out of the client's order. Redis's own answer (nothing ran) is
                // the client's, as a cluster client would get it.
                if behind > 0 {
                    return Then::Reply(reply);
                }
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

    /// After `error` from a send to `node`. Only a command that was not sent is sent again: one
    /// that may have run never is.
    fn after_error(
        &mut self,
        error: CallError,
        node: &Endpoint,
        place: &mut Option<Place>,
    ) -> Then {
        let retryable = match &error {
            // The node's lanes were closed under the command (the map stopped naming it) while
            // the cluster's go on: nothing was sent, so it goes where the map says now.
            CallError::NotSent(LaneError::Closed) => self.lanes.is_open(),
            // The master may be gone; a failover names a new one in the next map.
            CallError::NotSent(LaneError::Unavailable { .. }) => true,
            _ => false,
        };
        if !retryable {
            if matches!(error, CallError::Indeterminate { .. }) {
                self.lanes.refresh_soon();
            }
            return Then::Fail(error);
        }
        self.count(node, Redirected::Unavailable);
        self.lanes.refresh_soon();
        // As for TRYAGAIN: later commands of the slot may have been sent on a new connection.
        if place.as_mut().map_or(0, Place::redirected) > 0 {
            return Then::Fail(error);
        }
        match self.pause(&error.to_string()) {
            Then::Fail(_) => Then::Fail(error),
            then => then,
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

    /// The master `route` leads to now. While the map names none (its master failed and no
    /// replica is promoted yet), waits for one within the window like any busy cluster.
    async fn target(&mut self, route: &Route) -> Result<Endpoint, CallError> {
        loop {
            match self.lanes.target(route).await {
                Ok(node) => return Ok(node),
                Err(LaneError::Unavailable { reason }) if self.lanes.is_open() => {
                    self.lanes.refresh_soon();
                    match self.pause(&reason) {
                        Then::Pause(pause) => tokio::time::sleep(pause).await,
                        _ => {
                            return Err(CallError::NotSent(LaneError::Unavailable {
                                reason: format!("{reason} (waited {:?})", self.window),
                            }))
                        }
                    }
                }
                Err(error) => return Err(CallError::NotSent(error)),
            }
        }
    }
}

/// The outcome of `sent` (sent at `at`), and whether it was waited for in time.
async fn outcome(mut sent: NodeSend, at: Instant) -> (Result<Reply, CallError>, Fresh) {
    match (&mut sent).now_or_never() {
        Some(outcome) => (outcome, Fresh::No),
        None => {
            let outcome = sent.await;
            match at.elapsed() > ASK_FRESH {
                true => (outcome, Fresh::Slow),
                false => (outcome, Fresh::Yes),
            }
        }
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
    /// How long this caller's scripts may run (`script_limit`), on every node.
    limit: Option<ScriptLimit>,
    /// The scope user whose pool on each node carries the commands, instead of the lane's
    /// (`scope_pools`: a key-constrained principal's script commands).
    scope: Option<ScopeLogin>,
    /// One connection per node, kept while commands are in flight so that their order holds.
    pipes: Arc<Mutex<Vec<(Endpoint, NodeChannel)>>>,
    /// This caller's commands of each slot not yet final (`line`).
    lines: Lines,
}

impl ClusterChannel {
    pub(crate) fn new(lanes: Arc<ClusterLanes>, lane: Multiplexed, protocol: Protocol) -> Self {
        ClusterChannel {
            lanes,
            lane,
            protocol,
            budget: None,
            limit: None,
            scope: None,
            pipes: Arc::default(),
            lines: Lines::default(),
        }
    }

    /// The same channel on `login`'s scope pool of each node it sends to.
    pub(crate) fn scoped(mut self, login: ScopeLogin) -> Self {
        self.pipes.lock().clear();
        self.scope = Some(login);
        self
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

    pub(crate) fn scripts_limited(mut self, limit: ScriptLimit) -> Self {
        for (_, pipe) in self.pipes.lock().iter_mut() {
            *pipe = pipe.clone().scripts_limited(limit.clone());
        }
        self.limit = Some(limit);
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
        let on = self.lanes.node(node)?;
        let mut pipe = match &self.scope {
            Some(login) => on.scoped_speaking(login, self.protocol)?,
            None => on.multiplexed_speaking(self.lane, self.protocol)?,
        };
        if let Some(budget) = &self.budget {
            pipe = pipe.charged_to(budget.clone());
        }
        if let Some(limit) = &self.limit {
            pipe = pipe.scripts_limited(limit.clone());
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

    /// Queues `command` now on the node the map in hand names for `route`, unless its slot's
    /// line holds it (`line`: then it is sent when polled), and follows redirects once it is
    /// polled.
    pub(crate) fn send_to(
        &self,
        route: Route,
        command: Bytes,
        deadline: Option<Duration>,
    ) -> BoxFuture<'static, Result<Reply, CallError>> {
        let now = self.lanes.target_now(&route);
        let (place, first) = match (&route, now) {
            (Route::Slot(slot), Some(node)) => {
                let place = self
                    .lines
                    .admit(*slot, &node, || self.lanes.is_unsettled(*slot));
                let first = place.is_direct().then(|| {
                    let sent = self.send_on(&node, &command, Asking::No, deadline);
                    (node, sent)
                });
                (Some(place), first)
            }
            (Route::Slot(slot), None) => (Some(self.lines.hold(*slot)), None),
            (_, Some(node)) => {
                let sent = self.send_on(&node, &command, Asking::No, deadline);
                (None, Some((node, sent)))
            }
            (_, None) => (None, None),
        };
        let sent_at = Instant::now();
        let channel = self.clone();
        Box::pin(async move {
            // Held until the reply is final: later commands of the slot look at it.
            let mut place = place;
            let lanes = channel.lanes.clone();
            let mut attempts = Attempts::new(&lanes, channel.lane.into(), &route);
            let (mut node, mut sent, mut at) = match first {
                Some((node, sent)) => (node, sent, sent_at),
                None => {
                    let node = attempts.target(&route).await?;
                    let sent = channel.send_on(&node, &command, Asking::No, deadline);
                    (node, sent, Instant::now())
                }
            };
            loop {
                let then = match sent {
                    Ok(sent) => match outcome(sent, at).await {
                        (Ok(reply), fresh) => attempts.after_reply(reply, &node, fresh, &mut place),
                        (Err(error), _) => attempts.after_error(error, &node, &mut place),
                    },
                    Err(error) => {
                        attempts.after_error(CallError::NotSent(error), &node, &mut place)
                    }
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
                        node = attempts.target(&route).await?;
                        Asking::No
                    }
                };
                attempts.count(&node, Redirected::Resent);
                at = Instant::now();
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
    let mut attempts = Attempts::new(lanes, lane.into(), &route);
    let mut node = attempts.target(&route).await?;
    let mut asking = Asking::No;
    // The session runs a lent command alone (nothing of its own behind it), and waits for its
    // reply: every reply is fresh.
    let mut place = None;
    loop {
        let then = match lent_once(
            lanes, &node, asking, lane, protocol, tenant, &command, deadline,
        )
        .await
        {
            Ok(reply) => attempts.after_reply(reply, &node, Fresh::Yes, &mut place),
            Err(error) => attempts.after_error(error, &node, &mut place),
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
                node = attempts.target(&route).await?;
                asking = Asking::No;
            }
        }
        attempts.count(&node, Redirected::Resent);
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
