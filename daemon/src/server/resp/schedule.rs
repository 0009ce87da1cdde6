//! A session's schedule: the replies it still owes, in the order its commands were sent, what is in
//! flight where, and the one command held back for a *barrier*. Commands for the same multiplexed
//! lane go out without waiting; a command for another lane, or for an exclusive connection, waits
//! until everything before it is answered, so that a client's commands still run in the order sent.
//! Knows nothing of sockets: the session's loop asks it what may start and feeds it what starts.

use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use tollgate_lanes::{Route, SubscriptionKind};
use tollgate_model::Multiplexed;
use tollgate_resp::Command;

use super::amend::Amend;
use super::deadline;
use super::flights::Flight;
use super::keyspace::Whole;
use super::local::{self, Voice};
use super::namespace::shared::Shared;
use super::pending::{Class, Gather, InOrder, Lent, Pending};
use super::plan::ReadShape;
use super::slots::TransactionSlot;

/// What one planned command becomes.
pub enum Step {
    /// A reply the daemon writes itself.
    Reply(Bytes),
    /// Send these encoded bytes on a multiplexed lane, to where the route leads, with this
    /// deadline; correct the reply as the [`Amend`] says when it arrives.
    Multiplexed(Multiplexed, Route, Bytes, Option<Duration>, Option<Amend>),
    /// Borrow a BLOCKING or ADMIN connection on the route's node for this one command.
    Exclusive(Lent, Route, Command, Option<Amend>),
    /// On a cluster: send each part on a multiplexed lane to its route, and merge the replies.
    Gathered(Multiplexed, Gather, Option<Duration>),
    /// On a cluster: run each part on a BLOCKING or ADMIN connection of its route's node in turn,
    /// and merge the replies.
    GatheredLent(Lent, Gather, Option<Duration>),
    /// Awaited in place once everything before it has been answered: it changes the session.
    InPlace(InPlace),
    /// Write this reply, then close the connection.
    Close(Bytes),
    /// A read the near cache may answer: else this command is sent on REGULAR (its bytes and
    /// deadline are worked out only then).
    Cached(ReadShape, Command, Option<tollgate_lanes::Slot>),
}

impl Step {
    /// Where the step runs, which decides whether it must wait for what is in flight.
    pub fn class(&self) -> Class {
        match self {
            Step::Reply(_) | Step::Close(_) => Class::Local,
            Step::Multiplexed(lane, ..) | Step::Gathered(lane, ..) => Class::Multiplexed(*lane),
            // Waits as a REGULAR command does; served from the cache only with nothing in flight.
            Step::Cached(..) => Class::Multiplexed(Multiplexed::Regular),
            Step::Exclusive(..) | Step::GatheredLent(..) => Class::Exclusive,
            Step::InPlace(_) => Class::InPlace,
        }
    }
}

/// Work that changes the session, awaited in place.
pub enum InPlace {
    /// A command while a transaction connection is pinned, or one that pins it (WATCH, MULTI);
    /// on a cluster, with the slot its first key pins the transaction to.
    Transaction(Command, Option<TransactionSlot>),
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
    /// `LEASE WATCH|UNWATCH …`: starts or ends watches of the connection.
    LeaseWatch(Command),
    /// A tenant's command on the shared script namespace (`namespace.rs`).
    Namespace(Shared, Command),
    /// `CLIENT TRACKING ON <args>`, once the invalidation connection is open (`client_tracking.rs`).
    Tracking(Vec<Bytes>),
}

impl InPlace {
    /// Whether the work may wait for long (a blocking command on the pinned connection, a lease
    /// wait, a walk of the whole keyspace): the replies before it are not held back meanwhile.
    pub fn may_wait(&self) -> bool {
        match self {
            InPlace::Transaction(command, _) => deadline::may_block(command.name()),
            // A tenant's FCALL read first whose the functions are: it may run long.
            InPlace::Lease(_) | InPlace::Keyspace(..) | InPlace::Namespace(..) => true,
            InPlace::Subscribe(..)
            | InPlace::Unsubscribe(..)
            | InPlace::Hello(_)
            | InPlace::Monitor
            | InPlace::Reset
            | InPlace::LeaseWatch(_)
            | InPlace::Tracking(_) => false,
        }
    }
}

/// In-flight commands per place, to decide when a barrier is needed. Local replies hold nothing
/// up, so they are not counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct InFlight {
    regular: usize,
    script: usize,
    exclusive: usize,
}

