//! REGULAR and SCRIPT: commands from many callers pipelined over a few long-lived connections. Each
//! connection has a driver task; `NodeChannel::send` queues the command for that driver synchronously, so
//! the commands one caller sends in order are written in order. A connection to a Redis nearby
//! keeps one write unanswered at a time and gathers what arrives meanwhile into the next; to a
//! Redis a network round trip away it writes each batch at once (`turnaround`). Callers are packed
//! on the first connections with room. Commands in flight per lane are capped by the lane's gate; the number
//! queued behind the cap is bounded too. Each protocol (RESP2, RESP3) has its own connections, opened
//! when a client of that protocol first needs one; the lane's ceiling counts both.
//!
//! Every command carries a deadline (the lane's command timeout unless the caller gives its own). A
//! connection whose oldest unanswered command has waited past its deadline is closed: everything
//! written on it is indeterminate, and the next command opens a new one. New work is not packed on
//! a connection whose oldest reply is overdue by [`STALLED_AFTER`] while another one answers.
//!
//! SCRIPT's kills (`SCRIPT KILL`, `FUNCTION KILL`) bypass its connections for one of their own
//! (see `kill`). A channel with a script time limit registers each script it sends with the
//! node's script watch (`script_limit`) until its reply arrives; a command refused `BUSY` while the
//! watch stops a script is sent again (`resend`).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_model::{Lane, Protocol};
use tracing::Instrument;

use crate::budget::{Budget, Held};
use crate::busy;
use crate::ceilings::Outer;
use crate::config::LaneSettings;
use crate::conn::Conn;
use crate::connector::Connector;
use crate::error::{CallError, LaneError, Saturation};
use crate::gate::{Gate, Permit, Queue};
use crate::life::Life;
use crate::metrics::{LaneMetrics, Rejection};
use crate::quiet::Quiet;
use crate::reply::{reply_limits, Next, Reply, ReplyReader};
use crate::script_limit::{ScriptLimit, Watch, Watched};
use crate::stream::Stream;
use crate::turnaround::Turnaround;

/// `ASKING`, encoded.
pub(crate) const ASKING: &[u8] = b"*1\r\n$6\r\nASKING\r\n";

/// How many bytes of queued commands one write may gather.
const MAX_BATCH: usize = 64 * 1024;
/// Commands outstanding on one connection past which new work goes to the lane's next connection.
/// Work is packed rather than spread: a connection batches what arrives while its last write is
/// being answered, so fewer, busier connections make bigger batches, and Redis reads and writes
/// less per command. Measured with 50 unpipelined clients on 2 cores, spreading them over
/// REGULAR's 4 connections served 25-33% fewer requests per second than packing them on one; with
/// 50 clients pipelining 16 commands each, packing up to 1024 rather than 128 served 5-7% more
/// (GET, SET, INCR, LPUSH; Redis read 200 commands per read instead of 80).
const SPILL_AT: usize = 1024;
/// Bytes of commands outstanding on one connection past which new work goes to the next one: a
/// connection has one write unanswered and gathers the next (up to [`MAX_BATCH`]), so work past
/// what one more batch holds would wait a round trip more than on a connection of its own (large
/// commands such as a 10-key `MSET`: packed by count alone, they ran 3% slower).
const SPILL_BYTES: usize = MAX_BATCH;
/// How long a connection's oldest unanswered command may wait before new work is sent elsewhere:
/// one write held up in Redis (a paused client, a busy script) holds up everything pipelined behind
/// it. Far above any healthy reply time, so packing (and batching) is undisturbed in normal use.
const STALLED_AFTER: Duration = Duration::from_millis(500);

/// A reply and, when its caller has a budget, the bytes it holds against it until taken.
type Delivery = (Result<Reply, CallError>, Option<Held>);
type ReplySender = oneshot::Sender<Delivery>;

pub(crate) struct MultiplexedLane {
    pub(crate) lane: Lane,
    gate: Gate,
    /// Commands accepted and not yet answered; capped at in-flight ceiling plus queue length.
    outstanding: AtomicUsize,
    outstanding_cap: usize,
    /// The connections of each protocol, in [`Protocol::index`] order.
    slots: [Vec<Arc<Slot>>; 2],
    pub(crate) connector: Arc<Connector>,
    pub(crate) metrics: LaneMetrics,
    life: Arc<Life>,
    /// The deadline of a command sent without one of its own; `None`: none.
    command_timeout: Option<Duration>,
    /// The origin of the slots' [`Slot::owed_since`] clocks.
    epoch: Instant,
    /// Where this lane's kills go, and the node's script watch.
    scripts: Scripts,
}

