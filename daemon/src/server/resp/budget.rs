//! The bytes the daemon holds for each RESP client, against `resp.budgets`: its replies from the
//! moment a lane cuts them from Redis's stream (or an exclusive connection hands them over) until
//! they are written to its socket, and its input until it makes whole commands. Each byte is
//! counted once, by whoever holds it: the lane while a reply waits for its session ([`Held`]), then
//! the session's write buffer ([`ClientBudget::sync`]).
//!
//! Past its hard limit, or over its soft limit for longer than allowed, a client is *breached*: the
//! session disconnects it with an error and a log line naming the limit ([`ClientBudget::breached`]),
//! and everything still arriving for it is dropped. Before that, reading from it pauses
//! ([`ClientBudget::room`]): while its replies reach its soft limit (half its hard one without a
//! soft one), and, once it holds more than [`ALWAYS_READ`] of input, while all clients together are
//! at `total` or its tenant's clients at their share of it (`per_uid`, see [`super::pool`]). A
//! client may always hold [`ALWAYS_READ`] of input, so that ordinary commands keep flowing while
//! big uploads wait.
//!
//! [`Held`]: tollgate_lanes::Held

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tollgate_lanes::{Budget, OverBudget};
use tollgate_model::Caller;

use super::pool::{Account, Over, Pool, LEAST_READ};
use crate::config::{BudgetsConfig, ClassBudgets, Limit};

/// Input a client may hold whatever the total: one ordinary command or a few pipelined ones.
pub const ALWAYS_READ: usize = 64 * 1024;
/// A buffer with more spare capacity than this is given back once empty, so that one big reply or
/// command does not keep its memory for the rest of the connection.
const KEEP_CAPACITY: usize = 1024 * 1024;

/// Which of a client's two kinds of held bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Replies and messages not yet written to the client.
    Output,
    /// Input not yet parsed into commands.
    Input,
}

/// Which limit a client broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    Hard,
    /// Over the soft limit for longer than its `soft_for`.
    Soft(Duration),
    /// All clients together would have gone past `resp.budgets.total`.
    Total,
    /// The clients of this client's tenant (its principal and OS user) would have gone past
    /// `resp.budgets.per_uid`.
    Share,
}

/// Why a client is disconnected: which of its bytes, which limit (as its key in `tollgate.yaml`),
/// how many bytes it held and what the limit allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    pub direction: Direction,
    pub broken: Broken,
    /// The limit's key, e.g. `resp.budgets.normal.output.hard`.
    pub limit: String,
    pub held: usize,
    pub allowed: usize,
}

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.direction {
            Direction::Output => "replies held for this client",
            Direction::Input => "unparsed input from this client",
        };
        match self.broken {
            Broken::Hard => write!(
                f,
                "{what} ({} bytes) over {} ({} bytes)",
                self.held, self.limit, self.allowed
            ),
            Broken::Soft(after) => write!(
                f,
                "{what} ({} bytes) over {} ({} bytes) for longer than {after:?}",
                self.held, self.limit, self.allowed
            ),
            Broken::Total => write!(
                f,
                "{what} would take all clients' held bytes to {} bytes, over {} ({} bytes)",
                self.held, self.limit, self.allowed
            ),
            Broken::Share => write!(
                f,
                "{what} would take this user's clients' held bytes to {} bytes, over {} ({} bytes)",
                self.held, self.limit, self.allowed
            ),
        }
    }
}

/// Whether a session may read from its client now, and how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Read at most this many bytes.
    Read(usize),
    /// Not now: the client's replies are at its pause point (or it is breached). Taking or writing
    /// replies is what changes that, so the session needs no other wake-up.
    Paused,
    /// Not until all clients together, or this client's tenant, give back some bytes
    /// ([`ClientBudget::pool_room`]).
    PoolFull,
}

impl Room {
    /// How many bytes a read may take now; 0 when the session must not read.
    pub fn bytes(self) -> usize {
        match self {
            Room::Read(bytes) => bytes,
            Room::Paused | Room::PoolFull => 0,
        }
    }
}

