//! One client connection: read commands, plan each, start it on its lane, write replies in order.
//!
//! Pipelining is kept end to end: commands for the same multiplexed lane are sent without waiting,
//! and their replies are collected in order ([`Schedule`]). A command for another lane first
//! waits for everything before it (a *barrier*), so a client's commands still run in the order sent.
//! What each command becomes is the plan's (`plan.rs`), carried out on the session's state
//! (`state.rs`); this file is the loop and its I/O. A client that vanishes drops its in-flight
//! work: a borrowed connection with a reply still owed is closed by the lane, never reused. Work
//! awaited in place (a transaction's commands, a blocking command inside WATCH, a subscription, the
//! replies owed before a close) races the client's hang-up too ([`until_hang_up`]), so no session
//! outlives its client. Replies are written as soon as they are due ([`Outbox`]), while the client
//! is still read: neither direction waits for the other.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ahead::{Ahead, Read};
use super::budget::{self, Room};
use super::clients::{Client, UnblockMode};
use super::door::{self, Entered};
use super::ended::Ended;
use super::front::FrontDoor;
use super::hang_up::HangUp;
use super::local::Protocol;
use super::monitor::Watch;
use super::outbox::{self, Outbox};
use super::pending::{Class, Lent, Pending};
use super::replies;
use super::schedule::{Schedule, Step, Turn};
use super::sources::{self, End, Woke};
use super::state::{AtOnce, SessionState};
use super::subscriptions::{self, Eviction};
use super::{client_tracking, mailbox};
use crate::tracking::{Delivery, Gate};

/// Read in chunks of this size.
const READ_CHUNK: usize = 16 * 1024;
/// How much a client may send ahead while its next command waits for a barrier.
const PARKED_INPUT_CAP: usize = 1024 * 1024;
/// How long the last words to a client the daemon disconnects may take to write.
const LAST_WORDS: Duration = Duration::from_millis(100);

struct Session {
    state: SessionState,
    schedule: Schedule,
    ahead: Ahead,
    out: Outbox,
    /// A blocking command `CLIENT UNBLOCK` may end is in flight.
    blocked: bool,
    /// This session's invalidations (`CLIENT TRACKING`), each held behind the replies it had in
    /// flight when it arrived.
    gate: Gate<Delivery>,
}

pub async fn run(stream: UnixStream, front: Arc<FrontDoor>, stop: CancellationToken, id: u64) {
    let Some((stream, entered)) = door::enter(stream, &front, &stop, id).await else {
        return;
    };
    // The permit is held for the session's life: its place under `limits:`.
    let Entered {
        permit: _permit,
        caller,
        me,
    } = entered;
    let (reader, writer) = stream.into_split();
    let flight = front.services.flights.join(caller.tenant());
    let mut session = Session {
        state: SessionState::new(front, caller, id, me),
        schedule: Schedule::counted(flight),
        ahead: Ahead::default(),
        out: Outbox::default(),
        blocked: false,
        gate: Gate::default(),
    };
    if let Err(ended) = session.serve(reader, writer, stop).await {
        tracing::debug!(reason = %ended, "RESP session ended");
    }
    session.schedule.clear();
    session.state.finish().await;
}

/// How far a session is from its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Serving.
    No,
    /// The daemon is stopping: what was read is answered, nothing more is read.
    Stopping,
    /// The client quit (or sent what ends it): the replies owed, then these last words.
    Closing,
    /// Everything is buffered: once written, the connection closes.
    Closed,
}

impl Session {
    /// Writes (or passes to their redirect target) the invalidations whose replies are out.
    fn invalidations_due(&mut self) {
        let (_, answered) = self.schedule.counts();
        while let Some(delivery) = self.gate.next_due(answered) {
            match delivery.to == self.state.id {
                true => self.invalidate(&delivery),
                false => self.state.front.tracking.forward(delivery),
            }
        }
    }

    /// Writes an invalidation, whatever `CLIENT REPLY` says (as Redis pushes them).
    fn invalidate(&mut self, delivery: &Delivery) {
        let frame = client_tracking::message_frame(&delivery.message);
        tollgate_resp::encode(&frame, self.out.buffer());
    }

