//! One client connection: read commands, admit each, send it on its lane, write replies in order.
//!
//! Pipelining is kept end to end: commands for the same multiplexed lane are sent without waiting,
//! and their replies are collected in order ([`InOrder`]). A command for another lane first
//! waits for everything before it (a *barrier*), so a client's commands still run in the order sent.
//! Transactions pin one TRANSACTION connection to the session; subscriptions come from the shared
//! PUBSUB lane. A client that vanishes drops its in-flight work: a borrowed connection with a reply
//! still owed is closed by the lane, never reused. Work awaited in place (a transaction's commands,
//! a blocking command inside WATCH, a subscription, the replies owed before a close) races the
//! client's hang-up too ([`until_hang_up`]), so no session outlives its client.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use tollgate_lanes::{Borrowed, Channel, Quiet, SubscriptionKind};
use tollgate_model::{Caller, Lane};
use tollgate_policy::{Decision, DenyCause};
use tollgate_resp::{Command, Frame, ProtocolError};

use super::amend::Amend;
use super::budget::{self, ClientBudget, Room};
use super::clients::{Client, KillFilter, ListFilter, Registration};
use super::keyspace::{self, Whole};
use super::lease::{self, Intercept};
use super::lease_watch::{self, Watches};
use super::local::{self, Local, Protocol, ReplyMode, Voice};
use super::local::{wrong_arity, Arity};
use super::monitor::Watch;
use super::pending::{Amended, Class, InOrder, Pending};
use super::queued::QueuedLocally;
use super::subscriptions::{self, Eviction, Subscriptions};
use super::{replies, FrontDoor};
use crate::server::identity::Refused;
use crate::server::limits::TooMany;
use crate::server::peer::peer_credentials;

/// Flush the write buffer once it holds this much, even with replies still to come.
const FLUSH_AT: usize = 64 * 1024;
/// Read in chunks of this size.
const READ_CHUNK: usize = 16 * 1024;
/// The most commands of a pipeline admitted together.
const ADMIT_TOGETHER: usize = 64;
/// How much a client may send ahead while its next command waits for a barrier.
const PARKED_INPUT_CAP: usize = 1024 * 1024;
/// How long a connection turned away for a limit is drained before it is closed.
const TURN_AWAY_DRAIN: Duration = Duration::from_secs(1);
/// How long a refused peer is waited for to send its first command, which the refusal answers.
const REFUSED_WAIT: Duration = Duration::from_secs(5);

/// What one admitted command becomes.
enum Step {
    /// A reply the daemon writes itself.
    Reply(Bytes),
    /// Send these encoded bytes on a multiplexed lane (REGULAR, SCRIPT), with this deadline.
    Multiplexed(Lane, Bytes, Option<Duration>),
    /// Borrow a BLOCKING or ADMIN connection for this one command.
    Exclusive(Lane, Command),
    /// Awaited in place once everything before it has been answered: it changes the session.
    InPlace(InPlace),
    /// Write this reply, then close the connection.
    Close(Bytes),
    /// Send as the inner step says, and correct the reply when it arrives.
    Amended(Box<Step>, Amend),
}

impl Step {
    fn amended(self, amend: Option<Amend>) -> Step {
        match amend {
            Some(amend) => Step::Amended(Box::new(self), amend),
            None => self,
        }
    }
}

enum InPlace {
    /// A command while a transaction connection is pinned, or one that pins it (WATCH, MULTI).
    Transaction(Command),
    Subscribe(SubscriptionKind, Vec<Bytes>),
    Unsubscribe(SubscriptionKind, Vec<Bytes>),
    /// `HELLO` with another protocol: the lane connections change with it, so it waits for what
    /// was sent before on the old ones.
    Hello(local::Hello),
    /// `MONITOR`: from now on, the commands of the sessions this one may see are streamed to it.
    Monitor,
    /// A whole-keyspace command, run key by key over SCAN (see `keyspace.rs`).
    Keyspace(Whole, Vec<Bytes>),
    Reset,
    /// `LEASE …`, which may wait for the lease.
    Lease(Command),
}

/// The pinned TRANSACTION connection of a session in WATCH or MULTI.
struct Transaction {
    conn: Borrowed,
    in_multi: bool,
    /// A command was refused while queueing, so EXEC must fail as Redis fails it (EXECABORT).
    poisoned: bool,
    /// The queue's commands answered by the daemon, and where their replies go in EXEC's.
    local: QueuedLocally,
}

struct Session {
    front: Arc<FrontDoor>,
    caller: Caller,
    id: u64,
    protocol: Protocol,
    /// This session in the listener's list (`CLIENT LIST`): its name, last command and state.
    me: Registration,
    /// Set once the session sent `MONITOR`.
    monitor: Option<Watch>,
    regular: Option<Channel>,
    script: Option<Channel>,
    transaction: Option<Transaction>,
    subscriptions: Subscriptions,
    pending: InOrder,
    /// In-flight commands per class, to decide when a barrier is needed.
    in_flight: Vec<(Class, usize)>,
    /// An admitted command waiting for a barrier, and whether its reply will be heard.
    parked: Option<(Step, Voice)>,
    /// Which replies the client gets (`CLIENT REPLY`).
    reply_mode: ReplyMode,
    /// Commands read from the input ahead of their turn, oldest first.
    ahead: VecDeque<Ahead>,
    /// A guard ran out of its budget deciding this session's command: the worker it kept busy is
    /// given back to other sessions before this one goes on.
    owes_yield: bool,
    /// Ends this connection's session-bound leases when the session is dropped.
    leases: lease::Connection,
    /// `LEASE WATCH`es: holder changes pushed to the client.
    watches: Watches,
    out: BytesMut,
    /// The bytes held for this client, against `resp.budgets`.
    budget: Arc<ClientBudget>,
}

