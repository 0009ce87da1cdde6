//! `LEASE …` on the RESP socket: the lease service for any Redis client, one command per call
//! (`LEASE ACQUIRE|RENEW|RELEASE|INSPECT`), admitted by the policy's `leases:` rules like the HTTP
//! calls, answered with the HTTP API's outcome objects as RESP3 maps (flat arrays in RESP2). A
//! waiting acquire is awaited in place, so it holds up only its own connection. A lease taken with
//! `SESSION` is bound to the connection: a watchdog renews it while the connection lives and
//! releases it when the connection closes. `VALUE` keeps a value with the lease (leader election:
//! campaign = `ACQUIRE … WAIT … VALUE … SESSION`, leader = `INSPECT`, resign = `RELEASE`, observe =
//! `WATCH`, which `lease_watch.rs` serves). `COMMAND DOCS LEASE` is answered here too. Which
//! commands are the lease service's, and that none runs inside a transaction, is the plan's
//! (`kind.rs`, `plan.rs`).

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::{CancellationToken, DropGuard};
use tollgate_lease::api::{AcquireRequest, ReleaseRequest, RenewRequest};
use tollgate_lease::{Attempt, Holder, Identity, InvalidRequest, Mode, Resource};
use tollgate_lease_client::LeaseClient;
use tollgate_model::Caller;
use tollgate_policy::{Decision, LeaseMemo};
use tollgate_resp::Frame;

use super::admission_clock::AdmissionClock;
use super::front::FrontDoor;
use super::lease_reply;
use super::local::Protocol;
use super::replies;
use crate::quotas::{LeaseKey, Meters};

/// The connection's side of its leases: its session-bound leases, ended when it is dropped with
/// the session, and the resources the policy admitted it to.
pub struct Connection {
    id: u64,
    closed: CancellationToken,
    _ends: DropGuard,
    admitted: LeaseMemo,
}

impl Connection {
    pub fn new(id: u64) -> Connection {
        let closed = CancellationToken::new();
        Connection {
            id,
            _ends: closed.clone().drop_guard(),
            closed,
            admitted: LeaseMemo::default(),
        }
    }
}

/// One parsed `LEASE` call.
#[derive(Debug, PartialEq)]
enum Call {
    Acquire {
        resource: Resource,
        request: AcquireRequest,
        binding: Binding,
    },
    Renew {
        resource: Resource,
        request: RenewRequest,
    },
    Release {
        resource: Resource,
        request: ReleaseRequest,
    },
    Inspect {
        resource: Resource,
        attempt: Option<Attempt>,
    },
}

/// What keeps an acquired lease alive, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    /// Nothing: it lasts its TTL unless renewed.
    None,
    /// `SESSION`: renewed while this connection lives, released when it closes.
    Session,
    /// `WATCHDOG`: renewed while the calling process lives (as HTTP's `watchdog: true`).
    Process,
}

