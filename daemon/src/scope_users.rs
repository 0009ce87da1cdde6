//! The policy's scopes (`tollgate_policy::scope`) as the lanes' scope users, and the logins of
//! those the daemon made: the one place that knows both, since the lanes know nothing of
//! policies. Scope users are made on the embedded Redis only, where the daemon is administrator;
//! on an external Redis a key-constrained principal's scripts are refused, saying so.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use tollgate_lanes::{Endpoint, ProvisionedUsers, ScopeLogin, ScopeSelector, ScopeUser};
use tollgate_policy::scope::Scope;
use tollgate_policy::Generation;

/// The logins of the scope users the daemon made, by user name; cheap to clone.
#[derive(Clone, Default)]
pub struct ScopeLogins(Arc<RwLock<HashMap<String, ScopeLogin>>>);

impl ScopeLogins {
    pub fn of(&self, user: &str) -> Option<ScopeLogin> {
        self.0.read().get(user).cloned()
    }

    /// Makes the scope users `generation` needs on `provisioned`'s server (none are made
    /// without one), and keeps their logins.
    pub async fn follow(
        &self,
        generation: &Generation,
        provisioned: Option<(&ProvisionedUsers, &Endpoint)>,
    ) {
        let scopes = &generation.scopes().scopes;
        let wanted: Vec<(String, Vec<String>)> = scopes
            .iter()
            .map(|scope| {
                let user = scope_user(scope);
                (user.name.clone(), user.acl_rules())
            })
            .collect();
        let Some((users, endpoint)) = provisioned else {
            if !scopes.is_empty() {
                tracing::warn!(
                    scopes = scopes.len(),
                    "the policy confines some principals' scripts to scopes, which the daemon                      makes on its embedded Redis only: their scripts are refused"
                );
            }
            self.0.write().clear();
            return;
        };
        match users.set_scopes(endpoint, wanted).await {
            Ok(logins) => {
                tracing::info!(scopes = logins.len(), "scope users cut to the policy");
                *self.0.write() = logins
                    .into_iter()
                    .map(|login| (login.user.clone(), login))
                    .collect();
            }
            Err(error) => tracing::warn!(
                %error,
                "cannot set the scope users for the policy; scoped principals' scripts are refused"
            ),
        }
    }
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
