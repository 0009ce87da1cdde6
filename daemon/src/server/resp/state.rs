//! A session's connection-scoped state — protocol, name and reply mode, the pinned transaction,
//! subscriptions, lease watches, `MONITOR`, its channels on the multiplexed lanes — and what each
//! command becomes with it: the [`Plan`] carried out as a [`Step`] for the session's loop to
//! schedule, and the work awaited in place that changes the state.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tollgate_lanes::{Channel, LaneError, Route, ScriptLimit, Shape};
use tollgate_model::{Caller, Multiplexed};
use tollgate_policy::{Decision, DenyCause};
use tollgate_resp::Command;

use super::admission_clock::AdmissionClock;
use super::ahead::Admitting;
use super::amend::Amend;
use super::answer::{self, Asking};
use super::budget::ClientBudget;
use super::cached::{self, Fallback, Served};
use super::client_tracking;
use super::clients::Registration;
use super::databases;
use super::front::FrontDoor;
use super::keyspace;
use super::kind::Kind;
use super::lease;
use super::lease_watch::{self, Watches};
use super::local::{self, Local, Protocol, ReplyMode, Voice};
use super::monitor::Watch;
use super::namespace::{self, InFlight, ScriptKind};
use super::pending::{self, Amended, Class, Gather, Lent, Merge, Pending};
use super::placing::{self, Placed};
use super::plan::{self, Context, Forward, Plan, ReadShape, Refusal};
use super::replies;
use super::schedule::{InPlace, Step};
use super::scoped;
use super::script_refusal::{self, ScriptNote};
use super::subscriptions::{Caps, Subscriptions};
use super::tracking_hub::{Answer, Sent};
use super::transaction::{Borrower, Pinning};
use crate::quotas::Meters;
use crate::tracking::Finished;

/// How long this session's scripts may run (`resp.script_time_limit`, or a shorter one a policy
/// quota sets its principal), and who it is for the log line of a script that cannot be stopped;
/// `None` when the limit is off.
fn script_limit(
    front: &FrontDoor,
    caller: &Caller,
    meters: &Meters,
    id: u64,
) -> Option<ScriptLimit> {
    let limit = front.config.script_time_limit;
    if limit.is_zero() {
        return None;
    }
    let (after, set_by) = match meters.script_time_limit() {
        Some((shorter, quota)) if shorter < limit => (
            shorter,
            Arc::from(format!("quota {quota}'s script_time_limit")),
        ),
        _ => (limit, Arc::from("resp.script_time_limit")),
    };
    Some(ScriptLimit {
        after,
        set_by,
        cooldown: front.cooldowns.of(&caller.tenant()),
        who: Arc::from(format!(
            "client {id} principal {} uid {} pid {}",
            caller.principal, caller.uid, caller.pid
        )),
    })
}

/// This session's channel on each multiplexed lane, opened on first use.
#[derive(Default)]
struct Channels {
    regular: Option<Channel>,
    script: Option<Channel>,
    /// The scope user whose pool `script` is on (`scoped`); `None`: the SCRIPT lane.
    script_scope: Option<String>,
    /// The quotas' version `script`'s time limit was taken under (`Meters::version`).
    script_quotas: u64,
}

/// What a step may answer as it is planned: a cached read's hit, while nothing of the session is
/// in flight (`quiet`, as `serve_cached` asks), read at the turn's clock `now` (taken at the
/// first hit of the turn).
pub struct AtOnce<'a> {
    pub quiet: bool,
    pub now: &'a mut Option<Instant>,
}

impl Channels {
    fn slot(&mut self, lane: Multiplexed) -> &mut Option<Channel> {
        match lane {
            Multiplexed::Regular => &mut self.regular,
            Multiplexed::Script => &mut self.script,
        }
    }
}

pub struct SessionState {
    pub front: Arc<FrontDoor>,
    pub caller: Caller,
    pub id: u64,
    pub protocol: Protocol,
    /// This session in the listener's list (`CLIENT LIST`): its name, last command and state.
    pub me: Registration,
    /// Set once the session sent `MONITOR`.
    pub monitor: Option<Watch>,
    channels: Channels,
    pub transaction: Pinning,
    pub subscriptions: Subscriptions,
    /// Which replies the client gets (`CLIENT REPLY`).
    reply_mode: ReplyMode,
    /// A guard ran out of its budget deciding this session's command: the worker it kept busy is
    /// given back to other sessions before this one goes on.
    pub owes_yield: bool,
    /// Ends this connection's session-bound leases when the session is dropped.
    leases: lease::Connection,
    /// `LEASE WATCH`es: holder changes pushed to the client.
    pub watches: Watches,
    /// The bytes held for this client, against `resp.budgets`.
    pub budget: Arc<ClientBudget>,
    /// The time admitting this tenant's commands takes, against its share of the workers.
    pub clock: AdmissionClock,
    /// The caller's buckets under the policy's quotas.
    pub meters: Meters,
    /// Cacheable keys written or read by the commands of the transaction in progress: dropped
    /// from the near cache once each of its commands has run (EXEC among them).
    cache_writes: Vec<Bytes>,
    /// The kinds of script queued in the transaction in progress: counted in flight while its
    /// `EXEC` runs, as a script outside a transaction is while it runs (`namespace.rs`: another
    /// tenant's `SCRIPT KILL` must not stop it).
    transaction_scripts: Vec<ScriptKind>,
    /// What the command being started tells `CLIENT TRACKING` (its keys read or written), told
    /// once it is counted in the session's schedule ([`SessionState::sent`]).
    tracked: Sent,
    /// The keys written by the commands queued in the transaction in progress: told when EXEC
    /// runs them, together, as Redis tells them.
    tracked_in_multi: Vec<Bytes>,
}