/// Runs one `LEASE` command for `caller` and returns the reply to write.
pub async fn run(
    front: &FrontDoor,
    caller: &Caller,
    (clock, meters): (&AdmissionClock, &mut Meters),
    connection: &mut Connection,
    protocol: Protocol,
    argv: &[&[u8]],
) -> Bytes {
    let call = match parse(argv) {
        Ok(call) => call,
        Err(message) => return replies::error(message),
    };
    let resource = match &call {
        Call::Acquire { resource, .. }
        | Call::Renew { resource, .. }
        | Call::Release { resource, .. }
        | Call::Inspect { resource, .. } => resource,
    };
    // Guard time on the caller's admission clock, as for every other command: a spinning module
    // reached through LEASE costs its own user's share too.
    let started = tokio::time::Instant::now();
    let decision = front.services.admission.admit_lease_remembered(
        caller,
        resource.as_str(),
        &mut connection.admitted,
    );
    clock.spent(started);
    if let Decision::Denied(denial) = decision {
        return replies::denied(argv, &denial);
    }
    let bytes = argv.iter().map(|word| word.len()).sum();
    if let Err(throttled) = meters.admit(&front.services.quotas, bytes) {
        return replies::throttled(&throttled);
    }
    let identity = Identity::from(caller);
    let leases = &front.services.leases;
    let quotas = &front.services.quotas;
    let answered = match &call {
        Call::Acquire {
            resource,
            request,
            binding,
        } => {
            let holder = match binding {
                Binding::None => None,
                Binding::Session => {
                    Some(Holder::connection(connection.id, connection.closed.clone()))
                }
                Binding::Process => match Holder::process(caller.pid) {
                    Ok(holder) => Some(holder),
                    Err(error) => {
                        return replies::error(format!(
                            "ERR tollgate: cannot watch process {}: {error}",
                            caller.pid
                        ))
                    }
                },
            };
            let key = || LeaseKey::new(&identity, resource, &request.attempt);
            let hold = match meters.hold_lease((quotas, leases), key, request.ttl) {
                Ok(hold) => hold,
                Err(throttled) => return replies::throttled(&throttled),
            };
            let kept = holder.is_some();
            let acquired = leases.acquire(&identity, resource, request, holder).await;
            match &acquired {
                Ok(outcome) => hold.settle(outcome, kept),
                Err(_) => hold.unsent(),
            }
            acquired.map(|outcome| lease_reply::acquired(&outcome, &request.attempt, protocol))
        }
        Call::Renew { resource, request } => {
            let renewed = leases.renew(&identity, resource, request).await;
            if let Ok(outcome) = &renewed {
                let key = || LeaseKey::new(&identity, resource, &request.attempt);
                meters.lease_renewed(key, outcome);
            }
            renewed.map(|outcome| lease_reply::renewed(&outcome, protocol))
        }
        Call::Release { resource, request } => {
            let released = leases.release(&identity, resource, request).await;
            if let Ok(outcome) = &released {
                let key = || LeaseKey::new(&identity, resource, &request.attempt);
                meters.lease_released(key, outcome);
            }
            released.map(|outcome| lease_reply::released(&outcome, protocol))
        }
        Call::Inspect { resource, attempt } => leases
            .inspect(&identity, resource, attempt.as_ref())
            .await
            .map(|outcome| lease_reply::encoded(&lease_reply::value(&outcome), protocol)),
    };
    match answered {
        Ok(reply) => reply,
        Err(InvalidRequest { field, message }) => {
            replies::error(format!("ERR tollgate: {field}: {message}"))
        }
    }
}

