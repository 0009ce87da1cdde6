//! A compiled policy: ordered rules, first match decides. The host's compiler has already checked
//! names, categories and globs, so evaluation is a plain scan with no error paths.

use serde::{Deserialize, Serialize};

use crate::category::CategorySet;
use crate::channels::{self, Kind};
use crate::glob;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Denials are enforced.
    #[default]
    Enforce,
    /// Denials are reported but the command is allowed.
    Audit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Deny,
}

/// What a rule applies to: Redis commands, or lease resources (never both).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Commands {
        /// Canonical names (`GET`, `CLIENT|LIST`); a bare parent name (`CLIENT`) covers every
        /// subcommand.
        names: Vec<String>,
        categories: CategorySet,
        /// `*`: every command.
        any: bool,
        /// Key globs. An allow rule matches when every key of the command matches one, a deny
        /// rule when any key does ([`Action::keys_match`]). `None`: keys do not matter.
        keys: Option<Vec<String>>,
        /// Channel globs, read as `keys` are for the channels a pub/sub command names
        /// ([`channels`]): an allow rule matches when every channel (every channel a pattern can
        /// match) is granted, a deny rule when any may be. A shard channel is also a key: either
        /// field vouches for it. `None`: channels do not matter. Absent from policies compiled
        /// before channels were confined, hence the default.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        channels: Option<Vec<String>>,
        /// Bit `i` set: lane `i` in WIT order. `None`: any lane.
        lanes: Option<u8>,
    },
    Leases {
        resources: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub id: String,
    /// `None`: every principal.
    pub principals: Option<Vec<String>>,
    pub target: Target,
    pub action: Action,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompiledPolicy {
    pub mode: Mode,
    pub rules: Vec<Rule>,
}

/// What is being asked for.
pub enum Subject<'a, K> {
    Command {
        name: &'a str,
        categories: CategorySet,
        lane: u8,
        keys: &'a [K],
        /// The channels it names ([`channels::of`]); empty for a command that names none.
        channels: Channels<'a, K>,
    },
    Lease {
        resource: &'a [u8],
    },
}

/// The channels a command names, and how ([`Kind`]).
#[derive(Debug, Clone, Copy)]
pub struct Channels<'a, K> {
    pub kind: Kind,
    pub names: &'a [K],
}

impl<'a, K> Channels<'a, K> {
    /// A command that names no channel.
    pub fn none() -> Self {
        Channels {
            kind: Kind::Plain,
            names: &[],
        }
    }

    /// The channels of `argv` (its name `name`, canonical), none if it names none.
    pub fn of(name: &str, argv: &'a [K]) -> Self {
        match channels::of(name, argv) {
            Some((kind, names)) => Channels { kind, names },
            None => Channels::none(),
        }
    }
}

pub struct Request<'a, K> {
    pub principal: &'a str,
    pub subject: Subject<'a, K>,
}

