//! What a command becomes in this session, decided once from its [`Kind`] and the little of the
//! session it depends on ([`Context`]): answered here, queued inside MULTI, refused, admitted by
//! the policy first, or — once admitted — served over SCAN, subscribed, run on the pinned
//! transaction connection or forwarded on a lane. The session carries the plan out; nothing after
//! this asks again what kind of command it is.

use bytes::Bytes;
use tollgate_lanes::{Slot, SubscriptionKind};
use tollgate_model::{Lane, Multiplexed};

use super::amend::Amend;
use super::keyspace::Whole;
use super::kind::{Kind, LeaseCommand, Subscribing};
use super::local::{Arity, Local, Protocol};
use super::namespace::shared::Shared;
use super::pending::Lent;
pub use super::refusal::Refusal;
use super::slots::{Combine, Split, TransactionSlot};

/// The session's state a plan depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    pub protocol: Protocol,
    /// Messages may arrive unasked: the client holds a subscription or a lease watch.
    pub subscribed: bool,
    /// The client holds a lease watch (`LEASE WATCH`); RESP2's refusal names the watch commands.
    pub watching: bool,
    pub pinned: Pinned,
}

/// Whether the session holds a TRANSACTION connection, and how far its transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinned {
    No,
    /// After WATCH (or a MULTI that Redis refused), before MULTI.
    Watching,
    /// Between MULTI and EXEC or DISCARD: commands are queued.
    InMulti,
}

/// What a command becomes.
#[derive(Debug, PartialEq)]
pub enum Plan {
    /// Answered by the daemon now.
    Answer(Local),
    /// Inside MULTI, answered by the daemon as Redis queues it: `+QUEUED` now, its reply in EXEC's.
    Queue(Local),
    /// Refused with an error before it runs.
    Refuse(Refusal),
    /// `PING` forwarded unadmitted on REGULAR, so that it answers `PONG` only while Redis does
    /// (pools that health-check with PING see an outage).
    PingRedis,
    /// `COMMAND DOCS LEASE`, answered from the daemon.
    LeaseDocs,
    /// `LEASE …`, run in place (it may wait for the lease).
    Lease,
    /// `LEASE WATCH|UNWATCH …`, run in place: it changes the connection's watches.
    LeaseWatch,
    /// The policy decides first; then [`admitted`] says what it becomes.
    Admit,
    /// A whole-keyspace command, served key by key over SCAN.
    Keyspace(Whole),
    /// `CONFIG GET`: Redis's own values where its lane user may read them, the daemon's otherwise.
    ConfigGet(Forward),
    Subscribe(SubscriptionKind),
    Unsubscribe(SubscriptionKind),
    /// Run on the pinned TRANSACTION connection (WATCH and MULTI pin it).
    Transaction,
    /// On a cluster, the first command of a transaction with keys: it pins the transaction's
    /// connection on the node of its first key's slot.
    TransactionIn(TransactionSlot),
    /// Sent on a lane, its reply corrected on the way back where the daemon must.
    Forward(Forward, Option<Amend>),
    /// On a cluster, [`Plan::Forward`] to the master of the slot its keys are in.
    Placed(Forward, Slot, Option<Amend>),
    /// On a cluster, one command per slot, their replies merged in the client's order, then
    /// corrected as [`Plan::Forward`]'s are.
    Split(Forward, Split, Option<Amend>),
    /// On a cluster, sent to every master, their replies combined.
    EveryMaster(Forward, Combine),
    /// A read the near cache may answer (`cached.rs`); otherwise forwarded on REGULAR (on a
    /// cluster, to the master of the slot its keys are in).
    Cached(ReadShape, Option<Slot>),
    /// A tenant's command on Redis's shared namespace of scripts and libraries, served
    /// by the daemon (`namespace.rs`).
    Namespace(Shared),
}

