//! The replies the daemon itself writes — every error it answers with built here, so that each
//! cause reads the same everywhere.

use bytes::{BufMut, Bytes, BytesMut};
use tollgate_lanes::{CallError, LaneError};
use tollgate_model::Protocol;
use tollgate_policy::{Denial, DenyCause};
use tollgate_resp::{Command, Frame, ProtocolError};

use super::databases;
use super::refusal::Refusal;
use crate::quotas::Throttled;

/// The error a command refused before it runs is answered with.
pub fn refused(refusal: &Refusal, command: &Command) -> Bytes {
    let name = || String::from_utf8_lossy(command.name());
    match refusal {
        // Redis's own text while only subscribed; watching adds the watch commands.
        Refusal::WhileSubscribed => error(format!(
            "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context",
            name().to_lowercase()
        )),
        Refusal::WhileWatching => error(format!(
            "ERR Can't execute '{}': only LEASE WATCH / LEASE UNWATCH / (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context",
            name().to_lowercase()
        )),
        Refusal::LeaseInTransaction => {
            error("ERR tollgate: LEASE cannot be used inside WATCH or MULTI".to_owned())
        }
        Refusal::WrongArity(name) => wrong_arity(name),
        Refusal::Denied(denial) => denied(&command.argv(), denial),
        Refusal::WholeInTransaction => error(format!(
            "ERR tollgate: {} cannot run inside a transaction: it is served key by key, over the keys this client may touch",
            name().to_uppercase()
        )),
        Refusal::OtherDatabase(db) => error(databases::refusal(&name().to_uppercase(), db.as_bytes())),
        Refusal::InfoInTransaction => error(
            "ERR tollgate: INFO cannot run inside a transaction for this client: its server-wide \
             counts are left out of its reply, which a transaction's reply is not edited for"
                .to_owned(),
        ),
        Refusal::CrossSlot(cross) => error(cross.message()),
        Refusal::Throttled(throttled) => self::throttled(throttled),
    }
}

/// `-THROTTLED tollgate: quota acme-rate: over 2000 commands/s; retry in 12 ms`: its own error
/// code, so a client can tell "wait and retry" from "never" (`-NOPERM`).
pub fn throttled(throttled: &Throttled) -> Bytes {
    error(format!("THROTTLED tollgate: {throttled}"))
}

/// `-ERR wrong number of arguments for '<command>' command`, Redis's text.
pub fn wrong_arity(command: &str) -> Bytes {
    error(format!(
        "ERR wrong number of arguments for '{command}' command"
    ))
}

/// Unreadable input, answered before the connection closes.
pub fn protocol_error(error: &ProtocolError) -> Bytes {
    self::error(format!("ERR {error}"))
}

/// `EXEC` or `DISCARD` (`command`) with no transaction, as Redis answers it.
pub fn without_multi(command: &str) -> Bytes {
    error(format!("ERR {command} without MULTI"))
}

/// `EXEC` of a transaction a queued command was refused in.
pub fn exec_abort() -> Bytes {
    error("EXECABORT Transaction discarded because of previous errors.".to_owned())
}

/// `EXEC` of a transaction Redis refused to queue a command of (`refusal`, its error reply), the
/// client having been told `QUEUED` (see `transaction.rs`): Redis's own EXECABORT, naming why.
pub fn exec_abort_after(refusal: &[u8]) -> Bytes {
    let why = refusal
        .strip_prefix(b"-")
        .and_then(|text| text.strip_suffix(b"\r\n"))
        .map(String::from_utf8_lossy);
    match why {
        Some(why) => error(format!(
            "EXECABORT Transaction discarded because of previous errors: {why}"
        )),
        None => exec_abort(),
    }
}

pub fn queued() -> Bytes {
    Bytes::from_static(b"+QUEUED\r\n")
}

/// A `SUBSCRIBE` of `fresh` new names past `resp.max_subscriptions`.
pub fn too_many_subscriptions(fresh: usize, cap: usize) -> Bytes {
    error(format!(
        "ERR tollgate: {fresh} more subscriptions would take this client past resp.max_subscriptions ({cap}); none were made"
    ))
}

