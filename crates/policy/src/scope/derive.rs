//! Working out each principal's scope from the YAML rules.
//!
//! **Who is scoped.** A principal whose scripts the policy confines: it may run a script command
//! (EVAL, EVALSHA, their `_RO` forms, FCALL, FCALL_RO), some rule with `keys:` applies to it, every
//! file is enforcing (under `mode: audit` nothing is refused), and no allow rule of its says
//! `scripts: unconstrained`. Everyone else's scripts run as the SCRIPT lane's user, as before.
//!
//! **The rule (sound, and exact where it is written).** Under first-match, a request is admitted
//! exactly when some allow rule matches it and no deny rule before that rule does. So each allow
//! rule `R` that applies to the principal gives, for each command `c` it matches whatever the
//! keys (on every lane `c` can take), the keys `K_R` (every key, for a rule without `keys:`)
//! minus the globs of each deny rule that matches `c` and comes before `R` in its file or sits
//! in another file (a deny rule without `keys:` takes `c` out altogether), minus `tollgate:*`.
//! Commands with the same deny rules to subtract share one selector. Deny rules are taken as
//! matching on any lane, allow rules only when they match on every lane: either way Redis gets
//! less, never more. A command that names no key is only granted from a rule without `keys:`
//! and only when it shows nothing of the keyspace ([`KEYSPACE_WIDE`]): Redis ignores key
//! patterns for a command without keys (`SCAN` would list every tenant's keys).
//!
//! **Channels.** A script may publish (`PUBLISH`, `SPUBLISH`; Redis refuses subscribing in
//! scripts) on the channels an allow rule with `channels:` grants those commands, less the
//! channel globs of the deny rules before it (and, for the shard channels, which are keys too,
//! their key globs) and `tollgate:*`: channel selectors (`&` patterns), derived as the key ones
//! are. A rule without `channels:` grants scripts no channel: scope users start from
//! `resetchannels`.
//!
//! Not derived (documented in docs/policy.md): operator guard modules (unreadable; they can only
//! narrow what is admitted, so a scope may grant a script what a module would refuse).

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};
use tollgate_model::reserved::RESERVED_PREFIX;
use tollgate_model::Lane;
use tollgate_policy_rules::glob::{self, Piece};
use tollgate_policy_rules::{Action, Category, Channels, Mode, Request, Rule, Subject, Target};

use super::minus::minus;
use super::pattern::redis_pattern;
use super::{Scope, Scopes, Selector};
use crate::compile::{CompiledFile, Diagnostic, Severity};
use crate::decision::Descriptor;

/// Categories of keyless commands that see or change what lies beyond a scope's keys.
const KEYSPACE_WIDE: [Category; 5] = [
    Category::Keyspace,
    Category::Dangerous,
    Category::Admin,
    Category::Pubsub,
    Category::Scripting,
];

/// The commands a script may name a channel with (Redis refuses SUBSCRIBE and its kin in
/// scripts): what channel selectors grant.
const PUBLISHING: [&str; 2] = ["PUBLISH", "SPUBLISH"];

/// Commands that never run on a client's connection as named (the front door serves FLUSHDB
/// key by key; FLUSHALL reaches the lease database).
const NEVER: [&str; 2] = ["FLUSHDB", "FLUSHALL"];

/// What [`derive`] reads.
pub struct ScopeInput<'a> {
    pub files: &'a [CompiledFile],
    /// The catalog's commands that Redis runs as named (see `Admissible::commands`).
    pub descriptors: &'a [Descriptor],
    /// Each principal (`None`: callers no principal names) with the commands it may send on the
    /// SCRIPT lane (EVAL, SCRIPT LOAD, …): its scope's user runs them. A principal none of whose
    /// commands runs code is not scoped.
    pub scripts: Vec<(Option<String>, BTreeSet<String>)>,
}

