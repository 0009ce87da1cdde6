//! Redis keeps one namespace of scripts and function libraries for every user: `FUNCTION FLUSH`
//! wipes every tenant's libraries, `SCRIPT KILL` and `FUNCTION KILL` stop whichever script runs,
//! `FUNCTION LIST WITHCODE` shows every tenant's code. For a principal that an allow rule confines
//! to keys (a tenant; its scripts run in a scope, `scoped.rs`) the daemon divides it:
//!
//! - `FUNCTION LOAD` marks the library as the tenant's (`library.rs`); a library of another
//!   tenant or of the operator is not the tenant's to replace. `FUNCTION LIST` shows, `FUNCTION
//!   DELETE` and `FUNCTION FLUSH` delete, only the tenant's own libraries; `FCALL` of another
//!   tenant's function is refused (the operator's stay callable, as the policy grants).
//! - `SCRIPT KILL` and `FUNCTION KILL` stop the running script only when it is one of the
//!   tenant's (every script of that kind the daemon has in flight is this OS user's, and for a
//!   function Redis names it as one of the tenant's libraries); otherwise Redis's `NOTBUSY`.
//!   `FUNCTION STATS` names the running script only to its own tenant.
//! - `SCRIPT FLUSH` empties the tenant's view of the script cache (Redis's stays, with everyone
//!   else's scripts): its `EVALSHA` of a script it has not loaded or run since is `NOSCRIPT`, and
//!   `SCRIPT EXISTS` says 0 for it.
//! - `FUNCTION DUMP` and `FUNCTION RESTORE` act on everyone's libraries at once: refused.
//!   Inside a transaction every one of these is refused (the TRANSACTION connection runs it raw).
//!
//! Callers that reach every key (operators) keep Redis's namespace whole. On a Redis Cluster, where
//! each master keeps its own copy of the libraries, a tenant's namespace commands are refused (not
//! divided there yet). What stays shared is documented in
//! docs/policy.md ("Scripts and libraries").

mod library;
mod registry;
pub mod shared;

use bytes::{Bytes, BytesMut};
use tollgate_lanes::{Channel, Multiplexed, Reply, Shape};
use tollgate_model::{Caller, Protocol};
use tollgate_policy::{Denial, DenyCause};
use tollgate_resp::{Command, Frame};

use library::Named;
pub use registry::{InFlight, Namespace, ScriptKind, Whose};
use shared::Shared;

use super::plan::Plan;
use super::refusal::Refusal;
use super::replies;
use crate::services::Services;

/// Whether the command `name` may change the libraries (whoever sends it).
fn changes_libraries(name: &str) -> bool {
    matches!(
        name,
        "FUNCTION|LOAD" | "FUNCTION|DELETE" | "FUNCTION|FLUSH" | "FUNCTION|RESTORE"
    )
}

fn denial(name: &str, reason: String) -> Denial {
    Denial {
        rule: "scope".into(),
        module: "tollgate".into(),
        reason,
        cause: DenyCause::Rule,
        command: name.to_owned(),
    }
}

fn denied(name: &str, reason: String) -> Plan {
    Plan::Refuse(Refusal::Denied(denial(name, reason)))
}