/// What a multiplexed lane knows of scripts: where SCRIPT's kills go instead of its own
/// connections (its kill connection), and the script watch of the node (the clients' SCRIPT and
/// REGULAR lanes: REGULAR's commands refused `BUSY` while a script is stopped are sent again).
#[derive(Clone, Default)]
pub(crate) struct Scripts {
    pub(crate) kills: Option<Arc<MultiplexedLane>>,
    pub(crate) watch: Option<Arc<Watch>>,
}

/// One pooled connection as callers see it: the queue into its driver and its current load.
pub(crate) struct Slot {
    queue: mpsc::UnboundedSender<Box<Request>>,
    /// Commands outstanding.
    load: AtomicUsize,
    /// Their bytes ([`SPILL_BYTES`]).
    bytes: AtomicUsize,
    protocol: Protocol,
    /// Since when (ms after the lane's epoch, plus one) the connection has owed its oldest
    /// unanswered reply; 0 while it owes none.
    owed_since: AtomicU64,
}

impl Slot {
    /// Whether the connection's oldest reply has been owed longer than [`STALLED_AFTER`] at `now`
    /// (ms after the lane's epoch).
    fn stalled(&self, now: u64) -> bool {
        let since = self.owed_since.load(Ordering::Relaxed);
        since != 0 && now.saturating_sub(since) > STALLED_AFTER.as_millis() as u64
    }
}

/// A handle on one pooled connection of a multiplexed lane; cheap to clone. A client session keeps one
/// per node so that its pipeline stays in order (see [`crate::Channel`]).
#[derive(Clone)]
pub(crate) struct NodeChannel {
    slot: Arc<Slot>,
    lane: Arc<MultiplexedLane>,
    /// What this channel's replies are counted against while they wait for their caller.
    budget: Option<Arc<dyn Budget>>,
    /// How long this caller's scripts may run (`None`: not watched).
    limit: Option<ScriptLimit>,
}

/// One command on its way to Redis. Boxed from its send to its reply (through the slot's queue,
/// the writer's batch and the in-flight queue, as [`InFlight::request`]): moved by value it was
/// copied whole (~150 bytes) about ten times per command, more than its allocation costs.
struct Request {
    /// Taken (left empty) once copied into the batch, so a large command is not kept until its
    /// reply.
    command: Bytes,
    /// Replies to drop before this command's own: those of an `ASKING` written just before it.
    preamble: usize,
    reply: ReplySender,
    budget: Option<Arc<dyn Budget>>,
    since: Instant,
    /// How long Redis may take to answer it once it is the connection's oldest unanswered command.
    deadline: Option<Duration>,
    ticket: Ticket,
    /// A script, registered with the script watch until its reply arrives.
    watched: Option<Watched>,
}

/// Keeps a command counted as outstanding (lane) and as load (slot) until it is answered or dropped,
/// and as waiting (`lane_waiting`) until it gets an in-flight permit.
struct Ticket {
    lane: Arc<MultiplexedLane>,
    slot: Arc<Slot>,
    bytes: usize,
    waiting: bool,
}

impl Ticket {
    /// The ticket of a command of `bytes`, and how many commands of the lane were outstanding
    /// before it.
    fn new(lane: &Arc<MultiplexedLane>, slot: &Arc<Slot>, bytes: usize) -> (Self, usize) {
        let ahead = lane.outstanding.fetch_add(1, Ordering::AcqRel);
        slot.load.fetch_add(1, Ordering::AcqRel);
        slot.bytes.fetch_add(bytes, Ordering::Relaxed);
        lane.metrics.waiting.inc();
        let ticket = Ticket {
            lane: lane.clone(),
            slot: slot.clone(),
            bytes,
            waiting: true,
        };
        (ticket, ahead)
    }