/// One client's held bytes and limits; shared with the lanes, which count replies and messages
/// against it as [`Budget`].
pub struct ClientBudget {
    /// Named in the log line of a breach.
    client: u64,
    principal: String,
    uid: u32,
    normal: ClassBudgets,
    pubsub: ClassBudgets,
    /// The total and this client's tenant's share of it.
    pool: Account,
    subscribed: AtomicBool,
    /// Replies held: by lanes for this client, plus `buffered`.
    output: AtomicUsize,
    /// The session's write buffer as last synced.
    buffered: AtomicUsize,
    input: AtomicUsize,
    born: Instant,
    /// Since when (milliseconds after `born`, plus one) each direction has been over its soft
    /// limit; 0 while under it.
    output_soft_since: AtomicU64,
    input_soft_since: AtomicU64,
    breach: Mutex<Option<Breach>>,
    /// Set with `breach`, for the questions asked per read and per reply without a lock.
    breached: AtomicBool,
    /// A breach, or a direction going over its soft limit (a deadline to watch). Every waiter is
    /// woken (the session's loop and a write in progress both wait); each registers before it
    /// looks at the state, so no change is missed.
    changed: Notify,
}

impl ClientBudget {
    pub fn new(
        config: &BudgetsConfig,
        pool: &Arc<Pool>,
        caller: &Caller,
        client: u64,
    ) -> Arc<ClientBudget> {
        Arc::new(ClientBudget {
            client,
            principal: caller.principal.clone(),
            uid: caller.uid,
            normal: config.normal,
            pubsub: config.pubsub,
            pool: pool.account(caller.tenant()),
            subscribed: AtomicBool::new(false),
            output: AtomicUsize::new(0),
            buffered: AtomicUsize::new(0),
            input: AtomicUsize::new(0),
            born: Instant::now(),
            output_soft_since: AtomicU64::new(0),
            input_soft_since: AtomicU64::new(0),
            breach: Mutex::new(None),
            breached: AtomicBool::new(false),
            changed: Notify::new(),
        })
    }

    /// Records what the session itself holds: its write buffer, its unparsed input, and whether
    /// the client is subscribed (which class of limits applies). Growth past a hard limit breaches.
    pub fn sync(&self, buffered: usize, input: usize, subscribed: bool) {
        if self.subscribed.load(Ordering::Relaxed) != subscribed {
            self.subscribed.store(subscribed, Ordering::Relaxed);
        }
        self.buffered(buffered);
        // Only the session writes `buffered` and `input`; unchanged (the common case, asked on
        // every turn of its loop), the total shared by all sessions is not touched.
        let before = self.input.load(Ordering::Relaxed);
        if input == before {
            return;
        }
        self.input.store(input, Ordering::Relaxed);
        if input > before {
            self.pool.add(input - before);
        } else {
            self.pool.give_back(before - input);
        }
        self.track_soft(Direction::Input, input);
    }

    /// Records the session's write buffer alone (around a write that may wait for the client).
    pub fn buffered(&self, buffered: usize) {
        let before = self.buffered.load(Ordering::Relaxed);
        if buffered == before {
            return;
        }
        self.buffered.store(buffered, Ordering::Relaxed);
        if buffered > before {
            let grew = buffered - before;
            // Already in memory: only the client's own limits apply (the total refuses replies
            // as lanes hold them, and input as it is read).
            self.pool.add(grew);
            let held = self.output.fetch_add(grew, Ordering::AcqRel) + grew;
            self.check_growth(Direction::Output, held, None);
        } else {
            self.give_back_output(before - buffered);
        }
    }

    /// How much the session may read now, given `input` bytes already unparsed.
    pub fn room(&self, input: usize) -> Room {
        if self.is_breached() {
            return Room::Paused;
        }
        let limits = self.limits();
        let output = self.output.load(Ordering::Acquire);
        let pause_at = match limits.output {
            Limit { soft, .. } if soft.0 > 0 => soft.0,
            Limit { hard, .. } => hard.0 / 2,
        };
        if pause_at > 0 && output >= pause_at {
            return Room::Paused;
        }
        let mut room = usize::MAX;
        if limits.input.hard.0 > 0 {
            if input >= limits.input.hard.0 {
                // A command that cannot fit: nothing will ever parse it.
                self.breach(Breach {
                    direction: Direction::Input,
                    broken: Broken::Hard,
                    limit: self.key(Direction::Input, "hard"),
                    held: input,
                    allowed: limits.input.hard.0,
                });
                return Room::Paused;
            }
            room = limits.input.hard.0 - input;
        }
        if self.pool.limited() {
            let free = self.pool.free();
            if input < ALWAYS_READ {
                room = room.min((ALWAYS_READ - input).max(free));
            } else if free < LEAST_READ {
                return Room::PoolFull;
            } else {
                room = room.min(free);
            }
        }
        Room::Read(room)
    }