/// Which read the near cache may answer (`cached.rs`), its keys and fields still the command's
/// words: a hit looks its key up in place, and only a read that goes on (a miss, a forward)
/// takes them as its [`CachedRead`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadShape {
    Get,
    MGet,
    Strlen,
    Exists,
    HGet,
    HMGet,
    HGetAll,
}

/// A read the near cache may answer (`cached.rs`), with its keys and fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CachedRead {
    /// `GET key`.
    Get(Bytes),
    /// `MGET key …`, every key cacheable: answered key by key.
    MGet(Vec<Bytes>),
    /// `STRLEN key`: answered from the entry a `GET` filled, if there is one.
    Strlen(Bytes),
    /// `EXISTS key …`, every key cacheable: answered when every key has an entry.
    Exists(Vec<Bytes>),
    /// `HGET key field`.
    HGet(Bytes, Bytes),
    /// `HMGET key field …`.
    HMGet(Bytes, Vec<Bytes>),
    /// `HGETALL key`.
    HGetAll(Bytes),
}

/// Which connection a forwarded command is sent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    Multiplexed(Multiplexed),
    Exclusive(Lent),
}

impl Forward {
    pub fn lane(self) -> Lane {
        match self {
            Forward::Multiplexed(lane) => lane.into(),
            Forward::Exclusive(lane) => lane.lane().into(),
        }
    }

    /// How a command the policy admitted for `lane` is sent outside a transaction.
    pub fn of(lane: Lane) -> Forward {
        match ordinary(lane) {
            Lane::Script => Forward::Multiplexed(Multiplexed::Script),
            Lane::Blocking => Forward::Exclusive(Lent::Blocking),
            Lane::Admin => Forward::Exclusive(Lent::Admin),
            // TRANSACTION outside a transaction pins a connection instead (see `admitted`).
            Lane::Regular | Lane::Transaction | Lane::Pubsub => {
                Forward::Multiplexed(Multiplexed::Regular)
            }
        }
    }
}

/// The lane a command admitted for `lane` runs on: PUBLISH and the PUBSUB introspection commands
/// are ordinary requests; only subscribing uses the PUBSUB lane's shared subscriber.
pub fn ordinary(lane: Lane) -> Lane {
    match lane {
        Lane::Pubsub => Lane::Regular,
        lane => lane,
    }
}

impl Context {
    fn in_multi(self) -> bool {
        self.pinned == Pinned::InMulti
    }

    /// A locally answered command: queued inside MULTI if Redis would queue it.
    fn answer(self, local: Local) -> Plan {
        match self.in_multi() && local.queues_in_multi() {
            true => Plan::Queue(local),
            false => Plan::Answer(local),
        }
    }
}

/// What a command of `kind` with `argc` words becomes before the policy is asked.
pub fn before(kind: Kind, argc: usize, context: Context) -> Plan {
    let may_run_subscribed = match kind {
        Kind::Local(local) => local.allowed_while_subscribed(),
        Kind::Subscription(..) | Kind::Lease(LeaseCommand::Watch) => true,
        Kind::Lease(LeaseCommand::Call | LeaseCommand::Docs) | Kind::Redis => false,
    };
    if context.protocol == Protocol::Resp2 && context.subscribed && !may_run_subscribed {
        return Plan::Refuse(match context.watching {
            true => Refusal::WhileWatching,
            false => Refusal::WhileSubscribed,
        });
    }
    let local = match kind {
        Kind::Lease(LeaseCommand::Docs) => return Plan::LeaseDocs,
        Kind::Lease(LeaseCommand::Call | LeaseCommand::Watch) if context.pinned != Pinned::No => {
            return Plan::Refuse(Refusal::LeaseInTransaction)
        }
        Kind::Lease(LeaseCommand::Call) => return Plan::Lease,
        Kind::Lease(LeaseCommand::Watch) => return Plan::LeaseWatch,
        Kind::Subscription(..) | Kind::Redis => return Plan::Admit,
        Kind::Local(local) => local,
    };
    if let Arity::Wrong(name) = local.arity(argc) {
        return Plan::Refuse(Refusal::WrongArity(name));
    }
    // Except where Redis itself could not take it on a shared connection: a RESP2 subscriber's
    // PING (answered with a `pong` array, the subscription lane's health being the subscriber's
    // stream) and one queued inside MULTI.
    let subscribed_resp2 = context.protocol == Protocol::Resp2 && context.subscribed;
    if local == Local::Ping && !subscribed_resp2 && !context.in_multi() {
        return Plan::PingRedis;
    }
    match local.needs_admission() {
        true => Plan::Admit,
        false => context.answer(local),
    }
}