    fn granted(&mut self) {
        if std::mem::take(&mut self.waiting) {
            self.lane.metrics.waiting.dec();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.granted();
        self.lane.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.slot.load.fetch_sub(1, Ordering::AcqRel);
        self.slot.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A command written to Redis whose reply is owed: the request as queued (its `preamble` counts
/// down the replies still to drop before its own) and its in-flight permit.
struct InFlight {
    request: Box<Request>,
    permit: Permit,
}

impl InFlight {
    /// Frees the lane's capacity first, then answers: a caller that sends again as soon as it has
    /// the reply must find the capacity free. A reply is counted against the caller's budget from
    /// here until the caller takes it; one the budget refuses is dropped here, unrelayed.
    fn answer(self, outcome: Result<Reply, CallError>) {
        let InFlight { request, permit } = self;
        let Request {
            reply,
            budget,
            ticket,
            watched,
            ..
        } = *request;
        drop((permit, ticket));
        let outcome = match (outcome, &watched) {
            (Ok(answer), Some(watched)) => watched.outcome(answer),
            (outcome, _) => outcome,
        };
        // Deregistered before the caller hears: a command refused `BUSY` meanwhile goes again
        // once the stopped script is gone.
        drop(watched);
        let delivery = match (outcome, budget) {
            (Ok(answer), Some(budget)) => match Held::new(&budget, answer.bytes().len()) {
                Ok(held) => (Ok(answer), Some(held)),
                Err(over) => (Err(over.into()), None),
            },
            (outcome, _) => (outcome, None),
        };
        let _ = reply.send(delivery);
    }
}

/// The reply to one [`NodeChannel::send`].
pub(crate) struct NodeSend(SendState);

enum SendState {
    Done(Option<Result<Reply, CallError>>),
    Waiting(oneshot::Receiver<Delivery>),
}

impl Future for NodeSend {
    type Output = Result<Reply, CallError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            SendState::Done(outcome) => {
                Poll::Ready(outcome.take().expect("NodeSend polled after completion"))
            }
            // Taken, the reply no longer counts against the lane's hold: its caller counts it now.
            SendState::Waiting(receiver) => Pin::new(receiver).poll(cx).map(|delivery| {
                delivery.map_or_else(
                    |_| {
                        Err(CallError::Indeterminate {
                            reason: "the connection's driver stopped before the reply arrived"
                                .into(),
                        })
                    },
                    |(outcome, _held)| outcome,
                )
            }),
        }
    }
}

impl MultiplexedLane {
    /// Builds the lane and spawns one driver per connection slot (connections open lazily).
    pub(crate) fn start(
        settings: &LaneSettings,
        connector: Arc<Connector>,
        metrics: LaneMetrics,
        life: Arc<Life>,
        scripts: Scripts,
        outer: Outer,
        drivers: &mut tokio::task::JoinSet<()>,
    ) -> Arc<Self> {
        let lane = settings.lane;
        let connections = settings.connections;
        let gate = Gate::new(
            lane,
            settings.in_flight,
            Queue::External,
            settings.acquire_timeout,
            metrics.clone(),
        )
        .under(outer.gate);
        let mut receivers = Vec::with_capacity(2 * connections);
        let slots = Protocol::ALL.map(|protocol| {
            (0..connections)
                .map(|_| {
                    let (queue, receiver) = mpsc::unbounded_channel();
                    let slot = Arc::new(Slot {
                        queue,
                        load: AtomicUsize::new(0),
                        bytes: AtomicUsize::new(0),
                        protocol,
                        owed_since: AtomicU64::new(0),
                    });
                    receivers.push((receiver, slot.clone()));
                    slot
                })
                .collect()
        });
        let this = Arc::new(MultiplexedLane {
            lane,
            gate,
            outstanding: AtomicUsize::new(0),
            outstanding_cap: settings.in_flight.saturating_add(settings.queue_length),
            slots,
            connector,
            metrics,
            life,
            command_timeout: settings.command_timeout,
            epoch: Instant::now(),
            scripts,
        });
        for (connection, (receiver, slot)) in receivers.into_iter().enumerate() {
            // Every line a driver logs names its lane and connection, and, while connected, the
            // node (the connection's own span, `Conn::span`).
            let span = tracing::info_span!("lane", %lane, connection, protocol = ?slot.protocol);
            drivers.spawn(drive(this.clone(), receiver, slot).instrument(span));
        }
        this
    }

    /// A channel on the connection [`MultiplexedLane::pick`] names for `protocol`.
    pub(crate) fn channel(self: &Arc<Self>, protocol: Protocol) -> NodeChannel {
        NodeChannel {
            slot: self.pick(protocol).clone(),
            lane: self.clone(),
            budget: None,
            limit: None,
        }
    }

    /// The first connection of `protocol` with fewer than [`SPILL_AT`] commands and
    /// [`SPILL_BYTES`] bytes outstanding, or, when every one is that busy, the least loaded; a
    /// stalled connection only when every one is stalled. Connections past the first open only
    /// when work spills (or one stalls).
    fn pick(&self, protocol: Protocol) -> &Arc<Slot> {
        let slots = &self.slots[protocol.index()];
        let load = |slot: &&Arc<Slot>| slot.load.load(Ordering::Relaxed);
        let room = |slot: &&Arc<Slot>| {
            load(slot) < SPILL_AT && slot.bytes.load(Ordering::Relaxed) < SPILL_BYTES
        };
        let now = std::cell::OnceCell::new();
        let healthy = |slot: &&Arc<Slot>| {
            slot.owed_since.load(Ordering::Relaxed) == 0
                || !slot.stalled(*now.get_or_init(|| self.clock()))
        };
        slots
            .iter()
            .find(|slot| room(slot) && healthy(slot))
            .or_else(|| slots.iter().filter(healthy).min_by_key(load))
            .or_else(|| slots.iter().min_by_key(load))
            .expect("a lane has at least one connection")
    }

    /// Now, for [`Slot::owed_since`]: ms after the lane's epoch, plus one (0 means "nothing owed").
    fn clock(&self) -> u64 {
        (self.epoch.elapsed().as_millis() as u64).saturating_add(1)
    }

    pub(crate) fn close_gate(&self) {
        self.gate.close();
    }
}

impl NodeChannel {
    pub(crate) fn lane(&self) -> Lane {
        self.lane.lane
    }

    /// Whether the lane still takes commands (its node's lanes are not closing).
    pub(crate) fn is_open(&self) -> bool {
        self.lane.life.is_open()
    }

    /// Counts the replies to this channel's commands against `budget` while they wait to be taken.
    pub(crate) fn charged_to(mut self, budget: Arc<dyn Budget>) -> NodeChannel {
        self.budget = Some(budget);
        self
    }

    /// Watches the scripts sent on this channel: each is stopped once it runs past `limit`.
    pub(crate) fn scripts_limited(mut self, limit: ScriptLimit) -> NodeChannel {
        self.limit = Some(limit);
        self
    }

    /// The node's script watch (the clients' REGULAR and SCRIPT lanes).
    pub(crate) fn script_watch(&self) -> Option<&Arc<Watch>> {
        self.lane.scripts.watch.as_ref()
    }

    /// Moves the channel to the connection a new channel would get. Only for a caller with nothing
    /// in flight on it: commands sent on different connections may be answered out of order.
    pub(crate) fn repick(&mut self) {
        let slot = self.lane.pick(self.slot.protocol);
        if !Arc::ptr_eq(slot, &self.slot) {
            self.slot = slot.clone();
        }
    }

    /// Queues `command` (one encoded command) for writing now, with the lane's command timeout; the
    /// future resolves to its reply.
    pub(crate) fn send(&self, command: Bytes) -> NodeSend {
        self.send_within(command, self.lane.command_timeout)
    }

    /// [`NodeChannel::send`] with the command's own deadline (`None`: none), counted from when Redis
    /// could start on it: when it is the oldest command its connection owes a reply to. Past it the
    /// connection is closed and every command written on it fails as indeterminate.
    pub(crate) fn send_within(&self, command: Bytes, deadline: Option<Duration>) -> NodeSend {
        self.send_prefixed(command, 0, deadline)
    }

    /// [`NodeChannel::send_within`] preceded by `ASKING` in the same write, so that nothing else is
    /// written between them: the cluster's one-time redirect to a slot being imported.
    pub(crate) fn send_asking(&self, command: &[u8], deadline: Option<Duration>) -> NodeSend {
        let mut both = BytesMut::with_capacity(ASKING.len() + command.len());
        both.extend_from_slice(ASKING);
        both.extend_from_slice(command);
        self.send_prefixed(both.freeze(), 1, deadline)
    }

    fn send_prefixed(
        &self,
        command: Bytes,
        preamble: usize,
        deadline: Option<Duration>,
    ) -> NodeSend {
        let scripts = &self.lane.scripts;
        if let Some(kills) = scripts.kills.as_ref().filter(|_| busy::is_kill(&command)) {
            let on_its_own = NodeChannel {
                slot: kills.pick(self.slot.protocol).clone(),
                lane: kills.clone(),
                budget: self.budget.clone(),
                limit: None,
            };
            return on_its_own.send_within(command, deadline);
        }
        let lane = &self.lane;
        if !lane.life.is_open() {
            lane.metrics.reject(Rejection::Closed);
            return NodeSend(SendState::Done(Some(Err(CallError::NotSent(
                LaneError::Closed,
            )))));
        }
        let (ticket, ahead) = Ticket::new(lane, &self.slot, command.len());
        if ahead >= lane.outstanding_cap {
            lane.metrics
                .reject(Rejection::Saturated(Saturation::QueueFull));
            return NodeSend(SendState::Done(Some(Err(CallError::NotSent(
                LaneError::Saturated {
                    lane: lane.lane,
                    waited: std::time::Duration::ZERO,
                    cause: Saturation::QueueFull,
                },
            )))));
        }
        // Only SCRIPT's scripts are watched: REGULAR's channels share the watch to resend.
        let watched = match (&self.limit, &scripts.watch) {
            (Some(limit), Some(watch)) if lane.lane == Lane::Script => {
                let own = command.slice(preamble * ASKING.len()..);
                watch.register(&own, limit)
            }
            _ => None,
        };
        // A script (what the watch registers) of a caller whose last script was stopped waits
        // out the cooldown: refused, not sent.
        if let Some(cooldown) = watched
            .as_ref()
            .and_then(|_| self.limit.as_ref()?.cooldown.as_ref())
        {
            if let Some(remaining) = cooldown.remaining() {
                lane.metrics.reject(Rejection::ScriptCooldown);
                return NodeSend(SendState::Done(Some(Err(CallError::NotSent(
                    LaneError::ScriptCooldown {
                        remaining,
                        cooldown: cooldown.after,
                    },
                )))));
            }
        }
        let (reply, receiver) = oneshot::channel();
        let request = Box::new(Request {
            command,
            preamble,
            reply,
            budget: self.budget.clone(),
            // The turn's reading: one for the commands a session queues in one poll.
            since: crate::turn_clock::now(),
            deadline,
            ticket,
            watched,
        });
        match self.slot.queue.send(request) {
            Ok(()) => NodeSend(SendState::Waiting(receiver)),
            Err(_) => NodeSend(SendState::Done(Some(Err(CallError::NotSent(
                LaneError::Closed,
            ))))),
        }
    }
}

impl Request {
    /// Releases the request's place in the lane, then reports `error` to the caller.
    fn fail(self, error: CallError) {
        let Request { reply, ticket, .. } = self;
        drop(ticket);
        let _ = reply.send((Err(error), None));
    }
}

/// One connection slot's life: wait for work, connect, pipeline until the connection is lost or the
/// lanes close, and repeat.
async fn drive(
    lane: Arc<MultiplexedLane>,
    mut queue: mpsc::UnboundedReceiver<Box<Request>>,
    slot: Arc<Slot>,
) {
    let protocol = slot.protocol;
    let life = lane.life.clone();
    let mut next = None;
    loop {
        let first = match next.take() {
            Some(request) => request,
            None => tokio::select! {
                biased;
                _ = life.killed().cancelled() => break,
                request = queue.recv() => match request {
                    Some(request) => request,
                    None => break,
                },
                _ = life.draining().cancelled(), if queue.is_empty() => break,
            },
        };
        match lane.connector.connect(protocol).await {
            Ok(conn) => {
                let span = conn.span();
                next = pipeline(&lane, &slot, conn, first, &mut queue)
                    .instrument(span)
                    .await
            }
            Err(error) => {
                // Fail fast: everything queued now would meet the same outage.
                let reason = error.to_string();
                let mut failed = Some(first);
                while let Some(request) = failed.take().or_else(|| queue.try_recv().ok()) {
                    lane.metrics.reject(Rejection::Unavailable);
                    request.fail(CallError::NotSent(LaneError::Unavailable {
                        reason: reason.clone(),
                    }));
                }
            }
        }
    }
    queue.close();
    while let Ok(request) = queue.try_recv() {
        request.fail(CallError::NotSent(LaneError::Closed));
    }
}

/// Runs one connection: a writer that batches queued commands and a reader that hands each reply to
/// the oldest command in flight. Returns a request taken from the queue but not written, if the
/// connection was lost before it could be.
async fn pipeline(
    lane: &MultiplexedLane,
    slot: &Slot,
    conn: Conn,
    first: Box<Request>,
    queue: &mut mpsc::UnboundedReceiver<Box<Request>>,
) -> Option<Box<Request>> {
    let generation = conn.generation();
    let (stream, read, _tracked) = conn.into_parts();
    let (reader, writer) = tokio::io::split(stream);
    let owed = Owed::default();
    let lost = CancellationToken::new();
    let unanswered = Unanswered::default();
    let writing = async {
        let unsent = write_loop(lane, writer, first, queue, &owed, &unanswered, &lost).await;
        // The reader ends once it has answered what was written (or the connection failed).
        owed.finish();
        unsent
    };
    let (unsent, ()) = tokio::join!(
        writing,
        read_loop(
            lane,
            slot,
            reader,
            read,
            &owed,
            &unanswered,
            &lost,
            generation
        ),
    );
    slot.owed_since.store(0, Ordering::Relaxed);
    if lost.is_cancelled() {
        tracing::info!("connection to redis lost; its unanswered commands failed");
        lane.connector.note_lost();
    }
    unsent
}

async fn write_loop(
    lane: &MultiplexedLane,
    mut writer: WriteHalf<Stream>,
    first: Box<Request>,
    queue: &mut mpsc::UnboundedReceiver<Box<Request>>,
    in_flight: &Owed,
    owed: &Unanswered,
    lost: &CancellationToken,
) -> Option<Box<Request>> {
    let life = &lane.life;
    let mut batch = BytesMut::with_capacity(16 * 1024);
    let mut next = Some(first);
    // Made once (each new wait on a token locks it to register and again to deregister), and
    // quiet: polled only when they fire, not on every turn of the loop.
    let mut gone = Quiet::new(lost.cancelled());
    let mut killed = Quiet::new(life.killed().cancelled());
    let mut draining = Quiet::new(life.draining().cancelled());
    loop {
        let request = match next.take() {
            Some(request) => request,
            None => tokio::select! {
                biased;
                _ = &mut gone => return None,
                _ = &mut killed => return None,
                request = queue.recv() => request?,
                _ = &mut draining, if queue.is_empty() => return None,
            },
        };
        let permit = tokio::select! {
            permit = lane.gate.enter(request.since) => permit,
            _ = &mut gone => return Some(request),
        };
        match permit {
            Ok(permit) => stage(request, permit, &mut batch, in_flight),
            Err(error) => {
                request.fail(error.into());
                continue;
            }
        }
        let mut staged = 1;
        // Gather what is already queued into the same write, while permits are free.
        while next.is_none() && batch.len() < MAX_BATCH {
            let Ok(request) = queue.try_recv() else { break };
            next = stage_if_permitted(lane, request, &mut batch, in_flight);
            staged += usize::from(next.is_none());
        }
        // One write in flight to a Redis that answers quickly: while Redis still owes replies to
        // the previous write, commands that arrive join this one. Redis runs commands one at a
        // time anyway, so they wait little longer; but a batch costs Redis, the daemon and the
        // kernel one read, one write and one wake-up for many commands instead of one each.
        // Without this, 50 unpipelined clients settled as often as not into writes of one
        // command, and Redis spent 3x the CPU per command. A command that finds the connection
        // idle is written at once, and so is every batch to a Redis a network round trip away
        // (`turnaround`): held, each command would wait a round trip before its own.
        while next.is_none()
            && batch.len() < MAX_BATCH
            && owed.unanswered() > 0
            && owed.turnaround.near()
        {
            tokio::select! {
                biased;
                _ = &mut gone => return None,
                () = owed.settled() => {}
                request = queue.recv() => match request {
                    Some(request) => {
                        next = stage_if_permitted(lane, request, &mut batch, in_flight);
                        staged += usize::from(next.is_none());
                    }
                    None => break,
                },
            }
        }
        if owed.unanswered() > 0 {
            lane.metrics.overlapping_writes.inc();
        }
        owed.written(staged, lane.epoch);
        // The reader learns of the batch's commands once, before their replies can come.
        in_flight.staged();
        lane.metrics.writes.inc();
        let written = tokio::select! {
            written = writer.write_all(&batch) => written,
            _ = &mut gone => return next,
        };
        batch.clear();
        if written.is_err() {
            // The reader fails what was staged as indeterminate: part of it may have reached Redis.
            lost.cancel();
            return next;
        }
    }
}

/// Stages `request` if the lane has an in-flight permit free; otherwise hands it back.
fn stage_if_permitted(
    lane: &MultiplexedLane,
    request: Box<Request>,
    batch: &mut BytesMut,
    in_flight: &Owed,
) -> Option<Box<Request>> {
    match lane.gate.try_enter() {
        Some(permit) => {
            stage(request, permit, batch, in_flight);
            None
        }
        None => Some(request),
    }
}

fn stage(mut request: Box<Request>, permit: Permit, batch: &mut BytesMut, in_flight: &Owed) {
    request.ticket.granted();
    batch.extend_from_slice(&std::mem::take(&mut request.command));
    // Registered before the bytes are written, so the reader always knows whose reply arrives.
    in_flight.push(InFlight { request, permit });
}

#[allow(clippy::too_many_arguments)]
async fn read_loop(
    lane: &MultiplexedLane,
    slot: &Slot,
    mut reader: ReadHalf<Stream>,
    mut read: BytesMut,
    owed: &Owed,
    unanswered: &Unanswered,
    lost: &CancellationToken,
    generation: u64,
) {
    let mut current: Option<InFlight> = None;
    let mut replies = ReplyReader::new(reply_limits());
    // Created once (the loop below runs per reply) and quiet: polled only when they fire.
    let mut gone = Quiet::new(lost.cancelled());
    let mut killed = Quiet::new(lane.life.killed().cancelled());
    let mut moved = Quiet::new(lane.connector.moved(generation));
    let mut overdue = Overdue::new();
    let failure = loop {
        let mut refused_write = false;
        let handed = hand_out(
            &mut read,
            &mut replies,
            &mut current,
            owed,
            &mut refused_write,
        );
        if refused_write {
            lane.connector.refused_write();
        }
        match handed {
            Ok(0) => {}
            Ok(answered) => {
                unanswered.answered(answered, lane.epoch);
                overdue.head(lane, slot, current.as_ref());
            }
            Err(error) => break format!("redis sent an unreadable reply: {error}"),
        }
        if read.capacity() - read.len() < 4096 {
            read.reserve(16 * 1024);
        }
        tokio::select! {
            biased;
            _ = &mut gone => break "the connection failed".to_owned(),
            _ = &mut killed => break "lanes closed before the reply arrived".to_owned(),
            _ = &mut moved => break "the redis master moved to another server".to_owned(),
            missed = overdue.passed(), if overdue.armed() => if let Some(deadline) = missed {
                break format!("no reply within {deadline:?}; the connection was closed");
            },
            waiting = owed.next(), if current.is_none() => match waiting {
                Some(waiting) => {
                    current = Some(waiting);
                    overdue.head(lane, slot, current.as_ref());
                }
                None => return,
            },
            n = reader.read_buf(&mut read) => match n {
                Ok(0) => break "connection closed by redis".to_owned(),
                Ok(_) => {}
                Err(error) => break error.to_string(),
            },
        }
    };
    lost.cancel();
    // Oldest first: the written ones (counted before their write began), then those the writer
    // was still holding for its next write, which never left the daemon.
    let mut written = unanswered.unanswered();
    for waiting in current.into_iter().chain(owed.close()) {
        let reason = failure.clone();
        waiting.answer(Err(if written > 0 {
            written -= 1;
            CallError::Indeterminate { reason }
        } else {
            CallError::NotSent(LaneError::Unavailable { reason })
        }));
    }
}

/// Hands every complete reply already buffered to the command that owes it, oldest first; returns
/// how many. A reply too large to relay fails its own command only: the connection reads past it.
fn hand_out(
    read: &mut BytesMut,
    replies: &mut ReplyReader,
    current: &mut Option<InFlight>,
    owed: &Owed,
    refused_write: &mut bool,
) -> Result<usize, tollgate_resp::ProtocolError> {
    let mut answered = 0;
    while current.is_some() {
        let Some(next) = replies.next(read)? else {
            break;
        };
        if let Some(waiting) = current
            .as_mut()
            .filter(|waiting| waiting.request.preamble > 0)
        {
            // The reply to an `ASKING` written with the command: Redis answers it `+OK`, and the
            // command's own reply says whether the redirect it asked for worked.
            waiting.request.preamble -= 1;
            continue;
        }
        let outcome = match next {
            Next::Reply(reply) => {
                *refused_write |= reply.is_readonly();
                Ok(reply)
            }
            Next::TooLarge { limit } => Err(CallError::Indeterminate {
                reason: format!("the reply is larger than {limit} bytes and was not relayed"),
            }),
        };
        if let Some(waiting) = current.take() {
            waiting.answer(outcome);
        }
        *current = owed.pop();
        answered += 1;
    }
    Ok(answered)
}

/// The deadline of the command a connection owes its oldest reply to, counted from when it became
/// the oldest (Redis answers in order: before then it could not have been answered). One timer per
/// connection, moved only when a deadline earlier than the one it is set for appears, or when it
/// fires early: replies move the head far more often than a deadline passes.
struct Overdue {
    timer: Pin<Box<tokio::time::Sleep>>,
    /// When the timer is set to fire; `None` when it is not set.
    set_for: Option<Instant>,
    /// The current head's deadline: when, and how long it was given.
    due: Option<(Instant, Duration)>,
}

impl Overdue {
    fn new() -> Self {
        Overdue {
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            set_for: None,
            due: None,
        }
    }

    /// `head` is now the oldest command owed a reply (or none is).
    fn head(&mut self, lane: &MultiplexedLane, slot: &Slot, head: Option<&InFlight>) {
        let owed_since = match head {
            Some(_) => lane.clock(),
            None => 0,
        };
        slot.owed_since.store(owed_since, Ordering::Relaxed);
        // A script's time limit runs from here: before, Redis could not have started on it.
        if let Some(watched) = head.and_then(|head| head.request.watched.as_ref()) {
            watched.started();
        }
        self.due = head
            .and_then(|head| head.request.deadline)
            .map(|deadline| (Instant::now() + deadline, deadline));
        if let Some((at, _)) = self.due {
            if self.set_for.is_none_or(|set_for| at < set_for) {
                self.timer.as_mut().reset(at);
                self.set_for = Some(at);
            }
        }
    }

    fn armed(&self) -> bool {
        self.set_for.is_some()
    }

    /// Resolves when the timer fires: with the deadline the head missed, or `None` (the timer is
    /// set again for the head's own deadline, or left unset when nothing has one).
    async fn passed(&mut self) -> Option<Duration> {
        (&mut self.timer).await;
        match self.due {
            Some((at, deadline)) if at <= Instant::now() => Some(deadline),
            Some((at, _)) => {
                self.timer.as_mut().reset(at);
                self.set_for = Some(at);
                None
            }
            None => {
                self.set_for = None;
                None
            }
        }
    }
}

/// The commands a connection's writer staged, oldest first, for its reader to hand their replies
/// to. Writer and reader are two halves of one task (`pipeline`'s join), never running at once, so
/// the lock is never contended: a queue of their own costs a command far less than a channel's.
#[derive(Default)]
struct Owed {
    queue: Mutex<OwedQueue>,
    /// The reader, waiting for a command to be staged (or for the writer's end).
    reader: AtomicWaker,
}

#[derive(Default)]
struct OwedQueue {
    staged: VecDeque<InFlight>,
    /// The writer is done: once `staged` is empty, nothing more will come.
    finished: bool,
    /// The reader is gone: what is staged from now on is dropped (its caller hears that the
    /// driver stopped), as nobody will read its reply.
    closed: bool,
}

impl Owed {
    fn push(&self, command: InFlight) {
        let mut queue = self.queue.lock();
        if !queue.closed {
            queue.staged.push_back(command);
        }
    }

    /// The reader may look again: commands were staged.
    fn staged(&self) {
        self.reader.wake();
    }

    /// The writer is done.
    fn finish(&self) {
        self.queue.lock().finished = true;
        self.reader.wake();
    }

    /// The oldest staged command, if any.
    fn pop(&self) -> Option<InFlight> {
        self.queue.lock().staged.pop_front()
    }

    /// The oldest staged command, once there is one; `None` once the writer is done and every
    /// command it staged was taken.
    async fn next(&self) -> Option<InFlight> {
        std::future::poll_fn(|cx| {
            if let Some(command) = self.take_or_end() {
                return Poll::Ready(command);
            }
            self.reader.register(cx.waker());
            match self.take_or_end() {
                Some(command) => Poll::Ready(command),
                None => Poll::Pending,
            }
        })
        .await
    }

    /// `Some(Some(_))`: the oldest staged command; `Some(None)`: none will come; `None`: none yet.
    fn take_or_end(&self) -> Option<Option<InFlight>> {
        let mut queue = self.queue.lock();
        match queue.staged.pop_front() {
            Some(command) => Some(Some(command)),
            None if queue.finished => Some(None),
            None => None,
        }
    }

    /// The reader is gone: what is staged, oldest first (nothing is staged from now on).
    fn close(&self) -> Vec<InFlight> {
        let mut queue = self.queue.lock();
        queue.closed = true;
        queue.staged.drain(..).collect()
    }
}

/// Commands one connection has written and Redis has not yet answered (counted by its
/// [`Turnaround`], which also times them), shared by its writer and reader, so that the writer can
/// hold the next batch while a write is still being answered when Redis is near.
#[derive(Default)]
struct Unanswered {
    /// The writer, waiting for every written command to be answered.
    writer: AtomicWaker,
    turnaround: Turnaround,
}

impl Unanswered {
    /// `commands` are about to be written; `epoch` is the lane's, the origin of the clock that
    /// times the turnaround.
    fn written(&self, commands: usize, epoch: Instant) {
        self.turnaround
            .writing(commands, || epoch.elapsed().as_nanos() as u64);
    }

    fn answered(&self, commands: usize, epoch: Instant) {
        self.turnaround
            .answered(commands, || epoch.elapsed().as_nanos() as u64);
        if commands > 0 && self.unanswered() == 0 {
            self.writer.wake();
        }
    }

    fn unanswered(&self) -> usize {
        self.turnaround.unanswered() as usize
    }

    /// Resolves once every written command is answered.
    async fn settled(&self) {
        std::future::poll_fn(|cx| {
            self.writer.register(cx.waker());
            if self.unanswered() == 0 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}
