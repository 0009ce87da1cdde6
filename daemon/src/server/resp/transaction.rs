//! A session's transaction: WATCH and MULTI pin a TRANSACTION connection to the session; everything
//! until EXEC, DISCARD or an UNWATCH outside MULTI runs on it; then it goes back to the lane,
//! cleaned. Inside MULTI the daemon keeps what Redis cannot see: the replies of commands it answers
//! itself (spliced into EXEC's, see `queued.rs`) and whether a refused command must make EXEC fail.

use std::time::Duration;

use bytes::Bytes;
use tollgate_lanes::{Borrowed, Lanes};
use tollgate_model::Exclusive;
use tollgate_resp::Command;

use super::local::Protocol;
use super::plan::Pinned;
use super::queued::QueuedLocally;
use super::replies;

/// The session's TRANSACTION connection, if it holds one.
#[derive(Default)]
pub enum Pinning {
    #[default]
    None,
    /// After WATCH, or a MULTI Redis refused: pinned, not queueing.
    Watching(Borrowed),
    /// Between MULTI and EXEC or DISCARD.
    InMulti(Multi),
}

pub struct Multi {
    conn: Borrowed,
    queue: Queue,
    /// The queue's commands answered by the daemon, and where their replies go in EXEC's.
    local: QueuedLocally,
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
            Pinning::Watching(_) => Pinned::Watching,
            Pinning::InMulti(_) => Pinned::InMulti,
        }
    }

    /// How many commands MULTI has queued, as `CLIENT LIST` shows them.
    pub fn queued(&self) -> Option<usize> {
        match self {
            Pinning::InMulti(multi) => Some(multi.local.count()),
            Pinning::None | Pinning::Watching(_) => None,
        }
    }

    /// A command was refused: inside MULTI, EXEC will fail.
    pub fn refused(&mut self) {
        if let Pinning::InMulti(multi) = self {
            multi.queue = Queue::Aborted;
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
            Pinning::None | Pinning::Watching(_) => reply,
        }
    }

    /// Gives the connection back to the lane, cleaned; the transaction, if any, is discarded.
    pub async fn release(&mut self) {
        match std::mem::take(self) {
            Pinning::None => {}
            Pinning::Watching(conn) | Pinning::InMulti(Multi { conn, .. }) => conn.release().await,
        }
    }

    /// Runs `command` on the pinned connection (pinning one for WATCH and MULTI, `principal`'s
    /// share of the lane) and returns its reply.
    pub async fn run(
        &mut self,
        command: &Command,
        lanes: &Lanes,
        protocol: Protocol,
        principal: &str,
        deadline: Option<Duration>,
    ) -> Bytes {
        let is = |word: &[u8]| command.name().eq_ignore_ascii_case(word);
        if let Pinning::None = self {
            if is(b"WATCH") || is(b"MULTI") {
                match lanes
                    .borrow_for(Exclusive::Transaction, protocol, principal)
                    .await
                {
                    Ok(conn) => *self = Pinning::Watching(conn),
                    Err(error) => return replies::lane_failed(&error),
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
        let ends =
            is(b"EXEC") || is(b"DISCARD") || (is(b"UNWATCH") && self.pinned() != Pinned::InMulti);
        let sent = match self {
            Pinning::InMulti(Multi {
                conn,
                queue: Queue::Aborted,
                ..
            }) if is(b"EXEC") => {
                let _ = conn
                    .send(Bytes::from_static(b"*1\r\n$7\r\nDISCARD\r\n"))
                    .await;
                Ok(replies::exec_abort())
            }
            Pinning::Watching(conn) | Pinning::InMulti(Multi { conn, .. }) => {
                match conn.send_within(command.encoded(), deadline).await {
                    Ok(reply) => {
                        let opened = is(b"MULTI") && !reply.is_error();
                        Ok(self.answered(reply.into_bytes(), opened, is(b"EXEC")))
                    }
                    Err(error) => Err(error),
                }
            }
            // Pinned above.
            Pinning::None => Ok(replies::ok()),
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

    /// Redis's `reply` to a command run on the pinned connection, as the client reads it.
    fn answered(&mut self, reply: Bytes, opened_multi: bool, exec: bool) -> Bytes {
        if opened_multi {
            *self = match std::mem::take(self) {
                Pinning::Watching(conn) => Pinning::InMulti(Multi {
                    conn,
                    queue: Queue::Clean,
                    local: QueuedLocally::default(),
                }),
                pinning => pinning,
            };
        }
        let Pinning::InMulti(multi) = self else {
            return reply;
        };
        if reply[..] == b"+QUEUED\r\n"[..] {
            multi.local.queued_by_redis();
        }
        match exec {
            true => std::mem::take(&mut multi.local).splice(reply),
            false => reply,
        }
    }
}