    async fn serve(
        &mut self,
        mut reader: OwnedReadHalf,
        writer: OwnedWriteHalf,
        stop: CancellationToken,
    ) -> Result<(), Ended> {
        let mut input = BytesMut::with_capacity(READ_CHUNK);
        let mut ending = Ending::No;
        let mut last_words = Bytes::new();
        // Made once, not per turn of the loop (which turns per reply): each new wait on a token
        // locks it to register and again to deregister. One `Quiet`: polled only when one fires.
        let eviction = self.state.subscriptions.eviction();
        let killed = self.state.me.client.killed();
        let budget = self.state.budget.clone();
        let mut ends = sources::ends(
            eviction.clone(),
            killed.clone(),
            budget.clone(),
            Some(stop.clone()),
        );
        let front = self.state.front.clone();
        let me = self.state.me.client.clone();
        let mut hang_up = HangUp::new(&reader);
        loop {
            if ending == Ending::No {
                if let Some(close) = self.dispatch(&mut input, &mut reader, &writer).await? {
                    last_words = close;
                    ending = Ending::Closing;
                }
            }
            if ending == Ending::Closing && self.schedule.is_empty() {
                self.out.reply(&last_words);
                ending = Ending::Closed;
            }
            // Written as soon as it is due, without waiting for the client: what the socket does
            // not take now is written when it becomes writable, while reading goes on.
            if self.out.wants_write(&self.schedule) {
                self.out.write_ready(&writer).map_err(Ended::WriteFailed)?;
            }
            let done = self.schedule.is_empty() && self.out.is_empty();
            if done && matches!(ending, Ending::Stopping | Ending::Closed) {
                return Ok(());
            }
            let writing = self.out.wants_write(&self.schedule);
            // While a command waits for a barrier (or the client's last words wait for the
            // replies owed), keep reading, boundedly, only to notice a client that hangs up.
            let holding = self.schedule.is_parked() || ending == Ending::Closing;
            let may_read = matches!(ending, Ending::No | Ending::Closing)
                && self.schedule.len() + self.ahead.len() < front.config.max_pipeline
                && (!holding || input.len() < PARKED_INPUT_CAP);
            budget::trim(&mut input, READ_CHUNK);
            let subscribed = !self.state.subscriptions.is_empty();
            let watching = !self.state.watches.is_empty();
            // Messages pushed to the client are taken only while what is buffered for it drains:
            // one that does not read is left to its subscription's bounded buffer (and evicted
            // when that fills), not buffered here up to its budget.
            let draining = self.out.len() < outbox::WRITE_AT;
            budget.sync(self.out.len(), input.len(), subscribed);
            let room = match may_read {
                true => budget.room(input.len()),
                false => Room::Paused,
            };
            // The sources, in the biased order (see `sources.rs`): the ends first, so that a
            // session kept busy by its replies and input is still killed, evicted, stopped or cut
            // off at once (one `Quiet`, which costs a check until one fires); then replies before
            // more input. A rare source's future is made only when it is live.
            let woke = {
                let protocol = self.state.protocol;
                let state = &mut self.state;
                let mut unblocked = pin!(self.blocked.then(|| state.me.client.unblocked()));
                let mut gone = pin!((room.bytes() == 0).then(|| hang_up.gone()));
                let mut message =
                    pin!((subscribed && draining).then(|| state.subscriptions.next()));
                let mut watched =
                    pin!((watching && draining).then(|| state.watches.next(protocol)));
                let mut monitor = pin!((state.monitor.is_some() && draining)
                    .then(|| monitored(&mut state.monitor, &state.me.client)));
                let mut pool_room = pin!((room == Room::PoolFull).then(|| budget.pool_room()));
                // Taken while what is buffered drains, and while the gate has room: past it, the
                // mailbox collapses what it holds into one invalidation of everything.
                let mail = draining && self.gate.len() < mailbox::CAPACITY;
                let schedule = &mut self.schedule;
                let mut replies = !schedule.is_empty();
                let room = room.bytes();
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(end) = Pin::new(&mut ends).poll(cx) {
                        return Poll::Ready(Woke::End(end));
                    }
                    if replies {
                        match schedule.poll_next(cx) {
                            Poll::Ready(Some(reply)) => return Poll::Ready(Woke::Reply(reply)),
                            Poll::Ready(None) => replies = false,
                            Poll::Pending => {}
                        }
                    }
                    if let Poll::Ready(mode) = sources::poll_slot(unblocked.as_mut(), cx) {
                        return Poll::Ready(Woke::Unblocked(mode));
                    }
                    if writing {
                        if let Poll::Ready(ready) = sources::poll_writable(&writer, cx) {
                            return Poll::Ready(Woke::Writable(ready));
                        }
                    }
                    if room > 0 {
                        if let Poll::Ready(read) =
                            sources::poll_read(&mut reader, &mut input, room, cx)
                        {
                            return Poll::Ready(Woke::Read(read));
                        }
                    }
                    if sources::poll_slot(gone.as_mut(), cx).is_ready() {
                        return Poll::Ready(Woke::HungUp);
                    }
                    if let Poll::Ready(Some((message, held))) =
                        sources::poll_slot(message.as_mut(), cx)
                    {
                        return Poll::Ready(Woke::Message(message, held));
                    }
                    if let Poll::Ready(frame) = sources::poll_slot(watched.as_mut(), cx) {
                        return Poll::Ready(Woke::Watched(frame));
                    }
                    if let Poll::Ready(Some(line)) = sources::poll_slot(monitor.as_mut(), cx) {
                        return Poll::Ready(Woke::Monitored(line));
                    }
                    if sources::poll_slot(pool_room.as_mut(), cx).is_ready() {
                        return Poll::Ready(Woke::PoolRoom);
                    }
                    if mail && me.mailbox.poll(cx).is_ready() {
                        return Poll::Ready(Woke::Tracked);
                    }
                    Poll::Pending
                })
                .await
            };
            match woke {
                Woke::End(End::Evicted) => {
                    let eviction = self.state.subscriptions.eviction_reason();
                    if let Eviction::TooSlow(why) = &eviction {
                        // A subscriber too slow for its messages will not read those still
                        // buffered: only the reason is sent (after the end of a frame already
                        // partly sent), as for a breach of its budget.
                        self.out.discard_unsent();
                        self.out.message(&replies::disconnected(why));
                    }
                    let _ = self.out.last_words(&writer, LAST_WORDS).await;
                    tracing::info!(%eviction, "subscriber disconnected");
                    return Err(Ended::Evicted(eviction));
                }
                Woke::End(End::Killed) => {
                    // A kill of this session by itself answers first, as Redis closes after the reply.
                    while let Some(reply) = self.schedule.next_now() {
                        self.out.reply(&reply);
                    }
                    let _ = self.out.last_words(&writer, LAST_WORDS).await;
                    return Err(Ended::Killed);
                }
                Woke::End(End::Breached(breach)) => {
                    // What is buffered was not read and will not be: only the reason is sent
                    // (after the end of a frame already partly sent, so that it stays a frame).
                    self.out.discard_unsent();
                    self.out.message(&replies::disconnected(&breach));
                    let _ = self.out.last_words(&writer, LAST_WORDS).await;
                    return Err(Ended::OverBudget(breach));
                }
                Woke::End(End::Stopped) => {
                    // What was read is answered; a client already closing keeps its last words.
                    if ending == Ending::No {
                        ending = Ending::Stopping;
                    }
                    ends = sources::ends(eviction.clone(), killed.clone(), budget.clone(), None);
                }
                Woke::Reply(reply) => {
                    let mut read = reply.len();
                    self.out.reply(&reply);
                    // Replies of a pipeline arrive together: take every one already here in this turn.
                    while self.out.len() < outbox::WRITE_AT {
                        let Some(reply) = self.schedule.next_now() else {
                            break;
                        };
                        read += reply.len();
                        self.out.reply(&reply);
                    }
                    // Replies count against a quota of bytes once read, as they cannot be refused.
                    self.state.meters.owe(&front.services.quotas, read);
                    if !self.gate.is_empty() {
                        self.invalidations_due();
                    }
                    if self.blocked && self.schedule.in_flight(Class::Exclusive) == 0 {
                        self.blocked = false;
                        self.state.me.client.set_blocked(false);
                    }
                }
                Woke::Unblocked(mode) => {
                    self.schedule.unblock(unblocked(mode, self.state.protocol));
                }
                Woke::Writable(ready) => {
                    ready.map_err(Ended::WriteFailed)?;
                    self.out.write_ready(&writer).map_err(Ended::WriteFailed)?;
                }
                Woke::Read(read) => match read {
                    Ok(0) => return Err(Ended::Closed),
                    Ok(_) => {}
                    Err(error) => return Err(Ended::ReadFailed(error)),
                },
                // Reading nothing (at a budget, the pipeline cap or parked input): a client gone
                // meanwhile is noticed all the same, and gives its held bytes back now.
                Woke::HungUp => return Err(Ended::Closed),
                // The message counted against the budget (`_held`) until it is in `out`.
                Woke::Message(message, _held) => {
                    // Delivered whatever `CLIENT REPLY` says, as Redis 7 delivers them.
                    let frame = subscriptions::message_frame(message, self.state.protocol);
                    tollgate_resp::encode(&frame, self.out.buffer());
                }
                Woke::Watched(frame) => tollgate_resp::encode(&frame, self.out.buffer()),
                Woke::Monitored(line) => self.out.message(&line),
                Woke::PoolRoom => {}
                Woke::Tracked => {
                    let (started, _) = self.schedule.counts();
                    for delivery in me.mailbox.take(mailbox::CAPACITY - self.gate.len()) {
                        match delivery.tracking == self.state.id {
                            // Its own: after the replies owed now.
                            true => self.gate.hold(delivery, started),
                            // Another client's, redirected here once its replies were out.
                            false => self.invalidate(&delivery),
                        }
                    }
                    self.invalidations_due();
                }
            }
        }
    }

    /// Starts every complete command in `input` that may start now. Returns a final reply when the
    /// connection must close (QUIT, a protocol error), and `Err` when the client hung up while a
    /// command was awaited in place.
    async fn dispatch(
        &mut self,
        input: &mut BytesMut,
        reader: &mut OwnedReadHalf,
        writer: &OwnedWriteHalf,
    ) -> Result<Option<Bytes>, Ended> {
        // The near cache's clock for this turn: read once, at the first hit, and read again after
        // anything that waits (every command of a turn is served within microseconds of it).
        let mut now: Option<Instant> = None;
        loop {
            if self.schedule.len() >= self.state.front.config.max_pipeline {
                return Ok(None);
            }
            if std::mem::take(&mut self.state.owes_yield) {
                tokio::task::yield_now().await;
                now = None;
            }
            // A tenant past its share of the workers' admission time waits here, before it
            // admits more, and leaves the workers to the other tenants.
            if self.state.clock.in_debt() {
                self.state.clock.pay().await;
                now = None;
            }
            let (step, voice) = match self.schedule.unpark() {
                Some(parked) => parked,
                None => {
                    let admitting = self.state.admitting();
                    let (command, kind, decided) = match self.ahead.next(input, admitting) {
                        Some(Read::Command {
                            command,
                            kind,
                            decision,
                        }) => (command, kind, decision),
                        Some(Read::Invalid(error)) => {
                            return Ok(Some(replies::protocol_error(&error)))
                        }
                        None => return Ok(None),
                    };
                    let voice = self.state.voice(kind);
                    let at_once = AtOnce {
                        quiet: self.schedule.quiet(),
                        now: &mut now,
                    };
                    (self.state.step(command, kind, decided, at_once), voice)
                }
            };
            if self.schedule.turn(step.class()) == Turn::Wait {
                self.schedule.park(step, voice);
                return Ok(None);
            }
            // Told before it is sent (an invalidation of what it reads, arriving while it is in
            // flight, must find it tracked), and held behind its reply: this session takes its
            // mailbox only in its loop, after the step below is counted in the schedule.
            self.state.sent();
            match step {
                Step::Reply(reply) => {
                    let ready = Pending::Ready(Some((Class::Local, reply)));
                    self.schedule.push(Class::Local, ready, voice);
                }
                Step::Close(reply) => return Ok(Some(voice.say(reply))),
                Step::Cached(shape, command, slot) => {
                    let quiet = self.schedule.quiet();
                    let route =
                        slot.map_or(tollgate_lanes::Route::Any, tollgate_lanes::Route::Slot);
                    let now = *now.get_or_insert_with(Instant::now);
                    let (class, sent) = self.state.serve_cached(shape, command, quiet, now, route);
                    self.schedule.push(class, sent, voice);
                }
                Step::Multiplexed(lane, route, encoded, deadline, amend) => {
                    let class = Class::Multiplexed(lane);
                    let idle = self.schedule.in_flight(class) == 0;
                    let sent = self
                        .state
                        .send_multiplexed(lane, route, encoded, deadline, idle);
                    let sent = self.state.amend(sent, amend);
                    self.schedule.push(class, sent, voice);
                }
                Step::Gathered(lane, gather, deadline) => {
                    let class = Class::Multiplexed(lane);
                    let idle = self.schedule.in_flight(class) == 0;
                    let sent = self.state.send_gathered(lane, gather, deadline, idle);
                    self.schedule.push(class, sent, voice);
                }
                Step::Exclusive(lane, route, command, amend) => {
                    if lane == Lent::Blocking {
                        self.blocked = unblockable(command.name());
                        self.state.me.client.set_blocked(self.blocked);
                    }
                    let sent = self.state.send_exclusive(lane, route, command);
                    let sent = self.state.amend(sent, amend);
                    self.schedule.push(Class::Exclusive, sent, voice);
                }
                Step::GatheredLent(lane, gather, deadline) => {
                    let sent = self.state.send_gathered_lent(lane, gather, deadline);
                    self.schedule.push(Class::Exclusive, sent, voice);
                }
                Step::InPlace(work) => {
                    // Work that may wait (a blocking command on the pinned connection, a lease
                    // wait) does not hold back the replies before it.
                    let out = work.may_wait().then_some((writer, &mut self.out));
                    // Pinned here and lent: the future of work in place is as large as its
                    // largest kind (a lease call's, ~4 KiB), and handed over by value it was
                    // copied whole twice more per call.
                    let work = pin!(self.state.in_place(work));
                    let reply = until_hang_up(work, reader, input, out).await?;
                    now = None;
                    self.out.reply(&voice.say(reply));
                }
            }
        }
    }
}

