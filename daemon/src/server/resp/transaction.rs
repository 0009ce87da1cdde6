//! A session's transaction: WATCH and MULTI pin a TRANSACTION connection to the session; everything
//! until EXEC, DISCARD or an UNWATCH outside MULTI runs on it (the commands queued in MULTI
//! written without awaiting each `QUEUED`: [`Multi::ahead`]); then it goes back to the lane,
//! cleaned. Inside MULTI the daemon keeps what Redis cannot see: the replies of commands it answers
//! itself (spliced into EXEC's, see `queued.rs`) and whether a refused command must make EXEC fail.
//!
//! On a cluster the connection is pinned on the node of the transaction's slot: that of WATCH's
//! keys, or, after a MULTI with nothing watched, of the first queued command with keys. Until that
//! command, MULTI and the keyless commands queued after it are held here (answered as Redis
//! would) and sent, in order, once the node is known.

use std::time::Duration;

use bytes::Bytes;
use tollgate_lanes::{Borrowed, CallError, Lanes, Reply, Route, ScopeLogin, Shape};
use tollgate_model::{Exclusive, Tenant};
use tollgate_resp::Command;

use super::local::Protocol;
use super::plan::Pinned;
use super::queued::QueuedLocally;
use super::replies;
use super::slots::TransactionSlot;

/// What pinning borrows with.
pub struct Borrower<'a> {
    pub lanes: &'a Lanes,
    pub protocol: Protocol,
    /// Whose share of the lane the connection counts against.
    pub tenant: &'a Tenant,
    /// The scope user a key-confined principal's transaction runs as (see `scoped.rs`), when
    /// nothing is pinned yet; `None`: the lane's own user.
    pub scope: Option<ScopeLogin>,
}

/// The session's TRANSACTION connection, if it holds one.
#[derive(Default)]
pub enum Pinning {
    #[default]
    None,
    /// After WATCH, or a MULTI Redis refused: pinned, not queueing.
    Watching(Borrowed, Option<TransactionSlot>),
    /// On a cluster, after a MULTI with nothing pinned: held until a command names the slot.
    Opening(Opening),
    /// Between MULTI and EXEC or DISCARD.
    InMulti(Multi),
}

/// A cluster's MULTI before its slot is known: the keyless commands queued since, to send after
/// MULTI once the connection is pinned.
#[derive(Default)]
pub struct Opening {
    held: Vec<Command>,
    local: QueuedLocally,
    /// A command was refused while queueing: EXEC fails once the connection is pinned.
    aborted: bool,
}

pub struct Multi {
    conn: Borrowed,
    slot: Option<TransactionSlot>,
    queue: Queue,
    /// The queue's commands answered by the daemon, and where their replies go in EXEC's.
    local: QueuedLocally,
    /// What Redis answered, instead of `+QUEUED`, to the first command written ahead that it
    /// refused to queue (see [`Multi::ahead`]): what EXEC's EXECABORT names.
    refusal: Option<Bytes>,
}

/// Whether EXEC may run what was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Clean,
    /// A command was refused while queueing, so EXEC must fail as Redis fails it (EXECABORT).
    Aborted,
}

impl Pinning {
    pub fn pinned(&self) -> Pinned {
        match self {
            Pinning::None => Pinned::No,
            Pinning::Watching(..) => Pinned::Watching,
            Pinning::Opening(_) | Pinning::InMulti(_) => Pinned::InMulti,
        }
    }

    /// Whether a connection is pinned (`Opening` holds none yet).
    pub fn holds_connection(&self) -> bool {
        matches!(self, Pinning::Watching(..) | Pinning::InMulti(_))
    }

    /// The scope user the pinned connection is logged in as; `None`: the lane's, or none pinned.
    pub fn acting_as(&self) -> Option<&str> {
        match self {
            Pinning::Watching(conn, _) | Pinning::InMulti(Multi { conn, .. }) => conn.acting_as(),
            Pinning::None | Pinning::Opening(_) => None,
        }
    }

    /// The slot the transaction is pinned to, on a cluster, once it is.
    pub fn slot(&self) -> Option<&TransactionSlot> {
        match self {
            Pinning::Watching(_, slot) | Pinning::InMulti(Multi { slot, .. }) => slot.as_ref(),
            Pinning::None | Pinning::Opening(_) => None,
        }
    }

