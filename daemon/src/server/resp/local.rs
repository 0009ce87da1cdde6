//! Connection-scoped commands that the daemon answers itself and never forwards: they describe or
//! change this client's session, not data in Redis (PING, ECHO, QUIT, HELLO, AUTH, CLIENT SETNAME …).

use bytes::Bytes;
use tollgate_resp::Frame;

/// `CLIENT` subcommands that set state on the connection they run on (see [`Local::Unshareable`]).
const UNSHAREABLE: [&[u8]; 1] = [b"NO-TOUCH"];

/// `CLIENT` subcommands of client-side caching (see [`Local::ClientTracking`]).
const TRACKING: [&[u8]; 4] = [b"TRACKING", b"CACHING", b"GETREDIR", b"TRACKINGINFO"];

/// Which replies a client gets (`CLIENT REPLY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyMode {
    On,
    Off,
    /// The next command's reply is not sent; then on again.
    SkipNext,
}

/// Whether one command's reply reaches the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Voice {
    Heard,
    Silent,
}

impl Voice {
    /// What of `reply` the client gets: all of it, or nothing.
    pub fn say(self, reply: Bytes) -> Bytes {
        match self {
            Voice::Heard => reply,
            Voice::Silent => Bytes::new(),
        }
    }
}

impl ReplyMode {
    /// The voice of the next command's reply, and the mode after it.
    pub fn next(self) -> (Voice, ReplyMode) {
        match self {
            ReplyMode::On => (Voice::Heard, ReplyMode::On),
            ReplyMode::Off => (Voice::Silent, ReplyMode::Off),
            ReplyMode::SkipNext => (Voice::Silent, ReplyMode::On),
        }
    }
}

/// `CLIENT REPLY ON|OFF|SKIP`: the new mode, or the error to answer.
pub fn parse_client_reply(argv: &[&[u8]]) -> Result<ReplyMode, String> {
    match argv {
        [_, _, mode] if mode.eq_ignore_ascii_case(b"ON") => Ok(ReplyMode::On),
        [_, _, mode] if mode.eq_ignore_ascii_case(b"OFF") => Ok(ReplyMode::Off),
        [_, _, mode] if mode.eq_ignore_ascii_case(b"SKIP") => Ok(ReplyMode::SkipNext),
        [_, _, _] => Err("ERR syntax error".to_owned()),
        _ => Err("ERR wrong number of arguments for 'client|reply' command".to_owned()),
    }
}

/// The protocol a client asked for with `HELLO`.
pub use tollgate_model::Protocol;

/// A connection-scoped command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    Ping,
    Echo,
    Quit,
    Hello,
    Auth,
    ClientSetName,
    ClientGetName,
    ClientId,
    /// `CLIENT INFO`: this session's `CLIENT LIST` line.
    ClientInfo,
    /// Admitted by the policy first, then answered from the daemon's own sessions (see
    /// `clients.rs`): Redis's list would show the shared lane connections.
    ClientList,
    /// Admitted by the policy first; kills the daemon's sessions, never lane connections.
    ClientKill,
    /// Admitted by the policy first; ends a blocking command of one of the daemon's sessions
    /// (its id is the daemon's, which Redis does not know).
    ClientUnblock,
    /// Admitted by the policy first; streams the daemon's sessions' commands (`monitor.rs`).
    Monitor,
    /// `CLIENT SETINFO lib-name …`, which modern clients send on connect.
    ClientSetInfo,
    /// `CLIENT REPLY ON|OFF|SKIP`: which replies this client gets, kept by the daemon (forwarded,
    /// it would silence a Redis connection other clients share).
    ClientReply,
    /// Connection state that cannot work over connections shared between clients, refused:
    /// `CLIENT NO-TOUCH`.
    Unshareable,
    /// Client-side caching (`CLIENT TRACKING`, `CACHING`, `GETREDIR`, `TRACKINGINFO`), served by
    /// the listener's own tracking (`client_tracking.rs`, `tracking_hub.rs`).
    ClientTracking,
    /// `ASKING`, `READONLY`, `READWRITE`: a cluster client's connection state. The daemon shows
    /// clients one standalone server (and on a cluster its own connections send `ASKING` where
    /// a redirect needs it), so these are answered as a standalone server answers them; sent,
    /// they would set state on a connection other clients share.
    ClusterState,
    /// Admitted by the policy first: which databases a principal may select is policy.
    Select,
    /// Admitted by the policy first, then answered here: Redis's own configuration (passwords
    /// among it) is not exposed through the daemon.
    ConfigGet,
    Reset,
}