/// Awaits `work` while reading what the client sends meanwhile (boundedly, as for a parked command),
/// so that a hang-up is noticed: then `work` is dropped unfinished and `Err` says why. A borrowed
/// connection dropped with a reply owed is closed, never lent again (see `Borrowed`), so a blocking
/// command left in Redis by a vanished client dies with its connection. With `out`, what it holds
/// is written meanwhile.
async fn until_hang_up<T>(
    mut work: Pin<&mut impl Future<Output = T>>,
    reader: &mut OwnedReadHalf,
    input: &mut BytesMut,
    out: Option<(&OwnedWriteHalf, &mut Outbox)>,
) -> Result<T, Ended> {
    let mut hang_up = HangUp::new(reader);
    let (writer, mut out) = match out {
        Some((writer, out)) => {
            out.write_ready(writer).map_err(Ended::WriteFailed)?;
            (Some(writer), Some(out))
        }
        None => (None, None),
    };
    loop {
        let writing = out.as_ref().is_some_and(|out| !out.is_empty());
        tokio::select! {
            done = work.as_mut() => return Ok(done),
            read = reader.read_buf(input), if input.len() < PARKED_INPUT_CAP => match read {
                Ok(0) => return Err(Ended::ClosedWhileAwaited),
                Ok(_) => {}
                Err(error) => return Err(Ended::ReadFailed(error)),
            },
            // Read up to the cap: a client gone after that is noticed all the same.
            () = hang_up.gone(), if input.len() >= PARKED_INPUT_CAP => {
                return Err(Ended::ClosedWhileAwaited);
            }
            ready = writable(writer), if writing => {
                ready.map_err(Ended::WriteFailed)?;
                if let (Some(writer), Some(out)) = (writer, out.as_deref_mut()) {
                    out.write_ready(writer).map_err(Ended::WriteFailed)?;
                }
            }
        }
    }
}

