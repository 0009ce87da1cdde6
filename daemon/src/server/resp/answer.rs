//! The daemon's own answers to connection-scoped commands ([`Local`]), from what they see of their
//! session ([`Asking`]): PING, ECHO, CLIENT SETNAME/GETNAME/ID/INFO/LIST/KILL/REPLY, SELECT,
//! CONFIG GET's own answer, HELLO. Those that change more of the session than its name and reply
//! mode (QUIT, RESET, HELLO with another protocol, MONITOR) become a step the session takes.

use bytes::Bytes;
use tollgate_resp::Frame;

use super::client_tracking;
use super::clients::{Client, Clients, KillFilter, ListFilter, UnblockMode};
use super::local::{self, Local, Protocol, ReplyMode};
use super::replies;
use super::schedule::{InPlace, Step};
use super::tracking_hub::Hub;

/// What a locally answered command sees of its session.
pub struct Asking<'a> {
    pub protocol: Protocol,
    /// A RESP2 client holding subscriptions (its PING is answered with an array).
    pub subscribed_resp2: bool,
    pub id: u64,
    /// This session in the listener's list.
    pub me: &'a Client,
    /// Every session of the listener, for CLIENT LIST and KILL.
    pub clients: &'a Clients,
    pub reply_mode: &'a mut ReplyMode,
    /// Whether the policy names a principal so (`CLIENT KILL USER`'s `No such user`).
    pub principal_named: &'a dyn Fn(&str) -> bool,
    /// The listener's `CLIENT TRACKING`.
    pub tracking: &'a Hub,
    /// The lanes, for what `HELLO` says of the Redis behind them.
    pub lanes: &'a tollgate_lanes::Lanes,
}

/// What `local` (whose arity fits) with `argv` becomes.
pub fn answer(local: Local, argv: &[&[u8]], session: Asking<'_>) -> Step {
    let frame = match local {
        Local::Ping => local::ping(argv, session.subscribed_resp2),
        Local::Echo => Frame::Bulk(Bytes::copy_from_slice(argv[1])),
        Local::Quit => return Step::Close(replies::ok()),
        Local::Reset => return Step::InPlace(InPlace::Reset),
        Local::Monitor => return Step::InPlace(InPlace::Monitor),
        Local::Auth | Local::ClientSetInfo => return Step::Reply(replies::ok()),
        Local::Hello => match local::parse_hello(argv) {
            // Another protocol; or no lane has connected yet, and the reply names the Redis
            // behind the daemon: one is connected first.
            Ok(hello)
                if hello.protocol.is_some_and(|p| p != session.protocol)
                    || session.lanes.server_identity().is_none() =>
            {
                return Step::InPlace(InPlace::Hello(hello))
            }
            Ok(hello) => self::hello(
                hello,
                session.me,
                session.protocol,
                session.id,
                session.lanes,
            ),
            Err(error) => return Step::Reply(replies::error(error)),
        },
        Local::ClientSetName => {
            let name = argv[2];
            if !local::valid_client_name(name) {
                return Step::Reply(replies::invalid_client_name());
            }
            let name = (!name.is_empty()).then(|| Bytes::copy_from_slice(name));
            session.me.update(|state| state.name = name);
            return Step::Reply(replies::ok());
        }
        Local::ClientGetName => match session.me.name() {
            Some(name) => Frame::Bulk(name),
            None => local::null(session.protocol),
        },
        Local::ClientId => Frame::Integer(session.id as i64),
        Local::ClientInfo => listing(session.me.line() + "\n", session.protocol),
        Local::ClientReply => {
            return Step::Reply(match local::parse_client_reply(argv) {
                Ok(mode) => {
                    *session.reply_mode = mode;
                    match mode {
                        ReplyMode::On => replies::ok(),
                        ReplyMode::Off | ReplyMode::SkipNext => Bytes::new(),
                    }
                }
                Err(error) => replies::error(error),
            })
        }
        Local::Unshareable => {
            return Step::Reply(replies::unshareable(
                argv.get(1).copied().unwrap_or_default(),
            ))
        }
        Local::ClientTracking => {
            return client_tracking::answer(
                session.tracking,
                session.me,
                argv.get(1).copied().unwrap_or_default(),
                argv.get(2..).unwrap_or_default(),
                session.protocol,
            );
        }
        Local::Select => return Step::Reply(select(argv)),
        Local::ClusterState => return Step::Reply(replies::cluster_disabled()),
        // Inside MULTI, or where Redis's lane user may not read it: the daemon's own answer.
        Local::ConfigGet => local::config_get(argv, session.protocol),
        Local::ClientList => match ListFilter::parse(&argv[2..]) {
            Ok(filter) => listing(session.clients.list(session.me, &filter), session.protocol),
            Err(error) => return Step::Reply(replies::error(error)),
        },
        Local::ClientUnblock => {
            return Step::Reply(match parse_unblock(argv) {
                Ok((id, mode)) => {
                    let unblocked = session.clients.unblock(session.me, id, mode);
                    replies::encode(&Frame::Integer(i64::from(unblocked)))
                }
                Err(error) => replies::error(error.to_owned()),
            })
        }
        Local::ClientKill => {
            return Step::Reply(match KillFilter::parse(&argv[2..]) {
                Ok(filter)
                    if filter.user().is_some_and(|user| {
                        !session
                            .clients
                            .knows_user(session.me, user, session.principal_named)
                    }) =>
                {
                    replies::error(format!(
                        "ERR No such user '{}'",
                        filter.user().unwrap_or("")
                    ))
                }
                Ok(filter) => {
                    let killed = session.clients.kill(session.me, &filter);
                    match (filter.legacy(), killed) {
                        (true, 0) => replies::no_such_client(),
                        (true, _) => replies::ok(),
                        (false, killed) => replies::encode(&Frame::Integer(killed as i64)),
                    }
                }
                Err(error) => replies::error(error),
            })
        }
    };
    Step::Reply(replies::encode(&frame))
}