/// `plan` for the admitted command `name`, as the caller's place in the namespace makes it.
pub fn plan(
    plan: Plan,
    name: &str,
    command: &Command,
    services: &Services,
    caller: &Caller,
) -> Plan {
    let shared = Shared::of(name);
    let fcall = matches!(name, "FCALL" | "FCALL_RO");
    // The script cache is looked at only once some tenant has flushed its view of it.
    let cached = services.namespace.any_flushed()
        && matches!(
            name,
            "EVAL" | "EVAL_RO" | "EVALSHA" | "EVALSHA_RO" | "SCRIPT|LOAD" | "SCRIPT|EXISTS"
        );
    if shared.is_none() && !fcall && !cached {
        return plan;
    }
    if changes_libraries(name) {
        services.namespace.changed();
    }
    if matches!(plan, Plan::Refuse(_)) || !divided_for(services, caller) {
        return plan;
    }
    if matches!(plan, Plan::Transaction | Plan::TransactionIn(_)) {
        // A scoped tenant's scripts in a transaction are refused already (`scoped.rs`).
        return match shared {
            Some(_) => denied(
                name,
                format!(
                    "{} shares Redis's script and function namespace with other tenants, \
                     and a transaction's connection would run it undivided",
                    caller.principal
                ),
            ),
            None => plan,
        };
    }
    if let Some(shared) = shared {
        // A library lives on every master of a cluster, each with its own copy to load, list and
        // delete: not divided there yet, and so not a tenant's at all.
        if matches!(services.lanes.shape(), Shape::Cluster(_)) {
            return denied(
                name,
                format!(
                    "{} is a tenant of Redis's script and function namespace, which the daemon \
                     does not divide on a Redis Cluster yet",
                    caller.principal
                ),
            );
        }
        return Plan::Namespace(shared);
    }
    if cached {
        return seen(plan, name, command, &services.namespace, caller);
    }
    let Some(function) = command.word(1) else {
        return plan;
    };
    match services.namespace.whose(function) {
        Whose::Unread => Plan::Namespace(Shared::FCall),
        Whose::Operator => plan,
        Whose::Tenant { owner, .. } if owner == caller.principal => plan,
        Whose::Tenant { library, .. } => denied(name, called_elsewhere(function, &library)),
    }
}

/// Whether `caller`'s part of the namespace is its own: an allow rule confines it to keys (a
/// tenant), whether or not its scripts run in a scope. Callers that reach every key (operators)
/// keep Redis's namespace whole.
pub fn divided_for(services: &Services, caller: &Caller) -> bool {
    services
        .admission
        .current()
        .confined_to_keys(&caller.principal)
}

/// A script command of a tenant while some tenant has its own view of the script cache: what it
/// loads or runs is in its view from now on; an `EVALSHA` of a script out of its view is
/// `NOSCRIPT`, and its `SCRIPT EXISTS` is answered for its view.
fn seen(plan: Plan, name: &str, command: &Command, namespace: &Namespace, caller: &Caller) -> Plan {
    let tenant = caller.tenant();
    if !namespace.flushed(&tenant) {
        return plan;
    }
    match name {
        "EVAL" | "EVAL_RO" => {
            if let Some(body) = command.word(1) {
                namespace.saw(&tenant, registry::sha_of(body));
            }
            plan
        }
        "SCRIPT|LOAD" => {
            if let Some(body) = command.word(2) {
                namespace.saw(&tenant, registry::sha_of(body));
            }
            plan
        }
        "SCRIPT|EXISTS" => Plan::Namespace(Shared::ScriptExists),
        // EVALSHA and EVALSHA_RO.
        _ => match command.word(1).and_then(registry::sha_named) {
            Some(sha) if !namespace.knows(&tenant, &sha) => Plan::Namespace(Shared::NoScript),
            _ => plan,
        },
    }
}

fn called_elsewhere(function: &[u8], library: &str) -> String {
    format!(
        "function {} is of library {library}, which another tenant loaded",
        String::from_utf8_lossy(function)
    )
}

/// What a namespace command comes to.
pub enum Served {
    /// This reply.
    Reply(Bytes),
    /// The command goes on as planned before (an `FCALL` found to be the caller's to make).
    Forward,
}

/// Where a namespace command is served.
pub struct At<'a> {
    pub services: &'a Services,
    pub caller: &'a Caller,
    pub protocol: Protocol,
}