    /// Resolves once there is room for a read under the total and this client's tenant's share
    /// (after [`Room::PoolFull`]).
    pub async fn pool_room(&self) {
        self.pool.room().await
    }

    /// Resolves with the breach that ends this client: a hard limit broken (by the session or a
    /// lane), or a soft one held past its `soft_for`.
    pub async fn breached(self: Arc<Self>) -> Breach {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(breach) = self.breach.lock().clone() {
                return breach;
            }
            match self.soft_deadline() {
                Some(deadline) => tokio::select! {
                    () = &mut changed => {}
                    () = tokio::time::sleep_until(deadline) => self.check_soft(),
                },
                None => changed.await,
            }
        }
    }

    fn limits(&self) -> &ClassBudgets {
        if self.subscribed.load(Ordering::Relaxed) {
            &self.pubsub
        } else {
            &self.normal
        }
    }

    /// `resp.budgets.<class>.<direction>.<which>`
    fn key(&self, direction: Direction, which: &str) -> String {
        let class = if self.subscribed.load(Ordering::Relaxed) {
            "pubsub"
        } else {
            "normal"
        };
        let direction = match direction {
            Direction::Output => "output",
            Direction::Input => "input",
        };
        format!("resp.budgets.{class}.{direction}.{which}")
    }

    fn breach(&self, breach: Breach) {
        let mut slot = self.breach.lock();
        if slot.is_none() {
            tracing::warn!(
                client = self.client,
                principal = %self.principal,
                uid = self.uid,
                limit = %breach.limit,
                "disconnecting a RESP client over its budget: {breach}"
            );
            *slot = Some(breach);
            self.breached.store(true, Ordering::Release);
            self.changed.notify_waiters();
        }
    }

    fn is_breached(&self) -> bool {
        self.breached.load(Ordering::Acquire)
    }

    fn breach_reason(&self) -> Option<String> {
        self.breach.lock().as_ref().map(|breach| breach.to_string())
    }

    /// After output grew to `held`, or a take was refused `over` the total or the share: breaches
    /// a hard limit, the total or the share.
    fn check_growth(&self, direction: Direction, held: usize, over: Option<Over>) {
        let limits = self.limits();
        let limit = match direction {
            Direction::Output => limits.output,
            Direction::Input => limits.input,
        };
        if limit.hard.0 > 0 && held > limit.hard.0 {
            self.breach(Breach {
                direction,
                broken: Broken::Hard,
                limit: self.key(direction, "hard"),
                held,
                allowed: limit.hard.0,
            });
        } else if let Some(over) = over {
            let (broken, limit, held, allowed) = match over {
                Over::Total { held, allowed } => (Broken::Total, "total", held, allowed),
                Over::Share { held, allowed } => (Broken::Share, "per_uid", held, allowed),
            };
            self.breach(Breach {
                direction,
                broken,
                limit: format!("resp.budgets.{limit}"),
                held,
                allowed,
            });
        }
        self.track_soft(direction, held);
    }

    fn give_back_output(&self, bytes: usize) {
        let held = self.output.fetch_sub(bytes, Ordering::AcqRel) - bytes;
        self.pool.give_back(bytes);
        self.track_soft(Direction::Output, held);
    }

    fn soft_since(&self, direction: Direction) -> &AtomicU64 {
        match direction {
            Direction::Output => &self.output_soft_since,
            Direction::Input => &self.input_soft_since,
        }
    }

    fn soft_limit(&self, direction: Direction) -> Limit {
        match direction {
            Direction::Output => self.limits().output,
            Direction::Input => self.limits().input,
        }
    }

    /// Notes when `direction` went over its soft limit (or back under it), and breaches it when it
    /// has been over for too long.
    fn track_soft(&self, direction: Direction, held: usize) {
        let limit = self.soft_limit(direction);
        let since = self.soft_since(direction);
        if limit.soft.0 > 0 && held > limit.soft.0 {
            if since.load(Ordering::Relaxed) == 0 {
                let now = self.born.elapsed().as_millis() as u64 + 1;
                if since
                    .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    self.changed.notify_waiters();
                }
            } else {
                self.check_soft();
            }
        } else if since.load(Ordering::Relaxed) != 0 {
            since.store(0, Ordering::Release);
        }
    }

    /// The earliest moment a direction now over its soft limit has been over it for too long.
    fn soft_deadline(&self) -> Option<Instant> {
        [Direction::Output, Direction::Input]
            .into_iter()
            .filter_map(|direction| {
                let since = self.soft_since(direction).load(Ordering::Acquire);
                (since > 0).then(|| {
                    self.born
                        + Duration::from_millis(since - 1)
                        + self.soft_limit(direction).soft_for
                })
            })
            .min()
    }

    fn check_soft(&self) {
        for direction in [Direction::Output, Direction::Input] {
            let since = self.soft_since(direction).load(Ordering::Acquire);
            let limit = self.soft_limit(direction);
            if since == 0 || limit.soft.0 == 0 {
                continue;
            }
            let over_for = self
                .born
                .elapsed()
                .saturating_sub(Duration::from_millis(since - 1));
            if over_for >= limit.soft_for {
                let held = match direction {
                    Direction::Output => self.output.load(Ordering::Acquire),
                    Direction::Input => self.input.load(Ordering::Acquire),
                };
                self.breach(Breach {
                    direction,
                    broken: Broken::Soft(limit.soft_for),
                    limit: self.key(direction, "soft"),
                    held,
                    allowed: limit.soft.0,
                });
            }
        }
    }
}