/// Reads `LEASE <subcommand> …`; the error is the reply to send.
fn parse(argv: &[&[u8]]) -> Result<Call, String> {
    let word = argv
        .get(1)
        .ok_or_else(|| "ERR wrong number of arguments for 'lease' command".to_owned())?;
    // Compared in place: this runs for every lease call.
    let sub = ["ACQUIRE", "RENEW", "RELEASE", "INSPECT"]
        .into_iter()
        .find(|name| word.eq_ignore_ascii_case(name.as_bytes()));
    let arity = || {
        format!(
            "ERR wrong number of arguments for 'lease|{}' command",
            sub.unwrap_or_default().to_lowercase()
        )
    };
    let rest = &argv[2..];
    match sub {
        Some("ACQUIRE") => {
            let [name, ttl, options @ ..] = rest else {
                return Err(arity());
            };
            let options = Options::read(
                options,
                &[
                    "WAIT", "OWNER", "OP", "REPLICAS", "VALUE", "PERMITS", "COUNT", "MODE",
                ],
                &["SESSION", "WATCHDOG"],
            )?;
            let binding = match (options.flag("SESSION"), options.flag("WATCHDOG")) {
                (true, true) => {
                    return Err("ERR tollgate: SESSION and WATCHDOG exclude each other".to_owned())
                }
                (true, false) => Binding::Session,
                (false, true) => Binding::Process,
                (false, false) => Binding::None,
            };
            Ok(Call::Acquire {
                resource: resource(name)?,
                request: AcquireRequest {
                    attempt: options.attempt()?.unwrap_or_else(LeaseClient::new_attempt),
                    ttl: millis("ttl-ms", ttl)?,
                    wait: options.millis("WAIT")?.unwrap_or_default(),
                    watchdog: binding == Binding::Process,
                    replicas: options.number("REPLICAS")?.unwrap_or_default(),
                    value: options
                        .value("VALUE")
                        .map(|value| {
                            String::from_utf8(value.to_vec())
                                .map_err(|_| "ERR tollgate: VALUE must be UTF-8 text".to_owned())
                        })
                        .transpose()?,
                    permits: options.number("PERMITS")?,
                    count: options.number("COUNT")?,
                    mode: options.mode()?,
                },
                binding,
            })
        }
        Some("RENEW") => {
            let [name, ttl, options @ ..] = rest else {
                return Err(arity());
            };
            let options = Options::read(options, &["OWNER", "OP"], &[])?;
            Ok(Call::Renew {
                resource: resource(name)?,
                request: RenewRequest {
                    attempt: options.required_attempt()?,
                    ttl: millis("ttl-ms", ttl)?,
                },
            })
        }
        Some("RELEASE") => {
            let [name, options @ ..] = rest else {
                return Err(arity());
            };
            let options = Options::read(options, &["OWNER", "OP"], &[])?;
            Ok(Call::Release {
                resource: resource(name)?,
                request: ReleaseRequest {
                    attempt: options.required_attempt()?,
                },
            })
        }
        Some("INSPECT") => {
            let [name, options @ ..] = rest else {
                return Err(arity());
            };
            let options = Options::read(options, &["OWNER", "OP"], &[])?;
            Ok(Call::Inspect {
                resource: resource(name)?,
                attempt: options.attempt()?,
            })
        }
        _ => Err(format!(
            "ERR unknown subcommand '{}'. Try COMMAND DOCS LEASE.",
            String::from_utf8_lossy(argv[1])
        )),
    }
}

/// The options after a subcommand's positional arguments: `NAME value` pairs and bare flags, each
/// at most once, in any order, in any case. Kept on the stack, by each name's place in its list:
/// this runs for every lease call.
struct Options<'a> {
    valued: &'static [&'static str],
    values: [Option<&'a [u8]>; MAX_OPTIONS],
    flags: &'static [&'static str],
    set: [bool; MAX_OPTIONS],
}

/// The most names of one kind a subcommand takes (`ACQUIRE`'s eight valued options).
const MAX_OPTIONS: usize = 8;

impl<'a> Options<'a> {
    fn read(
        words: &[&'a [u8]],
        valued: &'static [&'static str],
        flags: &'static [&'static str],
    ) -> Result<Options<'a>, String> {
        debug_assert!(valued.len() <= MAX_OPTIONS && flags.len() <= MAX_OPTIONS);
        let mut options = Options {
            valued,
            values: [None; MAX_OPTIONS],
            flags,
            set: [false; MAX_OPTIONS],
        };
        let mut words = words.iter();
        while let Some(word) = words.next() {
            let named = |names: &[&'static str]| {
                names
                    .iter()
                    .position(|name| word.eq_ignore_ascii_case(name.as_bytes()))
            };
            if let Some(at) = named(valued) {
                let name = valued[at];
                if options.values[at].is_some() {
                    return Err(format!("ERR tollgate: {name} given twice"));
                }
                let value = words
                    .next()
                    .ok_or_else(|| format!("ERR tollgate: {name} needs a value"))?;
                options.values[at] = Some(value);
            } else if let Some(at) = named(flags) {
                if options.set[at] {
                    return Err(format!("ERR tollgate: {} given twice", flags[at]));
                }
                options.set[at] = true;
            } else {
                return Err(format!(
                    "ERR syntax error: unknown option '{}'",
                    String::from_utf8_lossy(word)
                ));
            }
        }
        Ok(options)
    }

    fn value(&self, name: &str) -> Option<&'a [u8]> {
        let at = self.valued.iter().position(|n| *n == name)?;
        self.values[at]
    }

    fn flag(&self, name: &str) -> bool {
        self.flags
            .iter()
            .position(|n| *n == name)
            .is_some_and(|at| self.set[at])
    }

    fn millis(&self, name: &'static str) -> Result<Option<Duration>, String> {
        self.value(name).map(|v| millis(name, v)).transpose()
    }

    fn number(&self, name: &'static str) -> Result<Option<u32>, String> {
        self.value(name)
            .map(|v| {
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .ok_or_else(|| format!("ERR tollgate: {name} must be a whole number"))
            })
            .transpose()
    }

    /// `MODE READ|WRITE`: a read/write lease.
    fn mode(&self) -> Result<Option<Mode>, String> {
        self.value("MODE")
            .map(|word| match word.to_ascii_uppercase().as_slice() {
                b"READ" => Ok(Mode::Read),
                b"WRITE" => Ok(Mode::Write),
                _ => Err("ERR tollgate: MODE is READ or WRITE".to_owned()),
            })
            .transpose()
    }

    /// `OWNER o OP op`, both or neither.
    fn attempt(&self) -> Result<Option<Attempt>, String> {
        match (self.value("OWNER"), self.value("OP")) {
            (None, None) => Ok(None),
            (Some(owner), Some(op)) => Ok(Some(Attempt {
                owner: text(owner),
                operation_id: text(op),
            })),
            _ => Err("ERR tollgate: OWNER and OP go together".to_owned()),
        }
    }

    fn required_attempt(&self) -> Result<Attempt, String> {
        self.attempt()?
            .ok_or_else(|| "ERR tollgate: OWNER <owner> OP <operation-id> are required".to_owned())
    }
}