impl At<'_> {
    /// A channel of the SCRIPT lane: its user runs the namespace commands (the kills and
    /// `FUNCTION STATS` go on its kill connection, which Redis reads while a script is busy).
    fn channel(&self) -> Result<Channel, Bytes> {
        self.services
            .lanes
            .multiplexed_speaking(Multiplexed::Script, self.protocol)
            .map_err(|error| replies::lane_failed(&error))
    }

    /// Sends `argv`; the reply as it came (Redis's error included).
    async fn call(&self, argv: &[&[u8]]) -> Result<Bytes, Bytes> {
        Ok(self.send(argv).await?.into_bytes())
    }

    async fn send(&self, argv: &[&[u8]]) -> Result<Reply, Bytes> {
        let mut encoded = BytesMut::new();
        tollgate_resp::encode_command(argv, &mut encoded);
        let reply = self.channel()?.send(encoded.freeze()).await;
        reply.map_err(|error| replies::call_failed(&error))
    }

    /// Sends `argv`; the reply as a frame, Redis's error as the client's reply.
    async fn frame(&self, argv: &[&[u8]]) -> Result<Frame, Bytes> {
        let reply = self.send(argv).await?;
        if reply.is_error() {
            return Err(reply.into_bytes());
        }
        reply
            .frame()
            .map_err(|error| replies::error(format!("ERR tollgate: unreadable reply: {error}")))
    }

    /// `FUNCTION LIST [LIBRARYNAME pattern] WITHCODE`; a whole list (no pattern) is also kept as
    /// whose the functions are, unless they changed while it was read.
    async fn list(&self, pattern: Option<&[u8]>) -> Result<Frame, Bytes> {
        let began = self.services.namespace.reading();
        let mut argv: Vec<&[u8]> = vec![b"FUNCTION", b"LIST"];
        if let Some(pattern) = pattern {
            argv.extend([b"LIBRARYNAME".as_slice(), pattern]);
        }
        argv.push(b"WITHCODE");
        let frame = self.frame(&argv).await?;
        if let (None, Some(listed)) = (pattern, library::listed(&frame)) {
            self.services.namespace.read(began, &listed);
        }
        Ok(frame)
    }

    /// The libraries whose names match `pattern` (all when `None`), with their code.
    async fn libraries(&self, pattern: Option<&[u8]>) -> Result<Vec<library::Listed>, Bytes> {
        let frame = self.list(pattern).await?;
        library::listed(&frame).ok_or_else(|| {
            replies::error("ERR tollgate: FUNCTION LIST answered unexpectedly".into())
        })
    }

    /// The library named exactly `name`, if there is one (library names hold no glob character).
    async fn library(&self, name: &str) -> Result<Option<library::Listed>, Bytes> {
        let found = self.libraries(Some(name.as_bytes())).await?;
        Ok(found.into_iter().find(|library| library.name == name))
    }

    fn notbusy(&self) -> Bytes {
        replies::error(format!(
            "NOTBUSY No scripts in execution right now. (tollgate: none of {}'s, this user's)",
            self.caller.principal
        ))
    }
}

/// Serves `shared` for the command `argv`.
pub async fn serve(shared: Shared, argv: &[Bytes], at: At<'_>) -> Served {
    let reply = match shared {
        Shared::FCall => return fcall(argv, &at).await,
        Shared::ScriptKill => script_kill(&at).await,
        Shared::FunctionKill => function_kill(&at).await,
        Shared::FunctionStats => function_stats(&at).await,
        Shared::FunctionList => function_list(argv, &at).await,
        Shared::FunctionLoad => function_load(argv, &at).await,
        Shared::FunctionDelete => function_delete(argv, &at).await,
        Shared::FunctionFlush => function_flush(&at).await,
        Shared::ScriptFlush => script_flush(&at),
        Shared::ScriptExists => script_exists(argv, &at).await,
        Shared::NoScript => Err(replies::error(
            "NOSCRIPT No matching script. Please use EVAL.".into(),
        )),
        Shared::ScriptDebug => Err(replies::error(format!(
            "NOPERM tollgate: SCRIPT DEBUG would hold a connection {} shares with other \
             callers (and, SYNC, the whole server) for a debugging session",
            at.caller.principal
        ))),
        Shared::FunctionDump | Shared::FunctionRestore => Err(replies::error(format!(
            "NOPERM tollgate: FUNCTION DUMP and RESTORE carry every tenant's libraries at once; \
             {} loads, lists and deletes its own with FUNCTION LOAD, LIST and DELETE",
            at.caller.principal
        ))),
    };
    Served::Reply(reply.unwrap_or_else(|error| error))
}

async fn fcall(argv: &[Bytes], at: &At<'_>) -> Served {
    if let Err(error) = at.libraries(None).await {
        return Served::Reply(error);
    }
    let function = argv.get(1).map(|word| &word[..]).unwrap_or_default();
    match at.services.namespace.whose(function) {
        Whose::Tenant { owner, library } if owner != at.caller.principal => {
            let words: Vec<&[u8]> = argv.iter().map(|word| &word[..]).collect();
            let name = String::from_utf8_lossy(&argv[0]).to_uppercase();
            Served::Reply(replies::denied(
                &words,
                &denial(&name, called_elsewhere(function, &library)),
            ))
        }
        // Changed again while it was read: not judged on a guess.
        Whose::Unread => Served::Reply(replies::error(
            "TRYAGAIN tollgate: the function libraries changed while the daemon read whose they \
             are; send it again"
                .into(),
        )),
        _ => Served::Forward,
    }
}