/// What a command of `kind` that the policy admitted as `name` (its catalog name) for `lane`
/// becomes; `first` is its first argument.
pub fn admitted(
    kind: Kind,
    name: &str,
    first: Option<&[u8]>,
    lane: Lane,
    context: Context,
) -> Plan {
    if let Some(whole) = Whole::of(name) {
        return match context.pinned {
            Pinned::No => Plan::Keyspace(whole),
            Pinned::Watching | Pinned::InMulti => Plan::Refuse(Refusal::WholeInTransaction),
        };
    }
    match kind {
        Kind::Local(Local::ConfigGet) if !context.in_multi() => {
            return Plan::ConfigGet(Forward::of(lane))
        }
        Kind::Local(local) => return context.answer(local),
        Kind::Subscription(kind, Subscribing::Subscribe) => return Plan::Subscribe(kind),
        Kind::Subscription(kind, Subscribing::Unsubscribe) => return Plan::Unsubscribe(kind),
        Kind::Lease(_) | Kind::Redis => {}
    }
    if context.pinned != Pinned::No || lane == Lane::Transaction {
        return Plan::Transaction;
    }
    Plan::Forward(Forward::of(lane), Amend::of(name, first))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::server::resp::words::command;

    const PLAIN: Context = Context {
        protocol: Protocol::Resp2,
        subscribed: false,
        watching: false,
        pinned: Pinned::No,
    };
    const IN_MULTI: Context = Context {
        pinned: Pinned::InMulti,
        ..PLAIN
    };
    const WATCHING: Context = Context {
        pinned: Pinned::Watching,
        ..PLAIN
    };
    const SUBSCRIBED_RESP2: Context = Context {
        subscribed: true,
        ..PLAIN
    };
    const SUBSCRIBED_RESP3: Context = Context {
        protocol: Protocol::Resp3,
        subscribed: true,
        watching: false,
        pinned: Pinned::No,
    };
    /// Watching a lease in RESP2: watch mode, which limits commands as subscribing does.
    const WATCHING_LEASE_RESP2: Context = Context {
        subscribed: true,
        watching: true,
        ..PLAIN
    };
    const WATCHING_LEASE_RESP3: Context = Context {
        protocol: Protocol::Resp3,
        ..WATCHING_LEASE_RESP2
    };

    fn before_admission(words: &str, context: Context) -> Plan {
        let command = command(words);
        before(Kind::of(&command), command.len(), context)
    }

    /// The plan once the policy admitted `words` for `lane`.
    fn after_admission(words: &str, lane: Lane, context: Context) -> Plan {
        let command = command(words);
        let name = catalog_name(words);
        admitted(Kind::of(&command), &name, command.word(1), lane, context)
    }

    /// The catalog's name for `words`: `CONFIG GET` is `CONFIG|GET`, as for every container
    /// command these tests send.
    fn catalog_name(words: &str) -> String {
        let mut words = words.split_whitespace().map(str::to_uppercase);
        let name = words.next().unwrap_or_default();
        match name.as_str() {
            "CONFIG" | "CLIENT" | "PUBSUB" => {
                format!("{name}|{}", words.next().unwrap_or_default())
            }
            _ => name,
        }
    }

    /// Each `(words, context, plan)`: the plan `words` must get in that context before the policy
    /// is asked.
    fn planned_as<const N: usize>(cases: [(&str, Context, Plan); N]) {
        for (words, context, plan) in cases {
            assert_eq!(
                before_admission(words, context),
                plan,
                "{words} in {context:?}"
            );
        }
    }

    /// Each `(words, lane, context, plan)`: once the policy admits `words` for the lane, in that
    /// context, the plan it must get.
    fn admitted_as<const N: usize>(cases: [(&str, Lane, Context, Plan); N]) {
        for (words, lane, context, plan) in cases {
            let got = after_admission(words, lane, context);
            assert_eq!(got, plan, "{words} in {context:?}");
        }
    }

    #[test]
    fn a_get_is_admitted_then_forwarded_on_regular() {
        assert_eq!(before_admission("GET k", PLAIN), Plan::Admit);
        assert_eq!(
            after_admission("GET k", Lane::Regular, PLAIN),
            Plan::Forward(Forward::Multiplexed(Multiplexed::Regular), None)
        );
    }

    #[test]
    fn a_command_goes_on_the_lane_the_policy_names() {
        let forward = |lane| match after_admission("X", lane, PLAIN) {
            Plan::Forward(forward, None) => forward,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            forward(Lane::Script),
            Forward::Multiplexed(Multiplexed::Script)
        );
        assert_eq!(forward(Lane::Blocking), Forward::Exclusive(Lent::Blocking));
        assert_eq!(forward(Lane::Admin), Forward::Exclusive(Lent::Admin));
        // PUBLISH and PUBSUB's introspection are ordinary requests.
        assert_eq!(
            forward(Lane::Pubsub),
            Forward::Multiplexed(Multiplexed::Regular)
        );
    }

    #[test]
    fn a_ping_goes_to_redis_so_that_it_answers_only_while_redis_does() {
        assert_eq!(before_admission("PING", PLAIN), Plan::PingRedis);
        assert_eq!(before_admission("PING", WATCHING), Plan::PingRedis);
        assert_eq!(before_admission("PING", SUBSCRIBED_RESP3), Plan::PingRedis);
    }

    #[test]
    fn a_ping_inside_multi_is_queued_locally() {
        assert_eq!(before_admission("PING", IN_MULTI), Plan::Queue(Local::Ping));
    }

    #[test]
    fn a_resp2_subscriber_s_ping_is_answered_here() {
        assert_eq!(
            before_admission("PING", SUBSCRIBED_RESP2),
            Plan::Answer(Local::Ping)
        );
    }

    #[test]
    fn a_resp2_subscriber_may_only_subscribe_ping_quit_and_reset() {
        for words in [
            "GET k",
            "CLIENT ID",
            "LEASE INSPECT r",
            "COMMAND DOCS LEASE",
        ] {
            assert_eq!(
                before_admission(words, SUBSCRIBED_RESP2),
                Plan::Refuse(Refusal::WhileSubscribed),
                "{words}"
            );
        }
        planned_as([
            ("SUBSCRIBE b", SUBSCRIBED_RESP2, Plan::Admit),
            ("QUIT", SUBSCRIBED_RESP2, Plan::Answer(Local::Quit)),
            ("RESET", SUBSCRIBED_RESP2, Plan::Answer(Local::Reset)),
        ]);
    }

    #[test]
    fn a_resp3_subscriber_may_run_anything() {
        assert_eq!(before_admission("GET k", SUBSCRIBED_RESP3), Plan::Admit);
        assert_eq!(
            before_admission("CLIENT ID", SUBSCRIBED_RESP3),
            Plan::Answer(Local::ClientId)
        );
    }

    #[test]
    fn connection_scoped_commands_are_answered_here_without_the_policy() {
        for (words, local) in [
            ("ECHO hi", Local::Echo),
            ("CLIENT SETNAME app", Local::ClientSetName),
            ("HELLO 3", Local::Hello),
            ("QUIT", Local::Quit),
            ("CLIENT REPLY OFF", Local::ClientReply),
        ] {
            assert_eq!(
                before_admission(words, PLAIN),
                Plan::Answer(local),
                "{words}"
            );
        }
    }

    #[test]
    fn inside_multi_only_what_redis_queues_is_queued() {
        planned_as([
            ("ECHO hi", IN_MULTI, Plan::Queue(Local::Echo)),
            (
                "CLIENT SETNAME app",
                IN_MULTI,
                Plan::Queue(Local::ClientSetName),
            ),
            // These act at once, or change how the connection speaks.
            ("RESET", IN_MULTI, Plan::Answer(Local::Reset)),
            ("HELLO 3", IN_MULTI, Plan::Answer(Local::Hello)),
            (
                "CLIENT REPLY ON",
                IN_MULTI,
                Plan::Answer(Local::ClientReply),
            ),
        ]);
    }

    #[test]
    fn a_local_command_with_the_wrong_arity_is_refused_with_redis_s_name_for_it() {
        let wrong = |name| Plan::Refuse(Refusal::WrongArity(name));
        planned_as([
            ("ECHO", PLAIN, wrong("echo")),
            ("SELECT", PLAIN, wrong("select")),
            ("PING a b", IN_MULTI, wrong("ping")),
        ]);
    }

    #[test]
    fn refusals_of_what_redis_would_refuse_to_queue_abort_the_transaction() {
        assert!(Refusal::WrongArity("echo").aborts_multi());
        assert!(Refusal::WholeInTransaction.aborts_multi());
        assert!(Refusal::LeaseInTransaction.aborts_multi());
        assert!(!Refusal::WhileSubscribed.aborts_multi());
        assert!(!Refusal::WhileWatching.aborts_multi());
    }

    #[test]
    fn commands_the_policy_decides_are_admitted_before_they_are_answered() {
        for words in [
            "SELECT 0",
            "CONFIG GET *",
            "CLIENT LIST",
            "CLIENT KILL ID 3",
            "MONITOR",
        ] {
            assert_eq!(before_admission(words, PLAIN), Plan::Admit, "{words}");
        }
        admitted_as([
            (
                "SELECT 0",
                Lane::Regular,
                PLAIN,
                Plan::Answer(Local::Select),
            ),
            (
                "SELECT 0",
                Lane::Regular,
                IN_MULTI,
                Plan::Queue(Local::Select),
            ),
            ("MONITOR", Lane::Admin, PLAIN, Plan::Answer(Local::Monitor)),
        ]);
    }

    #[test]
    fn config_get_asks_redis_outside_multi_and_is_answered_here_inside() {
        let asks_redis = || Plan::ConfigGet(Forward::Exclusive(Lent::Admin));
        admitted_as([
            ("CONFIG GET *", Lane::Admin, PLAIN, asks_redis()),
            ("CONFIG GET *", Lane::Admin, WATCHING, asks_redis()),
            (
                "CONFIG GET *",
                Lane::Admin,
                IN_MULTI,
                Plan::Queue(Local::ConfigGet),
            ),
        ]);
    }

    #[test]
    fn whole_keyspace_commands_are_served_over_scan_and_refused_in_a_transaction() {
        let refused = || Plan::Refuse(Refusal::WholeInTransaction);
        admitted_as([
            ("KEYS *", Lane::Regular, PLAIN, Plan::Keyspace(Whole::Keys)),
            (
                "FLUSHALL",
                Lane::Admin,
                PLAIN,
                Plan::Keyspace(Whole::FlushDb),
            ),
            ("DBSIZE", Lane::Regular, WATCHING, refused()),
            ("DBSIZE", Lane::Regular, IN_MULTI, refused()),
        ]);
    }

    #[test]
    fn subscription_commands_are_admitted_then_served_from_the_shared_subscriber() {
        admitted_as([
            (
                "SUBSCRIBE a",
                Lane::Pubsub,
                PLAIN,
                Plan::Subscribe(SubscriptionKind::Channel),
            ),
            (
                "PUNSUBSCRIBE",
                Lane::Pubsub,
                WATCHING,
                Plan::Unsubscribe(SubscriptionKind::Pattern),
            ),
        ]);
    }

    #[test]
    fn while_a_transaction_connection_is_pinned_everything_for_redis_runs_on_it() {
        for context in [WATCHING, IN_MULTI] {
            for lane in [Lane::Regular, Lane::Blocking, Lane::Script] {
                assert_eq!(after_admission("GET k", lane, context), Plan::Transaction);
            }
        }
    }

    #[test]
    fn watch_and_multi_pin_a_transaction_connection() {
        admitted_as([
            ("MULTI", Lane::Transaction, PLAIN, Plan::Transaction),
            ("WATCH k", Lane::Transaction, PLAIN, Plan::Transaction),
        ]);
    }

    #[test]
    fn publish_is_forwarded_and_its_receiver_count_corrected() {
        assert_eq!(
            after_admission("PUBLISH news hi", Lane::Pubsub, PLAIN),
            Plan::Forward(
                Forward::Multiplexed(Multiplexed::Regular),
                Some(Amend::Publish(
                    SubscriptionKind::Channel,
                    Bytes::from_static(b"news")
                ))
            )
        );
    }

    #[test]
    fn lease_commands_run_in_place_but_never_inside_a_transaction() {
        assert_eq!(before_admission("LEASE ACQUIRE r", PLAIN), Plan::Lease);
        for context in [WATCHING, IN_MULTI] {
            assert_eq!(
                before_admission("LEASE ACQUIRE r", context),
                Plan::Refuse(Refusal::LeaseInTransaction)
            );
        }
        assert_eq!(
            before_admission("COMMAND DOCS LEASE", IN_MULTI),
            Plan::LeaseDocs
        );
        assert_eq!(before_admission("COMMAND DOCS GET", PLAIN), Plan::Admit);
    }

    #[test]
    fn lease_watch_and_unwatch_run_in_place_also_while_subscribed_but_never_in_a_transaction() {
        planned_as([
            ("LEASE WATCH r", PLAIN, Plan::LeaseWatch),
            ("lease unwatch", PLAIN, Plan::LeaseWatch),
            ("LEASE WATCH r", SUBSCRIBED_RESP2, Plan::LeaseWatch),
            ("LEASE UNWATCH r", WATCHING_LEASE_RESP2, Plan::LeaseWatch),
            ("LEASE WATCH r", WATCHING_LEASE_RESP3, Plan::LeaseWatch),
            (
                "LEASE WATCH r",
                WATCHING,
                Plan::Refuse(Refusal::LeaseInTransaction),
            ),
            (
                "LEASE UNWATCH",
                IN_MULTI,
                Plan::Refuse(Refusal::LeaseInTransaction),
            ),
        ]);
    }

    #[test]
    fn a_resp2_watcher_may_only_watch_subscribe_ping_quit_and_reset_and_is_told_so() {
        for words in [
            "GET k",
            "CLIENT ID",
            "LEASE INSPECT r",
            "COMMAND DOCS LEASE",
        ] {
            assert_eq!(
                before_admission(words, WATCHING_LEASE_RESP2),
                Plan::Refuse(Refusal::WhileWatching),
                "{words}"
            );
        }
        planned_as([
            ("SUBSCRIBE b", WATCHING_LEASE_RESP2, Plan::Admit),
            ("PING", WATCHING_LEASE_RESP2, Plan::Answer(Local::Ping)),
            ("RESET", WATCHING_LEASE_RESP2, Plan::Answer(Local::Reset)),
            // RESP3 watchers run anything, as RESP3 subscribers do.
            ("GET k", WATCHING_LEASE_RESP3, Plan::Admit),
            ("PING", WATCHING_LEASE_RESP3, Plan::PingRedis),
        ]);
    }
}
