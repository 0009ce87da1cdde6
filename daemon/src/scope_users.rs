//! The policy's scopes (`tollgate_policy::scope`) as the lanes' scope users, and the logins of
//! those ready for use: the one place that knows both, since the lanes know nothing of policies.
//! On the embedded Redis the daemon, its administrator, makes them on every reload. On an
//! external Redis the operator makes them (`tollgate redis-acl` prints them, their passwords in
//! files of `lanes.scopes.passwords`), and the daemon checks each on every master and replica
//! before it uses it (`tollgate_lanes::check_scope_users`). A scoped principal whose scope user is not ready
//! has its scripts refused, saying so, never run unconfined.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use tollgate_lanes::{
    Endpoint, Lanes, LanesConfig, ProvisionedUsers, ScopeLogin, ScopeSelector, ScopeUser,
    ScopeUserCheck,
};
use tollgate_policy::scope::Scope;
use tollgate_policy::Generation;

/// Where the scope users come from.
pub enum Provisioning<'a> {
    /// The daemon makes them on its embedded server.
    Embedded(&'a ProvisionedUsers, &'a Endpoint),
    /// The operator made them on an external Redis; their passwords are in
    /// `clients.scopes.passwords` (`None`: not configured) and the lease lanes check them.
    External {
        leases: &'a Lanes,
        clients: &'a LanesConfig,
    },
}

/// The logins of the scope users ready for use, by user name; cheap to clone.
#[derive(Clone, Default)]
pub struct ScopeLogins(Arc<RwLock<HashMap<String, ScopeLogin>>>);

impl ScopeLogins {
    pub fn of(&self, user: &str) -> Option<ScopeLogin> {
        self.0.read().get(user).cloned()
    }

    /// Makes ready the scope users `generation` needs, as `provisioning` allows, and keeps
    /// their logins (only theirs: a scope of an older generation is forgotten).
    pub async fn follow(&self, generation: &Generation, provisioning: Provisioning<'_>) {
        let scopes = &generation.scopes().scopes;
        let wanted: Vec<(String, Vec<String>)> = scopes
            .iter()
            .map(|scope| {
                let user = scope_user(scope);
                (user.name.clone(), user.acl_rules())
            })
            .collect();
        let logins = match provisioning {
            Provisioning::Embedded(users, endpoint) => {
                match users.set_scopes(endpoint, wanted).await {
                    Ok(logins) => {
                        tracing::info!(scopes = logins.len(), "scope users cut to the policy");
                        logins
                    }
                    Err(error) => {
                        tracing::warn!(
                            %error,
                            "cannot set the scope users for the policy; scoped principals' \
                             scripts are refused"
                        );
                        Vec::new()
                    }
                }
            }
            Provisioning::External { leases, clients } => {
                let names: Vec<String> = wanted.into_iter().map(|(name, _)| name).collect();
                external(leases, clients, &names).await
            }
        };
        *self.0.write() = logins
            .into_iter()
            .map(|login| (login.user.clone(), login))
            .collect();
    }
}

/// The logins of the scope users `names` on an external Redis that are ready: a password file
/// in `lanes.scopes.passwords`, and every master and replica holds the user, out of the reserved
/// keyspace. Each one that
/// is not is logged, saying what to do.
async fn external(leases: &Lanes, clients: &LanesConfig, names: &[String]) -> Vec<ScopeLogin> {
    if names.is_empty() {
        return Vec::new();
    }
    let Some(dir) = clients.scopes.passwords.as_deref() else {
        tracing::warn!(
            scopes = names.len(),
            "the policy confines some principals' scripts to scopes; on an external Redis the \
             operator makes their users (`tollgate redis-acl --config … --passwords DIR` prints \
             them) and names DIR in lanes.scopes.passwords, which is not set: their scripts are \
             refused"
        );
        return Vec::new();
    };
    let mut found = Vec::new();
    for name in names {
        let file = dir.join(format!("{name}.password"));
        match std::fs::read_to_string(&file) {
            Ok(text) => found.push(ScopeLogin {
                user: name.clone(),
                password: text.lines().next().unwrap_or_default().to_owned(),
            }),
            Err(error) => tracing::warn!(
                user = %name,
                file = %file.display(),
                %error,
                "no password for this scope user: its principals' scripts are refused \
                 (`tollgate redis-acl --config … --passwords DIR` writes it)"
            ),
        }
    }
    let users: Vec<String> = found.iter().map(|login| login.user.clone()).collect();
    let checks = match tollgate_lanes::check_scope_users(leases, clients, &users).await {
        Ok(checks) => checks,
        Err(error) => {
            tracing::warn!(
                %error,
                "cannot check the scope users: scoped principals' scripts are refused"
            );
            return Vec::new();
        }
    };
    let mut ready = Vec::new();
    for (login, check) in found.into_iter().zip(checks) {
        match check {
            ScopeUserCheck::Ready => ready.push(login),
            ScopeUserCheck::Missing { server } => tracing::warn!(
                user = %login.user,
                %server,
                "this server has no such scope user: its principals' scripts are refused (run \
                 the lines `tollgate redis-acl --config …` prints on every server)"
            ),
            ScopeUserCheck::ReachesReserved { server, probe } => tracing::error!(
                user = %login.user,
                %server,
                %probe,
                "this scope user may reach the daemon's reserved keyspace: never used, its \
                 principals' scripts are refused (make it again from `tollgate redis-acl`)"
            ),
            ScopeUserCheck::Unclear { server, reason } => tracing::warn!(
                user = %login.user,
                %server,
                %reason,
                "cannot tell whether this scope user is ready: its principals' scripts are refused"
            ),
        }
    }
    tracing::info!(
        scopes = names.len(),
        ready = ready.len(),
        "scope users of the external Redis checked"
    );
    ready
}

/// `scope` as the Redis user its principals' scripts run as.
pub fn scope_user(scope: &Scope) -> ScopeUser {
    ScopeUser {
        name: scope.user.clone(),
        root: scope
            .scripts
            .iter()
            .chain(&scope.keyless)
            .cloned()
            .collect(),
        selectors: scope
            .selectors
            .iter()
            .map(|selector| ScopeSelector {
                commands: selector.commands.clone(),
                patterns: selector.patterns.clone(),
                read_only: selector.read_only,
                channels: selector.channels,
            })
            .collect(),
    }
}

/// The scopes of `generation` as `tollgate policy scopes` prints them: for each, its user, whose
/// scripts it holds and which rules' grants, then its `ACL SETUSER` rules after `reset`, one a
/// line (the password aside), so that a policy change shows up as a diff of what Redis enforces.
pub fn render(generation: &Generation) -> String {
    let scopes = generation.scopes();
    if scopes.scopes.is_empty() {
        return "no scopes: no principal's scripts are confined to its keys\n".to_owned();
    }
    let mut out = String::new();
    for scope in &scopes.scopes {
        let whose: Vec<&str> = scope
            .principals
            .iter()
            .map(|p| p.as_deref().unwrap_or("(unmapped)"))
            .collect();
        let channels = if scope.channel_rules.is_empty() {
            String::new()
        } else {
            format!("; channels of {}", scope.channel_rules.join(", "))
        };
        out.push_str(&format!(
            "{}: scripts of {} (rules {}{channels})\n",
            scope.user,
            whose.join(", "),
            if scope.rules.is_empty() {
                "none".to_owned()
            } else {
                scope.rules.join(", ")
            }
        ));
        for rule in scope_user(scope).acl_rules() {
            out.push_str(&format!("  {rule}\n"));
        }
    }
    out
}