/// `SCRIPT FLUSH [ASYNC|SYNC]`: Redis's cache stays (every tenant's scripts are in it); the
/// tenant's view of it is emptied, so that it knows only what it loads or runs from now on.
fn script_flush(at: &At<'_>) -> Result<Bytes, Bytes> {
    match at.services.namespace.flush(&at.caller.tenant()) {
        Ok(()) => Ok(replies::ok()),
        Err(registry::TooManyViews) => Err(replies::error(
            "BUSY tollgate: too many tenants have flushed their scripts for the daemon to keep \
             another view of the script cache"
                .into(),
        )),
    }
}

/// `SCRIPT EXISTS sha …` for a tenant with a view of its own: what Redis has and the tenant knows.
async fn script_exists(argv: &[Bytes], at: &At<'_>) -> Result<Bytes, Bytes> {
    let words: Vec<&[u8]> = argv.iter().map(|word| &word[..]).collect();
    let Frame::Array(answers) = at.frame(&words).await? else {
        return Err(replies::error(
            "ERR tollgate: SCRIPT EXISTS answered unexpectedly".into(),
        ));
    };
    let tenant = at.caller.tenant();
    let namespace = &at.services.namespace;
    let answers = answers
        .into_iter()
        .zip(argv.iter().skip(2))
        .map(|(answer, name)| match registry::sha_named(name) {
            Some(sha) if namespace.knows(&tenant, &sha) => answer,
            _ => Frame::Integer(0),
        })
        .collect();
    Ok(replies::encode(&Frame::Array(answers)))
}

async fn script_kill(at: &At<'_>) -> Result<Bytes, Bytes> {
    let tenant = at.caller.tenant();
    if !at
        .services
        .namespace
        .all_in_flight_are(ScriptKind::Eval, &tenant)
    {
        return Ok(at.notbusy());
    }
    at.call(&[b"SCRIPT", b"KILL"]).await
}

async fn function_kill(at: &At<'_>) -> Result<Bytes, Bytes> {
    let tenant = at.caller.tenant();
    if !at
        .services
        .namespace
        .all_in_flight_are(ScriptKind::Function, &tenant)
        || !runs_own_function(at).await?
    {
        return Ok(at.notbusy());
    }
    at.call(&[b"FUNCTION", b"KILL"]).await
}

/// Whether Redis is running a function of one of the caller's libraries.
async fn runs_own_function(at: &At<'_>) -> Result<bool, Bytes> {
    let stats = match at.frame(&[b"FUNCTION", b"STATS"]).await {
        Ok(stats) => stats,
        // BUSY: an EVAL runs, not a function.
        Err(error) if error.starts_with(b"-BUSY") => return Ok(false),
        Err(error) => return Err(error),
    };
    let Some(running) = library::running_function(&stats) else {
        return Ok(false);
    };
    if at.services.namespace.whose(running.as_bytes()) == Whose::Unread {
        at.libraries(None).await?;
    }
    Ok(matches!(
        at.services.namespace.whose(running.as_bytes()),
        Whose::Tenant { owner, .. } if owner == at.caller.principal
    ))
}

async fn function_stats(at: &At<'_>) -> Result<Bytes, Bytes> {
    let stats = at.frame(&[b"FUNCTION", b"STATS"]).await?;
    let running = library::running_function(&stats);
    let own = match running {
        None => true,
        Some(_) => {
            let tenant = at.caller.tenant();
            at.services
                .namespace
                .all_in_flight_are(ScriptKind::Function, &tenant)
                && runs_own_function(at).await?
        }
    };
    let stats = match own {
        true => stats,
        false => library::hide_running(stats, super::local::null(at.protocol)),
    };
    Ok(replies::encode(&stats))
}