impl Local {
    /// What a command named `name`, with `first` as its first argument, is.
    pub fn of(name: &[u8], first: Option<&[u8]>) -> Option<Local> {
        let is = |word: &[u8]| name.eq_ignore_ascii_case(word);
        let sub = |word: &[u8]| first.is_some_and(|s| s.eq_ignore_ascii_case(word));
        Some(if is(b"PING") {
            Local::Ping
        } else if is(b"ECHO") {
            Local::Echo
        } else if is(b"QUIT") {
            Local::Quit
        } else if is(b"HELLO") {
            Local::Hello
        } else if is(b"AUTH") {
            Local::Auth
        } else if is(b"SELECT") {
            Local::Select
        } else if is(b"MONITOR") {
            Local::Monitor
        } else if is(b"RESET") {
            Local::Reset
        } else if is(b"CLIENT") && sub(b"SETNAME") {
            Local::ClientSetName
        } else if is(b"CLIENT") && sub(b"GETNAME") {
            Local::ClientGetName
        } else if is(b"CLIENT") && sub(b"ID") {
            Local::ClientId
        } else if is(b"CLIENT") && sub(b"INFO") {
            Local::ClientInfo
        } else if is(b"CLIENT") && sub(b"LIST") {
            Local::ClientList
        } else if is(b"CLIENT") && sub(b"KILL") {
            Local::ClientKill
        } else if is(b"CLIENT") && sub(b"UNBLOCK") {
            Local::ClientUnblock
        } else if is(b"CLIENT") && sub(b"SETINFO") {
            Local::ClientSetInfo
        } else if is(b"CLIENT") && sub(b"REPLY") {
            Local::ClientReply
        } else if is(b"CLIENT") && TRACKING.iter().any(|word| sub(word)) {
            Local::ClientTracking
        } else if is(b"CLIENT") && UNSHAREABLE.iter().any(|word| sub(word)) {
            Local::Unshareable
        } else if is(b"CONFIG") && sub(b"GET") {
            Local::ConfigGet
        } else if is(b"ASKING") || is(b"READONLY") || is(b"READWRITE") {
            Local::ClusterState
        } else {
            return None;
        })
    }

    /// Must the policy admit this before the daemon answers it?
    pub fn needs_admission(self) -> bool {
        matches!(
            self,
            Local::Select
                | Local::ConfigGet
                | Local::ClientList
                | Local::ClientKill
                | Local::ClientUnblock
                | Local::Monitor
        )
    }

    /// May this run while a RESP2 client is subscribed? (Redis allows only these there.)
    pub fn allowed_while_subscribed(self) -> bool {
        matches!(self, Local::Ping | Local::Quit | Local::Reset)
    }

    /// Is a command of this kind queued inside MULTI, its reply taking its place in EXEC's? These
    /// are the ones Redis queues; the rest act at once (RESET, QUIT) or change how the connection
    /// speaks (HELLO, CLIENT REPLY), which the daemon keeps immediate.
    pub fn queues_in_multi(self) -> bool {
        matches!(
            self,
            Local::Ping
                | Local::Echo
                | Local::Auth
                | Local::ClientSetName
                | Local::ClientGetName
                | Local::ClientId
                | Local::ClientInfo
                | Local::ClientList
                | Local::ClientKill
                | Local::ClientUnblock
                | Local::ClientSetInfo
                | Local::Select
                | Local::ConfigGet
                | Local::Unshareable
                | Local::ClientTracking
        )
    }

    /// Redis's name for the command in arity errors, and whether `argc` words fit its arity (as
    /// Redis checks it before running or queueing the command).
    pub fn arity(self, argc: usize) -> Arity {
        let fits = match self {
            Local::Ping => argc <= 2,
            Local::Echo | Local::ClientGetName | Local::ClientId | Local::ClientInfo => argc == 2,
            Local::Quit | Local::Hello | Local::Unshareable | Local::ClientTracking => true,
            Local::ClusterState => true,
            Local::Auth => (2..=3).contains(&argc),
            Local::ClientSetName | Local::ClientReply => argc == 3,
            Local::ClientKill => argc >= 3,
            Local::ClientUnblock => (3..=4).contains(&argc),
            Local::ClientSetInfo => argc == 4,
            Local::ClientList => argc >= 2,
            Local::Select => argc == 2,
            Local::ConfigGet => argc >= 3,
            Local::Reset | Local::Monitor => argc == 1,
        };
        if fits {
            Arity::Fits
        } else {
            Arity::Wrong(self.name())
        }
    }