/// The deciding rule, if any, and what it decided under the policy's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<'p> {
    Allow(&'p Rule),
    Deny(&'p Rule),
    /// `mode: audit`: this rule would deny; the command goes through.
    AuditDeny(&'p Rule),
    /// No rule matches; the chain's default (deny) applies.
    NoMatch,
}

impl CompiledPolicy {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a compiled policy always serialises")
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<CompiledPolicy, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// Whether any command rule matches on keys. When none does, a command's keys cannot change
    /// a decision, and an evaluator need not gather them.
    pub fn matches_keys(&self) -> bool {
        self.rules.iter().any(Rule::matches_keys)
    }

    /// Whether [`CompiledPolicy::evaluate`] gives the same outcome for every command of this
    /// `principal`, `name`, `categories` and `lane`, whatever its arguments: true when the first
    /// rule that can match such a command looks at none of its arguments (or no rule can match).
    /// A host may then reuse one evaluation's answer for all of them. Lease requests depend on
    /// their resource and are never argument-free, nor are commands that name channels (the
    /// guard refuses one whose channel did not cross whole, whatever the rules).
    pub fn decided_without_arguments(
        &self,
        principal: &str,
        name: &str,
        categories: CategorySet,
        lane: u8,
    ) -> bool {
        if name == crate::LEASE_COMMAND || channels::positions(name, usize::MAX).is_some() {
            return false;
        }
        for rule in &self.rules {
            if rule
                .principals
                .as_ref()
                .is_some_and(|principals| !principals.iter().any(|p| p == principal))
            {
                continue;
            }
            let Target::Commands {
                names,
                categories: rule_categories,
                any,
                keys,
                channels,
                lanes,
            } = &rule.target
            else {
                continue;
            };
            let may_match =
                (*any || rule_categories.intersects(categories) || names_cover(names, name))
                    && lanes.is_none_or(|mask| mask & (1 << lane) != 0);
            if may_match {
                // This rule decides every such command unless a condition on the arguments
                // passes some by; then the answer depends on them.
                return keys.is_none() && channels.is_none();
            }
        }
        true
    }

    /// Whether any command rule matches on channels (as [`CompiledPolicy::matches_keys`]).
    pub fn matches_channels(&self) -> bool {
        self.rules.iter().any(Rule::matches_channels)
    }

    pub fn evaluate<K: AsRef<[u8]>>(&self, request: &Request<'_, K>) -> Outcome<'_> {
        let Some(rule) = self.rules.iter().find(|rule| rule.matches(request)) else {
            return Outcome::NoMatch;
        };
        match (rule.action, self.mode) {
            (Action::Allow, _) => Outcome::Allow(rule),
            (Action::Deny, Mode::Enforce) => Outcome::Deny(rule),
            (Action::Deny, Mode::Audit) => Outcome::AuditDeny(rule),
        }
    }
}

impl Rule {
    /// Whether this is a command rule that matches on keys.
    pub fn matches_keys(&self) -> bool {
        matches!(self.target, Target::Commands { keys: Some(_), .. })
    }

    /// Whether this is a command rule that matches on channels.
    pub fn matches_channels(&self) -> bool {
        matches!(
            self.target,
            Target::Commands {
                channels: Some(_),
                ..
            }
        )
    }

    pub fn matches<K: AsRef<[u8]>>(&self, request: &Request<'_, K>) -> bool {
        if let Some(principals) = &self.principals {
            if !principals.iter().any(|p| p == request.principal) {
                return false;
            }
        }
        match (&self.target, &request.subject) {
            (
                Target::Commands {
                    names,
                    categories,
                    any,
                    keys,
                    channels,
                    lanes,
                },
                Subject::Command {
                    name,
                    categories: command_categories,
                    lane,
                    keys: command_keys,
                    channels: command_channels,
                },
            ) => {
                (*any || categories.intersects(*command_categories) || names_cover(names, name))
                    && lanes.is_none_or(|mask| mask & (1 << lane) != 0)
                    && self.action.names_match(
                        keys.as_deref(),
                        channels.as_deref(),
                        command_keys,
                        command_channels,
                    )
            }
            (Target::Leases { resources }, Subject::Lease { resource }) => {
                globs_match(resources, resource)
            }
            _ => false,
        }
    }
}

impl Action {
    /// Whether a command's keys satisfy a rule's key globs. An allow rule vouches for a command
    /// only when every key is one it grants; a deny rule refuses a command when any key is one it
    /// protects, so a decoy key next to a protected one (`DEL decoy protected:1`) cannot dodge it.
    /// Either way a key glob cannot vouch for or against a command that names no key (SCAN, DBSIZE,
    /// EXEC): a rule with `keys` matches only commands with keys.
    pub fn keys_match<K: AsRef<[u8]>>(self, globs: &[String], keys: &[K]) -> bool {
        let matching = |key: &K| globs_match(globs, key.as_ref());
        match self {
            Action::Allow => !keys.is_empty() && keys.iter().all(matching),
            Action::Deny => keys.iter().any(matching),
        }
    }
}

impl Action {
    /// Whether a command's keys and channels satisfy a rule's `keys` and `channels` (`None`:
    /// the rule does not constrain them). A rule that constrains neither matches whatever the
    /// command names. Otherwise a command that names channels is judged on them: plain channels
    /// and patterns by `channels` alone (`keys` never vouch for a channel), shard channels (which
    /// are also its keys) by either field; a command that names none is judged on its keys by
    /// `keys` ([`Action::keys_match`]), and a rule with only `channels` does not match it.
    pub fn names_match<K: AsRef<[u8]>>(
        self,
        key_globs: Option<&[String]>,
        channel_globs: Option<&[String]>,
        keys: &[K],
        named: &Channels<'_, K>,
    ) -> bool {
        if key_globs.is_none() && channel_globs.is_none() {
            return true;
        }
        if named.names.is_empty() {
            return key_globs.is_some_and(|globs| self.keys_match(globs, keys));
        }
        let by_channels = |globs: &[String]| match self {
            Action::Allow => channels::granted(globs, named.kind, named.names),
            Action::Deny => channels::hit(globs, named.kind, named.names),
        };
        match named.kind {
            Kind::Plain | Kind::Pattern => channel_globs.is_some_and(by_channels),
            Kind::Shard => {
                let empty: &[String] = &[];
                let (k, c) = (key_globs.unwrap_or(empty), channel_globs.unwrap_or(empty));
                let by = |channel: &K| {
                    let one = std::slice::from_ref(channel);
                    self.keys_match(k, one) || channels::hit(c, Kind::Shard, one)
                };
                match self {
                    Action::Allow => named.names.iter().all(by),
                    Action::Deny => named.names.iter().any(by),
                }
            }
        }
    }
}

fn names_cover(names: &[String], name: &str) -> bool {
    let parent = name.split_once('|').map_or(name, |(parent, _)| parent);
    names.iter().any(|n| n == name || n == parent)
}

fn globs_match(globs: &[String], text: &[u8]) -> bool {
    globs
        .iter()
        .any(|pattern| glob::matches(pattern.as_bytes(), text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Category;

    fn rule(id: &str, principals: Option<&[&str]>, target: Target, action: Action) -> Rule {
        Rule {
            id: id.into(),
            principals: principals.map(|p| p.iter().map(|s| s.to_string()).collect()),
            target,
            action,
            reason: format!("because {id}"),
        }
    }

    fn commands(names: &[&str], categories: &[Category], keys: Option<&[&str]>) -> Target {
        Target::Commands {
            names: names.iter().map(|s| s.to_string()).collect(),
            categories: categories.iter().copied().collect(),
            any: false,
            keys: keys.map(|k| k.iter().map(|s| s.to_string()).collect()),
            channels: None,
            lanes: None,
        }
    }

    fn command<'a>(principal: &'a str, name: &'a str, keys: &'a [&'a str]) -> Request<'a, &'a str> {
        Request {
            principal,
            subject: Subject::Command {
                name,
                categories: [Category::Read].into_iter().collect(),
                lane: 0,
                keys,
                channels: Channels::none(),
            },
        }
    }

    fn pubsub<'a>(principal: &'a str, argv: &'a [&'a str]) -> Request<'a, &'a str> {
        let keys = match argv[0] {
            "SPUBLISH" => &argv[1..2],
            "SSUBSCRIBE" => &argv[1..],
            _ => &[],
        };
        Request {
            principal,
            subject: Subject::Command {
                name: argv[0],
                categories: [Category::Pubsub].into_iter().collect(),
                lane: 4,
                keys,
                channels: Channels::of(argv[0], argv),
            },
        }
    }

    fn with_channels(
        names: &[&str],
        categories: &[Category],
        keys: Option<&[&str]>,
        channels: &[&str],
    ) -> Target {
        let mut target = commands(names, categories, keys);
        if let Target::Commands { channels: c, .. } = &mut target {
            *c = Some(channels.iter().map(|s| s.to_string()).collect());
        }
        target
    }

    /// acme may use its own channels; a deny rule protects acme:secret:*; legacy key rules
    /// still vouch for shard channels.
    fn channel_policy() -> CompiledPolicy {
        CompiledPolicy {
            mode: Mode::Enforce,
            rules: vec![
                rule(
                    "secret",
                    None,
                    with_channels(&[], &[Category::Pubsub], None, &["acme:secret:*"]),
                    Action::Deny,
                ),
                rule(
                    "acme-channels",
                    Some(&["acme"]),
                    with_channels(&[], &[Category::Pubsub], Some(&["acme:*"]), &["acme:*"]),
                    Action::Allow,
                ),
                rule(
                    "globex-keys",
                    Some(&["globex"]),
                    commands(&[], &[Category::Pubsub], Some(&["globex:*"])),
                    Action::Allow,
                ),
            ],
        }
    }

    #[test]
    fn channels_are_judged_by_channel_globs_and_patterns_by_what_they_can_match() {
        let policy = channel_policy();
        let decided =
            |principal: &str, argv: &[&str]| decided_by(&policy, &pubsub(principal, argv));
        assert_eq!(
            decided("acme", &["PUBLISH", "acme:chan", "hi"]),
            "allow acme-channels"
        );
        assert_eq!(decided("acme", &["PUBLISH", "globex:chan", "hi"]), "none");
        assert_eq!(
            decided("acme", &["SUBSCRIBE", "acme:a", "acme:b"]),
            "allow acme-channels"
        );
        assert_eq!(
            decided("acme", &["SUBSCRIBE", "acme:a", "globex:b"]),
            "none"
        );
        assert_eq!(decided("acme", &["PSUBSCRIBE", "acme:*"]), "deny secret");
        assert_eq!(
            decided("acme", &["PSUBSCRIBE", "acme:news:*"]),
            "allow acme-channels"
        );
        assert_eq!(decided("acme", &["PSUBSCRIBE", "*"]), "deny secret");
        assert_eq!(decided("acme", &["PSUBSCRIBE", "acme*"]), "deny secret");
        assert_eq!(decided("acme", &["PSUBSCRIBE", "acmex*"]), "none");
        assert_eq!(
            decided("acme", &["PUBLISH", "acme:secret:x", "hi"]),
            "deny secret"
        );
        assert_eq!(
            decided("acme", &["SUBSCRIBE", "acme:a", "acme:secret:x"]),
            "deny secret"
        );
        // A command that names no channel is not a channel rule's to allow.
        assert_eq!(decided("acme", &["PUBSUB", "NUMPAT"]), "none");
        assert_eq!(decided("acme", &["UNSUBSCRIBE"]), "none");
        // Key globs never vouch for a plain channel...
        assert_eq!(decided("globex", &["PUBLISH", "globex:chan", "hi"]), "none");
        // ...but shard channels are keys too: either field vouches.
        assert_eq!(
            decided("globex", &["SPUBLISH", "globex:chan", "hi"]),
            "allow globex-keys"
        );
        assert_eq!(
            decided("acme", &["SPUBLISH", "acme:chan", "hi"]),
            "allow acme-channels"
        );
        assert_eq!(
            decided("acme", &["SSUBSCRIBE", "acme:a", "globex:b"]),
            "none"
        );
        assert_eq!(
            decided("acme", &["SPUBLISH", "acme:secret:1", "hi"]),
            "deny secret"
        );
        // Keyed commands are still judged by keys alone.
        assert_eq!(
            decided_by(&policy, &command("acme", "GET", &["acme:1"])),
            "none",
            "GET is not @pubsub"
        );
    }

    #[test]
    fn a_rule_with_only_channels_matches_no_keyed_command() {
        let policy = CompiledPolicy {
            mode: Mode::Enforce,
            rules: vec![rule(
                "chans",
                None,
                with_channels(&[], &[Category::Read], None, &["*"]),
                Action::Allow,
            )],
        };
        assert_eq!(decided_by(&policy, &command("p", "GET", &["k"])), "none");
        assert!(policy.matches_channels() && !policy.matches_keys());
    }

    fn sample(mode: Mode) -> CompiledPolicy {
        CompiledPolicy {
            mode,
            rules: vec![
                rule(
                    "no-flush",
                    None,
                    commands(&["FLUSHALL"], &[], None),
                    Action::Deny,
                ),
                rule(
                    "tenant",
                    Some(&["acme"]),
                    commands(&[], &[Category::Read], Some(&["acme:*"])),
                    Action::Allow,
                ),
                rule(
                    "clients",
                    None,
                    commands(&["CLIENT"], &[], None),
                    Action::Allow,
                ),
            ],
        }
    }

    #[test]
    fn first_matching_rule_decides() {
        let policy = sample(Mode::Enforce);
        let id = |outcome: Outcome<'_>| match outcome {
            Outcome::Allow(rule) => format!("allow {}", rule.id),
            Outcome::Deny(rule) => format!("deny {}", rule.id),
            Outcome::AuditDeny(rule) => format!("audit {}", rule.id),
            Outcome::NoMatch => "none".into(),
        };
        assert_eq!(
            id(policy.evaluate(&command("acme", "GET", &["acme:1"]))),
            "allow tenant"
        );
        assert_eq!(
            id(policy.evaluate(&command("acme", "MGET", &["acme:1", "x"]))),
            "none"
        );
        assert_eq!(
            id(policy.evaluate(&command("bob", "GET", &["acme:1"]))),
            "none"
        );
        // A keyless command in the rule's categories is not the tenant rule's to allow.
        assert_eq!(id(policy.evaluate(&command("acme", "DBSIZE", &[]))), "none");
        assert_eq!(
            id(policy.evaluate(&command("bob", "FLUSHALL", &[]))),
            "deny no-flush"
        );
        assert_eq!(
            id(policy.evaluate(&command("bob", "CLIENT|LIST", &[]))),
            "allow clients"
        );
        let audit = sample(Mode::Audit);
        assert_eq!(
            id(audit.evaluate(&command("bob", "FLUSHALL", &[]))),
            "audit no-flush"
        );
    }

    /// A deny rule on `protected:*`, then an allow rule for every key.
    fn protected() -> CompiledPolicy {
        CompiledPolicy {
            mode: Mode::Enforce,
            rules: vec![
                rule(
                    "protected",
                    None,
                    commands(&["DEL", "MSET", "GET"], &[], Some(&["protected:*"])),
                    Action::Deny,
                ),
                rule(
                    "any-key",
                    None,
                    commands(&["DEL", "MSET", "GET"], &[], Some(&["*"])),
                    Action::Allow,
                ),
            ],
        }
    }

    fn decided_by(policy: &CompiledPolicy, request: &Request<'_, &str>) -> String {
        match policy.evaluate(request) {
            Outcome::Allow(rule) => format!("allow {}", rule.id),
            Outcome::Deny(rule) => format!("deny {}", rule.id),
            Outcome::AuditDeny(rule) => format!("audit {}", rule.id),
            Outcome::NoMatch => "none".into(),
        }
    }

    #[test]
    fn a_deny_rule_matches_when_any_key_matches() {
        let policy = protected();
        for keys in [
            &["decoy", "protected:1"][..],
            &["protected:1", "decoy"],
            &["a", "b", "protected:x", "c"],
            &["protected:1"],
        ] {
            assert_eq!(
                decided_by(&policy, &command("p", "DEL", keys)),
                "deny protected",
                "{keys:?}"
            );
        }
        for keys in [&["decoy"][..], &["decoy", "protectedx"], &["unprotected:1"]] {
            assert_eq!(
                decided_by(&policy, &command("p", "DEL", keys)),
                "allow any-key",
                "{keys:?}"
            );
        }
        // Still no match on a command without keys, for either action.
        assert_eq!(decided_by(&policy, &command("p", "DEL", &[])), "none");
    }

    #[test]
    fn an_allow_rule_matches_only_when_every_key_matches() {
        let policy = sample(Mode::Enforce);
        for keys in [
            &["acme:1", "x"][..],
            &["x", "acme:1"],
            &["acme:1", "acme:2", "b"],
        ] {
            assert_eq!(
                decided_by(&policy, &command("acme", "MGET", keys)),
                "none",
                "{keys:?}"
            );
        }
        assert_eq!(
            decided_by(&policy, &command("acme", "MGET", &["acme:1", "acme:2"])),
            "allow tenant"
        );
    }

    #[test]
    fn key_semantics_follow_the_action() {
        let globs = vec!["p:*".to_owned()];
        let mixed = ["x", "p:1"];
        assert!(Action::Deny.keys_match(&globs, &mixed));
        assert!(!Action::Allow.keys_match(&globs, &mixed));
        assert!(Action::Allow.keys_match(&globs, &["p:1", "p:2"]));
        assert!(!Action::Deny.keys_match(&globs, &["x", "y"]));
        let none: [&str; 0] = [];
        assert!(!Action::Allow.keys_match(&globs, &none));
        assert!(!Action::Deny.keys_match(&globs, &none));
    }

    #[test]
    fn keys_matter_only_when_a_command_rule_has_key_globs() {
        assert!(sample(Mode::Enforce).matches_keys());
        let mut without = sample(Mode::Enforce);
        without.rules.retain(|rule| rule.id != "tenant");
        assert!(!without.matches_keys());
        // Without key globs, no set of keys changes the decision.
        for keys in [&[][..], &["acme:1"], &["x", "y"]] {
            let id = |policy: &CompiledPolicy| match policy.evaluate(&command(
                "acme",
                "CLIENT|LIST",
                keys,
            )) {
                Outcome::Allow(rule) | Outcome::Deny(rule) | Outcome::AuditDeny(rule) => {
                    Some(rule.id.clone())
                }
                Outcome::NoMatch => None,
            };
            assert_eq!(id(&without), Some("clients".to_owned()));
        }
    }

    #[test]
    fn lease_rules_apply_only_to_leases() {
        let policy = CompiledPolicy {
            mode: Mode::Enforce,
            rules: vec![rule(
                "jobs",
                None,
                Target::Leases {
                    resources: vec!["jobs:*".into()],
                },
                Action::Allow,
            )],
        };
        let lease = |resource: &'static str| Request::<&str> {
            principal: "p",
            subject: Subject::Lease {
                resource: resource.as_bytes(),
            },
        };
        assert!(matches!(
            policy.evaluate(&lease("jobs:1")),
            Outcome::Allow(_)
        ));
        assert_eq!(policy.evaluate(&lease("other")), Outcome::NoMatch);
        assert_eq!(
            policy.evaluate(&command("p", "GET", &["jobs:1"])),
            Outcome::NoMatch
        );
    }

    #[test]
    fn compiled_policy_round_trips_through_bytes() {
        let policy = sample(Mode::Audit);
        assert_eq!(
            CompiledPolicy::from_bytes(&policy.to_bytes()).unwrap(),
            policy
        );
    }

    #[test]
    fn argument_free_decisions_are_known_from_the_rules() {
        let policy = sample(Mode::Enforce);
        let read: CategorySet = [Category::Read].into_iter().collect();
        // acme's reads meet the key rule first: its keys decide.
        assert!(!policy.decided_without_arguments("acme", "GET", read, 0));
        // FLUSHALL is denied before any key rule, for everyone.
        assert!(policy.decided_without_arguments("acme", "FLUSHALL", CategorySet::default(), 5));
        // Another principal's reads skip the tenant rule and fall through to no match.
        assert!(policy.decided_without_arguments("globex", "GET", read, 0));
        assert!(policy.decided_without_arguments(
            "globex",
            "CLIENT|LIST",
            CategorySet::default(),
            5
        ));
        assert!(!policy.decided_without_arguments("acme", LEASE_COMMAND_FOR_TESTS, read, 0));
        // Channel commands always go to the guard, whatever the rules.
        assert!(!policy.decided_without_arguments("globex", "PUBLISH", read, 4));
    }

    const LEASE_COMMAND_FOR_TESTS: &str = crate::LEASE_COMMAND;

    /// A small deterministic generator (xorshift), so the property below needs no dependency.
    struct Draw(u64);

    impl Draw {
        fn next(&mut self, below: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % below as u64) as usize
        }
    }

    /// Whenever `decided_without_arguments` says so, every key list gets the outcome of every
    /// other, over many generated policies: the claim a host's reuse of answers rests on.
    #[test]
    fn argument_free_means_every_key_list_gets_one_outcome() {
        const PRINCIPALS: [&str; 3] = ["acme", "globex", "uid:7"];
        const NAMES: [&str; 4] = ["GET", "SET", "CLIENT|KILL", "FLUSHALL"];
        const CATEGORIES: [Category; 3] = [Category::Read, Category::Write, Category::Admin];
        const GLOBS: [&str; 4] = ["acme:*", "a*", "*", "globex:?"];
        const KEY_LISTS: [&[&str]; 6] = [
            &[],
            &["acme:1"],
            &["globex:1"],
            &["acme:1", "globex:x"],
            &["zzz"],
            &["a"],
        ];
        let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
        let mut claims = 0;
        for _ in 0..400 {
            let rules = (0..1 + draw.next(5))
                .map(|at| {
                    let principals = match draw.next(3) {
                        0 => None,
                        _ => Some(vec![PRINCIPALS[draw.next(3)].to_owned()]),
                    };
                    let target = if draw.next(6) == 0 {
                        Target::Leases {
                            resources: vec![GLOBS[draw.next(4)].to_owned()],
                        }
                    } else {
                        Target::Commands {
                            names: (0..draw.next(2))
                                .map(|_| ["GET", "CLIENT", "FLUSHALL"][draw.next(3)].to_owned())
                                .collect(),
                            categories: (0..draw.next(2))
                                .map(|_| CATEGORIES[draw.next(3)])
                                .collect(),
                            any: draw.next(4) == 0,
                            keys: (draw.next(2) == 0).then(|| vec![GLOBS[draw.next(4)].to_owned()]),
                            channels: (draw.next(4) == 0)
                                .then(|| vec![GLOBS[draw.next(4)].to_owned()]),
                            lanes: (draw.next(3) == 0).then(|| 1 << draw.next(6)),
                        }
                    };
                    let action = [Action::Allow, Action::Deny][draw.next(2)];
                    rule(&format!("r{at}"), None, target, action).with_principals(principals)
                })
                .collect();
            let policy = CompiledPolicy {
                mode: [Mode::Enforce, Mode::Audit][draw.next(2)],
                rules,
            };
            for principal in PRINCIPALS {
                for name in NAMES {
                    for category in CATEGORIES {
                        let categories: CategorySet = [category].into_iter().collect();
                        for lane in 0..6 {
                            if !policy.decided_without_arguments(principal, name, categories, lane)
                            {
                                continue;
                            }
                            claims += 1;
                            let outcome = |keys: &[&str]| {
                                policy.evaluate(&Request {
                                    principal,
                                    subject: Subject::Command {
                                        name,
                                        categories,
                                        lane,
                                        keys,
                                        channels: Channels::none(),
                                    },
                                })
                            };
                            let first = outcome(KEY_LISTS[0]);
                            for keys in KEY_LISTS {
                                assert_eq!(
                                    outcome(keys),
                                    first,
                                    "{principal} {name} {categories:?} lane {lane} {keys:?} in {policy:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
        // The generator reaches both answers often, or the property says little.
        assert!(claims > 10_000, "{claims} argument-free claims");
    }

    impl Rule {
        fn with_principals(mut self, principals: Option<Vec<String>>) -> Rule {
            self.principals = principals;
            self
        }
    }
}