impl InFlight {
    fn count(&mut self, class: Class) -> Option<&mut usize> {
        match class {
            Class::Multiplexed(Multiplexed::Regular) => Some(&mut self.regular),
            Class::Multiplexed(Multiplexed::Script) => Some(&mut self.script),
            Class::Exclusive => Some(&mut self.exclusive),
            Class::Local | Class::InPlace => None,
        }
    }
}

/// A session's owed replies and held-back command.
#[derive(Default)]
pub struct Schedule {
    pending: InOrder,
    in_flight: InFlight,
    /// A planned command waiting for a barrier, and whether its reply will be heard.
    parked: Option<(Step, Voice)>,
    /// The multiplexed lane of the last reply handed out, unless a reply from an exclusive
    /// connection or work in place came after it (see [`Schedule::continues_run`]).
    run: Option<Multiplexed>,
    /// This session's part in its user's commands in flight on the multiplexed lanes, against the
    /// user's share of each (`flights.rs`); `None` counts nothing.
    flight: Option<Flight>,
    /// Commands pushed and replies handed out, ever: what holds a tracking invalidation behind
    /// the replies owed when it arrived (`crate::tracking::Gate`).
    started: u64,
    answered: u64,
}

/// What the schedule says of a step that is ready to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// It may start now.
    Go,
    /// It must wait until what is in flight has been answered.
    Wait,
}

impl Schedule {
    /// A schedule that counts its commands in flight in its user's `flight`.
    pub fn counted(flight: Flight) -> Schedule {
        Schedule {
            flight: Some(flight),
            ..Schedule::default()
        }
    }

    /// Whether a step of `class` may start beside what is in flight: a multiplexed lane pipelines
    /// behind itself only (while its user is within its share of the lane); an exclusive
    /// connection is borrowed alone; work in place waits for every reply owed, the daemon's own
    /// included (it writes its reply straight to the client).
    pub fn turn(&self, class: Class) -> Turn {
        let InFlight {
            regular,
            script,
            exclusive,
        } = self.in_flight;
        let busy = match class {
            Class::Local => false,
            Class::Multiplexed(Multiplexed::Regular) => {
                script + exclusive > 0 || self.at_share(Multiplexed::Regular)
            }
            Class::Multiplexed(Multiplexed::Script) => {
                regular + exclusive > 0 || self.at_share(Multiplexed::Script)
            }
            Class::Exclusive => regular + script + exclusive > 0,
            Class::InPlace => !self.pending.is_empty(),
        };
        match busy {
            true => Turn::Wait,
            false => Turn::Go,
        }
    }

    fn at_share(&self, lane: Multiplexed) -> bool {
        self.flight
            .as_ref()
            .is_some_and(|flight| flight.must_wait(lane))
    }

    /// Whether nothing of the session is in flight on any connection to Redis.
    pub fn quiet(&self) -> bool {
        self.in_flight == InFlight::default()
    }

    /// How many commands are in flight on `class`'s connections.
    pub fn in_flight(&self, class: Class) -> usize {
        let mut in_flight = self.in_flight;
        in_flight.count(class).map_or(0, |count| *count)
    }

    /// A started command, whose reply is owed after every reply owed already.
    pub fn push(&mut self, class: Class, pending: Pending, voice: Voice) {
        if let Some(count) = self.in_flight.count(class) {
            *count += 1;
        }
        if let (Class::Multiplexed(lane), Some(flight)) = (class, &mut self.flight) {
            flight.sent(lane);
        }
        self.pending.push_back(pending, voice);
        self.started += 1;
    }

    /// Commands started and replies handed out, ever (see [`crate::tracking::Gate`]).
    pub fn counts(&self) -> (u64, u64) {
        (self.started, self.answered)
    }

    /// Holds `step` back until the next barrier lifts.
    pub fn park(&mut self, step: Step, voice: Voice) {
        self.parked = Some((step, voice));
    }

    /// The step held back, to try again.
    pub fn unpark(&mut self) -> Option<(Step, Voice)> {
        self.parked.take()
    }

    pub fn is_parked(&self) -> bool {
        self.parked.is_some()
    }

