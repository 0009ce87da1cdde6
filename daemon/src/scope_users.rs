//! The policy's scopes (`tollgate_policy::scope`) as the lanes' scope users: the one place that
//! knows both, since the lanes know nothing of policies.

use tollgate_lanes::{ScopeSelector, ScopeUser};
use tollgate_policy::scope::Scope;

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
            })
            .collect(),
    }
}
