//! Where a session's script commands go. A key-constrained principal's scripts run as its
//! scope's Redis user (`tollgate_policy::scope`), on that scope's pool of connections, so that
//! Redis refuses a `redis.call` on a key the policy does not grant; everyone else's run on the
//! SCRIPT lane. Every command the session sends on its SCRIPT channel (EVAL, EVALSHA, FCALL, their
//! `_RO` forms, SCRIPT LOAD, …) goes to the same place, so a script cache miss (`NOSCRIPT`) and
//! the `SCRIPT LOAD` after it behave as Redis's own: the cache is the server's.
//!
//! Inside a transaction a script runs on the session's pinned TRANSACTION connection, so a scoped
//! principal's transaction runs with that connection logged in as its scope user from WATCH or
//! MULTI on (`transaction.rs`; the lane logs it back in as its own user when it is given back):
//! a script inside `MULTI` or after `WATCH` is held to the scope as one on the SCRIPT channel is.
//! Redis then judges the transaction's other commands by the scope too; they were admitted by
//! the same rules the scope's selectors are cut from. A script in a transaction whose connection
//! is not its scope's (the scope user is not provisioned, as on an external Redis, or a reload
//! moved the principal to another scope since WATCH/MULTI) is refused.

use bytes::Bytes;
use tollgate_lanes::{Channel, ScopeLogin};
use tollgate_model::{Caller, Protocol};
use tollgate_policy::{Denial, DenyCause};

use super::plan::Plan;
use super::refusal::Refusal;
use super::replies;
use crate::services::Services;

/// The commands that run a script as the connection's user.
pub const RUN_SCRIPTS: [&str; 6] = [
    "EVAL",
    "EVAL_RO",
    "EVALSHA",
    "EVALSHA_RO",
    "FCALL",
    "FCALL_RO",
];

/// The scope user `caller`'s scripts run as under the active policy; `None`: the SCRIPT lane.
pub fn scope_of(services: &Services, caller: &Caller) -> Option<String> {
    let generation = services.admission.current();
    let scope = generation.scopes().of(&caller.principal)?;
    Some(scope.user.clone())
}

/// The login of the scope user `caller`'s transactions run as, if it is scoped and the daemon
/// provisioned its scope's user.
pub fn login(services: &Services, caller: &Caller) -> Option<ScopeLogin> {
    services
        .lane_users
        .scope_login(&scope_of(services, caller)?)
}

/// Why a scope user has no login: what the operator reads.
const NOT_READY: &str = "is not ready on this Redis (the daemon makes scope users on its \
    embedded Redis; on an external one the operator makes them from `tollgate redis-acl` and \
    names their passwords' directory in lanes.scopes.passwords, on every node of a cluster; the \
    daemon's log says which)";

/// A channel on the pool of the scope user `user`; `Err`: the reply to give instead.
pub fn channel(
    services: &Services,
    caller: &Caller,
    user: &str,
    protocol: Protocol,
) -> Result<Channel, Bytes> {
    let Some(login) = services.lane_users.scope_login(user) else {
        return Err(Bytes::from(format!(
            "-NOPERM tollgate: the scripts of {} run as the scope user {user}, which {NOT_READY}\r\n",
            caller.principal
        )));
    };
    services
        .lanes
        .scoped_speaking(&login, protocol)
        .map_err(|error| replies::lane_failed(&error))
}

/// `plan` for the script command `name`, refused when it would run in a transaction for a
/// principal whose scripts are confined to a scope, on a connection not logged in as that
/// scope's user. `pinned`: the user the transaction's connection is logged in as (`Some(None)`:
/// the lane's), or `None` while none is pinned yet (a cluster's MULTI waits for a slot), when the
/// connection it will pin logs in as the scope's user if that user is ready.
pub fn in_transaction(
    plan: Plan,
    name: &str,
    services: &Services,
    caller: &Caller,
    pinned: Option<Option<&str>>,
) -> Plan {
    // The policy's generation is only looked at for a script in a transaction: every other
    // command pays two comparisons.
    let transaction = matches!(plan, Plan::Transaction | Plan::TransactionIn(_));
    if !transaction || !RUN_SCRIPTS.contains(&name) {
        return plan;
    }
    let Some(user) = scope_of(services, caller) else {
        return plan;
    };
    let login = services.lane_users.scope_login(&user);
    match pinned {
        Some(acting) if acting == Some(user.as_str()) => return plan,
        None if login.is_some() => return plan,
        _ => {}
    }
    let why = match login {
        None => format!("its scope user {user} {NOT_READY}, so its transactions run unconfined"),
        Some(_) => format!(
            "this transaction began before the policy put its scripts in scope {user}; run it \
             again"
        ),
    };
    Plan::Refuse(Refusal::Denied(Denial {
        rule: "scope".into(),
        module: "tollgate".into(),
        reason: format!(
            "the scripts of {} run in its scope, and {why}",
            caller.principal
        ),
        cause: DenyCause::Rule,
        command: name.to_owned(),
    }))
}