/// `CLIENT UNBLOCK id [TIMEOUT|ERROR]`'s id and mode; the error is Redis's. An id no session has
/// (a negative one too) unblocks nothing.
fn parse_unblock(argv: &[&[u8]]) -> Result<(u64, UnblockMode), &'static str> {
    let id: i64 = std::str::from_utf8(argv[2])
        .ok()
        .and_then(|id| id.parse().ok())
        .ok_or("ERR value is not an integer or out of range")?;
    let mode = match argv.get(3) {
        None => UnblockMode::Timeout,
        Some(mode) if mode.eq_ignore_ascii_case(b"TIMEOUT") => UnblockMode::Timeout,
        Some(mode) if mode.eq_ignore_ascii_case(b"ERROR") => UnblockMode::Error,
        Some(_) => return Err("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"),
    };
    Ok((u64::try_from(id).unwrap_or(0), mode))
}

/// Takes a valid `HELLO`'s name (its protocol is the caller's to switch); the reply describes the
/// server as it speaks `protocol`: the Redis behind `lanes`, by the words of its own `HELLO`.
pub fn hello(
    hello: local::Hello,
    me: &Client,
    protocol: Protocol,
    id: u64,
    lanes: &tollgate_lanes::Lanes,
) -> Frame {
    if let Some(name) = hello.name {
        me.update(|state| state.name = Some(name));
    }
    local::hello_reply(protocol, id, lanes.server_identity())
}

/// `CLIENT LIST`/`INFO` text: a bulk string in RESP2, a verbatim `txt` string in RESP3 (Redis's).
fn listing(text: String, protocol: Protocol) -> Frame {
    match protocol {
        Protocol::Resp2 => Frame::Bulk(Bytes::from(text)),
        Protocol::Resp3 => Frame::Verbatim {
            format: *b"txt",
            text: Bytes::from(text),
        },
    }
}

/// Lanes share their connections between clients, so only database 0 can be served.
fn select(argv: &[&[u8]]) -> Bytes {
    match argv.get(1).copied() {
        Some(b"0") if argv.len() == 2 => replies::ok(),
        Some(db) if argv.len() == 2 => replies::other_database(db),
        _ => replies::wrong_arity("select"),
    }
}