    /// How many replies are owed.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The next reply owed, once it has arrived (as the client is to read it: nothing for a
    /// silenced one). A poll, for the session's hand-written wait (`sources.rs`); a reply is taken
    /// only when it is returned.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let Some((class, reply)) = std::task::ready!(self.pending.poll_next_unpin(cx)) else {
            return Poll::Ready(None);
        };
        self.settle(class);
        Poll::Ready(Some(reply))
    }

    /// The next reply owed if it has arrived already. Polling without a waker is safe: the caller
    /// polls [`Schedule::poll_next`] again when this says nothing.
    pub fn next_now(&mut self) -> Option<Bytes> {
        let (class, reply) = self.pending.next().now_or_never()??;
        self.settle(class);
        Some(reply)
    }

    /// Whether the oldest reply still owed comes with the last one handed out: both from the
    /// same multiplexed lane, sent together, so that Redis answers them together and writing the
    /// replies already here may wait for it (one write for a pipeline's replies, as Redis makes).
    /// Any other reply owed — from a borrowed connection (a blocking command), another lane, or
    /// work in place — may take as long as Redis likes: what is here is written without it.
    pub fn continues_run(&self) -> bool {
        match (self.run, self.pending.oldest()) {
            (Some(run), Some(Class::Multiplexed(lane))) => run == lane,
            _ => false,
        }
    }

    /// Ends the blocking command in flight with `reply` (`CLIENT UNBLOCK`); whether there was one.
    pub fn unblock(&mut self, reply: Bytes) -> bool {
        self.pending.answer_exclusive(reply)
    }

    /// Drops every reply owed (the client is gone).
    pub fn clear(&mut self) {
        let mut flight = self.flight.take();
        if let Some(flight) = &mut flight {
            flight.forget();
        }
        *self = Schedule {
            flight,
            ..Schedule::default()
        };
    }

    fn settle(&mut self, class: Class) {
        self.answered += 1;
        if let Some(count) = self.in_flight.count(class) {
            *count -= 1;
        }
        if let (Class::Multiplexed(lane), Some(flight)) = (class, &mut self.flight) {
            flight.answered(lane);
        }
        match class {
            Class::Multiplexed(lane) => self.run = Some(lane),
            Class::Exclusive | Class::InPlace => self.run = None,
            // The daemon's own replies are ready as soon as they are planned: between two of a
            // run's replies, they do not end it.
            Class::Local => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGULAR: Class = Class::Multiplexed(Multiplexed::Regular);
    const SCRIPT: Class = Class::Multiplexed(Multiplexed::Script);

    /// The next reply owed, awaited as the session's wait polls it.
    async fn next(schedule: &mut Schedule) -> Option<Bytes> {
        std::future::poll_fn(|cx| schedule.poll_next(cx)).await
    }

    fn reply(text: &'static str) -> Pending {
        Pending::Ready(Some((Class::Local, Bytes::from_static(text.as_bytes()))))
    }

    /// A reply owed for `class` that has arrived.
    fn arrived(class: Class, text: &'static str) -> Pending {
        Pending::Ready(Some((class, Bytes::from_static(text.as_bytes()))))
    }

    /// A reply that never arrives (only the count under its class matters to the barrier).
    fn owed() -> Pending {
        Pending::Exclusive(Box::pin(futures::future::pending::<Bytes>()))
    }

    #[test]
    fn an_empty_schedule_lets_anything_start() {
        let schedule = Schedule::default();
        for class in [
            Class::Local,
            REGULAR,
            SCRIPT,
            Class::Exclusive,
            Class::InPlace,
        ] {
            assert_eq!(schedule.turn(class), Turn::Go, "{class:?}");
        }
    }

    #[test]
    fn commands_for_the_same_multiplexed_lane_are_pipelined_without_waiting() {
        let mut schedule = Schedule::default();
        schedule.push(REGULAR, owed(), Voice::Heard);
        schedule.push(REGULAR, owed(), Voice::Heard);
        assert_eq!(schedule.turn(REGULAR), Turn::Go);
        assert_eq!(schedule.in_flight(REGULAR), 2);
    }

    #[test]
    fn a_command_for_another_lane_waits_for_a_barrier() {
        let mut schedule = Schedule::default();
        schedule.push(REGULAR, owed(), Voice::Heard);
        assert_eq!(schedule.turn(SCRIPT), Turn::Wait);
        assert_eq!(schedule.turn(Class::Exclusive), Turn::Wait);
        assert_eq!(schedule.turn(Class::InPlace), Turn::Wait);
    }

    #[test]
    fn an_exclusive_command_waits_even_for_another_exclusive_one() {
        let mut schedule = Schedule::default();
        schedule.push(Class::Exclusive, owed(), Voice::Heard);
        assert_eq!(schedule.turn(Class::Exclusive), Turn::Wait);
        assert_eq!(schedule.turn(REGULAR), Turn::Wait);
    }

    #[test]
    fn local_replies_hold_up_only_work_in_place() {
        let mut schedule = Schedule::default();
        schedule.push(Class::Local, reply("+PONG\r\n"), Voice::Heard);
        assert_eq!(schedule.turn(REGULAR), Turn::Go);
        assert_eq!(schedule.turn(Class::Exclusive), Turn::Go);
        assert_eq!(schedule.turn(Class::InPlace), Turn::Wait);
    }

    #[tokio::test]
    async fn replies_come_back_in_the_order_sent_and_a_silenced_one_as_nothing() {
        let mut schedule = Schedule::default();
        schedule.push(REGULAR, arrived(REGULAR, "$1\r\na\r\n"), Voice::Heard);
        schedule.push(Class::Local, reply("+OK\r\n"), Voice::Silent);
        schedule.push(REGULAR, arrived(REGULAR, "$1\r\nb\r\n"), Voice::Heard);
        assert_eq!(
            next(&mut schedule).await.as_deref(),
            Some(&b"$1\r\na\r\n"[..])
        );
        assert_eq!(next(&mut schedule).await.as_deref(), Some(&b""[..]));
        assert_eq!(schedule.next_now().as_deref(), Some(&b"$1\r\nb\r\n"[..]));
        assert_eq!(next(&mut schedule).await, None);
        assert!(schedule.is_empty());
    }

    #[tokio::test]
    async fn an_answered_reply_lifts_the_barrier_it_raised() {
        let mut schedule = Schedule::default();
        schedule.push(REGULAR, arrived(REGULAR, "+OK\r\n"), Voice::Heard);
        assert_eq!(schedule.turn(Class::Exclusive), Turn::Wait);
        next(&mut schedule).await;
        assert_eq!(schedule.in_flight(REGULAR), 0);
        assert_eq!(schedule.turn(Class::Exclusive), Turn::Go);
    }

    #[test]
    fn a_reply_that_has_not_arrived_is_not_taken_early() {
        let mut schedule = Schedule::default();
        schedule.push(Class::Exclusive, owed(), Voice::Heard);
        schedule.push(Class::Local, reply("+OK\r\n"), Voice::Heard);
        assert_eq!(schedule.next_now(), None);
        assert_eq!(schedule.len(), 2);
    }

    /// A reply owed on a multiplexed lane that never arrives.
    fn owed_on(lane: Multiplexed) -> Pending {
        Pending::Gathered(lane, Box::pin(futures::future::pending::<Bytes>()))
    }

    #[tokio::test]
    async fn a_run_on_one_lane_is_written_together_and_nothing_waits_for_a_blocking_command() {
        let mut schedule = Schedule::default();
        schedule.push(REGULAR, arrived(REGULAR, "+OK\r\n"), Voice::Heard);
        schedule.push(REGULAR, owed_on(Multiplexed::Regular), Voice::Heard);
        next(&mut schedule).await;
        // The next reply of the same run comes with it: the one here may wait for it.
        assert!(schedule.continues_run());
        let mut schedule = Schedule::default();
        schedule.push(REGULAR, arrived(REGULAR, "+OK\r\n"), Voice::Heard);
        schedule.push(Class::Exclusive, owed(), Voice::Heard);
        next(&mut schedule).await;
        // A blocking command may take as long as it likes: the reply is written without it.
        assert!(!schedule.continues_run());
        let mut schedule = Schedule::default();
        schedule.push(
            Class::Exclusive,
            arrived(Class::Exclusive, "*-1\r\n"),
            Voice::Heard,
        );
        schedule.push(REGULAR, owed_on(Multiplexed::Regular), Voice::Heard);
        next(&mut schedule).await;
        assert!(!schedule.continues_run());
        // Another lane's reply is not of the run either.
        let mut schedule = Schedule::default();
        schedule.push(REGULAR, arrived(REGULAR, "+OK\r\n"), Voice::Heard);
        schedule.push(SCRIPT, owed_on(Multiplexed::Script), Voice::Heard);
        next(&mut schedule).await;
        assert!(!schedule.continues_run());
        assert!(!Schedule::default().continues_run());
    }

    #[test]
    fn a_parked_step_is_given_back_once() {
        let mut schedule = Schedule::default();
        schedule.park(Step::Reply(Bytes::from_static(b"+OK\r\n")), Voice::Heard);
        assert!(schedule.is_parked());
        assert!(matches!(
            schedule.unpark(),
            Some((Step::Reply(_), Voice::Heard))
        ));
        assert!(schedule.unpark().is_none());
    }
}