/// The lanes' side: replies and messages held for this client until its session takes them.
impl Budget for ClientBudget {
    fn hold(&self, bytes: usize) -> Result<(), OverBudget> {
        if self.is_breached() {
            let reason = self.breach_reason().unwrap_or_default();
            return Err(OverBudget(format!(
                "the client is being disconnected: {reason}"
            )));
        }
        let hard = self.limits().output.hard.0;
        let held = self.output.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if hard > 0 && held > hard {
            self.output.fetch_sub(bytes, Ordering::AcqRel);
            self.check_growth(Direction::Output, held, None);
            return Err(OverBudget(self.breach_reason().unwrap_or_default()));
        }
        // Small replies are always held, as small input is always read: a full total holds up
        // big transfers, never ordinary commands.
        if held <= ALWAYS_READ {
            self.pool.add(bytes);
        } else if let Err(over) = self.pool.take(bytes) {
            self.output.fetch_sub(bytes, Ordering::AcqRel);
            self.check_growth(Direction::Output, 0, Some(over));
            return Err(OverBudget(self.breach_reason().unwrap_or_default()));
        }
        self.track_soft(Direction::Output, held);
        Ok(())
    }

    fn release(&self, bytes: usize) {
        self.give_back_output(bytes);
    }
}

impl Drop for ClientBudget {
    /// What the session still counted (its buffers die with it) leaves the total; what lanes hold
    /// keeps an `Arc` on this budget, so by now nothing else is left.
    fn drop(&mut self) {
        let left = *self.output.get_mut() + *self.input.get_mut();
        if left > 0 {
            self.pool.give_back(left);
        }
    }
}