/// Whether `CLIENT UNBLOCK` ends a command of this name here: the list, sorted-set and stream
/// pops, not WAIT (whose answer only Redis knows) nor anything else on the BLOCKING lane.
fn unblockable(name: &[u8]) -> bool {
    const POPS: [&[u8]; 10] = [
        b"BLPOP",
        b"BRPOP",
        b"BRPOPLPUSH",
        b"BLMOVE",
        b"BZPOPMIN",
        b"BZPOPMAX",
        b"BLMPOP",
        b"BZMPOP",
        b"XREAD",
        b"XREADGROUP",
    ];
    POPS.iter().any(|pop| name.eq_ignore_ascii_case(pop))
}

/// What a command `CLIENT UNBLOCK` ended answers, as Redis answers it: a timeout's null array (for
/// BRPOPLPUSH and BLMOVE too), or `-UNBLOCKED`.
fn unblocked(mode: UnblockMode, protocol: Protocol) -> Bytes {
    match (mode, protocol) {
        (UnblockMode::Error, _) => {
            Bytes::from_static(b"-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n")
        }
        (UnblockMode::Timeout, Protocol::Resp3) => Bytes::from_static(b"_\r\n"),
        (UnblockMode::Timeout, Protocol::Resp2) => Bytes::from_static(b"*-1\r\n"),
    }
}

/// Resolves when `writer` may take more (never without one).
async fn writable(writer: Option<&OwnedWriteHalf>) -> std::io::Result<()> {
    match writer {
        Some(writer) => writer.writable().await,
        None => std::future::pending().await,
    }
}

/// The next `MONITOR` line for this session, once it monitors.
async fn monitored(watch: &mut Option<Watch>, viewer: &Client) -> Option<Bytes> {
    match watch {
        Some(watch) => watch.next(viewer).await,
        None => std::future::pending().await,
    }
}