    /// How many commands MULTI has queued, as `CLIENT LIST` shows them.
    pub fn queued(&self) -> Option<usize> {
        match self {
            Pinning::InMulti(multi) => Some(multi.local.count()),
            Pinning::Opening(opening) => Some(opening.local.count()),
            Pinning::None | Pinning::Watching(..) => None,
        }
    }

    /// A command was refused: inside MULTI, EXEC will fail.
    pub fn refused(&mut self) {
        match self {
            Pinning::InMulti(multi) => multi.queue = Queue::Aborted,
            Pinning::Opening(opening) => opening.aborted = true,
            Pinning::None | Pinning::Watching(..) => {}
        }
    }

    /// Inside MULTI, a reply the daemon gave is queued as Redis would queue it: `+QUEUED` now,
    /// `reply` in EXEC's. Outside, `reply` as it is.
    pub fn queue_local(&mut self, reply: Bytes) -> Bytes {
        match self {
            Pinning::InMulti(multi) => {
                multi.local.queue(reply);
                replies::queued()
            }
            Pinning::Opening(opening) => {
                opening.local.queue(reply);
                replies::queued()
            }
            Pinning::None | Pinning::Watching(..) => reply,
        }
    }

    /// Gives the connection back to the lane, cleaned; the transaction, if any, is discarded.
    pub async fn release(&mut self) {
        match std::mem::take(self) {
            Pinning::None | Pinning::Opening(_) => {}
            Pinning::Watching(conn, _) | Pinning::InMulti(Multi { conn, .. }) => {
                conn.release().await
            }
        }
    }

    /// Runs `command` on the pinned connection (pinning one for WATCH and MULTI, within `on`'s
    /// tenant's share of the lane; on a cluster, on the node of `slot`, the slot of the command's keys) and
    /// returns its reply.
    pub async fn run(
        &mut self,
        command: &Command,
        on: Borrower<'_>,
        slot: Option<TransactionSlot>,
        deadline: Option<Duration>,
    ) -> Bytes {
        let is = |word: &[u8]| command.name().eq_ignore_ascii_case(word);
        if let Pinning::None = self {
            let cluster = matches!(on.lanes.shape(), Shape::Cluster(_));
            if is(b"MULTI") && cluster && slot.is_none() {
                *self = Pinning::Opening(Opening::default());
                return replies::ok();
            }
            if is(b"WATCH") || is(b"MULTI") {
                match pin(&on, slot.as_ref()).await {
                    Ok(conn) => *self = Pinning::Watching(conn, slot.clone()),
                    Err(reply) => return reply,
                }
            } else if is(b"EXEC") {
                return replies::without_multi("EXEC");
            } else if is(b"DISCARD") {
                return replies::without_multi("DISCARD");
            } else {
                // UNWATCH with nothing pinned, as Redis answers it.
                return replies::ok();
            }
        }
        if let Pinning::Opening(opening) = self {
            if is(b"DISCARD") {
                *self = Pinning::None;
                return replies::ok();
            }
            if slot.is_none() && !is(b"EXEC") {
                opening.held.push(command.clone());
                return replies::queued();
            }
            if let Err(reply) = self.open(&on, slot.as_ref(), deadline).await {
                return reply;
            }
        }
        if let Pinning::InMulti(multi) = self {
            if let Some(reply) = multi.ahead(command, &is, deadline).await {
                if reply.ends {
                    self.release().await;
                }
                if reply.failed {
                    // The connection is gone and the transaction with it (closed when dropped).
                    *self = Pinning::None;
                }
                return reply.bytes;
            }
        }
        let ends =
            is(b"EXEC") || is(b"DISCARD") || (is(b"UNWATCH") && self.pinned() != Pinned::InMulti);
        let sent = match self {
            Pinning::InMulti(Multi {
                conn,
                queue: Queue::Aborted,
                refusal,
                ..
            }) if is(b"EXEC") => {
                let _ = conn
                    .send(Bytes::from_static(b"*1\r\n$7\r\nDISCARD\r\n"))
                    .await;
                Ok(refusal
                    .as_deref()
                    .map_or_else(replies::exec_abort, replies::exec_abort_after))
            }
            Pinning::Watching(conn, _) | Pinning::InMulti(Multi { conn, .. }) => {
                match conn.send_within(command.encoded(), deadline).await {
                    Ok(reply) => {
                        let opened = is(b"MULTI") && !reply.is_error();
                        Ok(self.answered(reply.into_bytes(), opened, is(b"EXEC")))
                    }
                    Err(error) => Err(error),
                }
            }
            // Pinned above.
            Pinning::None | Pinning::Opening(_) => Ok(replies::ok()),
        };
        let reply = match sent {
            Ok(reply) => reply,
            Err(error) => {
                // The connection is gone and the transaction with it: dropped with a reply owed,
                // the lane closes it.
                *self = Pinning::None;
                return replies::call_failed(&error);
            }
        };
        if ends {
            self.release().await;
        }
        reply
    }