/// A command read ahead of its turn (see [`Session::read_ahead`]).
enum Ahead {
    /// Admitted already, together with the rest of its run.
    Decided(Command, Decision),
    /// Planned, and admitted if it needs to be, when its turn comes.
    Parsed(Command),
    /// Unreadable input: the connection closes when its turn comes.
    Invalid(ProtocolError),
}

pub async fn run(stream: UnixStream, front: Arc<FrontDoor>, stop: CancellationToken, id: u64) {
    let peer = match peer_credentials(&stream) {
        Ok(peer) => peer,
        Err(error) => {
            tracing::warn!(%error, "cannot read peer credentials; closing");
            return;
        }
    };
    // Held for the session's life: its place under `limits:`.
    let _permit = match front.connections.admit(peer, &front.identities) {
        Ok(permit) => permit,
        Err(too_many) => return turn_away(stream, &too_many).await,
    };
    let caller = match front.identities.caller(peer) {
        Ok(caller) => caller,
        Err(refused) => return refuse(stream, &refused, &stop).await,
    };
    let admin = front.identities.admin(peer, "").is_ok();
    let me = front
        .clients
        .register(id, caller.principal.clone(), admin, &front.socket);
    let (reader, writer) = stream.into_split();
    let mut session = Session {
        subscriptions: Subscriptions::new(front.config.subscriber_buffer),
        budget: ClientBudget::new(&front.config.budgets, front.pool.clone(), &caller, id),
        front,
        caller,
        id,
        protocol: Protocol::Resp2,
        me,
        monitor: None,
        regular: None,
        script: None,
        transaction: None,
        pending: InOrder::default(),
        in_flight: Vec::new(),
        parked: None,
        reply_mode: ReplyMode::On,
        ahead: VecDeque::new(),
        owes_yield: false,
        leases: lease::Connection::new(id),
        watches: Watches::default(),
        out: BytesMut::new(),
    };
    let outcome = session.serve(reader, writer, stop).await;
    if let Err(reason) = outcome {
        tracing::debug!(client = id, %reason, "RESP session ended");
    }
    session.finish().await;
}

/// Answers a refused peer with `-NOPERM` naming why, then closes. The refusal waits (boundedly) for
/// the first command so that the client reads it as that command's reply rather than finding the
/// connection closed before it could send.
async fn refuse(mut stream: UnixStream, refused: &Refused, stop: &CancellationToken) {
    tracing::warn!(
        uid = refused.uid,
        gid = refused.gid,
        "refusing an unmapped peer"
    );
    let mut first = BytesMut::with_capacity(READ_CHUNK);
    tokio::select! {
        _ = tokio::time::timeout(REFUSED_WAIT, stream.read_buf(&mut first)) => {}
        () = stop.cancelled() => {}
    }
    let reply = replies::error(format!("NOPERM tollgate: {refused}"));
    // The peer may be gone already; there is nothing else to tell it.
    let _ = stream.write_all(&reply).await;
    let _ = stream.shutdown().await;
}