/// Every principal's scope; `Err`: globs that cannot be written for Redis, at their rules.
pub fn derive(input: &ScopeInput<'_>) -> Result<Scopes, Vec<Diagnostic>> {
    let names: Vec<&str> = input
        .scripts
        .iter()
        .filter_map(|(name, _)| name.as_deref())
        .collect();
    let unnamed = unnamed(&names);
    let unkeyed: Vec<Vec<Rule>> = input
        .files
        .iter()
        .map(|file| file.policy.rules.iter().map(without_keys).collect())
        .collect();
    let mut scopes: Vec<Scope> = Vec::new();
    let mut assigned = Vec::new();
    let mut errors: Vec<Diagnostic> = Vec::new();
    for (principal, scripts) in &input.scripts {
        let name = principal.as_deref().unwrap_or(&unnamed);
        let runs_code = scripts.iter().any(|script| {
            input
                .descriptors
                .iter()
                .any(|d| &d.name == script && d.traits.scripting && !d.keys.is_empty())
        });
        if !runs_code || !scoped(input.files, name) {
            assigned.push((principal.clone(), None));
            continue;
        }
        let derived = Deriver {
            input,
            unkeyed: &unkeyed,
            principal: name,
        }
        .scope(scripts.clone());
        let scope = match derived {
            Ok(scope) => scope,
            Err(found) => {
                for error in found {
                    if !errors.contains(&error) {
                        errors.push(error);
                    }
                }
                continue;
            }
        };
        let at = match scopes.iter().position(|s| s.user == scope.user) {
            Some(at) => at,
            None => {
                scopes.push(scope);
                scopes.len() - 1
            }
        };
        scopes[at].principals.push(principal.clone());
        assigned.push((principal.clone(), Some(at)));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Scopes { scopes, assigned })
}

/// Whether `principal`'s scripts are confined (the module's header says when).
fn scoped(files: &[CompiledFile], principal: &str) -> bool {
    let applies = |rule: &Rule| applies(rule, principal);
    files.iter().all(|file| file.policy.mode == Mode::Enforce)
        && files.iter().any(|file| {
            file.policy
                .rules
                .iter()
                .any(|r| applies(r) && (r.matches_keys() || r.matches_channels()))
        })
        && !files.iter().any(|file| {
            file.policy
                .rules
                .iter()
                .zip(&file.places)
                .any(|(rule, place)| {
                    applies(rule) && rule.action == Action::Allow && place.unconstrained
                })
        })
}

struct Deriver<'a> {
    input: &'a ScopeInput<'a>,
    unkeyed: &'a [Vec<Rule>],
    principal: &'a str,
}

/// A deny rule that cuts an allow rule: `(file, index)`.
type Cut = (usize, usize);

/// (patterns, read-only, channel patterns) → commands: the selectors being gathered.
type Grants = BTreeMap<(Vec<Vec<u8>>, bool, bool), BTreeSet<String>>;