    /// A cluster's held MULTI, once a command names its slot (`None`: EXEC of keyless commands
    /// only, run on any master): pins the connection there, sends MULTI and the held commands.
    /// `Err`: the reply to give instead; the transaction is over.
    async fn open(
        &mut self,
        on: &Borrower<'_>,
        slot: Option<&TransactionSlot>,
        deadline: Option<Duration>,
    ) -> Result<(), Bytes> {
        let Pinning::Opening(opening) = std::mem::take(self) else {
            return Ok(());
        };
        let mut conn = pin(on, slot).await?;
        let multi = conn
            .send_within(Bytes::from_static(b"*1\r\n$5\r\nMULTI\r\n"), deadline)
            .await;
        match multi {
            Ok(reply) if !reply.is_error() => {}
            Ok(reply) => return Err(reply.into_bytes()),
            Err(error) => return Err(replies::call_failed(&error)),
        }
        let mut multi = Multi {
            conn,
            slot: slot.cloned(),
            queue: match opening.aborted {
                true => Queue::Aborted,
                false => Queue::Clean,
            },
            local: opening.local,
            refusal: None,
        };
        for held in opening.held {
            match multi.conn.send_within(held.encoded(), deadline).await {
                Ok(reply) if queued(reply.bytes()) => multi.local.queued_by_redis(),
                // The client was told QUEUED; Redis refused it, so EXEC fails, as Redis's would.
                Ok(_) => multi.queue = Queue::Aborted,
                Err(error) => return Err(replies::call_failed(&error)),
            }
        }
        *self = Pinning::InMulti(multi);
        Ok(())
    }

    /// Redis's `reply` to a command run on the pinned connection, as the client reads it.
    fn answered(&mut self, reply: Bytes, opened_multi: bool, exec: bool) -> Bytes {
        if opened_multi {
            *self = match std::mem::take(self) {
                Pinning::Watching(conn, slot) => Pinning::InMulti(Multi {
                    conn,
                    slot,
                    queue: Queue::Clean,
                    local: QueuedLocally::default(),
                    refusal: None,
                }),
                pinning => pinning,
            };
        }
        let Pinning::InMulti(multi) = self else {
            return reply;
        };
        if queued(&reply) {
            multi.local.queued_by_redis();
        }
        match exec {
            true => std::mem::take(&mut multi.local).splice(reply),
            false => reply,
        }
    }
}

/// Commands Redis refuses inside MULTI whatever its state (`no-multi` in Redis 7.0's command
/// table; MULTI and WATCH are checked apart): sent and awaited, so that the client hears Redis's
/// own refusal when it queues them, as it would from Redis.
const NOT_IN_MULTI: [&[u8]; 4] = [b"SAVE", b"SHUTDOWN", b"SYNC", b"PSYNC"];

/// Commands written ahead at most before their replies are collected.
const MOST_AHEAD: usize = 1024;

/// What [`Multi::ahead`] answered, and what becomes of the transaction.
struct Ahead {
    bytes: Bytes,
    /// The transaction is over (EXEC ran): the connection goes back to the lane.
    ends: bool,
    /// The connection failed: the transaction is over and the connection closed.
    failed: bool,
}