/// A `SUBSCRIBE` of `fresh` new names past `resp.max_subscriptions_per_uid`.
pub fn too_many_user_subscriptions(fresh: usize, cap: usize) -> Bytes {
    error(format!(
        "ERR tollgate: {fresh} more subscriptions would take this user's clients past resp.max_subscriptions_per_uid ({cap}); none were made"
    ))
}

/// `SELECT` of a database other than 0.
pub fn other_database(db: &[u8]) -> Bytes {
    error(databases::refusal("SELECT", db))
}

pub fn invalid_client_name() -> Bytes {
    error("ERR Client names cannot contain spaces, newlines or special characters.".to_owned())
}

/// A `CLIENT` subcommand (`sub`) that sets state on the connection it runs on.
pub fn unshareable(sub: &[u8]) -> Bytes {
    error(format!(
        "ERR tollgate: CLIENT {} is not available: connections to Redis are shared between clients",
        String::from_utf8_lossy(sub).to_uppercase()
    ))
}

/// A cluster client's `ASKING`/`READONLY`/`READWRITE`, answered as by a standalone server: the
/// daemon shows clients one server, whatever is behind it.
pub fn cluster_disabled() -> Bytes {
    Bytes::from_static(b"-ERR This instance has cluster support disabled\r\n")
}

/// The old form of `CLIENT KILL addr` when no session matched.
pub fn no_such_client() -> Bytes {
    error("ERR No such client".to_owned())
}

/// Why the daemon is about to close the connection of a client it gives up on.
pub fn disconnected(why: &impl std::fmt::Display) -> Bytes {
    error(format!("ERR tollgate: {why}; disconnected"))
}

/// `-NOPERM tollgate: rule <id> denies <COMMAND>: <reason>`. A command no catalog knows, or
/// with the wrong number of arguments, gets Redis's own error instead: no rule decided it, and
/// clients and their tests match on Redis's text.
pub fn denied(argv: &[&[u8]], denial: &Denial) -> Bytes {
    let name = argv.first().copied().unwrap_or_default();
    match denial.cause {
        DenyCause::WrongArity => error(format!("ERR {}", denial.reason)),
        DenyCause::UnknownCommand => match argv.get(1) {
            Some(sub) if is_container(name) => error(unknown_subcommand(name, sub)),
            _ => error(unknown_command(name, &argv[1.min(argv.len())..])),
        },
        _ => error(format!(
            "NOPERM tollgate: rule {} denies {}: {}",
            denial.rule,
            String::from_utf8_lossy(name).to_uppercase(),
            denial.reason
        )),
    }
}

/// Redis 7.0's commands of subcommands (`CONFIG GET`): an unknown subcommand of one gets its own
/// text, which clients and test suites match on.
const CONTAINERS: [&str; 15] = [
    "ACL", "CLIENT", "CLUSTER", "COMMAND", "CONFIG", "FUNCTION", "LATENCY", "MEMORY", "MODULE",
    "OBJECT", "PUBSUB", "SCRIPT", "SLOWLOG", "XGROUP", "XINFO",
];

fn is_container(name: &[u8]) -> bool {
    CONTAINERS
        .iter()
        .any(|container| name.eq_ignore_ascii_case(container.as_bytes()))
}

/// Redis's text for an unknown subcommand: the subcommand as sent (its first 128 bytes), the
/// command upper-cased.
fn unknown_subcommand(name: &[u8], sub: &[u8]) -> String {
    let sub = String::from_utf8_lossy(&sub[..sub.len().min(128)]).into_owned();
    let name = String::from_utf8_lossy(name).to_ascii_uppercase();
    format!("ERR unknown subcommand '{sub}'. Try {name} HELP.")
}

