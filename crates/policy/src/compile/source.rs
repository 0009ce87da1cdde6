//! The YAML a policy author writes, as serde reads it (unknown fields are errors).

use std::collections::BTreeMap;

use serde::Deserialize;
use tollgate_model::ByteSize;
use tollgate_policy_rules::Mode;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub principals: BTreeMap<String, PrincipalSource>,
    #[serde(default)]
    pub rules: Vec<RuleSource>,
    /// Expectations `tollgate policy test` checks against this very policy.
    #[serde(default)]
    pub tests: Vec<TestSource>,
    /// What must never, or always, be admitted whatever the rules say: proven over every request
    /// class at each compile and reload.
    #[serde(default)]
    pub invariants: Vec<InvariantSource>,
    /// Limits each principal is held to: commands and bytes per second, leases held at once, how
    /// long its scripts may run.
    #[serde(default)]
    pub quotas: Vec<QuotaSource>,
}

/// One quota: an id, whom it holds (every principal but administrators when absent), and at least
/// one limit.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaSource {
    pub id: String,
    pub principals: Option<Vec<String>>,
    pub commands_per_second: Option<u64>,
    /// How many commands a full bucket gives at once; one second's worth when absent.
    pub burst: Option<u64>,
    pub bytes_per_second: Option<ByteSize>,
    /// Leases held at once.
    pub leases: Option<u64>,
    /// How long one of the principal's scripts may run, when shorter than the daemon's
    /// `resp.script_time_limit`.
    #[serde(default, with = "humantime_serde")]
    pub script_time_limit: Option<std::time::Duration>,
}

/// One invariant: an id and exactly one of `never` or `always`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvariantSource {
    pub id: String,
    pub never: Option<SelectorSource>,
    pub always: Option<SelectorSource>,
}

/// The requests an invariant speaks of, written as a rule's target is (`principals`, then
/// `commands` with optional `keys`, `channels` and `lanes`, or `leases`). Keys and channels read
/// as a rule's do: under `never`, a request with any in the globs; under `always`, one whose
/// every one is.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectorSource {
    pub principals: Option<Vec<String>>,
    pub commands: Option<Vec<String>>,
    pub keys: Option<Vec<String>>,
    /// Channel globs for the pub/sub commands that name channels, as a rule's `channels:`.
    pub channels: Option<Vec<String>>,
    pub lanes: Option<Vec<String>>,
    pub leases: Option<Vec<String>>,
}

/// Who a principal is: peer credentials that map to it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrincipalSource {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
    pub users: Vec<String>,
    pub groups: Vec<String>,
    /// Every local peer not matched by a more specific principal.
    pub any: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSource {
    pub id: String,
    pub principals: Option<Vec<String>>,
    pub commands: Option<Vec<String>>,
    pub keys: Option<Vec<String>>,
    /// Channel globs for the pub/sub commands that name channels (docs/policy.md, "Channels").
    pub channels: Option<Vec<String>>,
    pub lanes: Option<Vec<String>>,
    pub leases: Option<Vec<String>>,
    pub allow: Option<String>,
    pub deny: Option<String>,
    /// `unconstrained`: the author accepts that scripts this rule allows reach keys its `keys:`
    /// does not grant.
    pub scripts: Option<ScriptAccess>,
}

/// What a key-constrained rule that allows scripts says about the keys they reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScriptAccess {
    /// A script may reach any key, whatever the rule's `keys:` say.
    Unconstrained,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Expected {
    Allow,
    Deny,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestSource {
    pub principal: String,
    /// A command line, split on whitespace (`SET app:1 v`), or `LEASE <resource>`.
    pub command: String,
    pub expect: Expected,
    /// The rule expected to decide, when it matters.
    pub rule: Option<String>,
}