/// Answers a connection past a cap of `limits:` with an error, at once (like Redis past its
/// `maxclients`), then closes it. What the client sent meanwhile is read and dropped for a moment,
/// so that the close does not reset the connection before the client reads the error.
async fn turn_away(mut stream: UnixStream, too_many: &TooMany) {
    let reply = replies::error(format!("ERR tollgate: {too_many}"));
    // The peer may be gone already; there is nothing else to tell it.
    let _ = stream.write_all(&reply).await;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(TURN_AWAY_DRAIN, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

impl Session {
    async fn serve(
        &mut self,
        mut reader: OwnedReadHalf,
        mut writer: OwnedWriteHalf,
        stop: CancellationToken,
    ) -> Result<(), String> {
        let mut input = BytesMut::with_capacity(READ_CHUNK);
        let mut stopping = false;
        // Made once, not per turn of the loop (which turns per reply): each new wait on a token
        // locks it to register and again to deregister. Quiet: polled only when they fire.
        let eviction = self.subscriptions.eviction();
        let mut evicted = Quiet::new(eviction.cancelled());
        let mut stopped = Quiet::new(stop.cancelled());
        let killed = self.me.client.killed();
        let mut killed = Quiet::new(killed.cancelled());
        let mut breached = Quiet::new(self.budget.clone().breached());
        let pool = self.front.pool.clone();
        loop {
            if !stopping {
                if let Some(close) = self.dispatch(&mut input, &mut reader).await? {
                    until_hang_up(self.drain(), &mut reader, &mut input).await?;
                    self.out.extend_from_slice(&close);
                    return self.flush(&mut writer).await;
                }
            }
            if self.pending.is_empty() {
                self.flush(&mut writer).await?;
                if stopping {
                    return Ok(());
                }
            } else if self.out.len() >= FLUSH_AT {
                self.flush(&mut writer).await?;
            }
            // While a command waits for a barrier, keep reading (boundedly) only to notice a client
            // that hangs up during a long blocking command.
            let may_read = !stopping
                && self.pending.len() + self.ahead.len() < self.front.config.max_pipeline
                && (self.parked.is_none() || input.len() < PARKED_INPUT_CAP);
            budget::trim(&mut input, READ_CHUNK);
            self.budget
                .sync(self.out.len(), input.len(), !self.subscriptions.is_empty());
            let room = match may_read {
                true => self.budget.room(input.len()),
                false => Room::Paused,
            };
            tokio::select! {
                Some((class, reply)) = self.pending.next(), if !self.pending.is_empty() => {
                    self.settle(class);
                    self.out.extend_from_slice(&reply);
                    // Replies of a pipeline arrive together: take every one already here in this
                    // turn. Polling without a waker is safe: the select polls again with one.
                    while let Some(Some((class, reply))) = self.pending.next().now_or_never() {
                        self.settle(class);
                        self.out.extend_from_slice(&reply);
                        if self.out.len() >= FLUSH_AT {
                            break;
                        }
                    }
                }
                read = budget::read(&mut reader, &mut input, room.bytes()), if room.bytes() > 0 => {
                    match read {
                        Ok(0) => return Err("client closed the connection".to_owned()),
                        Ok(_) => {}
                        Err(error) => return Err(format!("read failed: {error}")),
                    }
                }
                // The message counts against the budget (`_held`) until it is in `out`.
                Some((message, _held)) = self.subscriptions.next(), if !self.subscriptions.is_empty() => {
                    // Delivered whatever `CLIENT REPLY` says, as Redis 7 delivers them.
                    let frame = subscriptions::message_frame(message, self.protocol);
                    tollgate_resp::encode(&frame, &mut self.out);
                }
                _ = &mut evicted => {
                    let eviction = self.subscriptions.eviction_reason();
                    if let Eviction::TooSlow(why) = &eviction {
                        self.out.extend_from_slice(&replies::error(format!("ERR tollgate: {why}; disconnected")));
                    }
                    let _ = tokio::time::timeout(std::time::Duration::from_millis(100), self.flush(&mut writer)).await;
                    tracing::info!(client = self.id, principal = %self.caller.principal, %eviction, "subscriber disconnected");
                    return Err(eviction.to_string());
                }
                frame = self.watches.next(self.protocol), if !self.watches.is_empty() => {
                    tollgate_resp::encode(&frame, &mut self.out);
                }
                Some(line) = monitored(&mut self.monitor, &self.me.client), if self.monitor.is_some() => {
                    self.out.extend_from_slice(&line);
                }
                _ = &mut killed => {
                    // A kill of this session by itself answers first, as Redis closes after the reply.
                    while let Some(Some((class, reply))) = self.pending.next().now_or_never() {
                        self.settle(class);
                        self.out.extend_from_slice(&reply);
                    }
                    let _ = tokio::time::timeout(std::time::Duration::from_millis(100), self.flush(&mut writer)).await;
                    return Err("killed by CLIENT KILL".to_owned());
                }
                () = pool.room(), if room == Room::PoolFull => {}
                breach = &mut breached => {
                    // What is buffered was not read and will not be: only the reason is sent.
                    self.out.clear();
                    self.out.extend_from_slice(&replies::error(format!("ERR tollgate: {breach}; disconnected")));
                    let _ = tokio::time::timeout(std::time::Duration::from_millis(100), writer.write_all(&self.out)).await;
                    return Err(breach.to_string());
                }
                _ = &mut stopped, if !stopping => stopping = true,
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
    ) -> Result<Option<Bytes>, String> {
        loop {
            if self.pending.len() >= self.front.config.max_pipeline {
                return Ok(None);
            }
            if std::mem::take(&mut self.owes_yield) {
                tokio::task::yield_now().await;
            }
            let (step, voice) = match self.parked.take() {
                Some(parked) => parked,
                None => match self.next_command(input) {
                    Some(Ahead::Decided(command, decision)) => {
                        let voice = self.voice(&command);
                        (self.plan(command, Some(decision)), voice)
                    }
                    Some(Ahead::Parsed(command)) => {
                        let voice = self.voice(&command);
                        (self.plan(command, None), voice)
                    }
                    Some(Ahead::Invalid(error)) => {
                        return Ok(Some(replies::error(format!("ERR {error}"))))
                    }
                    None => return Ok(None),
                },
            };
            let (step, amend) = match step {
                Step::Amended(inner, amend) => (*inner, Some(amend)),
                step => (step, None),
            };
            match step {
                Step::Reply(reply) => self.push(
                    Class::Local,
                    Pending::Ready(Some((Class::Local, reply))),
                    voice,
                ),
                Step::Close(reply) => return Ok(Some(voice.say(reply))),
                Step::Multiplexed(lane, encoded, deadline) => {
                    if self.needs_barrier(Class::Multiplexed(lane)) {
                        self.parked = Some((
                            Step::Multiplexed(lane, encoded, deadline).amended(amend),
                            voice,
                        ));
                        return Ok(None);
                    }
                    let future = self.send_multiplexed(lane, encoded, deadline);
                    let future = self.amend(future, amend);
                    self.push(Class::Multiplexed(lane), future, voice);
                }
                Step::Exclusive(lane, command) => {
                    if self.needs_barrier(Class::Exclusive) {
                        self.parked = Some((Step::Exclusive(lane, command).amended(amend), voice));
                        return Ok(None);
                    }
                    let future = self.send_exclusive(lane, command);
                    let future = self.amend(future, amend);
                    self.push(Class::Exclusive, future, voice);
                }
                Step::InPlace(work) => {
                    if !self.pending.is_empty() {
                        self.parked = Some((Step::InPlace(work), voice));
                        return Ok(None);
                    }
                    let reply = until_hang_up(self.in_place(work), reader, input).await?;
                    self.out.extend_from_slice(&voice.say(reply));
                }
                Step::Amended(..) => unreachable!("unwrapped above, never nested"),
            }
        }
    }

    /// Whether `command`'s reply reaches the client, as `CLIENT REPLY` left it; a `SKIP` is used
    /// up here. `CLIENT REPLY` itself is always heard (only `ON` answers, as in Redis).
    fn voice(&mut self, command: &Command) -> Voice {
        // Subscription confirmations are out-of-band: Redis 7 sends them whatever the mode.
        if self.reply_mode == ReplyMode::On
            || Local::of(command.name(), command.word(1)) == Some(Local::ClientReply)
            || subscription_command(command.name()).is_some()
        {
            return Voice::Heard;
        }
        let (voice, mode) = self.reply_mode.next();
        self.reply_mode = mode;
        voice
    }

    /// The next command to plan, read ahead when nothing is left from the last read.
    fn next_command(&mut self, input: &mut BytesMut) -> Option<Ahead> {
        match self.ahead.pop_front() {
            Some(next) => Some(next),
            None => self.read_ahead(input),
        }
    }

    /// Reads the run of ordinary commands at the front of `input` (a pipeline: up to
    /// [`ADMIT_TOGETHER`]) and admits them together, which enters each guard once for the run
    /// instead of once per command; the command that ended the run, if any, is kept as read.
    /// Returns the first command read; the others wait in `ahead`.
    fn read_ahead(&mut self, input: &mut BytesMut) -> Option<Ahead> {
        let mut run = Vec::new();
        let ended = loop {
            if run.len() == ADMIT_TOGETHER {
                break None;
            }
            match tollgate_resp::parse_command(input, &self.front.limits) {
                // A lone command (unpipelined) is planned as it is.
                Ok(Some(command)) if run.is_empty() && input.is_empty() => {
                    return Some(Ahead::Parsed(command))
                }
                Ok(Some(command)) if self.admits_ahead(&command) => run.push(command),
                Ok(Some(command)) => break Some(Ahead::Parsed(command)),
                Ok(None) => break None,
                Err(error) => break Some(Ahead::Invalid(error)),
            }
        };
        if run.len() > 1 {
            // Every command's words in one buffer, and each command's share of it.
            let words: Vec<&[u8]> = run.iter().flat_map(Command::words).collect();
            let mut rest = &words[..];
            let argvs: Vec<&[&[u8]]> = run
                .iter()
                .map(|command| {
                    let (argv, after) = rest.split_at(command.len());
                    rest = after;
                    argv
                })
                .collect();
            let decisions = self.front.admission.admit_all(&self.caller, &argvs);
            let decided = run.into_iter().zip(decisions);
            self.ahead
                .extend(decided.map(|(command, decision)| Ahead::Decided(command, decision)));
        } else {
            self.ahead.extend(run.pop().map(Ahead::Parsed));
        }
        self.ahead.extend(ended);
        self.ahead.pop_front()
    }

    /// Whether `command` may be admitted before the commands read before it have run: admission
    /// depends only on the caller and the command, but a connection-scoped command is the
    /// session's own, and a subscription changes which commands RESP2 accepts afterwards.
    fn admits_ahead(&self, command: &Command) -> bool {
        self.subscriptions.is_empty()
            && Local::of(command.name(), command.word(1)).is_none()
            && subscription_command(command.name()).is_none()
            && !lease::is_ours(command)
    }

    /// Decides what `argv` becomes: connection-scoped commands are answered here; everything else
    /// is admitted by the policy (unless `decided` ahead) and routed by the lane it names.
    fn plan(&mut self, command: Command, decided: Option<Decision>) -> Step {
        if let Some(decision) = decided {
            // Read ahead only if neither connection-scoped nor a subscription command.
            return self.route(command, decision, None, None);
        }
        let local = Local::of(command.name(), command.word(1));
        let subscription = subscription_command(command.name());
        if self.protocol == Protocol::Resp2
            && self.subscribed()
            && !local.is_some_and(Local::allowed_while_subscribed)
            && subscription.is_none()
            && !lease_watch::is_watch(&command.argv())
        {
            // Redis's own text while only subscribed; watching adds the watch commands.
            let only = match self.watches.is_empty() {
                true => "(P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE",
                false => "LEASE WATCH / LEASE UNWATCH / (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE",
            };
            return Step::Reply(replies::error(format!(
                "ERR Can't execute '{}': only {only} / PING / QUIT / RESET are allowed in this context",
                String::from_utf8_lossy(command.name()).to_lowercase()
            )));
        }
        match lease::intercept(&command, self.protocol, self.transaction.is_some()) {
            Some(Intercept::Reply(reply)) => return Step::Reply(reply),
            Some(Intercept::Run) => return Step::InPlace(InPlace::Lease(command)),
            None => {}
        }
        if let Some(local) = local {
            self.me.client.update(|state| state.ran_local(local.name()));
            // Credentials are never shown, as Redis hides AUTH and HELLO.
            if !local.needs_admission() && !matches!(local, Local::Auth | Local::Hello) {
                self.front.monitors.ran(&self.me.client, &command);
            }
            if let Arity::Wrong(name) = local.arity(command.len()) {
                return self.queued(local, Step::Reply(wrong_arity(name)));
            }
            if local == Local::Ping && self.pings_redis() {
                return self.sending(Lane::Regular, command);
            }
            if !local.needs_admission() {
                let step = self.local(local, &command.argv());
                return self.queued(local, step);
            }
        }
        let decision = self.front.admission.admit(&self.caller, &command.argv());
        self.route(command, decision, local, subscription)
    }

    /// What an admitted (or refused) command becomes, given what [`Session::plan`] found it to be.
    fn route(
        &mut self,
        command: Command,
        decision: Decision,
        local: Option<Local>,
        subscription: Option<(SubscriptionKind, bool)>,
    ) -> Step {
        let (lane, amend) = match decision {
            Decision::Admitted {
                lane, descriptor, ..
            } => {
                if let Some(whole) = Whole::of(&descriptor.name) {
                    return self.whole_keyspace(whole, command);
                }
                let amend = Amend::of(&descriptor.name, command.word(1));
                self.me.client.update(|state| state.ran(descriptor));
                self.front.monitors.ran(&self.me.client, &command);
                (lane, amend)
            }
            Decision::Denied(denial) => {
                self.owes_yield |= denial.cause == DenyCause::Deadline;
                if let Some(transaction) = self.transaction.as_mut().filter(|t| t.in_multi) {
                    transaction.poisoned = true;
                }
                return Step::Reply(replies::denied(&command.argv(), &denial));
            }
        };
        match local {
            Some(Local::Select) => {
                return self.queued(Local::Select, Step::Reply(select(&command.argv())))
            }
            Some(Local::ConfigGet) => {
                let fallback = replies::encode(&local::config_get(&command.argv(), self.protocol));
                if self.transaction.as_ref().is_some_and(|t| t.in_multi) {
                    return self.queued(Local::ConfigGet, Step::Reply(fallback));
                }
                // Redis's own values, where its lane user may read them.
                return self
                    .sending(lane, command)
                    .amended(Some(Amend::ConfigGet { fallback }));
            }
            Some(Local::Monitor) => return Step::InPlace(InPlace::Monitor),
            Some(Local::ClientList) => {
                let reply = match ListFilter::parse(&command.argv()[2..]) {
                    Ok(filter) => {
                        let list = self.front.clients.list(&self.me.client, &filter);
                        replies::encode(&self.listing(list))
                    }
                    Err(error) => replies::error(error),
                };
                return self.queued(Local::ClientList, Step::Reply(reply));
            }
            Some(Local::ClientKill) => {
                let reply = match KillFilter::parse(&command.argv()[2..]) {
                    Ok(filter) => {
                        let killed = self.front.clients.kill(&self.me.client, &filter);
                        match (filter.legacy(), killed) {
                            (true, 0) => replies::error("ERR No such client".to_owned()),
                            (true, _) => replies::ok(),
                            (false, killed) => replies::encode(&Frame::Integer(killed as i64)),
                        }
                    }
                    Err(error) => replies::error(error),
                };
                return self.queued(Local::ClientKill, Step::Reply(reply));
            }
            _ => {}
        }
        if let Some((kind, subscribe)) = subscription {
            return Step::InPlace(if subscribe {
                InPlace::Subscribe(kind, command.shared_argv())
            } else {
                InPlace::Unsubscribe(kind, command.shared_argv())
            });
        }
        if self.transaction.is_some() || lane == Lane::Transaction {
            return Step::InPlace(InPlace::Transaction(command));
        }
        self.sending(lane, command).amended(amend)
    }

    /// Whether `PING` goes to Redis, so that it answers `PONG` only while Redis does (pools that
    /// health-check with PING see an outage): always, except where Redis itself could not take
    /// it on a shared connection — a RESP2 subscriber's PING (answered with a `pong` array, the
    /// subscription lane's health being the subscriber's stream) and one queued inside MULTI.
    fn pings_redis(&self) -> bool {
        let subscribed_resp2 = self.protocol == Protocol::Resp2 && self.subscribed();
        let in_multi = self.transaction.as_ref().is_some_and(|t| t.in_multi);
        !subscribed_resp2 && !in_multi
    }

    /// A whole-keyspace command runs key by key, which a transaction cannot hold: inside one it is
    /// refused (and EXEC fails), never sent raw.
    fn whole_keyspace(&mut self, whole: Whole, command: Command) -> Step {
        if let Some(transaction) = self.transaction.as_mut() {
            transaction.poisoned |= transaction.in_multi;
            return Step::Reply(replies::error(format!(
                "ERR tollgate: {} cannot run inside a transaction: it is served key by key, over the keys this client may touch",
                String::from_utf8_lossy(command.name()).to_uppercase()
            )));
        }
        Step::InPlace(InPlace::Keyspace(whole, command.shared_argv()))
    }

    /// Inside MULTI, a locally answered command is queued as Redis would queue it: `+QUEUED` now,
    /// its reply in EXEC's; an error (a wrong arity, a refusal) answers at once and makes EXEC
    /// fail, as Redis does for a command it refuses to queue.
    fn queued(&mut self, local: Local, step: Step) -> Step {
        let Some(transaction) = self.transaction.as_mut().filter(|t| t.in_multi) else {
            return step;
        };
        match step {
            Step::Reply(reply) if reply.starts_with(b"-") => {
                transaction.poisoned = true;
                Step::Reply(reply)
            }
            Step::Reply(reply) if local.queues_in_multi() => {
                transaction.local.queue(reply);
                Step::Reply(Bytes::from_static(b"+QUEUED\r\n"))
            }
            step => step,
        }
    }

    /// How a command admitted for `lane` is sent.
    fn sending(&self, lane: Lane, command: Command) -> Step {
        let multiplexed = |lane| {
            let deadline = self.front.deadlines.of_command(&command);
            Step::Multiplexed(lane, command.encoded(), deadline)
        };
        match lane {
            Lane::Regular | Lane::Script => multiplexed(lane),
            Lane::Blocking | Lane::Admin => Step::Exclusive(lane, command),
            // PUBLISH and the PUBSUB introspection commands are ordinary requests.
            Lane::Pubsub | Lane::Transaction => multiplexed(Lane::Regular),
        }
    }

    /// Whether messages may arrive unasked: subscribed, or watching leases. In RESP2 that limits
    /// the commands accepted, as Redis limits a subscriber's.
    fn subscribed(&self) -> bool {
        !self.subscriptions.is_empty() || !self.watches.is_empty()
    }

    fn local(&mut self, local: Local, argv: &[&[u8]]) -> Step {
        let subscribed_resp2 = self.protocol == Protocol::Resp2 && self.subscribed();
        let frame = match local {
            Local::Ping => local::ping(argv, subscribed_resp2),
            Local::Echo => Frame::Bulk(Bytes::copy_from_slice(argv[1])),
            Local::Quit => return Step::Close(replies::ok()),
            Local::Reset => return Step::InPlace(InPlace::Reset),
            Local::Auth => return Step::Reply(replies::ok()),
            Local::Hello => match local::parse_hello(argv) {
                Ok(hello) if hello.protocol.is_some_and(|p| p != self.protocol) => {
                    return Step::InPlace(InPlace::Hello(hello))
                }
                Ok(hello) => self.hello(hello),
                Err(error) => return Step::Reply(replies::error(error)),
            },
            Local::ClientSetName => {
                let name = argv[2];
                if !local::valid_client_name(name) {
                    return Step::Reply(replies::error(
                        "ERR Client names cannot contain spaces, newlines or special characters."
                            .to_owned(),
                    ));
                }
                let name = (!name.is_empty()).then(|| Bytes::copy_from_slice(name));
                self.me.client.update(|state| state.name = name);
                return Step::Reply(replies::ok());
            }
            Local::ClientGetName => match self.me.client.name() {
                Some(name) => Frame::Bulk(name.clone()),
                None => local::null(self.protocol),
            },
            Local::ClientId => Frame::Integer(self.id as i64),
            Local::ClientInfo => self.listing(self.me.client.line() + "\n"),
            Local::ClientSetInfo => return Step::Reply(replies::ok()),
            Local::ClientReply => {
                return Step::Reply(match local::parse_client_reply(argv) {
                    Ok(mode) => {
                        self.reply_mode = mode;
                        match mode {
                            ReplyMode::On => replies::ok(),
                            ReplyMode::Off | ReplyMode::SkipNext => Bytes::new(),
                        }
                    }
                    Err(error) => replies::error(error),
                })
            }
            Local::Unshareable => {
                return Step::Reply(replies::error(format!(
                    "ERR tollgate: CLIENT {} is not available: connections to Redis are shared between clients",
                    String::from_utf8_lossy(argv.get(1).copied().unwrap_or_default()).to_uppercase()
                )))
            }
            Local::Select
            | Local::ConfigGet
            | Local::ClientList
            | Local::ClientKill
            | Local::Monitor => {
                unreachable!("the policy admits {local:?} before it is answered")
            }
        };
        Step::Reply(replies::encode(&frame))
    }

    /// `CLIENT LIST`/`INFO` text: a bulk string in RESP2, a verbatim `txt` string in RESP3 (Redis's).
    fn listing(&self, text: String) -> Frame {
        match self.protocol {
            Protocol::Resp2 => Frame::Bulk(Bytes::from(text)),
            Protocol::Resp3 => Frame::Verbatim {
                format: *b"txt",
                text: Bytes::from(text),
            },
        }
    }

    /// Takes a valid `HELLO`'s protocol and name; the reply describes the server.
    fn hello(&mut self, hello: local::Hello) -> Frame {
        if let Some(protocol) = hello.protocol {
            self.speak(protocol);
        }
        if let Some(name) = hello.name {
            self.me.client.update(|state| state.name = Some(name));
        }
        local::hello_reply(self.protocol, self.id)
    }

    /// Switches the client's protocol. Its multiplexed channels are dropped, so that its next
    /// commands go to connections speaking the new one (a transaction already pinned keeps its
    /// connection, and protocol, until it ends).
    fn speak(&mut self, protocol: Protocol) {
        if protocol != self.protocol {
            self.protocol = protocol;
            self.me.client.update(|state| {
                state.resp = match protocol {
                    Protocol::Resp2 => 2,
                    Protocol::Resp3 => 3,
                }
            });
            self.regular = None;
            self.script = None;
        }
    }

    fn needs_barrier(&self, class: Class) -> bool {
        self.in_flight.iter().any(|(other, count)| {
            *count > 0 && *other != Class::Local && (*other != class || class == Class::Exclusive)
        })
    }

    fn push(&mut self, class: Class, future: Pending, voice: Voice) {
        match self.in_flight.iter_mut().find(|(c, _)| *c == class) {
            Some((_, count)) => *count += 1,
            None => self.in_flight.push((class, 1)),
        }
        self.pending.push_back(future, voice);
    }

    fn in_flight_count(&self, class: Class) -> usize {
        self.in_flight
            .iter()
            .find(|(c, _)| *c == class)
            .map_or(0, |(_, count)| *count)
    }

    fn settle(&mut self, class: Class) {
        if let Some((_, count)) = self.in_flight.iter_mut().find(|(c, _)| *c == class) {
            *count -= 1;
        }
    }

    /// Writes every in-flight reply into the output buffer, in order.
    async fn drain(&mut self) {
        while let Some((class, reply)) = self.pending.next().await {
            self.settle(class);
            self.out.extend_from_slice(&reply);
        }
    }

    async fn flush(&mut self, writer: &mut OwnedWriteHalf) -> Result<(), String> {
        if self.out.is_empty() {
            return Ok(());
        }
        // A client that does not read is disconnected at its budget, not waited for; what waits to
        // be written counts against it meanwhile.
        self.budget.buffered(self.out.len());
        let breached = self.budget.clone().breached();
        tokio::select! {
            biased;
            written = writer.write_all(&self.out) => {
                written.map_err(|error| format!("write failed: {error}"))?
            }
            breach = breached => return Err(breach.to_string()),
        }
        self.out.clear();
        budget::trim(&mut self.out, 0);
        self.budget.buffered(0);
        Ok(())
    }

    fn amend(&self, pending: Pending, amend: Option<Amend>) -> Pending {
        match amend {
            Some(amend) => Pending::Amended(Box::new(Amended {
                inner: pending,
                amend: Some(amend),
                pubsub: self.front.lanes.pubsub(),
            })),
            None => pending,
        }
    }

    fn send_multiplexed(
        &mut self,
        lane: Lane,
        encoded: Bytes,
        deadline: Option<Duration>,
    ) -> Pending {
        // Between commands, follow the lane's choice of connection (it packs work on few); with
        // commands in flight, stay, so that their replies keep their order.
        let between_commands = self.in_flight_count(Class::Multiplexed(lane)) == 0;
        let slot = match lane {
            Lane::Script => &mut self.script,
            _ => &mut self.regular,
        };
        match slot {
            Some(channel) if between_commands => channel.repick(),
            Some(_) => {}
            None => match self.front.lanes.multiplexed_speaking(lane, self.protocol) {
                Ok(channel) => *slot = Some(channel.charged_to(self.budget.clone())),
                Err(error) => {
                    let reply = replies::lane_failed(&error);
                    return Pending::Ready(Some((Class::Multiplexed(lane), reply)));
                }
            },
        }
        let channel = slot.as_ref().expect("channel opened above");
        Pending::Multiplexed(lane, channel.send_within(encoded, deadline))
    }

    fn send_exclusive(&mut self, lane: Lane, command: Command) -> Pending {
        let lanes = self.front.lanes.clone();
        let protocol = self.protocol;
        let deadline = self.front.deadlines.of_command(&command);
        let principal = self.caller.principal.clone();
        Pending::Exclusive(Box::pin(async move {
            let mut conn = match lanes.borrow_for(lane, protocol, &principal).await {
                Ok(conn) => conn,
                Err(error) => return replies::lane_failed(&error),
            };
            let encoded = command.encoded();
            let reply = match conn.send_within(encoded, deadline).await {
                Ok(reply) => reply.into_bytes(),
                Err(error) => replies::call_failed(&error),
            };
            conn.release().await;
            reply
        }))
    }

    /// Work that changes the session; what `CLIENT LIST` shows of it follows.
    async fn in_place(&mut self, work: InPlace) -> Bytes {
        let reply = self.change(work).await;
        let subscriptions = self.subscriptions.counts();
        let multi = self
            .transaction
            .as_ref()
            .filter(|t| t.in_multi)
            .map(|t| t.local.count());
        self.me.client.update(|state| {
            state.subscriptions = subscriptions;
            state.multi = multi;
        });
        reply
    }

    async fn change(&mut self, work: InPlace) -> Bytes {
        match work {
            InPlace::Transaction(command) => self.transaction_command(command).await,
            InPlace::Subscribe(kind, argv) => self.subscribe(kind, argv).await,
            InPlace::Unsubscribe(kind, argv) => self.unsubscribe(kind, argv),
            InPlace::Hello(hello) => replies::encode(&self.hello(hello)),
            InPlace::Keyspace(whole, argv) => {
                let channel = match &self.regular {
                    Some(channel) => channel.clone(),
                    None => match self
                        .front
                        .lanes
                        .multiplexed_speaking(Lane::Regular, self.protocol)
                    {
                        Ok(channel) => channel,
                        Err(error) => return replies::lane_failed(&error),
                    },
                };
                let scope = keyspace::Scope {
                    caller: &self.caller,
                    admission: &self.front.admission,
                    channel: &channel,
                    protocol: self.protocol,
                };
                keyspace::serve(whole, &argv, scope).await
            }
            InPlace::Monitor => {
                self.monitor = Some(self.front.monitors.watch());
                replies::ok()
            }
            InPlace::Lease(command) => {
                let argv = command.argv();
                if lease_watch::is_watch(&argv) {
                    let (front, caller) = (&self.front, &self.caller);
                    return lease_watch::run(
                        front,
                        caller,
                        &mut self.watches,
                        self.protocol,
                        &argv,
                    )
                    .await;
                }
                lease::run(
                    &self.front,
                    &self.caller,
                    &self.leases,
                    self.protocol,
                    &argv,
                )
                .await
            }
            InPlace::Reset => {
                self.subscriptions.clear();
                self.watches.clear();
                self.monitor = None;
                if let Some(transaction) = self.transaction.take() {
                    transaction.conn.release().await;
                }
                self.speak(Protocol::Resp2);
                self.me.client.update(|state| state.name = None);
                self.reply_mode = ReplyMode::On;
                Bytes::from_static(b"+RESET\r\n")
            }
        }
    }

    /// WATCH and MULTI pin a TRANSACTION connection; everything until EXEC, DISCARD or an UNWATCH
    /// outside MULTI runs on it; then it goes back to the lane, cleaned.
    async fn transaction_command(&mut self, command: Command) -> Bytes {
        let name = command.name().to_ascii_uppercase();
        if self.transaction.is_none() {
            match name.as_slice() {
                b"WATCH" | b"MULTI" => match self
                    .front
                    .lanes
                    .borrow_for(Lane::Transaction, self.protocol, &self.caller.principal)
                    .await
                {
                    Ok(conn) => {
                        self.transaction = Some(Transaction {
                            conn,
                            in_multi: false,
                            poisoned: false,
                            local: QueuedLocally::default(),
                        })
                    }
                    Err(error) => return replies::lane_failed(&error),
                },
                // Without a pinned connection these are answered as Redis would.
                b"EXEC" => return replies::error("ERR EXEC without MULTI".to_owned()),
                b"DISCARD" => return replies::error("ERR DISCARD without MULTI".to_owned()),
                _ => return replies::ok(),
            }
        }
        let transaction = self.transaction.as_mut().expect("pinned above");
        let ends = match name.as_slice() {
            b"EXEC" | b"DISCARD" => true,
            b"UNWATCH" => !transaction.in_multi,
            _ => false,
        };
        let reply = if name.as_slice() == b"EXEC" && transaction.poisoned {
            let _ = transaction
                .conn
                .send(Bytes::from_static(b"*1\r\n$7\r\nDISCARD\r\n"))
                .await;
            replies::error("EXECABORT Transaction discarded because of previous errors.".to_owned())
        } else {
            let deadline = self.front.deadlines.of_command(&command);
            match transaction
                .conn
                .send_within(command.encoded(), deadline)
                .await
            {
                Ok(reply) => {
                    if name.as_slice() == b"MULTI" && !reply.is_error() {
                        transaction.in_multi = true;
                    }
                    let reply = reply.into_bytes();
                    if transaction.in_multi && &reply[..] == b"+QUEUED\r\n" {
                        transaction.local.queued_by_redis();
                    }
                    if name.as_slice() == b"EXEC" {
                        std::mem::take(&mut transaction.local).splice(reply)
                    } else {
                        reply
                    }
                }
                Err(error) => {
                    // The connection is gone and the transaction with it.
                    self.transaction = None;
                    return replies::call_failed(&error);
                }
            }
        };
        if ends {
            if let Some(transaction) = self.transaction.take() {
                transaction.conn.release().await;
            }
        }
        reply
    }

    async fn subscribe(&mut self, kind: SubscriptionKind, argv: Vec<Bytes>) -> Bytes {
        let mut out = BytesMut::new();
        let pubsub = self.front.lanes.pubsub();
        let capacity = self.front.config.subscriber_buffer;
        let names = &argv[1..];
        let cap = self.front.config.max_subscriptions;
        let fresh = self.subscriptions.new_names(kind, names);
        if self.subscriptions.len() + fresh > cap {
            return replies::error(format!(
                "ERR tollgate: {} more subscriptions would take this client past resp.max_subscriptions ({cap}); none were made",
                fresh
            ));
        }
        for name in argv.into_iter().skip(1) {
            if let Err(error) = self
                .subscriptions
                .subscribe(&pubsub, kind, name.clone(), capacity, self.budget.clone())
                .await
            {
                out.extend_from_slice(&replies::lane_failed(&error));
                continue;
            }
            let frame = subscriptions::confirmation(
                confirmation_word(kind, true),
                Some(name),
                self.subscriptions.count(kind),
                self.protocol,
            );
            tollgate_resp::encode(&frame, &mut out);
        }
        out.freeze()
    }

    fn unsubscribe(&mut self, kind: SubscriptionKind, argv: Vec<Bytes>) -> Bytes {
        let mut names: Vec<Bytes> = argv.into_iter().skip(1).collect();
        if names.is_empty() {
            names = self.subscriptions.names(kind);
        }
        let word = confirmation_word(kind, false);
        let mut out = BytesMut::new();
        if names.is_empty() {
            let frame = subscriptions::confirmation(
                word,
                None,
                self.subscriptions.count(kind),
                self.protocol,
            );
            tollgate_resp::encode(&frame, &mut out);
        }
        for name in names {
            self.subscriptions.unsubscribe(kind, &name);
            let frame = subscriptions::confirmation(
                word,
                Some(name),
                self.subscriptions.count(kind),
                self.protocol,
            );
            tollgate_resp::encode(&frame, &mut out);
        }
        out.freeze()
    }

    /// After the client is gone: an open transaction is discarded and its connection returned clean.
    async fn finish(&mut self) {
        self.pending = InOrder::default();
        self.subscriptions.clear();
        if let Some(transaction) = self.transaction.take() {
            transaction.conn.release().await;
        }
    }
}

/// Awaits `work` while reading what the client sends meanwhile (boundedly, as for a parked command),
/// so that a hang-up is noticed: then `work` is dropped unfinished and `Err` says why. A borrowed
/// connection dropped with a reply owed is closed, never lent again (see `Borrowed`), so a blocking
/// command left in Redis by a vanished client dies with its connection.
async fn until_hang_up<T>(
    work: impl Future<Output = T>,
    reader: &mut OwnedReadHalf,
    input: &mut BytesMut,
) -> Result<T, String> {
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return Ok(done),
            read = reader.read_buf(input), if input.len() < PARKED_INPUT_CAP => match read {
                Ok(0) => return Err("client closed the connection while a command was awaited".to_owned()),
                Ok(_) => {}
                Err(error) => return Err(format!("read failed: {error}")),
            },
        }
    }
}

/// The next `MONITOR` line for this session, once it monitors.
async fn monitored(watch: &mut Option<Watch>, viewer: &Client) -> Option<Bytes> {
    match watch {
        Some(watch) => watch.next(viewer).await,
        None => std::future::pending().await,
    }
}

/// `(kind, true)` for the subscribe commands, `(kind, false)` for the unsubscribes.
pub(super) fn subscription_command(name: &[u8]) -> Option<(SubscriptionKind, bool)> {
    const COMMANDS: [(&[u8], SubscriptionKind, bool); 6] = [
        (b"SUBSCRIBE", SubscriptionKind::Channel, true),
        (b"PSUBSCRIBE", SubscriptionKind::Pattern, true),
        (b"SSUBSCRIBE", SubscriptionKind::Shard, true),
        (b"UNSUBSCRIBE", SubscriptionKind::Channel, false),
        (b"PUNSUBSCRIBE", SubscriptionKind::Pattern, false),
        (b"SUNSUBSCRIBE", SubscriptionKind::Shard, false),
    ];
    // Asked of every command: compared in place rather than upper-cased into a new buffer.
    COMMANDS
        .iter()
        .find(|(word, ..)| name.eq_ignore_ascii_case(word))
        .map(|&(_, kind, subscribe)| (kind, subscribe))
}

fn confirmation_word(kind: SubscriptionKind, subscribe: bool) -> &'static str {
    match (kind, subscribe) {
        (SubscriptionKind::Channel, true) => "subscribe",
        (SubscriptionKind::Pattern, true) => "psubscribe",
        (SubscriptionKind::Shard, true) => "ssubscribe",
        (SubscriptionKind::Channel, false) => "unsubscribe",
        (SubscriptionKind::Pattern, false) => "punsubscribe",
        (SubscriptionKind::Shard, false) => "sunsubscribe",
    }
}

/// Lanes share their connections between clients, so only database 0 can be served.
fn select(argv: &[&[u8]]) -> Bytes {
    match argv.get(1).copied() {
        Some(b"0") if argv.len() == 2 => replies::ok(),
        Some(_) if argv.len() == 2 => replies::error(
            "ERR tollgate serves database 0 only (lane connections are shared between clients)"
                .to_owned(),
        ),
        _ => wrong_arity("select"),
    }
}