    /// Redis's name for the command, as errors and `CLIENT LIST`'s `cmd=` show it.
    pub fn name(self) -> &'static str {
        match self {
            Local::Ping => "ping",
            Local::Echo => "echo",
            Local::Quit => "quit",
            Local::Hello => "hello",
            Local::Auth => "auth",
            Local::ClientSetName => "client|setname",
            Local::ClientGetName => "client|getname",
            Local::ClientId => "client|id",
            Local::ClientInfo => "client|info",
            Local::ClientList => "client|list",
            Local::ClientKill => "client|kill",
            Local::ClientUnblock => "client|unblock",
            Local::ClientSetInfo => "client|setinfo",
            Local::ClientReply => "client|reply",
            Local::Unshareable | Local::ClientTracking => "client",
            Local::ClusterState => "asking",
            Local::Select => "select",
            Local::ConfigGet => "config|get",
            Local::Reset => "reset",
            Local::Monitor => "monitor",
        }
    }
}

/// Whether a command's argument count fits, and if not, the name its error uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    Fits,
    Wrong(&'static str),
}

/// The null a client of `protocol` reads: `_` in RESP3, `$-1` in RESP2.
pub fn null(protocol: Protocol) -> Frame {
    match protocol {
        Protocol::Resp3 => Frame::Null3,
        Protocol::Resp2 => Frame::Null,
    }
}

/// `PING [message]`: in RESP2 subscribed mode Redis answers with a `pong` array instead.
pub fn ping(argv: &[&[u8]], subscribed_resp2: bool) -> Frame {
    let message = argv.get(1).map(|message| Bytes::copy_from_slice(message));
    if subscribed_resp2 {
        return Frame::Array(vec![
            Frame::Bulk(Bytes::from_static(b"pong")),
            Frame::Bulk(message.unwrap_or_default()),
        ]);
    }
    match message {
        Some(message) => Frame::Bulk(message),
        None => Frame::Simple(Bytes::from_static(b"PONG")),
    }
}

/// What a valid `HELLO` asks for.
#[derive(Debug)]
pub struct Hello {
    pub protocol: Option<Protocol>,
    pub name: Option<Bytes>,
}

/// Parses `HELLO [protover [AUTH user pass] [SETNAME name]]`; the error is the reply to send.
pub fn parse_hello(argv: &[&[u8]]) -> Result<Hello, String> {
    let mut hello = Hello {
        protocol: None,
        name: None,
    };
    let mut rest = argv.iter().skip(1);
    if let Some(version) = rest.next() {
        hello.protocol = Some(match *version {
            b"2" => Protocol::Resp2,
            b"3" => Protocol::Resp3,
            _ => return Err("NOPROTO unsupported protocol version".to_owned()),
        });
    }
    while let Some(option) = rest.next() {
        if option.eq_ignore_ascii_case(b"AUTH") {
            // Identity comes from the socket; credentials are accepted and not used.
            if rest.next().is_none() || rest.next().is_none() {
                return Err("ERR syntax error in HELLO option 'AUTH'".to_owned());
            }
        } else if option.eq_ignore_ascii_case(b"SETNAME") {
            hello.name = Some(
                rest.next()
                    .map(|name| Bytes::copy_from_slice(name))
                    .ok_or_else(|| "ERR syntax error in HELLO option 'SETNAME'".to_owned())?,
            );
        } else {
            return Err(format!(
                "ERR syntax error in HELLO option '{}'",
                String::from_utf8_lossy(option)
            ));
        }
    }
    Ok(hello)
}