impl Deriver<'_> {
    fn scope(&self, scripts: BTreeSet<String>) -> Result<Scope, Vec<Diagnostic>> {
        let mut errors = Vec::new();
        let mut keyless = BTreeSet::new();
        let mut rules = Vec::new();
        let mut channel_rules = Vec::new();
        let mut selectors: Grants = BTreeMap::new();
        for (f, file) in self.input.files.iter().enumerate() {
            for (r, rule) in file.policy.rules.iter().enumerate() {
                if rule.action != Action::Allow || !applies(rule, self.principal) {
                    continue;
                }
                let Target::Commands { keys, channels, .. } = &rule.target else {
                    continue;
                };
                if let Some(globs) = channels {
                    self.channel_selectors(f, r, globs, &mut selectors, &mut errors);
                    if !channel_rules.contains(&rule.id) {
                        channel_rules.push(rule.id.clone());
                    }
                    // A rule with only `channels:` matches no keyed or keyless command.
                    if keys.is_none() {
                        continue;
                    }
                }
                let mut groups: BTreeMap<Vec<Cut>, Vec<&Descriptor>> = BTreeMap::new();
                for descriptor in self.input.descriptors {
                    // Pub/sub commands' keys are shard channels, which Redis checks against
                    // channel patterns: key selectors would grant them nothing (publishing is
                    // the channel selectors', subscribing never runs in a script).
                    if descriptor.traits.scripting && !descriptor.keys.is_empty()
                        || descriptor.categories.contains(Category::Pubsub)
                        || NEVER.contains(&descriptor.name.as_str())
                        || !self.every_lane(&self.unkeyed[f][r], descriptor)
                    {
                        continue;
                    }
                    let Some(cuts) = self.cuts(f, r, descriptor) else {
                        continue;
                    };
                    if descriptor.keys.is_empty() {
                        let wide = KEYSPACE_WIDE
                            .iter()
                            .any(|c| descriptor.categories.contains(*c));
                        if keys.is_none() && !wide {
                            keyless.insert(descriptor.name.clone());
                        }
                        continue;
                    }
                    groups.entry(cuts).or_default().push(descriptor);
                }
                let mut granted = false;
                for (cuts, commands) in groups {
                    match self.patterns(keys.as_deref(), &cuts) {
                        Ok(patterns) if patterns.is_empty() => {}
                        Ok(patterns) => {
                            let read_only = !commands.iter().any(|d| d.traits.write);
                            selectors
                                .entry((patterns, read_only, false))
                                .or_default()
                                .extend(commands.iter().map(|d| d.name.clone()));
                            granted = true;
                        }
                        Err(message) => {
                            let place = file.places[r];
                            let error = Diagnostic {
                                file: file.path.clone(),
                                line: place.line,
                                column: place.column,
                                severity: Severity::Error,
                                message: format!(
                                    "rule `{}`: {message}, so Redis cannot hold the scripts of \
                                     `{}` to it; narrow the globs, or say `scripts: \
                                     unconstrained` to let its scripts reach any key",
                                    rule.id, self.principal
                                ),
                            };
                            if !errors.contains(&error) {
                                errors.push(error);
                            }
                        }
                    }
                }
                if granted && !rules.contains(&rule.id) {
                    rules.push(rule.id.clone());
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let selectors: Vec<Selector> = selectors
            .into_iter()
            .map(|((patterns, read_only, channels), commands)| Selector {
                patterns,
                read_only,
                commands,
                channels,
            })
            .collect();
        let user = user_name(&scripts, &keyless, &selectors);
        Ok(Scope {
            user,
            principals: Vec::new(),
            rules,
            channel_rules,
            scripts,
            keyless,
            selectors,
        })
    }

    /// The channel selectors allow rule `r` of file `f`, whose channel globs are `globs`, gives
    /// the publishing commands it matches; an error at the rule when Redis cannot write them.
    fn channel_selectors(
        &self,
        f: usize,
        r: usize,
        globs: &[String],
        selectors: &mut Grants,
        errors: &mut Vec<Diagnostic>,
    ) {
        let file = &self.input.files[f];
        let rule = &file.policy.rules[r];
        for name in PUBLISHING {
            let Some(descriptor) = self.input.descriptors.iter().find(|d| d.name == name) else {
                continue;
            };
            if !self.every_lane(&self.unkeyed[f][r], descriptor) {
                continue;
            }
            let Some(away) = self.channel_cuts(f, r, descriptor) else {
                continue;
            };
            match self.minus_all(Some(globs), away) {
                Ok(patterns) if patterns.is_empty() => {}
                Ok(patterns) => {
                    selectors
                        .entry((patterns, false, true))
                        .or_default()
                        .insert(name.to_owned());
                }
                Err(message) => {
                    let place = file.places[r];
                    let error = Diagnostic {
                        file: file.path.clone(),
                        line: place.line,
                        column: place.column,
                        severity: Severity::Error,
                        message: format!(
                            "rule `{}`: {message}, so Redis cannot hold the channels the scripts \
                             of `{}` publish on to it; narrow the channel globs",
                            rule.id, self.principal
                        ),
                    };
                    if !errors.contains(&error) {
                        errors.push(error);
                    }
                }
            }
        }
    }

    /// The globs the deny rules before allow rule `r` of file `f` take from its channels for
    /// the publishing `descriptor` (each with words for an error); `None` when one without
    /// globs takes the command out.
    fn channel_cuts(
        &self,
        f: usize,
        r: usize,
        descriptor: &Descriptor,
    ) -> Option<Vec<(String, String)>> {
        let shard = descriptor.name == "SPUBLISH";
        let mut away = Vec::new();
        for (g, file) in self.input.files.iter().enumerate() {
            let before = if g == f { r } else { file.policy.rules.len() };
            for (d, rule) in file.policy.rules[..before].iter().enumerate() {
                if rule.action != Action::Deny {
                    continue;
                }
                let hits = lanes(descriptor)
                    .iter()
                    .any(|lane| self.unkeyed[g][d].matches(&self.request(descriptor, *lane)));
                let Target::Commands { keys, channels, .. } = &rule.target else {
                    continue;
                };
                if !hits {
                    continue;
                }
                let mut globs: Vec<&String> = channels.iter().flatten().collect();
                if shard {
                    globs.extend(keys.iter().flatten());
                }
                match (keys, channels) {
                    (None, None) => return None,
                    _ => {
                        away.extend(globs.into_iter().map(|glob| {
                            (glob.clone(), format!("deny rule `{}`'s `{glob}`", rule.id))
                        }))
                    }
                }
            }
        }
        Some(away)
    }

    /// Whether `rule` (keys set aside) matches `descriptor` on every lane it can take.
    fn every_lane(&self, rule: &Rule, descriptor: &Descriptor) -> bool {
        lanes(descriptor)
            .iter()
            .all(|lane| rule.matches(&self.request(descriptor, *lane)))
    }

    /// The deny rules with keys that cut allow rule `r` of file `f` for `descriptor`; `None`
    /// when a deny rule without keys takes the command out.
    fn cuts(&self, f: usize, r: usize, descriptor: &Descriptor) -> Option<Vec<Cut>> {
        let mut cuts = Vec::new();
        for (g, file) in self.input.files.iter().enumerate() {
            let before = if g == f { r } else { file.policy.rules.len() };
            for (d, rule) in file.policy.rules[..before].iter().enumerate() {
                if rule.action != Action::Deny {
                    continue;
                }
                let unkeyed = &self.unkeyed[g][d];
                let hits = lanes(descriptor)
                    .iter()
                    .any(|lane| unkeyed.matches(&self.request(descriptor, *lane)));
                if !hits {
                    continue;
                }
                if !rule.matches_keys() {
                    // Only `channels:`: it matches no keyed command but the shard ones (which
                    // it then takes out of the key selectors: Redis checks their channels
                    // against channel patterns anyway).
                    if rule.matches_channels()
                        && !matches!(descriptor.name.as_str(), "SPUBLISH" | "SSUBSCRIBE")
                    {
                        continue;
                    }
                    return None;
                }
                if !descriptor.keys.is_empty() {
                    cuts.push((g, d));
                }
            }
        }
        Some(cuts)
    }

    /// The allow rule's globs (`None`: every key) minus each cut's globs and the reserved
    /// keyspace, written for Redis; `Err` names what cannot be written.
    fn patterns(&self, keys: Option<&[String]>, cuts: &[Cut]) -> Result<Vec<Vec<u8>>, String> {
        let mut away: Vec<(String, String)> = Vec::new();
        for (g, d) in cuts {
            let rule = &self.input.files[*g].policy.rules[*d];
            if let Target::Commands {
                keys: Some(protected),
                ..
            } = &rule.target
            {
                for glob in protected {
                    away.push((glob.clone(), format!("deny rule `{}`'s `{glob}`", rule.id)));
                }
            }
        }
        self.minus_all(keys, away)
    }

    /// `keys` (`None`: every name) less each of `away`'s globs and the reserved keyspace,
    /// written for Redis; `Err` names what cannot be written.
    fn minus_all(
        &self,
        keys: Option<&[String]>,
        mut away: Vec<(String, String)>,
    ) -> Result<Vec<Vec<u8>>, String> {
        let everything = ["*".to_owned()];
        let mut globs: Vec<Vec<Piece>> = keys
            .unwrap_or(&everything)
            .iter()
            .map(|g| glob::pieces(g.as_bytes()))
            .collect();
        let reserved = format!("{}*", escape(RESERVED_PREFIX));
        away.push((reserved, "the daemon's reserved keyspace".to_owned()));
        for (glob, what) in &away {
            let cut = glob::pieces(glob.as_bytes());
            let mut left = Vec::new();
            for pieces in &globs {
                let rest = minus(pieces, &cut, glob).map_err(|error| {
                    format!("a glob of it, less {what}, is not a Redis pattern: {error}")
                })?;
                for pieces in rest {
                    if !left.contains(&pieces) {
                        left.push(pieces);
                    }
                }
            }
            globs = left;
        }
        let mut patterns = Vec::new();
        for pieces in &globs {
            match redis_pattern(pieces) {
                Ok(Some(pattern)) if !pattern.is_empty() => {
                    if !patterns.contains(&pattern) {
                        patterns.push(pattern);
                    }
                }
                // The empty key cannot be written (`~` alone is refused): it is left out.
                Ok(_) => {}
                Err(error) => return Err(format!("{error}")),
            }
        }
        patterns.sort();
        Ok(patterns)
    }

    fn request<'r>(&'r self, descriptor: &'r Descriptor, lane: Lane) -> Request<'r, &'r [u8]> {
        Request {
            principal: self.principal,
            subject: Subject::Command {
                name: &descriptor.name,
                categories: descriptor.categories,
                // Lanes in WIT order, as the YAML guard numbers them.
                lane: lane as u8,
                keys: &[],
                channels: Channels::none(),
            },
        }
    }
}

fn applies(rule: &Rule, principal: &str) -> bool {
    rule.principals
        .as_ref()
        .is_none_or(|names| names.iter().any(|name| name == principal))
}

fn without_keys(rule: &Rule) -> Rule {
    let mut rule = rule.clone();
    if let Target::Commands { keys, channels, .. } = &mut rule.target {
        *keys = None;
        *channels = None;
    }
    rule
}

/// The lanes a command can be admitted on (as `Admissible` reads them).
fn lanes(descriptor: &Descriptor) -> Vec<Lane> {
    let mut lanes = vec![descriptor.lane];
    if descriptor.traits.blocking && descriptor.lane != Lane::Blocking {
        lanes.push(Lane::Blocking);
    }
    lanes
}

/// A name no principal has, for the callers the policies do not name.
fn unnamed(principals: &[&str]) -> String {
    let mut name = String::from("*unnamed*");
    while principals.contains(&name.as_str()) {
        name.push('*');
    }
    name
}

/// `text` as a glob matching only itself.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `tollgate-scope-` and the first 12 hex digits of a digest of everything the user is granted.
fn user_name(
    scripts: &BTreeSet<String>,
    keyless: &BTreeSet<String>,
    selectors: &[Selector],
) -> String {
    let mut hash = Sha256::new();
    for name in scripts {
        hash.update(b"s");
        hash.update(name.as_bytes());
        hash.update([0]);
    }
    for name in keyless {
        hash.update(b"k");
        hash.update(name.as_bytes());
        hash.update([0]);
    }
    for selector in selectors {
        hash.update(match (selector.channels, selector.read_only) {
            (true, _) => b"(c",
            (false, true) => b"(r",
            (false, false) => b"(w",
        });
        for pattern in &selector.patterns {
            hash.update((pattern.len() as u64).to_le_bytes());
            hash.update(pattern);
        }
        for name in &selector.commands {
            hash.update(b"c");
            hash.update(name.as_bytes());
            hash.update([0]);
        }
        hash.update(b")");
    }
    let digest = hex::encode(hash.finalize());
    format!("tollgate-scope-{}", &digest[..12])
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use tollgate_policy_rules::CategorySet;

    use super::*;
    use crate::compile::{compile, CatalogCommand, CatalogIndex};
    use crate::decision::{KeyAccess, Traits};

    fn command(
        name: &str,
        lane: Lane,
        categories: &[Category],
        keys: usize,
        write: bool,
    ) -> Descriptor {
        Descriptor {
            name: name.into(),
            lane,
            categories: categories.iter().copied().collect::<CategorySet>(),
            traits: Traits {
                write,
                scripting: categories.contains(&Category::Scripting),
                ..Traits::default()
            },
            arity: -1,
            keys: (1..=keys)
                .map(|position| KeyAccess {
                    position,
                    read: true,
                    write,
                })
                .collect(),
        }
    }

    fn catalog() -> Vec<Descriptor> {
        use Category::*;
        vec![
            command("GET", Lane::Regular, &[Read, String], 1, false),
            command("PFCOUNT", Lane::Regular, &[Read, Hyperloglog], 1, false),
            command("SET", Lane::Regular, &[Write, String], 1, true),
            command("SUNIONSTORE", Lane::Regular, &[Write, Set], 2, true),
            command("PING", Lane::Regular, &[Connection], 0, false),
            command("SCAN", Lane::Regular, &[Keyspace, Read], 0, false),
            command(
                "FLUSHDB",
                Lane::Regular,
                &[Keyspace, Write, Dangerous],
                0,
                true,
            ),
            command("EVAL", Lane::Script, &[Scripting], 1, false),
            command("PUBLISH", Lane::Regular, &[Pubsub], 0, false),
            command("SPUBLISH", Lane::Regular, &[Pubsub], 1, false),
            command("SUBSCRIBE", Lane::Pubsub, &[Pubsub], 0, false),
        ]
    }

    fn scopes(yaml: &str, scripts: &[(&str, &[&str])]) -> Result<Scopes, Vec<Diagnostic>> {
        let descriptors = catalog();
        let index = CatalogIndex {
            commands: descriptors
                .iter()
                .map(|d| {
                    let command = CatalogCommand {
                        categories: d.categories,
                        scripting: d.traits.scripting,
                        keyed: !d.keys.is_empty(),
                    };
                    (d.name.clone(), command)
                })
                .collect(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let file = compile(Path::new("p.yaml"), yaml, &index, deadline).unwrap();
        let scripts = scripts
            .iter()
            .map(|(name, runs)| {
                let principal = (!name.is_empty()).then(|| (*name).to_owned());
                (principal, runs.iter().map(|s| (*s).to_owned()).collect())
            })
            .collect();
        derive(&ScopeInput {
            files: &[file],
            descriptors: &descriptors,
            scripts,
        })
    }

    const TENANTS: &str = "principals:\n  acme: { uids: [2001] }\n  globex: { uids: [2002] }\n\
        rules:\n\
        - id: shared-is-read-only\n  commands: [\"@write\"]\n  keys: [\"shared:*\"]\n  deny: no\n\
        - id: acme-keys\n  principals: [acme]\n  commands: [\"@read\", \"@write\", \"@scripting\"]\n  keys: [\"acme:*\", \"shared:*\"]\n  allow: own\n\
        - id: globex-keys\n  principals: [globex]\n  commands: [\"@read\", \"@write\"]\n  keys: [\"globex:*\", \"shared:*\"]\n  allow: own\n\
        - id: scripts\n  commands: [EVAL, PING, SCAN]\n  allow: scripts\n";

    #[test]
    fn a_tenant_gets_its_keys_read_and_write_and_shared_keys_read_only() {
        let scopes = scopes(
            TENANTS,
            &[("acme", &["EVAL"]), ("globex", &[]), ("", &["EVAL"])],
        )
        .unwrap();
        let acme = scopes
            .of("acme")
            .expect("acme runs scripts under keys: scoped");
        assert_eq!(acme.rules, ["acme-keys"]);
        let sel: Vec<(Vec<&str>, bool, Vec<&str>)> = acme
            .selectors
            .iter()
            .map(|s| {
                (
                    s.patterns
                        .iter()
                        .map(|p| std::str::from_utf8(p).unwrap())
                        .collect(),
                    s.read_only,
                    s.commands.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            sel,
            [
                (vec!["acme:*"], false, vec!["SET", "SUNIONSTORE"]),
                (vec!["acme:*", "shared:*"], true, vec!["GET", "PFCOUNT"]),
            ]
        );
        assert!(acme.allows("GET", &[b"shared:motd"]));
        assert!(acme.allows("SET", &[b"acme:1"]));
        assert!(!acme.allows("SET", &[b"shared:motd"]));
        // A decoy beside a protected key: the policy refuses it, and so does the scope.
        assert!(!acme.allows("SUNIONSTORE", &[b"acme:d", b"shared:a"]));
        assert!(!acme.allows("GET", &[b"globex:secret"]));
        // PING shows nothing of other keys; SCAN would list them all; FLUSHDB never runs raw.
        assert!(acme.keyless.contains("PING"));
        assert!(!acme.keyless.contains("SCAN") && !acme.allows("SCAN", &[]));
        // globex runs no script: not scoped. Unnamed callers may run EVAL and a rule with keys
        // (the deny) applies to them: scoped, with no key granted at all.
        assert!(scopes.of("globex").is_none());
        let unnamed = scopes.of("uid:7").unwrap();
        assert!(unnamed.selectors.is_empty() && unnamed.keyless.contains("PING"));
        assert_eq!(
            acme.words(),
            "tollgate: scope of rule acme-keys does not include that key"
        );
    }

    #[test]
    fn a_rule_without_keys_grants_every_key_but_denied_and_reserved_ones() {
        let yaml = "principals:\n  app: { uids: [1] }\nrules:\n\
            - id: config-is-read-only\n  commands: [\"@write\"]\n  keys: [\"config:*\"]\n  deny: no\n\
            - id: all\n  commands: [\"*\"]\n  allow: yes\n";
        let scopes = scopes(yaml, &[("app", &["EVAL"]), ("", &["EVAL"])]).unwrap();
        let app = scopes.of("app").unwrap();
        assert!(app.allows("SET", &[b"other"]));
        assert!(!app.allows("SET", &[b"config:x"]));
        assert!(app.allows("GET", &[b"config:x"]));
        assert!(!app.allows("SET", &[b"tollgate:lease"]));
        assert!(!app.allows("GET", &[b"tollgate:lease"]));
        assert!(app.allows("GET", &[b"tollgate"]));
        // The refusal names the rule whose grant the scope holds.
        assert_eq!(app.rules, ["all"]);
        // Unnamed callers share the grants, so they share the user.
        assert_eq!(scopes.of("uid:9").unwrap().user, app.user);
        assert_eq!(scopes.scopes.len(), 1);
        assert_eq!(scopes.scopes[0].principals, [Some("app".to_owned()), None]);
    }

    #[test]
    fn a_scripts_channels_are_its_rules_channel_globs_less_denied_and_reserved_ones() {
        let yaml = "principals:\n  acme: { uids: [1] }\n  globex: { uids: [2] }\nrules:\n\
            - id: secret\n  commands: [PUBLISH]\n  channels: [\"acme:secret:*\"]\n  deny: no\n\
            - id: acme-keys\n  principals: [acme]\n  commands: [GET]\n  keys: [\"acme:*\"]\n  allow: own\n\
            - id: acme-channels\n  principals: [acme]\n  commands: [PUBLISH, SUBSCRIBE]\n  channels: [\"acme:*\", \"t*\"]\n  allow: own\n\
            - id: globex-channels\n  principals: [globex]\n  commands: [PUBLISH]\n  channels: [\"globex:*\"]\n  allow: own\n\
            - id: scripts\n  commands: [EVAL]\n  allow: scripts\n";
        let scopes = scopes(yaml, &[("acme", &["EVAL"]), ("globex", &["EVAL"])]).unwrap();
        let acme = scopes.of("acme").unwrap();
        assert!(acme.publishes("PUBLISH", b"acme:news"));
        assert!(acme.publishes("PUBLISH", b"tea"));
        assert!(!acme.publishes("PUBLISH", b"globex:news"));
        assert!(!acme.publishes("PUBLISH", b"acme:secret:1"));
        assert!(!acme.publishes("PUBLISH", b"tollgate:release"));
        // SPUBLISH is not the rule's; SUBSCRIBE never runs in a script.
        assert!(!acme.publishes("SPUBLISH", b"acme:news"));
        assert!(acme
            .selectors
            .iter()
            .all(|s| !s.channels || s.commands.len() == 1));
        // Channel patterns grant no key, and key selectors no channel.
        assert!(!acme.allows("PUBLISH", &[]) && acme.allows("GET", &[b"acme:1"]));
        assert_eq!(acme.rules, ["acme-keys"]);
        assert_eq!(
            acme.channel_words(),
            "tollgate: scope of rule acme-channels does not include that channel"
        );
        // A principal confined by channels alone is scoped too.
        let globex = scopes.of("globex").unwrap();
        assert!(
            globex.publishes("PUBLISH", b"globex:x") && !globex.publishes("PUBLISH", b"acme:x")
        );
        assert_ne!(globex.user, acme.user);
    }

    #[test]
    fn unconstrained_scripts_and_audit_mode_are_not_scoped() {
        let unconstrained = TENANTS.replace(
            "  allow: own\n- id: globex",
            "  scripts: unconstrained\n  allow: own\n- id: globex",
        );
        let scopes = scopes(&unconstrained, &[("acme", &["EVAL"])]).unwrap();
        assert!(scopes.of("acme").is_none());
        let audit = format!("mode: audit\n{TENANTS}");
        let scopes = self::scopes(&audit, &[("acme", &["EVAL"])]).unwrap();
        assert!(scopes.of("acme").is_none());
    }

    #[test]
    fn a_difference_redis_cannot_write_is_an_error_at_the_allow_rule() {
        let yaml = "principals:\n  app: { uids: [1] }\nrules:\n\
            - id: no-b\n  commands: [\"@write\"]\n  keys: [\"*b\"]\n  deny: no\n\
            - id: a\n  commands: [\"*\"]\n  keys: [\"a*\"]\n  allow: yes\n";
        let errors = scopes(yaml, &[("app", &["EVAL"])]).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        let text = errors[0].to_string();
        assert!(text.starts_with("p.yaml:8:"), "{text}");
        assert!(text.contains("error: rule `a`"), "{text}");
        assert!(text.contains("deny rule `no-b`'s `*b`"), "{text}");
        // A glob with a literal space has no Redis pattern: neither `[ ]` nor `[^\x00-…]` can
        // be written.
        let yaml = "principals:\n  app: { uids: [1] }\nrules:\n\
            - id: spaced\n  commands: [\"*\"]\n  keys: [\"a b*\"]\n  allow: yes\n";
        let errors = scopes(yaml, &[("app", &["EVAL"])]).unwrap_err();
        assert!(errors[0].message.contains("whitespace"), "{errors:?}");
    }
}