pub(super) fn resource(word: &[u8]) -> Result<Resource, String> {
    Resource::parse(&lossy(word)).map_err(|error| format!("ERR tollgate: resource: {error}"))
}

fn text(word: &[u8]) -> String {
    lossy(word).into_owned()
}

/// `word` as text, invalid UTF-8 replaced as `String::from_utf8_lossy` replaces it; checked first,
/// since nearly every word is valid and the lossy walk costs twice the check.
fn lossy(word: &[u8]) -> Cow<'_, str> {
    std::str::from_utf8(word).map_or_else(|_| String::from_utf8_lossy(word), Cow::Borrowed)
}

fn millis(name: &str, word: &[u8]) -> Result<Duration, String> {
    std::str::from_utf8(word)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| format!("ERR tollgate: {name} must be a whole number of milliseconds"))
}

/// One argument as `COMMAND DOCS` describes it.
struct Arg {
    name: &'static str,
    kind: &'static str,
    token: Option<&'static str>,
    optional: bool,
}

const fn arg(name: &'static str, kind: &'static str) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        optional: false,
    }
}

const fn option(name: &'static str, kind: &'static str, token: &'static str) -> Arg {
    Arg {
        name,
        kind,
        token: Some(token),
        optional: true,
    }
}

/// The subcommands: name, summary, arguments.
const SUBCOMMANDS: [(&str, &str, &[Arg]); 6] = [
    (
        "acquire",
        "Takes a fenced lease on a resource, waiting up to WAIT ms; without OWNER/OP the daemon makes the attempt and returns it. PERMITS n makes the resource a semaphore of n permits (COUNT k of them taken at once, 1 by default); MODE READ|WRITE a read/write lease.",
        &[
            arg("resource", "string"),
            arg("ttl-ms", "integer"),
            option("wait-ms", "integer", "WAIT"),
            option("owner", "string", "OWNER"),
            option("operation-id", "string", "OP"),
            option("replicas", "integer", "REPLICAS"),
            option("value", "string", "VALUE"),
            option("permits", "integer", "PERMITS"),
            option("count", "integer", "COUNT"),
            option("mode", "string", "MODE"),
            option("session", "pure-token", "SESSION"),
            option("watchdog", "pure-token", "WATCHDOG"),
        ],
    ),
    (
        "renew",
        "Extends a lease the attempt holds.",
        &[
            arg("resource", "string"),
            arg("ttl-ms", "integer"),
            Arg { optional: false, ..option("owner", "string", "OWNER") },
            Arg { optional: false, ..option("operation-id", "string", "OP") },
        ],
    ),
    (
        "release",
        "Releases a lease the attempt holds and wakes one waiter.",
        &[
            arg("resource", "string"),
            Arg { optional: false, ..option("owner", "string", "OWNER") },
            Arg { optional: false, ..option("operation-id", "string", "OP") },
        ],
    ),
    (
        "inspect",
        "Tells whether a resource is held, its fence, value and remaining time, and whether the named attempt holds it; for a semaphore or read/write lease, every holder.",
        &[
            arg("resource", "string"),
            option("owner", "string", "OWNER"),
            option("operation-id", "string", "OP"),
        ],
    ),
    (
        "watch",
        "Streams the resource's holder changes as push messages: who holds it now, then each new holder (fence, value), release and expiry, until UNWATCH.",
        &[arg("resource", "string")],
    ),
    (
        "unwatch",
        "Ends the named watches, or all of them.",
        &[Arg { optional: true, ..arg("resource", "string") }],
    ),
];

