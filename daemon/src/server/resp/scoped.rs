//! Where a session's script commands go. A key-constrained principal's scripts run as its
//! scope's Redis user (`tollgate_policy::scope`), on that scope's pool of connections, so that
//! Redis refuses a `redis.call` on a key the policy does not grant; everyone else's run on the
//! SCRIPT lane. Every command the session sends on its SCRIPT channel (EVAL, EVALSHA, FCALL, their
//! `_RO` forms, SCRIPT LOAD, …) goes to the same place, so a script cache miss (`NOSCRIPT`) and
//! the `SCRIPT LOAD` after it behave as Redis's own: the cache is the server's.
//!
//! Inside a transaction a script would run on the TRANSACTION connection, whose user no scope
//! confines: a scoped principal's scripts are refused there (not yet supported).

use bytes::Bytes;
use tollgate_lanes::Channel;
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

/// A channel on the pool of the scope user `user`; `Err`: the reply to give instead.
pub fn channel(
    services: &Services,
    caller: &Caller,
    user: &str,
    protocol: Protocol,
) -> Result<Channel, Bytes> {
    let Some(login) = services.lane_users.scope_login(user) else {
        return Err(Bytes::from(format!(
            "-NOPERM tollgate: the scripts of {} run as the scope user {user}, which the daemon \
             has not made (scopes are made on the daemon's embedded Redis only)\r\n",
            caller.principal
        )));
    };
    services
        .lanes
        .scoped_speaking(&login, protocol)
        .map_err(|error| replies::lane_failed(&error))
}

/// `plan` for the script command `name`, refused when it would run in a transaction for a
/// principal whose scripts are confined to a scope.
pub fn in_transaction(plan: Plan, name: &str, services: &Services, caller: &Caller) -> Plan {
    // The policy's generation is only looked at for a script in a transaction: every other
    // command pays two comparisons.
    let transaction = matches!(plan, Plan::Transaction | Plan::TransactionIn(_));
    if !transaction || !RUN_SCRIPTS.contains(&name) || scope_of(services, caller).is_none() {
        return plan;
    }
    Plan::Refuse(Refusal::Denied(Denial {
        rule: "scope".into(),
        module: "tollgate".into(),
        reason: format!(
            "the scripts of {} run in its scope, and a transaction's connection is not confined \
             to it (scripts in MULTI or after WATCH are not supported for scoped principals yet)",
            caller.principal
        ),
        cause: DenyCause::Rule,
        command: name.to_owned(),
    }))
}