impl SessionState {
    pub fn new(front: Arc<FrontDoor>, caller: Caller, id: u64, me: Registration) -> Self {
        SessionState {
            subscriptions: Subscriptions::new(
                front.config.subscriber_buffer,
                front.subscription_shares.clone(),
                caller.tenant(),
            ),
            budget: ClientBudget::new(&front.config.budgets, &front.services.pool, &caller, id),
            clock: front.services.admission_clocks.clock(caller.tenant()),
            meters: Meters::none(
                &caller.principal,
                front.services.identities.is_admin(caller.uid, caller.gid),
            ),
            front,
            caller,
            id,
            protocol: Protocol::Resp2,
            me,
            monitor: None,
            channels: Channels::default(),
            transaction: Pinning::None,
            reply_mode: ReplyMode::On,
            owes_yield: false,
            leases: lease::Connection::new(id),
            watches: Watches::default(),
            cache_writes: Vec::new(),
            transaction_scripts: Vec::new(),
            tracked: Sent::default(),
            tracked_in_multi: Vec::new(),
        }
    }

    /// What reading ahead needs of the session.
    pub fn admitting(&self) -> Admitting<'_> {
        Admitting {
            admission: &self.front.services.admission,
            caller: &self.caller,
            clock: &self.clock,
            limits: &self.front.limits,
            subscribed: self.listening(),
        }
    }

    /// Whether messages may arrive unasked: subscribed, or watching leases. In RESP2 that limits
    /// the commands accepted, as Redis limits a subscriber's.
    fn listening(&self) -> bool {
        !self.subscriptions.is_empty() || !self.watches.is_empty()
    }

    fn context(&self) -> Context {
        Context {
            protocol: self.protocol,
            subscribed: self.listening(),
            watching: !self.watches.is_empty(),
            pinned: self.transaction.pinned(),
        }
    }

    /// Whether the reply of a command of `kind` reaches the client, as `CLIENT REPLY` left it; a
    /// `SKIP` is used up here.
    pub fn voice(&mut self, kind: Kind) -> Voice {
        if self.reply_mode == ReplyMode::On || kind.always_heard() {
            return Voice::Heard;
        }
        let (voice, mode) = self.reply_mode.next();
        self.reply_mode = mode;
        voice
    }

    /// What `command` (of `kind`, admitted ahead if `decided`) becomes; a cached read's hit is
    /// answered at once where `at_once` allows it.
    pub fn step(
        &mut self,
        command: Command,
        kind: Kind,
        decided: Option<Decision>,
        at_once: AtOnce,
    ) -> Step {
        if self.me.client.tracking.load(Ordering::Relaxed) {
            self.tracked.finished = Some(self.finishing(&command));
        }
        let plan = match decided {
            Some(decision) => self.admitted(&command, kind, decision),
            None => {
                let plan = plan::before(kind, command.len(), self.context());
                if let Kind::Local(local) = kind {
                    if !matches!(
                        plan,
                        Plan::Refuse(Refusal::WhileSubscribed | Refusal::WhileWatching)
                    ) {
                        self.ran_local(local, &command);
                    }
                }
                plan
            }
        };
        self.carry_out(plan, command, kind, at_once)
    }

    /// How `command` ends for `CLIENT CACHING`, which holds for the next command only, or the
    /// whole transaction (see `crate::tracking::Finished`).
    fn finishing(&self, command: &Command) -> Finished {
        let name = command.name();
        let is = |word: &[u8]| name.eq_ignore_ascii_case(word);
        if is(b"CLIENT") {
            Finished::Client
        } else if is(b"MULTI")
            || (self.transaction.queued().is_some() && !is(b"EXEC") && !is(b"DISCARD"))
        {
            Finished::InMulti
        } else {
            Finished::Command
        }
    }

    /// What the command just counted in the schedule (or about to run in place) tells
    /// `CLIENT TRACKING`: its reads are remembered and its writes told now, before its reply
    /// can be handed out, so that an invalidation of them is held behind it.
    pub fn sent(&mut self) {
        if !self.tracked.is_empty() {
            let sent = std::mem::take(&mut self.tracked);
            self.front.tracking.sent(self.id, sent);
        }
    }

    /// What `CLIENT LIST` and `MONITOR` show of a connection-scoped command.
    fn ran_local(&mut self, local: Local, command: &Command) {
        self.me.ran_local(local.name());
        // AUTH and HELLO are shown as Redis shows them, their credentials redacted.
        if !local.needs_admission() {
            self.front.monitors.ran(&self.me.client, command);
        }
    }

    /// The plan for a command the policy decided.
    fn admitted(&mut self, command: &Command, kind: Kind, decision: Decision) -> Plan {
        match decision {
            Decision::Admitted {
                lane, descriptor, ..
            } => {
                // EXEC and DISCARD end a transaction whose commands were each charged as they
                // were queued: refusing them would leave the client inside MULTI.
                let ends_transaction = matches!(descriptor.name.as_str(), "EXEC" | "DISCARD");
                let quotas = &self.front.services.quotas;
                if !ends_transaction {
                    if let Err(throttled) = self.meters.admit(quotas, command.wire_len()) {
                        return Plan::Refuse(Refusal::Throttled(throttled));
                    }
                }
                if matches!(descriptor.name.as_str(), "MOVE" | "COPY" | "MIGRATE") {
                    let argv = command.argv();
                    if let Some(db) = databases::other_database(&descriptor.name, &argv) {
                        return Plan::Refuse(Refusal::OtherDatabase(db));
                    }
                }
                let plan = plan::admitted(
                    kind,
                    &descriptor.name,
                    command.word(1),
                    lane,
                    self.context(),
                );
                let plan = self.info_for_caller(plan, &descriptor.name);
                let plan = self.scripts_told_why(plan, &descriptor.name, command);
                let plan = scoped::in_transaction(
                    plan,
                    &descriptor.name,
                    &self.front.services,
                    &self.caller,
                    self.transaction
                        .holds_connection()
                        .then(|| self.transaction.acting_as()),
                );
                let services = &self.front.services;
                let plan = namespace::plan(plan, &descriptor.name, command, services, &self.caller);
                let plan = match self.front.services.lanes.shape() {
                    Shape::Single => plan,
                    Shape::Cluster(splitting) => {
                        let argv = command.argv();
                        let placed = Placed {
                            name: &descriptor.name,
                            argv: &argv,
                            keys: &descriptor.keys,
                        };
                        let pinned = self.transaction.slot();
                        placing::on_cluster(plan, placed, splitting, pinned)
                    }
                };
                // The near cache, when on, sees what admission let through (and only that).
                let plan = match &self.front.services.cache {
                    Some(near) => near.plan(plan, &descriptor, command, &mut self.cache_writes),
                    None => plan,
                };
                if !matches!(plan, Plan::Keyspace(_) | Plan::Refuse(_)) {
                    if descriptor.name == "CONFIG|SET" {
                        self.tracked.max_keys = Sent::max_keys(&command.argv());
                    }
                    if self.me.client.tracking.load(Ordering::Relaxed) {
                        let sent = Sent::of(&descriptor, &command.argv());
                        self.tracked.reads = sent.reads;
                        match (
                            self.transaction.queued().is_some(),
                            descriptor.name.as_str(),
                        ) {
                            (true, "EXEC") => {
                                self.tracked.writes = std::mem::take(&mut self.tracked_in_multi)
                            }
                            (true, "DISCARD") => self.tracked_in_multi.clear(),
                            (true, _) => self.tracked_in_multi.extend(sent.writes),
                            (false, _) => self.tracked.writes = sent.writes,
                        }
                    }
                    // Redis never shows an administrative command (CONFIG SET, ACL SETUSER …).
                    if !descriptor.traits.admin {
                        self.front.monitors.ran(&self.me.client, command);
                    }
                    self.me.ran(&descriptor);
                }
                plan
            }
            Decision::Denied(denial) => {
                self.owes_yield |= denial.cause == DenyCause::Deadline;
                Plan::Refuse(Refusal::Denied(*denial))
            }
        }
    }

    /// An `INFO` plan told whether its caller sees the server-wide counts (see [`Amend::Info`]).
    /// Inside a transaction, where replies are not edited, it is refused to a caller who may not
    /// see them.
    fn info_for_caller(&self, plan: Plan, name: &str) -> Plan {
        if name != "INFO" {
            return plan;
        }
        let sees_every_key = self
            .front
            .services
            .admission
            .current()
            .sees_every_key(&self.caller.principal);
        match plan {
            Plan::Forward(forward, Some(Amend::Info { .. })) => Plan::Forward(
                forward,
                Some(Amend::Info {
                    sees_every_key,
                    clients: Some(self.me.sessions_seen()),
                    tracking: Some(Box::new(self.front.tracking.stats())),
                }),
            ),
            Plan::Transaction | Plan::TransactionIn(_) if !sees_every_key => {
                Plan::Refuse(Refusal::InfoInTransaction)
            }
            plan => plan,
        }
    }

    /// A script's plan, its reply amended to name the rule behind a call Redis refused it.
    fn scripts_told_why(&self, plan: Plan, name: &str, command: &Command) -> Plan {
        // Looked at, not taken apart: most plans pass through unchanged.
        let &Plan::Forward(forward, None) = &plan else {
            return plan;
        };
        if !scoped::RUN_SCRIPTS.contains(&name) {
            return plan;
        }
        let body = matches!(name, "EVAL" | "EVAL_RO")
            .then(|| command.word(1).map(Bytes::copy_from_slice))
            .flatten();
        let note = self.script_note(name, body);
        Plan::Forward(forward, Some(Amend::Script(Box::new(note))))
    }

    /// What a script's reply is amended with, and the script counted in flight meanwhile (for
    /// a tenant, by its OS user: `namespace.rs`).
    fn script_note(&self, name: &str, body: Option<Bytes>) -> ScriptNote {
        ScriptNote {
            generation: self.front.services.admission.current(),
            caller: self.caller.clone(),
            body,
            in_flight: ScriptKind::of(name).map(|kind| self.script_started(kind)),
        }
    }

    /// A script of `kind` counted in flight for this caller (for a tenant, by its OS user).
    fn script_started(&self, kind: ScriptKind) -> InFlight {
        let services = &self.front.services;
        let tenant = namespace::divided_for(services, &self.caller);
        services
            .namespace
            .started(kind, tenant.then(|| self.caller.tenant()))
    }

    /// The scripts `command` of a transaction runs now, counted in flight while it does: a script
    /// after `WATCH`, or `EXEC` with the scripts queued since `MULTI` (a queued script runs only
    /// then, and is only remembered).
    fn transaction_runs(&mut self, command: &Command) -> Vec<InFlight> {
        // Upper-cased on the stack: the longest name looked for is `EVALSHA_RO`'s ten letters.
        let word = command.name();
        let mut upper = [0u8; 10];
        let name = match upper.get_mut(..word.len()) {
            Some(name) => {
                name.copy_from_slice(word);
                name.make_ascii_uppercase();
                std::str::from_utf8(name).unwrap_or_default()
            }
            None => "",
        };
        // Outside MULTI what was remembered belongs to a transaction that ended some other way
        // (DISCARD, RESET, a lost connection): forgotten.
        if self.transaction.queued().is_none() {
            self.transaction_scripts.clear();
        }
        let kind = ScriptKind::of(name);
        let kinds = match (name, kind) {
            ("EXEC", _) => std::mem::take(&mut self.transaction_scripts),
            (_, Some(kind)) if self.transaction.queued().is_some() => {
                if !self.transaction_scripts.contains(&kind) {
                    self.transaction_scripts.push(kind);
                }
                Vec::new()
            }
            (_, kind) => kind.into_iter().collect(),
        };
        kinds
            .into_iter()
            .map(|kind| self.script_started(kind))
            .collect()
    }

    /// A tenant's `FCALL`, found to be its to make once the daemon read whose the
    /// functions are: sent on its SCRIPT channel now (nothing is in flight before it).
    async fn fcall_now(&mut self, name: &str, command: Command) -> Bytes {
        let note = self.script_note(name, None);
        let deadline = self.front.deadlines.of_command(&command);
        let sent = match self.channel(Multiplexed::Script, true) {
            Ok(channel) => channel.send_routed(Route::Any, command.encoded(), deadline),
            Err(reply) => return reply,
        };
        match sent.await {
            Ok(reply) => note.apply(reply.into_bytes()),
            Err(error) => replies::call_failed(&error),
        }
    }

    fn carry_out(&mut self, plan: Plan, command: Command, kind: Kind, at_once: AtOnce) -> Step {
        match plan {
            Plan::Answer(local) => self.answer(local, &command, false),
            Plan::Queue(local) => self.answer(local, &command, true),
            Plan::Refuse(refusal) => {
                if refusal.aborts_multi() {
                    self.transaction.refused();
                }
                Step::Reply(replies::refused(&refusal, &command))
            }
            Plan::PingRedis => {
                let regular = Forward::Multiplexed(Multiplexed::Regular);
                self.sending(regular, Route::Any, command, None)
            }
            // Inside MULTI, queued as the daemon's other answers are (its reply in EXEC's).
            Plan::LeaseDocs => {
                let docs = replies::encode(&lease::docs(self.protocol));
                Step::Reply(self.transaction.queue_local(docs))
            }
            Plan::Lease => Step::InPlace(InPlace::Lease(command)),
            Plan::LeaseWatch => Step::InPlace(InPlace::LeaseWatch(command)),
            Plan::Admit => {
                let started = tokio::time::Instant::now();
                let decision = self
                    .front
                    .services
                    .admission
                    .admit(&self.caller, &command.argv());
                self.clock.spent(started);
                let plan = self.admitted(&command, kind, decision);
                self.carry_out(plan, command, kind, at_once)
            }
            Plan::Keyspace(whole) => Step::InPlace(InPlace::Keyspace(whole, command.shared_argv())),
            Plan::Namespace(shared) => Step::InPlace(InPlace::Namespace(shared, command)),
            Plan::ConfigGet(forward) => {
                let fallback = replies::encode(&local::config_get(&command.argv(), self.protocol));
                self.sending(
                    forward,
                    Route::Any,
                    command,
                    Some(Amend::ConfigGet { fallback }),
                )
            }
            Plan::Subscribe(kind) => Step::InPlace(InPlace::Subscribe(kind, command.shared_argv())),
            Plan::Unsubscribe(kind) => {
                Step::InPlace(InPlace::Unsubscribe(kind, command.shared_argv()))
            }
            Plan::Transaction => Step::InPlace(InPlace::Transaction(command, None)),
            Plan::TransactionIn(slot) => Step::InPlace(InPlace::Transaction(command, Some(slot))),
            Plan::Forward(forward, amend) => self.sending(forward, Route::Any, command, amend),
            Plan::Cached(shape, slot) => match self.hit_now(shape, &command, at_once) {
                Some(reply) => Step::Reply(reply),
                None => Step::Cached(shape, command, slot),
            },
            Plan::Placed(forward, slot, amend) => {
                self.sending(forward, Route::Slot(slot), command, amend)
            }
            Plan::Split(forward, split, amend) => {
                let parts = split.parts().iter();
                let parts = parts.map(|part| (Route::Slot(part.slot()), part.command().clone()));
                let parts = parts.collect();
                self.gathering(forward, command, parts, Merge::Split(split), amend)
            }
            Plan::EveryMaster(forward, combine) => {
                let Some(masters) = self.front.services.lanes.masters_now() else {
                    let unmapped = LaneError::Unavailable {
                        reason: "no slot map from the cluster yet".to_owned(),
                    };
                    return Step::Reply(replies::lane_failed(&unmapped));
                };
                let encoded = command.encoded();
                let parts = masters.into_iter().map(|node| (node, encoded.clone()));
                self.gathering(
                    forward,
                    command,
                    parts.collect(),
                    Merge::Combine(combine),
                    None,
                )
            }
        }
    }

    /// A connection-scoped command answered here. Inside MULTI an error answers at once and makes
    /// EXEC fail, as Redis does for a command it refuses to queue; a reply is `queued` into EXEC's.
    fn answer(&mut self, local: Local, command: &Command, queued: bool) -> Step {
        let admission = &self.front.services.admission;
        let principal_named = |name: &str| {
            admission
                .current()
                .principals()
                .iter()
                .any(|principal| principal.name == name)
        };
        let asking = Asking {
            principal_named: &principal_named,
            protocol: self.protocol,
            subscribed_resp2: self.protocol == Protocol::Resp2 && self.listening(),
            id: self.id,
            me: &self.me.client,
            clients: &self.front.clients,
            reply_mode: &mut self.reply_mode,
            tracking: &self.front.tracking,
            lanes: &self.front.services.lanes,
        };
        match answer::answer(local, &command.argv(), asking) {
            Step::Reply(reply) if reply.starts_with(b"-") => {
                self.transaction.refused();
                Step::Reply(reply)
            }
            Step::Reply(reply) if queued => Step::Reply(self.transaction.queue_local(reply)),
            step => step,
        }
    }

    /// How a command is sent on its connection to where `route` leads, its reply corrected by
    /// `amend`.
    fn sending(
        &self,
        forward: Forward,
        route: Route,
        command: Command,
        amend: Option<Amend>,
    ) -> Step {
        match forward {
            Forward::Multiplexed(lane) => {
                let deadline = self.front.deadlines.of_command(&command);
                Step::Multiplexed(lane, route, command.encoded(), deadline, amend)
            }
            Forward::Exclusive(lane) => Step::Exclusive(lane, route, command, amend),
        }
    }

    /// How a command sent as `parts` to several nodes is sent. An exclusive lane's parts run one
    /// after the other on connections borrowed in turn; a multiplexed lane's go out at once.
    fn gathering(
        &self,
        forward: Forward,
        command: Command,
        parts: Vec<(Route, Bytes)>,
        merge: Merge,
        amend: Option<Amend>,
    ) -> Step {
        let deadline = self.front.deadlines.of_command(&command);
        let gather = Gather {
            parts,
            merge,
            amend,
        };
        match forward {
            Forward::Multiplexed(lane) => Step::Gathered(lane, gather, deadline),
            Forward::Exclusive(lane) => Step::GatheredLent(lane, gather, deadline),
        }
    }

    /// Sends `encoded` on this session's channel of `lane`. Between commands (`idle`), the lane's
    /// choice of connection is followed (it packs work on few); with commands in flight the
    /// channel stays, so that their replies keep their order.
    pub fn send_multiplexed(
        &mut self,
        lane: Multiplexed,
        route: Route,
        encoded: Bytes,
        deadline: Option<Duration>,
        idle: bool,
    ) -> Pending {
        match self.channel(lane, idle) {
            Ok(channel) => {
                Pending::Multiplexed(lane, channel.send_routed(route, encoded, deadline))
            }
            Err(reply) => Pending::Ready(Some((Class::Multiplexed(lane), reply))),
        }
    }

    /// [`SessionState::send_multiplexed`] of every part of `gather` at once, their replies merged.
    pub fn send_gathered(
        &mut self,
        lane: Multiplexed,
        gather: Gather,
        deadline: Option<Duration>,
        idle: bool,
    ) -> Pending {
        let channel = match self.channel(lane, idle) {
            Ok(channel) => channel,
            Err(reply) => return Pending::Ready(Some((Class::Multiplexed(lane), reply))),
        };
        let Gather {
            parts,
            merge,
            amend,
        } = gather;
        let sent: Vec<_> = parts
            .into_iter()
            .map(|(route, part)| channel.send_routed(route, part, deadline))
            .collect();
        let gathered = Pending::Gathered(
            lane,
            Box::pin(async move {
                let outcomes = futures::future::join_all(sent).await;
                merge.merge(outcomes.into_iter().map(pending::part_frame).collect())
            }),
        );
        self.amend(gathered, amend)
    }

    /// [`SessionState::send_exclusive`] of every part of `gather`, one after the other.
    pub fn send_gathered_lent(
        &self,
        lane: Lent,
        gather: Gather,
        deadline: Option<Duration>,
    ) -> Pending {
        let lanes = self.front.services.lanes.clone();
        let protocol = self.protocol;
        let tenant = self.caller.tenant();
        let amend = gather.amend;
        let gather = (gather.parts, gather.merge);
        let lent = Pending::Exclusive(Box::pin(async move {
            let (parts, merge) = gather;
            let mut frames = Vec::with_capacity(parts.len());
            for (route, part) in parts {
                let reply = lanes
                    .run_lent(route, lane.lane(), protocol, &tenant, part, deadline)
                    .await;
                frames.push(pending::part_frame(reply));
            }
            merge.merge(frames)
        }));
        self.amend(lent, amend)
    }

    /// This session's channel of `lane`, opened on first use. Between commands (`idle`), the
    /// lane's choice of connection is followed (it packs work on few); with commands in flight the
    /// channel stays, so that their replies keep their order. `Err`: the reply to give instead.
    fn channel(&mut self, lane: Multiplexed, idle: bool) -> Result<&Channel, Bytes> {
        // A key-constrained principal's SCRIPT channel is on its scope's pool; between commands,
        // a reload that changed its scope moves it.
        let scope = (lane == Multiplexed::Script)
            .then(|| scoped::scope_of(&self.front.services, &self.caller))
            .flatten();
        // So does a reload that changed the quotas (and so perhaps its script time limit).
        if lane == Multiplexed::Script
            && idle
            && (self.channels.script_scope != scope
                || self.channels.script_quotas != self.meters.version())
        {
            self.channels.script = None;
        }
        if lane == Multiplexed::Script && self.channels.script.is_none() {
            self.channels.script_quotas = self.meters.version();
        }
        if let (Some(user), None) = (&scope, &self.channels.script) {
            let channel = scoped::channel(&self.front.services, &self.caller, user, self.protocol)?
                .charged_to(self.budget.clone());
            let limit = script_limit(&self.front, &self.caller, &self.meters, self.id);
            self.channels.script_scope = scope.clone();
            return Ok(self.channels.script.insert(match limit {
                Some(limit) => channel.scripts_limited(limit),
                None => channel,
            }));
        }
        if lane == Multiplexed::Script && self.channels.script.is_none() {
            self.channels.script_scope = None;
        }
        let slot = self.channels.slot(lane);
        let channel = match slot {
            Some(channel) => {
                if idle {
                    channel.repick();
                }
                channel
            }
            None => match self
                .front
                .services
                .lanes
                .multiplexed_speaking(lane, self.protocol)
            {
                Ok(channel) => {
                    let channel = channel.charged_to(self.budget.clone());
                    // Only SCRIPT's channel is watched: the limit (and its log line's text) is
                    // made for it alone.
                    let limit = (lane == Multiplexed::Script)
                        .then(|| script_limit(&self.front, &self.caller, &self.meters, self.id))
                        .flatten();
                    slot.insert(match limit {
                        Some(limit) => channel.scripts_limited(limit),
                        None => channel,
                    })
                }
                Err(error) => return Err(replies::lane_failed(&error)),
            },
        };
        Ok(channel)
    }

    /// Borrows a connection of `lane` (the share of the caller's principal and OS user) on `route`'s node for
    /// `command` alone.
    pub fn send_exclusive(&self, lane: Lent, route: Route, command: Command) -> Pending {
        let lanes = self.front.services.lanes.clone();
        let protocol = self.protocol;
        let deadline = self.front.deadlines.of_command(&command);
        let tenant = self.caller.tenant();
        Pending::Exclusive(Box::pin(async move {
            let encoded = command.encoded();
            let ran = lanes.run_lent(route, lane.lane(), protocol, &tenant, encoded, deadline);
            match ran.await {
                Ok(reply) => reply.into_bytes(),
                Err(error) => replies::call_failed(&error),
            }
        }))
    }

    /// A `GET`'s hit, answered as its step is planned: the step is then the daemon's own reply,
    /// and nothing of what a cached read's step carries is built or moved.
    fn hit_now(&self, shape: ReadShape, command: &Command, at_once: AtOnce) -> Option<Bytes> {
        // A command CLIENT TRACKING must be told of is told once its step is counted (`sent`),
        // and only then looked up (`serve_cached`): an invalidation between the two must find
        // its read tracked.
        if !at_once.quiet || !self.tracked.is_empty() {
            return None;
        }
        let near = self.front.services.cache.as_ref()?;
        let now = *at_once.now.get_or_insert_with(Instant::now);
        near.hit(shape, command, now, self.protocol)
    }

    /// A read the near cache may answer (see `cached.rs`); `quiet`: nothing of the session is in
    /// flight. Where it runs, and its reply to come.
    pub fn serve_cached(
        &mut self,
        shape: ReadShape,
        command: Command,
        quiet: bool,
        now: Instant,
        route: Route,
    ) -> (Class, Pending) {
        // A GET's hit first: its answer needs nothing that a miss or a forward does.
        if let (true, Some(near)) = (quiet, &self.front.services.cache) {
            if let Some(reply) = near.hit(shape, &command, now, self.protocol) {
                return (Class::Local, Pending::Ready(Some((Class::Local, reply))));
            }
        }
        let read = cached::read_of(shape, &command);
        let encoded = command.encoded();
        let deadline = self.front.deadlines.of_command(&command);
        drop(command);
        let regular = Class::Multiplexed(Multiplexed::Regular);
        let front = self.front.clone();
        let (served, forwarded) = match &front.services.cache {
            Some(near) => {
                let fallback = Fallback {
                    lanes: front.services.lanes.clone(),
                    protocol: self.protocol,
                    encoded: encoded.clone(),
                    route: route.clone(),
                };
                let served = near.serve(&read, quiet, now, fallback, deadline);
                let forwarded = matches!(served, Served::Forward).then(|| near.forwarded(&read));
                (served, forwarded)
            }
            None => (Served::Forward, None),
        };
        match served {
            Served::Hit(reply) => (Class::Local, Pending::Ready(Some((Class::Local, reply)))),
            // Alone, as an exclusive borrow is: the session's later commands wait for it.
            Served::Filling(pending) => (Class::Exclusive, pending),
            // Its reply drops the entries it read past (`NearCache::forwarded`).
            Served::Forward => {
                let sent =
                    self.send_multiplexed(Multiplexed::Regular, route, encoded, deadline, quiet);
                (regular, self.amend(sent, forwarded))
            }
        }
    }

    /// `pending`, its reply corrected by `amend` when it arrives.
    pub fn amend(&self, pending: Pending, amend: Option<Amend>) -> Pending {
        match amend {
            Some(amend) => Pending::Amended(Box::new(Amended {
                inner: pending,
                amend: Some(amend),
                pubsub: self.front.services.lanes.pubsub(),
            })),
            None => pending,
        }
    }

    /// Work that changes the session; what `CLIENT LIST` shows of it follows.
    pub async fn in_place(&mut self, work: InPlace) -> Bytes {
        let reply = self.change(work).await;
        let subscriptions = self.subscriptions.counts();
        let multi = self.transaction.queued();
        self.me.client.update(|state| {
            state.subscriptions = subscriptions;
            state.multi = multi;
        });
        reply
    }

    async fn change(&mut self, work: InPlace) -> Bytes {
        match work {
            InPlace::Transaction(command, slot) => {
                let deadline = self.front.deadlines.of_command(&command);
                // The scope is looked up only when the transaction is about to pin.
                let scope = match self.transaction.holds_connection() {
                    true => None,
                    false => scoped::login(&self.front.services, &self.caller),
                };
                let scoped = scope.is_some() || self.transaction.acting_as().is_some();
                let running = self.transaction_runs(&command);
                let on = Borrower {
                    lanes: &self.front.services.lanes,
                    protocol: self.protocol,
                    tenant: &self.caller.tenant(),
                    scope,
                };
                let reply = self.transaction.run(&command, on, slot, deadline).await;
                drop(running);
                let reply = match scoped {
                    // A key or channel its scope refused a script says whose scope it is.
                    true => script_refusal::in_transaction(
                        reply,
                        &self.front.services.admission.current(),
                        &self.caller,
                    ),
                    false => reply,
                };
                if let Some(near) = &self.front.services.cache {
                    // What the transaction wrote is dropped once it ran (and again after each
                    // of its commands, which only queued: harmless); forgotten once it is over.
                    near.drop_written(&self.cache_writes);
                    if self.transaction.queued().is_none() {
                        self.cache_writes.clear();
                    }
                }
                reply
            }
            InPlace::Subscribe(kind, argv) => {
                let caps = Caps {
                    subscriptions: self.front.config.max_subscriptions,
                    buffer: self.front.config.subscriber_buffer,
                };
                let pubsub = self.front.services.lanes.pubsub();
                let budget = self.budget.clone();
                self.subscriptions
                    .subscribe_all(&pubsub, kind, argv, caps, budget, self.protocol)
                    .await
            }
            InPlace::Unsubscribe(kind, argv) => {
                let pubsub = self.front.services.lanes.pubsub();
                self.subscriptions
                    .unsubscribe_all(&pubsub, kind, argv, self.protocol)
                    .await
            }
            InPlace::Hello(hello) => {
                if let Some(protocol) = hello.protocol {
                    self.speak(protocol);
                }
                let lanes = &self.front.services.lanes;
                if lanes.server_identity().is_none() {
                    // No lane has connected yet: a PING connects one, whose handshake tells
                    // who Redis is (what the reply names). Failing, the daemon names itself.
                    if let Ok(channel) =
                        lanes.multiplexed_speaking(Multiplexed::Regular, self.protocol)
                    {
                        let mut ping = bytes::BytesMut::new();
                        tollgate_resp::encode_command(&["PING"], &mut ping);
                        let deadline = Some(Duration::from_secs(1));
                        let _ = channel
                            .send_routed(Route::Any, ping.freeze(), deadline)
                            .await;
                    }
                }
                replies::encode(&answer::hello(
                    hello,
                    &self.me.client,
                    self.protocol,
                    self.id,
                    &self.front.services.lanes,
                ))
            }
            InPlace::Keyspace(whole, argv) => {
                let channel = match &self.channels.regular {
                    Some(channel) => channel.clone(),
                    None => match self
                        .front
                        .services
                        .lanes
                        .multiplexed_speaking(Multiplexed::Regular, self.protocol)
                    {
                        Ok(channel) => channel,
                        Err(error) => return replies::lane_failed(&error),
                    },
                };
                let lanes = &self.front.services.lanes;
                let servers = match lanes.shape() {
                    Shape::Single => keyspace::Servers::One,
                    Shape::Cluster(_) => match lanes.masters().await {
                        Ok(masters) => keyspace::Servers::Masters(masters),
                        Err(error) => return replies::lane_failed(&error),
                    },
                };
                let scope = keyspace::Scope {
                    caller: &self.caller,
                    admission: &self.front.services.admission,
                    channel: &channel,
                    protocol: self.protocol,
                    servers,
                };
                let flushing = whole == keyspace::Whole::FlushDb;
                let reply = keyspace::serve(whole, &argv, scope).await;
                if let (true, Some(near)) = (flushing, &self.front.services.cache) {
                    near.flushed();
                }
                if flushing {
                    // Redis's null invalidation, after the flush's reply (`CLIENT TRACKING`).
                    let flush = Sent {
                        flush: true,
                        ..Sent::default()
                    };
                    self.front.tracking.sent(self.id, flush);
                }
                reply
            }
            InPlace::Namespace(shared, command) => {
                let argv = command.shared_argv();
                let at = namespace::At {
                    services: &self.front.services,
                    caller: &self.caller,
                    protocol: self.protocol,
                };
                match namespace::serve(shared, &argv, at).await {
                    namespace::Served::Reply(reply) => reply,
                    namespace::Served::Forward => {
                        let name = String::from_utf8_lossy(command.name()).to_uppercase();
                        self.fcall_now(&name, command).await
                    }
                }
            }
            InPlace::Monitor => {
                self.monitor = Some(self.front.monitors.watch());
                replies::ok()
            }
            InPlace::Lease(command) => {
                let argv = command.argv();
                lease::run(
                    &self.front,
                    &self.caller,
                    (&self.clock, &mut self.meters),
                    &mut self.leases,
                    self.protocol,
                    &argv,
                )
                .await
            }
            InPlace::LeaseWatch(command) => {
                let argv = command.argv();
                let (front, caller) = (&self.front, &self.caller);
                lease_watch::run(front, caller, &mut self.watches, self.protocol, &argv).await
            }
            InPlace::Tracking(args) => {
                let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_ref()).collect();
                let done = self.front.tracking.turn_on(&self.me.client, &args).await;
                client_tracking::reply(done.map(|()| Answer::Ok), self.protocol)
            }
            InPlace::Reset => {
                self.front.tracking.reset(&self.me.client);
                self.tracked_in_multi.clear();
                self.subscriptions.clear();
                self.watches.clear();
                self.monitor = None;
                self.transaction.release().await;
                self.speak(Protocol::Resp2);
                self.me.client.update(|state| state.name = None);
                self.reply_mode = ReplyMode::On;
                Bytes::from_static(b"+RESET\r\n")
            }
        }
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
            self.channels = Channels::default();
        }
    }

    /// After the client is gone: an open transaction is discarded and its connection returned clean.
    pub async fn finish(&mut self) {
        self.front.tracking.leave(self.id);
        self.subscriptions.clear();
        self.transaction.release().await;
    }
}