impl Multi {
    /// Queued commands are written without waiting for Redis's `+QUEUED`, which says only that
    /// Redis queued them, and the client is told `QUEUED` at once: a client pipelining MULTI, ten
    /// commands and EXEC waits two round trips to Redis, not twelve (through a 0.5 ms hop, 1.3 ms a
    /// transaction instead of 7.4, where Redis direct takes 0.6). EXEC of a clean queue is written the same way
    /// and collects every reply owed with its own. A command Redis refused to queue (out of
    /// memory, a replica, a busy script, an ACL refusal) made Redis discard the transaction, so
    /// EXEC fails as Redis's does, naming the first refusal; what a client sees differently from
    /// Redis direct is only where that error arrives (at EXEC, after `QUEUED`). Anything else
    /// (DISCARD, a nested MULTI or WATCH, EXEC of a queue the daemon refused a command of) first
    /// collects what is owed, then runs as before; so do the commands Redis never queues
    /// ([`NOT_IN_MULTI`]). `None`: run `command` as before.
    async fn ahead(
        &mut self,
        command: &Command,
        is: &impl Fn(&[u8]) -> bool,
        deadline: Option<Duration>,
    ) -> Option<Ahead> {
        let failed = |error: &CallError| Ahead {
            bytes: replies::call_failed(error),
            ends: false,
            failed: true,
        };
        let exec = is(b"EXEC");
        let synchronous = exec
            || [&b"DISCARD"[..], b"MULTI", b"WATCH"]
                .into_iter()
                .chain(NOT_IN_MULTI)
                .any(is);
        if !synchronous {
            // Bounded: past this many, what is owed is collected first, so that a transaction
            // of a million commands does not leave a million `QUEUED`s waiting in Redis's output
            // buffer (one more round trip per thousand commands).
            if self.conn.ahead() >= MOST_AHEAD {
                if let Err(error) = self.collect(deadline, false).await {
                    return Some(failed(&error));
                }
            }
            return Some(
                match self.conn.send_ahead(command.encoded(), deadline).await {
                    Ok(()) => {
                        self.local.queued_by_redis();
                        Ahead {
                            bytes: replies::queued(),
                            ends: false,
                            failed: false,
                        }
                    }
                    Err(error) => failed(&error),
                },
            );
        }
        let clean_exec = exec && self.queue == Queue::Clean;
        if clean_exec {
            if let Err(error) = self.conn.send_ahead(command.encoded(), deadline).await {
                return Some(failed(&error));
            }
        }
        if self.conn.ahead() == 0 {
            return None;
        }
        let exec_reply = match self.collect(deadline, clean_exec).await {
            Ok(exec_reply) => exec_reply?,
            Err(error) => return Some(failed(&error)),
        };
        let bytes = match &self.refusal {
            Some(refusal) if exec_reply.is_error() => replies::exec_abort_after(refusal),
            _ => std::mem::take(&mut self.local).splice(exec_reply.into_bytes()),
        };
        Some(Ahead {
            bytes,
            ends: true,
            failed: false,
        })
    }

    /// Reads every reply owed for commands written ahead; one that is not `+QUEUED` makes EXEC
    /// fail (the first is kept to name why). With `exec_last`, the last is EXEC's own: returned,
    /// not checked.
    async fn collect(
        &mut self,
        deadline: Option<Duration>,
        exec_last: bool,
    ) -> Result<Option<Reply>, CallError> {
        let mut refused = None;
        let mut last = None;
        self.conn
            .collect_ahead(deadline, |reply| {
                if let Some(reply_to_queue) = last.replace(reply) {
                    if refused.is_none() && !queued(reply_to_queue.bytes()) {
                        refused = Some(reply_to_queue);
                    }
                }
            })
            .await?;
        if !exec_last {
            refused = refused.or(last.take().filter(|reply| !queued(reply.bytes())));
        }
        if let Some(refused) = refused {
            self.queue = Queue::Aborted;
            self.refusal.get_or_insert_with(|| refused.into_bytes());
        }
        Ok(last)
    }
}

/// Whether `reply` is Redis's `+QUEUED`: the command was queued for EXEC.
fn queued(reply: &[u8]) -> bool {
    reply == b"+QUEUED\r\n"
}

/// A TRANSACTION connection on the node of `slot` (any master without one), logged in as the
/// borrower's scope user if it has one.
async fn pin(on: &Borrower<'_>, slot: Option<&TransactionSlot>) -> Result<Borrowed, Bytes> {
    let route = slot.map_or(Route::Any, |slot| Route::Slot(slot.slot()));
    let mut conn = on
        .lanes
        .borrow_at(route, Exclusive::Transaction, on.protocol, Some(on.tenant))
        .await
        .map_err(|error| replies::lane_failed(&error))?;
    if let Some(login) = &on.scope {
        conn.act_as(login)
            .await
            .map_err(|error| replies::call_failed(&error))?;
    }
    Ok(conn)
}