/// The server description `HELLO` answers with: a map in RESP3, a flat array in RESP2.
pub fn hello_reply(
    protocol: Protocol,
    client_id: u64,
    server: Option<tollgate_lanes::ServerIdentity>,
) -> Frame {
    let text = |s: &'static str| Frame::Bulk(Bytes::from_static(s.as_bytes()));
    // The Redis behind the daemon, in its own words (clients pick features by them); the
    // daemon's own name and version only before any lane has connected.
    let (server, version) = match server {
        Some(server) => (server.server, server.version),
        None => ("tollgate".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
    };
    let pairs = vec![
        (text("server"), Frame::Bulk(Bytes::from(server))),
        (text("version"), Frame::Bulk(Bytes::from(version))),
        (
            text("proto"),
            Frame::Integer(match protocol {
                Protocol::Resp2 => 2,
                Protocol::Resp3 => 3,
            }),
        ),
        (text("id"), Frame::Integer(client_id as i64)),
        (text("mode"), text("standalone")),
        (text("role"), text("master")),
        (text("modules"), Frame::Array(Vec::new())),
    ];
    super::replies::map(protocol, pairs)
}

/// What `CONFIG GET` shows through the daemon: what is true of Tollgate's own service (one
/// database). Tools that probe other parameters get an empty answer, as Redis gives for unknown
/// ones.
const CONFIG: &[(&str, &str)] = &[("databases", "1")];

/// `CONFIG GET pattern [pattern …]`, matching `*` and exact names.
pub fn config_get(argv: &[&[u8]], protocol: Protocol) -> Frame {
    let pairs: Vec<(Frame, Frame)> = CONFIG
        .iter()
        .filter(|(name, _)| {
            argv.iter()
                .skip(2)
                .any(|pattern| *pattern == b"*" || pattern.eq_ignore_ascii_case(name.as_bytes()))
        })
        .map(|(name, value)| {
            (
                Frame::Bulk(Bytes::from_static(name.as_bytes())),
                Frame::Bulk(Bytes::from_static(value.as_bytes())),
            )
        })
        .collect();
    super::replies::map(protocol, pairs)
}

/// The client name must not contain spaces or newlines (Redis's rule, so `CLIENT LIST` stays parseable).
pub fn valid_client_name(name: &[u8]) -> bool {
    name.iter().all(|&b| b > b' ' && b <= b'~')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::resp::words::argv;

    #[test]
    fn client_reply_skips_one_reply_or_silences_until_on() {
        assert_eq!(
            parse_client_reply(&argv("CLIENT REPLY skip")),
            Ok(ReplyMode::SkipNext)
        );
        assert_eq!(ReplyMode::SkipNext.next(), (Voice::Silent, ReplyMode::On));
        assert_eq!(ReplyMode::Off.next(), (Voice::Silent, ReplyMode::Off));
        assert_eq!(ReplyMode::On.next(), (Voice::Heard, ReplyMode::On));
        assert!(parse_client_reply(&argv("CLIENT REPLY maybe")).is_err());
        assert!(parse_client_reply(&argv("CLIENT REPLY")).is_err());
    }

    #[test]
    fn recognises_connection_scoped_commands_case_insensitively() {
        assert_eq!(Local::of(b"ping", None), Some(Local::Ping));
        assert_eq!(
            Local::of(b"client", Some(b"setname")),
            Some(Local::ClientSetName)
        );
        assert_eq!(Local::of(b"CLIENT", Some(b"LIST")), Some(Local::ClientList));
        assert_eq!(Local::of(b"CLIENT", Some(b"PAUSE")), None);
        assert_eq!(
            Local::of(b"client", Some(b"reply")),
            Some(Local::ClientReply)
        );
        assert_eq!(
            Local::of(b"CLIENT", Some(b"tracking")),
            Some(Local::ClientTracking)
        );
        assert_eq!(
            Local::of(b"client", Some(b"no-touch")),
            Some(Local::Unshareable)
        );
        assert_eq!(Local::of(b"GET", Some(b"k")), None);
    }

    #[test]
    fn hello_parses_version_auth_and_setname() {
        let hello = parse_hello(&argv("HELLO 3 AUTH u p SETNAME app")).unwrap();
        assert_eq!(hello.protocol, Some(Protocol::Resp3));
        assert_eq!(hello.name.as_deref(), Some(&b"app"[..]));
        assert!(parse_hello(&argv("HELLO 4"))
            .unwrap_err()
            .starts_with("NOPROTO"));
        assert!(parse_hello(&argv("HELLO 3 AUTH u")).is_err());
    }

    #[test]
    fn config_get_shows_only_what_is_true_of_the_daemon() {
        let databases = config_get(&argv("CONFIG GET databases save"), Protocol::Resp2);
        assert_eq!(
            databases,
            Frame::Array(vec![
                Frame::Bulk(Bytes::from_static(b"databases")),
                Frame::Bulk(Bytes::from_static(b"1"))
            ])
        );
        assert_eq!(
            config_get(&argv("CONFIG GET requirepass"), Protocol::Resp3),
            Frame::Map(Vec::new())
        );
    }

    #[test]
    fn subscribed_resp2_ping_is_an_array() {
        assert!(matches!(ping(&argv("PING"), true), Frame::Array(items) if items.len() == 2));
        assert_eq!(
            ping(&argv("PING"), false),
            Frame::Simple(Bytes::from_static(b"PONG"))
        );
    }
}