/// `COMMAND DOCS LEASE`, in the shape Redis gives its own commands.
pub fn docs(protocol: Protocol) -> Frame {
    let text = |s: &str| Frame::Bulk(Bytes::from(s.to_owned()));
    let set = |items: Vec<Frame>| match protocol {
        Protocol::Resp3 => Frame::Set(items),
        Protocol::Resp2 => Frame::Array(items),
    };
    let argument = |a: &Arg| {
        let mut fields = vec![(text("name"), text(a.name)), (text("type"), text(a.kind))];
        if let Some(token) = a.token {
            fields.push((text("token"), text(token)));
        }
        if a.optional {
            fields.push((
                text("flags"),
                set(vec![Frame::Simple(Bytes::from_static(b"optional"))]),
            ));
        }
        replies::map(protocol, fields)
    };
    let about = |summary: &str, extra: Vec<(Frame, Frame)>| {
        let mut fields = vec![
            (text("summary"), text(summary)),
            (text("since"), text("0.1.0")),
            (text("group"), text("tollgate")),
            (text("complexity"), text("O(1)")),
        ];
        fields.extend(extra);
        replies::map(protocol, fields)
    };
    let subcommands = SUBCOMMANDS
        .iter()
        .map(|(name, summary, args)| {
            let arguments = Frame::Array(args.iter().map(argument).collect());
            (
                text(&format!("lease|{name}")),
                about(summary, vec![(text("arguments"), arguments)]),
            )
        })
        .collect();
    let lease = about(
        "Fenced leases of the Tollgate daemon, admitted by the policy's leases: rules.",
        vec![(text("subcommands"), replies::map(protocol, subcommands))],
    );
    replies::map(protocol, vec![(text("lease"), lease)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::resp::words::argv;

    #[test]
    fn acquire_reads_its_options_in_any_order_and_case() {
        let Ok(Call::Acquire {
            resource,
            request,
            binding,
        }) = parse(&argv(
            "LEASE acquire orders:1 5000 session op o-1 WAIT 250 owner me",
        ))
        else {
            panic!("a valid acquire");
        };
        assert_eq!(resource.as_str(), "orders:1");
        assert_eq!(request.ttl, Duration::from_millis(5000));
        assert_eq!(request.wait, Duration::from_millis(250));
        assert_eq!(
            (
                request.attempt.owner.as_str(),
                request.attempt.operation_id.as_str()
            ),
            ("me", "o-1")
        );
        assert_eq!(binding, Binding::Session);
        assert!(!request.watchdog);
    }

    #[test]
    fn a_value_goes_with_the_acquisition_as_text() {
        let value = |words| match parse(&argv(words)) {
            Ok(Call::Acquire { request, .. }) => request.value,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            value("LEASE ACQUIRE r 1000 VALUE node-a:8080 SESSION"),
            Some("node-a:8080".to_owned())
        );
        assert_eq!(value("LEASE ACQUIRE r 1000"), None);
        let mut words = argv("LEASE ACQUIRE r 1000 VALUE x");
        words[5] = &[0xff_u8][..];
        assert!(parse(&words).unwrap_err().contains("UTF-8"));
    }

    #[test]
    fn permits_count_and_mode_ask_for_a_shared_shape() {
        let request = |words| match parse(&argv(words)) {
            Ok(Call::Acquire { request, .. }) => request,
            other => panic!("{other:?}"),
        };
        let semaphore = request("LEASE ACQUIRE r 1000 PERMITS 5 count 2");
        assert_eq!((semaphore.permits, semaphore.count), (Some(5), Some(2)));
        assert_eq!(
            request("LEASE ACQUIRE r 1000 mode read").mode,
            Some(Mode::Read)
        );
        assert_eq!(
            request("LEASE ACQUIRE r 1000 MODE Write").mode,
            Some(Mode::Write)
        );
        let exclusive = request("LEASE ACQUIRE r 1000");
        assert_eq!(
            (exclusive.permits, exclusive.count, exclusive.mode),
            (None, None, None)
        );
    }

    #[test]
    fn without_an_attempt_the_daemon_makes_a_fresh_one() {
        let attempt = |words| match parse(&argv(words)) {
            Ok(Call::Acquire { request, .. }) => request.attempt,
            other => panic!("{other:?}"),
        };
        let (a, b) = (
            attempt("LEASE ACQUIRE r 1000"),
            attempt("LEASE ACQUIRE r 1000"),
        );
        assert_ne!(a, b);
        assert!(a.validate().is_ok());
    }

    #[test]
    fn bad_input_names_what_is_wrong() {
        let error = |words| parse(&argv(words)).unwrap_err();
        assert!(error("LEASE").contains("wrong number"));
        assert!(error("LEASE ACQUIRE r").contains("lease|acquire"));
        assert!(error("LEASE ACQUIRE r soon").contains("ttl-ms"));
        assert!(error("LEASE ACQUIRE r 1000 OWNER o").contains("OWNER and OP"));
        assert!(error("LEASE ACQUIRE r 1000 WAIT 1 WAIT 2").contains("twice"));
        assert!(error("LEASE ACQUIRE r 1000 WAIT").contains("needs a value"));
        assert!(error("LEASE ACQUIRE r 1000 COLOUR red").contains("unknown option"));
        assert!(error("LEASE ACQUIRE r/1 1000").contains("resource"));
        assert!(error("LEASE ACQUIRE r 1000 SESSION WATCHDOG").contains("exclude"));
        assert!(error("LEASE RENEW r 1000").contains("required"));
        assert!(error("LEASE ACQUIRE r 1000 MODE SHARED").contains("READ or WRITE"));
        assert!(error("LEASE ACQUIRE r 1000 PERMITS many").contains("PERMITS"));
        assert!(error("LEASE RELEASE r OWNER o").contains("OWNER and OP"));
        assert!(error("LEASE STEAL r").contains("unknown subcommand"));
        assert!(error("LEASE ACQUIRE r 1000 SESSION session").contains("SESSION given twice"));
        assert!(error("LEASE RELEASE r OWNER o OP p op q").contains("OP given twice"));
    }

    #[test]
    fn owner_op_and_resource_that_are_not_utf8_are_read_as_lossy_text() {
        let mut words = argv("LEASE RELEASE r OWNER o OP p");
        let (owner, op): (&[u8], &[u8]) = (b"o\xffwn", b"\xc3");
        (words[4], words[6]) = (owner, op);
        let Ok(Call::Release { request, .. }) = parse(&words) else {
            panic!("a release");
        };
        assert_eq!(request.attempt.owner, String::from_utf8_lossy(owner));
        assert_eq!(request.attempt.operation_id, String::from_utf8_lossy(op));
        assert_eq!(
            resource(b"r\xff").map(|r| r.as_str().to_owned()),
            Resource::parse(&String::from_utf8_lossy(b"r\xff"))
                .map(|r| r.as_str().to_owned())
                .map_err(|error| format!("ERR tollgate: resource: {error}"))
        );
    }
}