/// Gives back an empty buffer's memory when one big reply or command left it large.
pub fn trim(buffer: &mut BytesMut, fresh: usize) {
    if buffer.is_empty() && buffer.capacity() > KEEP_CAPACITY {
        *buffer = BytesMut::with_capacity(fresh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ByteSize;

    fn config(total: usize, output: Limit, input: Limit) -> BudgetsConfig {
        let class = ClassBudgets { output, input };
        BudgetsConfig {
            total: ByteSize(total),
            per_uid: Some(ByteSize(0)),
            normal: class,
            pubsub: ClassBudgets {
                output: Limit {
                    hard: ByteSize(output.hard.0 / 2),
                    ..output
                },
                input,
            },
        }
    }

    fn limit(hard: usize, soft: usize, soft_for: Duration) -> Limit {
        Limit {
            hard: ByteSize(hard),
            soft: ByteSize(soft),
            soft_for,
        }
    }

    const NEVER: Duration = Duration::from_secs(3600);

    fn client(config: &BudgetsConfig, pool: &Arc<Pool>) -> Arc<ClientBudget> {
        client_of(config, pool, 1000)
    }

    fn client_of(config: &BudgetsConfig, pool: &Arc<Pool>, uid: u32) -> Arc<ClientBudget> {
        let caller = Caller {
            principal: "app".to_owned(),
            uid,
            gid: uid,
            pid: 1,
        };
        ClientBudget::new(config, pool, &caller, 7)
    }

    fn budget(config: &BudgetsConfig) -> (Arc<Pool>, Arc<ClientBudget>) {
        let pool = Pool::new(config);
        (pool.clone(), client(config, &pool))
    }

    #[test]
    fn a_reply_past_the_hard_limit_is_refused_and_breaches_the_client() {
        let config = config(0, limit(100, 0, NEVER), limit(0, 0, NEVER));
        let (pool, client) = budget(&config);
        client.hold(60).unwrap();
        let refused = client.hold(41).unwrap_err();
        assert!(
            refused
                .0
                .contains("(101 bytes) over resp.budgets.normal.output.hard (100 bytes)"),
            "{refused}"
        );
        // Nothing more is held for a client on its way out, however small.
        assert!(client.hold(1).is_err());
        assert_eq!(pool.used(), 60);
        client.release(60);
        assert_eq!(pool.used(), 0);
    }

    #[tokio::test]
    async fn the_breach_is_reported_to_the_session() {
        let config = config(0, limit(100, 0, NEVER), limit(0, 0, NEVER));
        let (_, client) = budget(&config);
        let breached = tokio::spawn(client.clone().breached());
        tokio::task::yield_now().await;
        client.sync(150, 0, false);
        let breach = breached.await.unwrap();
        assert_eq!(
            (breach.direction, breach.broken, breach.held, breach.allowed),
            (Direction::Output, Broken::Hard, 150, 100)
        );
        assert_eq!(breach.limit, "resp.budgets.normal.output.hard");
    }

    #[test]
    fn subscribed_clients_have_their_own_limits() {
        let config = config(0, limit(100, 0, NEVER), limit(0, 0, NEVER));
        let (_, client) = budget(&config);
        client.sync(0, 0, true);
        let refused = client.hold(60).unwrap_err();
        assert!(
            refused
                .0
                .contains("over resp.budgets.pubsub.output.hard (50 bytes)"),
            "{refused}"
        );
    }

    #[test]
    fn the_total_refuses_one_client_s_reply_when_others_hold_the_rest() {
        let total = 4 * ALWAYS_READ;
        let config = config(total, limit(0, 0, NEVER), limit(0, 0, NEVER));
        let pool = Pool::new(&config);
        let first = client(&config, &pool);
        let second = client(&config, &pool);
        first.hold(total - 10).unwrap();
        // A small reply is held all the same (ordinary commands go on while the total is full).
        second.hold(100).unwrap();
        let refused = second.hold(ALWAYS_READ).unwrap_err();
        let expected = format!(
            "to {} bytes, over resp.budgets.total ({total} bytes)",
            total + 90 + ALWAYS_READ
        );
        assert!(refused.0.contains(&expected), "{refused}");
        second.release(100);
        assert!(first.hold(10).is_ok(), "the first client is not breached");
        drop(first);
        assert_eq!(pool.used(), 0, "a client's bytes leave the total with it");
    }

    #[test]
    fn one_user_at_its_share_is_paused_and_refused_alone() {
        let mut config = config(16 * ALWAYS_READ, limit(0, 0, NEVER), limit(0, 0, NEVER));
        config.per_uid = Some(ByteSize(4 * ALWAYS_READ));
        let pool = Pool::new(&config);
        let attacker = client_of(&config, &pool, 2002);
        let attackers_second = client_of(&config, &pool, 2002);
        let victim = client_of(&config, &pool, 2001);
        attacker.sync(0, 4 * ALWAYS_READ, false);
        // The attacker's big input waits, on any of its connections; small input still flows.
        assert_eq!(attacker.room(4 * ALWAYS_READ), Room::PoolFull);
        assert_eq!(attackers_second.room(ALWAYS_READ), Room::PoolFull);
        assert_eq!(attackers_second.room(100), Room::Read(ALWAYS_READ - 100));
        // The other user reads up to its own share, and its big reply is held.
        assert_eq!(victim.room(ALWAYS_READ), Room::Read(4 * ALWAYS_READ));
        victim.hold(2 * ALWAYS_READ).unwrap();
        // The attacker's own big reply is what is refused, naming the share.
        let refused = attackers_second.hold(2 * ALWAYS_READ).unwrap_err();
        assert!(
            refused.0.contains(&format!(
                "this user's clients' held bytes to {} bytes, over resp.budgets.per_uid ({} bytes)",
                6 * ALWAYS_READ,
                4 * ALWAYS_READ
            )),
            "{refused}"
        );
        assert!(victim.hold(10).is_ok(), "the victim is not breached");
        assert!(attacker.hold(10).is_ok(), "nor the attacker's other client");
    }

    #[test]
    fn reading_pauses_at_the_soft_limit_and_the_input_limit_breaches() {
        let config = config(0, limit(1000, 100, NEVER), limit(200, 0, NEVER));
        let (_, client) = budget(&config);
        assert_eq!(client.room(50), Room::Read(150));
        client.hold(100).unwrap();
        assert_eq!(client.room(0), Room::Paused, "replies at the soft limit");
        client.release(1);
        assert_eq!(client.room(0), Room::Read(200));
        assert_eq!(client.room(200), Room::Paused);
        let breach = client.breach.lock().clone().expect("breached");
        assert_eq!(
            (breach.direction, breach.broken, breach.limit.as_str()),
            (
                Direction::Input,
                Broken::Hard,
                "resp.budgets.normal.input.hard"
            )
        );
    }

    #[test]
    fn without_a_soft_limit_reading_pauses_at_half_the_hard_one() {
        let config = config(0, limit(100, 0, NEVER), limit(0, 0, NEVER));
        let (_, client) = budget(&config);
        client.hold(49).unwrap();
        assert_eq!(client.room(0), Room::Read(usize::MAX));
        client.hold(1).unwrap();
        assert_eq!(client.room(0), Room::Paused);
    }

    #[test]
    fn a_full_total_pauses_big_inputs_but_not_small_ones() {
        let config = config(4 * ALWAYS_READ, limit(0, 0, NEVER), limit(0, 0, NEVER));
        let pool = Pool::new(&config);
        let big = client(&config, &pool);
        let small = client(&config, &pool);
        big.sync(0, 4 * ALWAYS_READ, false);
        assert_eq!(big.room(4 * ALWAYS_READ), Room::PoolFull);
        assert_eq!(small.room(100), Room::Read(ALWAYS_READ - 100));
        big.sync(0, ALWAYS_READ, false);
        assert_eq!(big.room(ALWAYS_READ), Room::Read(3 * ALWAYS_READ));
    }

    #[tokio::test]
    async fn over_the_soft_limit_for_longer_than_allowed_breaches_and_dipping_under_resets() {
        let soft_for = Duration::from_millis(50);
        let config = config(0, limit(1000, 100, soft_for), limit(0, 0, NEVER));
        let (_, client) = budget(&config);
        let breached = tokio::spawn(client.clone().breached());
        client.hold(150).unwrap();
        let first = client.soft_deadline().expect("over the soft limit");
        tokio::time::sleep(Duration::from_millis(5)).await;
        client.release(100);
        assert_eq!(client.soft_deadline(), None, "under it again");
        client.hold(100).unwrap();
        let second = client.soft_deadline().expect("over it again");
        assert!(second > first, "the time over the limit starts again");
        let breach = breached.await.unwrap();
        assert_eq!(breach.broken, Broken::Soft(soft_for));
        assert_eq!(breach.limit, "resp.budgets.normal.output.soft");
        assert_eq!(breach.held, 150);
    }

    #[test]
    fn the_session_s_buffers_count_once_and_leave_with_it() {
        let config = config(0, limit(0, 0, NEVER), limit(0, 0, NEVER));
        let (pool, client) = budget(&config);
        client.hold(10).unwrap();
        // The session takes the reply (the lane's hold ends) and buffers it.
        client.release(10);
        client.sync(10, 500, false);
        assert_eq!(pool.used(), 510);
        client.sync(0, 20, false);
        assert_eq!(pool.used(), 20);
        client.sync(7, 20, false);
        drop(client);
        assert_eq!(pool.used(), 0);
    }
}