/// Redis's text for an unknown command: the name as sent and the first arguments, each quoted,
/// until 128 bytes of them are shown.
fn unknown_command(name: &[u8], args: &[&[u8]]) -> String {
    let mut shown = String::new();
    for arg in args {
        if shown.len() >= 128 {
            break;
        }
        let room = 128 - shown.len();
        let arg = String::from_utf8_lossy(&arg[..arg.len().min(room)]).into_owned();
        shown.push_str(&format!("'{arg}' "));
    }
    let name = String::from_utf8_lossy(&name[..name.len().min(128)]).into_owned();
    format!("ERR unknown command '{name}', with args beginning with: {shown}")
}

pub fn lane_failed(error: &LaneError) -> Bytes {
    let code = match error {
        LaneError::Saturated { .. } => "BUSY",
        LaneError::Unavailable { .. } => "UNAVAILABLE",
        LaneError::Closed => "SHUTDOWN",
        LaneError::Scope { .. } | LaneError::ScriptCooldown { .. } => "BUSY",
        // Redis's own code for "not now, try again": a migration or failover outlasted the retries.
        LaneError::Redirected { .. } => "TRYAGAIN",
    };
    error_bytes(format!("{code} tollgate: {error}"))
}

/// A refusal by the lane keeps its code; a lost reply is `IOERR` (the command may have run); a
/// reply dropped for the client's budget is `ERR` (it ran; the connection is closed next).
pub fn call_failed(error: &CallError) -> Bytes {
    match error {
        CallError::NotSent(refused) => lane_failed(refused),
        CallError::Indeterminate { .. } => error_bytes(format!("IOERR tollgate: {error}")),
        CallError::OverBudget(_) => error_bytes(format!("ERR tollgate: {error}")),
        CallError::ScriptStopped {
            limit,
            set_by,
            kill,
        } => error_bytes(format!(
            "ERR tollgate: script stopped after {set_by} ({}) with {kill}; it wrote nothing",
            humantime::format_duration(*limit)
        )),
    }
}

pub fn error(text: String) -> Bytes {
    error_bytes(text)
}

fn error_bytes(text: String) -> Bytes {
    // A newline would end the error line early and desynchronise the client.
    let line = text.replace(['\r', '\n'], " ");
    let mut out = BytesMut::with_capacity(line.len() + 3);
    out.put_u8(b'-');
    out.put_slice(line.as_bytes());
    out.put_slice(b"\r\n");
    out.freeze()
}

pub fn ok() -> Bytes {
    Bytes::from_static(b"+OK\r\n")
}

pub fn encode(frame: &Frame) -> Bytes {
    // Room for a small reply (a lease outcome, a status) at once rather than grown piece by piece.
    let mut out = BytesMut::with_capacity(256);
    tollgate_resp::encode(frame, &mut out);
    out.freeze()
}

/// A map reply: a map in RESP3, a flat array of keys and values in RESP2 (as Redis answers).
pub fn map(protocol: Protocol, pairs: Vec<(Frame, Frame)>) -> Frame {
    match protocol {
        Protocol::Resp3 => Frame::Map(pairs),
        Protocol::Resp2 => Frame::Array(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()),
    }
}

#[cfg(test)]
mod tests {
    use tollgate_lanes::OverBudget;

    use super::*;

    fn code(reply: &Bytes) -> &str {
        let text = std::str::from_utf8(reply).unwrap();
        text[1..].split_whitespace().next().unwrap()
    }

    #[test]
    fn each_failure_says_whether_the_command_may_have_run() {
        let refused = CallError::from(LaneError::Unavailable {
            reason: "down".into(),
        });
        assert_eq!(code(&call_failed(&refused)), "UNAVAILABLE");
        assert_eq!(code(&call_failed(&LaneError::Closed.into())), "SHUTDOWN");
        let lost = CallError::Indeterminate {
            reason: "reset".into(),
        };
        assert_eq!(code(&call_failed(&lost)), "IOERR");
        // It ran: neither a refusal nor a shutdown, whatever else the client is told.
        let dropped = CallError::OverBudget(OverBudget("over 1 MiB".into()));
        assert_eq!(code(&call_failed(&dropped)), "ERR");
    }
}