/// `FUNCTION LIST [LIBRARYNAME pattern] [WITHCODE]`, cut to the caller's libraries.
async fn function_list(argv: &[Bytes], at: &At<'_>) -> Result<Bytes, Bytes> {
    let mut pattern = None;
    let mut with_code = false;
    let mut words = argv.iter().skip(2);
    while let Some(word) = words.next() {
        if word.eq_ignore_ascii_case(b"WITHCODE") {
            with_code = true;
        } else if word.eq_ignore_ascii_case(b"LIBRARYNAME") && pattern.is_none() {
            let Some(given) = words.next() else {
                return Err(replies::error(
                    "ERR library name argument was not given".into(),
                ));
            };
            pattern = Some(given.clone());
        } else {
            return Err(replies::error(format!(
                "ERR Unknown argument {}",
                String::from_utf8_lossy(word)
            )));
        }
    }
    let frame = at.list(pattern.as_deref()).await?;
    match library::own_libraries(frame, &at.caller.principal, with_code) {
        Some(own) => Ok(replies::encode(&own)),
        None => Err(replies::error(
            "ERR tollgate: FUNCTION LIST answered unexpectedly".into(),
        )),
    }
}

/// `FUNCTION LOAD [REPLACE] code`, the library marked as the caller's.
async fn function_load(argv: &[Bytes], at: &At<'_>) -> Result<Bytes, Bytes> {
    let (replace, code) = match argv {
        [_, _, code] => (false, code),
        [_, _, replace, code] if replace.eq_ignore_ascii_case(b"REPLACE") => (true, code),
        _ => {
            return Err(replies::error(
                "ERR tollgate: FUNCTION LOAD takes [REPLACE] and the library's code".into(),
            ))
        }
    };
    let name = match library::library_name(code) {
        Named::Library(name) => name,
        Named::Unreadable(why) => {
            return Err(replies::error(format!(
                "ERR tollgate: a tenant's library must begin `#!lua name=<name>`: {why}"
            )))
        }
    };
    let principal = &at.caller.principal;
    let _changing = at.services.namespace.changing.lock().await;
    if let Some(existing) = at.library(&name).await? {
        if existing.owner.as_deref() != Some(principal.as_str()) {
            return Err(replies::error(match replace {
                false => format!("ERR Library '{name}' already exists"),
                true => format!(
                    "ERR tollgate: library '{name}' is not {principal}'s to replace: another \
                     tenant or the operator loaded it"
                ),
            }));
        }
    }
    let owned = library::owned(code, principal);
    let mut argv: Vec<&[u8]> = vec![b"FUNCTION", b"LOAD"];
    if replace {
        argv.push(b"REPLACE");
    }
    argv.push(&owned);
    at.services.namespace.changed();
    let reply = at.call(&argv).await;
    // Whose the new functions are is read now, under the lock, so that no FCALL meanwhile finds
    // them unread for long.
    let _ = at.libraries(None).await;
    reply
}

/// `FUNCTION DELETE name`: only the caller's library; any other is "not found", as Redis says.
async fn function_delete(argv: &[Bytes], at: &At<'_>) -> Result<Bytes, Bytes> {
    let [_, _, name] = argv else {
        return Err(replies::error(
            "ERR wrong number of arguments for 'function|delete' command".into(),
        ));
    };
    let name = String::from_utf8_lossy(name).into_owned();
    let _changing = at.services.namespace.changing.lock().await;
    let own = at
        .library(&name)
        .await?
        .is_some_and(|library| library.owner.as_deref() == Some(at.caller.principal.as_str()));
    if !own {
        return Err(replies::error("ERR Library not found".into()));
    }
    at.services.namespace.changed();
    at.call(&[b"FUNCTION", b"DELETE", name.as_bytes()]).await
}

/// `FUNCTION FLUSH [ASYNC|SYNC]`: the caller's libraries deleted, one by one.
async fn function_flush(at: &At<'_>) -> Result<Bytes, Bytes> {
    let _changing = at.services.namespace.changing.lock().await;
    let libraries = at.libraries(None).await?;
    at.services.namespace.changed();
    for library in libraries {
        if library.owner.as_deref() != Some(at.caller.principal.as_str()) {
            continue;
        }
        let reply = at
            .call(&[b"FUNCTION", b"DELETE", library.name.as_bytes()])
            .await?;
        if reply.starts_with(b"-") {
            return Ok(reply);
        }
    }
    Ok(replies::ok())
}
