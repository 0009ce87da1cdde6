//! The checks between parsed YAML and a compiled policy. Each finding is recorded with the path
//! of the node it concerns; [`Spans`] turns the path into a line and column.

use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr;
use std::time::Instant;

use tollgate_model::{Lane, UNMAPPED_PREFIX};
use tollgate_policy_rules::{glob, Action, Category, CategorySet, CompiledPolicy, Rule, Target};

use super::shadow::{Shadow, Shadows, BUDGET};
use super::source::{
    InvariantSource, PolicyFile, PrincipalSource, QuotaSource, RuleSource, ScriptAccess, TestSource,
};
use super::spans::Spans;
use super::{
    CatalogCommand, CatalogIndex, CompiledFile, Diagnostic, Expectation, Invariant, Must,
    Principal, RulePlace, Severity, DEFAULT_DENY,
};
use crate::quota::MIN_SCRIPT_TIME_LIMIT;
use crate::quota::{Quota, Rate};

/// The commands that name plain channels or patterns, which only `channels:` confines (shard
/// channels are keys too). PUBSUB's subcommands are left out: they only count or list.
const CHANNEL_COMMANDS: [&str; 3] = ["PUBLISH", "SUBSCRIBE", "PSUBSCRIBE"];

/// The first entry of `source.commands` that names a channel command or `@pubsub` outright.
/// A rule's grant of `command` (at `at`) to `who`, whom the allow rule `keyed` confines to keys.
struct ConfinedGrant {
    at: String,
    rule: String,
    command: &'static str,
    who: String,
    keyed: String,
}

/// Who of `rule`'s principals one of the `keyed` allow rules confines to keys, and that rule's id.
fn confined_by<'r>(rule: &Rule, keyed: &[&'r Rule]) -> Option<(String, &'r str)> {
    keyed.iter().find_map(|keyed| {
        let both = match (&rule.principals, &keyed.principals) {
            (None, None) => Some("every principal".to_owned()),
            (None, Some(names)) => names.first().map(|n| format!("`{n}`")),
            (Some(names), None) => names.first().map(|n| format!("`{n}`")),
            (Some(mine), Some(theirs)) => mine
                .iter()
                .find(|n| theirs.contains(n))
                .map(|n| format!("`{n}`")),
        };
        both.map(|who| (who, keyed.id.as_str()))
    })
}

fn named_channel_command(source: &RuleSource) -> Option<(usize, &str)> {
    source
        .commands
        .as_ref()?
        .iter()
        .enumerate()
        .find(|(_, entry)| {
            entry.eq_ignore_ascii_case("@pubsub")
                || CHANNEL_COMMANDS.contains(&entry.to_ascii_uppercase().as_str())
        })
        .map(|(index, entry)| (index, entry.as_str()))
}

pub struct Checker<'a> {
    path: &'a Path,
    spans: &'a Spans,
    catalog: &'a CatalogIndex,
    /// When checking gives up on the file (reported as an error).
    deadline: Instant,
    /// The catalog's scripting commands, by name: what a key-constrained rule may not allow.
    scripting: Vec<(&'a str, CatalogCommand)>,
    diagnostics: Vec<Diagnostic>,
}

impl<'a> Checker<'a> {
    pub fn new(
        path: &'a Path,
        spans: &'a Spans,
        catalog: &'a CatalogIndex,
        deadline: Instant,
    ) -> Self {
        let mut scripting: Vec<(&str, CatalogCommand)> = catalog
            .commands
            .iter()
            .filter(|(_, command)| command.scripting)
            .map(|(name, command)| (name.as_str(), *command))
            .collect();
        scripting.sort_unstable_by_key(|(name, _)| *name);
        Checker {
            path,
            spans,
            catalog,
            deadline,
            scripting,
            diagnostics: Vec::new(),
        }
    }

    pub fn run(mut self, file: PolicyFile) -> Result<CompiledFile, Vec<Diagnostic>> {
        let principals: Vec<Principal> = file
            .principals
            .iter()
            .map(|(name, source)| self.principal(name, source))
            .collect();
        let known: HashSet<&str> = principals.iter().map(|p| p.name.as_str()).collect();
        let mut ids = HashSet::new();
        let mut rules = Vec::new();
        let mut places = Vec::new();
        let mut shadows = Shadows::new(self.catalog);
        for (index, source) in file.rules.iter().enumerate() {
            let at = format!("rules.{index}");
            if Instant::now() >= self.deadline {
                self.error(
                    &at,
                    format!(
                        "compiling stopped at rule `{}` ({} of {}): the compile deadline \
                         (policy.compile_deadline) passed; split the policy or raise the deadline",
                        source.id,
                        index + 1,
                        file.rules.len()
                    ),
                );
                break;
            }
            if !ids.insert(source.id.as_str()) {
                self.error(
                    &format!("{at}.id"),
                    format!("rule id `{}` is used twice", source.id),
                );
            }
            if let Some(rule) = self.rule(&at, source, &known) {
                let (line, column) = self.spans.at(&at);
                places.push(RulePlace {
                    line,
                    column,
                    unconstrained: source.scripts == Some(ScriptAccess::Unconstrained),
                });
                self.shadowed(&at, &rule, &rules, &mut shadows);
                shadows.add(rules.len(), &rule);
                rules.push(rule);
            }
        }
        let tests = file
            .tests
            .iter()
            .enumerate()
            .filter_map(|(index, test)| self.test(index, test, &known, &ids))
            .collect();
        let mut invariant_ids = HashSet::new();
        let mut invariants = Vec::new();
        for (index, source) in file.invariants.iter().enumerate() {
            if !invariant_ids.insert(source.id.as_str()) {
                self.error(
                    &format!("invariants.{index}.id"),
                    format!("invariant id `{}` is used twice", source.id),
                );
            }
            invariants.extend(self.invariant(index, source, &known));
        }
        let mut quota_ids = HashSet::new();
        let mut quotas = Vec::new();
        for (index, source) in file.quotas.iter().enumerate() {
            if !quota_ids.insert(source.id.as_str()) {
                self.error(
                    &format!("quotas.{index}.id"),
                    format!("quota id `{}` is used twice", source.id),
                );
            }
            quotas.extend(self.quota(index, source, &known));
        }
        self.unconfined_channels(&file.rules, &rules);
        let (errors, warnings): (Vec<_>, Vec<_>) = self
            .diagnostics
            .into_iter()
            .partition(|d| d.severity == Severity::Error);
        if !errors.is_empty() {
            return Err(errors.into_iter().chain(warnings).collect());
        }
        Ok(CompiledFile {
            path: self.path.to_owned(),
            policy: CompiledPolicy {
                mode: file.mode,
                rules,
            },
            places,
            principals,
            tests,
            invariants,
            quotas,
            warnings,
        })
    }

    fn report(&mut self, severity: Severity, at: &str, message: String) {
        let (line, column) = self.spans.at(at);
        self.diagnostics.push(Diagnostic {
            file: self.path.to_owned(),
            line,
            column,
            severity,
            message,
        });
    }

    fn error(&mut self, at: &str, message: String) {
        self.report(Severity::Error, at, message);
    }

    fn principal(&mut self, name: &str, source: &PrincipalSource) -> Principal {
        let at = format!("principals.{name}");
        let mut uids = source.uids.clone();
        let mut gids = source.gids.clone();
        for (index, user) in source.users.iter().enumerate() {
            match nix::unistd::User::from_name(user) {
                Ok(Some(found)) => uids.push(found.uid.as_raw()),
                _ => self.error(
                    &format!("{at}.users.{index}"),
                    format!("no user named `{user}` on this machine"),
                ),
            }
        }
        for (index, group) in source.groups.iter().enumerate() {
            match nix::unistd::Group::from_name(group) {
                Ok(Some(found)) => gids.push(found.gid.as_raw()),
                _ => self.error(
                    &format!("{at}.groups.{index}"),
                    format!("no group named `{group}` on this machine"),
                ),
            }
        }
        // The daemon names a peer the policy maps to no principal `uid:<n>`; a principal of that
        // name would hand its rules to whoever has that uid.
        if name.starts_with(UNMAPPED_PREFIX) {
            self.error(&at, format!("principal names beginning with `{UNMAPPED_PREFIX}` are reserved for peers no principal maps"));
        }
        if uids.is_empty() && gids.is_empty() && !source.any {
            self.error(&at, format!("principal `{name}` matches nobody: give uids, gids, users, groups or `any: true`"));
        }
        Principal {
            name: name.to_owned(),
            uids,
            gids,
            any: source.any,
        }
    }

    fn rule(&mut self, at: &str, source: &RuleSource, known: &HashSet<&str>) -> Option<Rule> {
        let principals = self.principals(at, &source.principals, known);
        let (action, reason) = match (&source.allow, &source.deny) {
            (Some(reason), None) => (Action::Allow, reason.clone()),
            (None, Some(reason)) => (Action::Deny, reason.clone()),
            _ => {
                self.error(
                    at,
                    format!(
                        "rule `{}` needs exactly one of `allow: <reason>` or `deny: <reason>`",
                        source.id
                    ),
                );
                return None;
            }
        };
        let what = format!("rule `{}`", source.id);
        let target = self.target(
            at,
            &what,
            &source.commands,
            &source.keys,
            &source.lanes,
            &source.leases,
        )?;
        let target = self.channels(at, source, action, target);
        self.scripts(at, source, action);
        Some(Rule {
            id: source.id.clone(),
            principals,
            target,
            action,
            reason,
        })
    }

    /// The quota at `quotas.{index}`: known principals, at least one limit, no limit of zero.
    fn quota(
        &mut self,
        index: usize,
        source: &QuotaSource,
        known: &HashSet<&str>,
    ) -> Option<Quota> {
        let at = format!("quotas.{index}");
        let principals = self.principals(&at, &source.principals, known);
        if source.commands_per_second.is_none()
            && source.bytes_per_second.is_none()
            && source.leases.is_none()
            && source.script_time_limit.is_none()
        {
            self.error(
                &at,
                format!(
                    "quota `{}` sets no limit: give `commands_per_second`, `bytes_per_second`, \
                     `leases`, `script_time_limit` or several",
                    source.id
                ),
            );
            return None;
        }
        let mut positive = |field: &str, value: Option<u64>| {
            if value == Some(0) {
                self.error(
                    &format!("{at}.{field}"),
                    format!(
                        "quota `{}`: `{field}` is 0, which would refuse everything; \
                         deny with a rule instead",
                        source.id
                    ),
                );
            }
            value
        };
        let per_second = positive("commands_per_second", source.commands_per_second);
        let burst = positive("burst", source.burst);
        let bytes = positive(
            "bytes_per_second",
            source.bytes_per_second.map(|size| size.0 as u64),
        );
        let leases = positive("leases", source.leases);
        if burst.is_some() && per_second.is_none() {
            self.error(
                &format!("{at}.burst"),
                format!(
                    "quota `{}`: `burst` sizes the commands bucket; give `commands_per_second` too",
                    source.id
                ),
            );
        }
        let script_time_limit = source.script_time_limit;
        if script_time_limit.is_some_and(|limit| limit < MIN_SCRIPT_TIME_LIMIT) {
            self.error(
                &format!("{at}.script_time_limit"),
                format!(
                    "quota `{}`: `script_time_limit` must be at least {MIN_SCRIPT_TIME_LIMIT:?}: \
                     Redis looks at a running script's time only that often",
                    source.id
                ),
            );
        }
        let (line, _) = self.spans.at(&at);
        Some(Quota {
            id: source.id.clone(),
            principals,
            commands: per_second.map(|per_second| Rate {
                per_second,
                burst: burst.unwrap_or(per_second),
            }),
            bytes: bytes.map(|per_second| Rate {
                per_second,
                burst: per_second,
            }),
            leases,
            script_time_limit,
            line,
        })
    }

    /// A rule's or selector's `principals`, each checked to be known.
    fn principals(
        &mut self,
        at: &str,
        principals: &Option<Vec<String>>,
        known: &HashSet<&str>,
    ) -> Option<Vec<String>> {
        principals.as_ref().map(|names| {
            for (index, name) in names.iter().enumerate() {
                if !known.contains(name.as_str()) {
                    self.error(
                        &format!("{at}.principals.{index}"),
                        format!("unknown principal `{name}`"),
                    );
                }
            }
            names.clone()
        })
    }

    /// What a rule or selector at `at` (`what` names it in messages) applies to: commands, with
    /// optional keys and lanes, or lease resources.
    fn target(
        &mut self,
        at: &str,
        what: &str,
        commands: &Option<Vec<String>>,
        keys: &Option<Vec<String>>,
        lanes: &Option<Vec<String>>,
        leases: &Option<Vec<String>>,
    ) -> Option<Target> {
        match (commands, leases) {
            (Some(commands), None) => self.commands(at, commands, keys, lanes),
            (None, Some(resources)) => {
                if keys.is_some() || lanes.is_some() {
                    self.error(
                        at,
                        format!("{what}: `keys` and `lanes` apply to commands, not leases"),
                    );
                }
                self.globs(&format!("{at}.leases"), resources);
                Some(Target::Leases {
                    resources: resources.clone(),
                })
            }
            _ => {
                self.error(
                    at,
                    format!("{what} needs exactly one of `commands` or `leases`"),
                );
                None
            }
        }
    }

    /// The invariant at `invariants.{index}`: its selector as a rule whose action reads keys as
    /// the invariant does (`never`: deny, any key; `always`: allow, every key).
    fn invariant(
        &mut self,
        index: usize,
        source: &InvariantSource,
        known: &HashSet<&str>,
    ) -> Option<Invariant> {
        let at = format!("invariants.{index}");
        let (must, selector, field) = match (&source.never, &source.always) {
            (Some(selector), None) => (Must::Never, selector, "never"),
            (None, Some(selector)) => (Must::Always, selector, "always"),
            _ => {
                self.error(
                    &at,
                    format!(
                        "invariant `{}` needs exactly one of `never: {{...}}` or `always: {{...}}`",
                        source.id
                    ),
                );
                return None;
            }
        };
        let here = format!("{at}.{field}");
        let what = format!("invariant `{}`", source.id);
        let principals = self.principals(&here, &selector.principals, known);
        let target = self.target(
            &here,
            &what,
            &selector.commands,
            &selector.keys,
            &selector.lanes,
            &selector.leases,
        )?;
        let target = self.with_channels(&here, &what, selector.channels.as_ref(), target);
        let (line, column) = self.spans.at(&at);
        Some(Invariant {
            id: source.id.clone(),
            must,
            selector: Rule {
                id: source.id.clone(),
                principals,
                target,
                action: match must {
                    Must::Never => Action::Deny,
                    Must::Always => Action::Allow,
                },
                reason: String::new(),
            },
            line,
            column,
        })
    }

    /// The rule's `channels:` added to its target: globs checked, only on command rules. An
    /// allow rule with `keys:` and no `channels:` that names a command reaching channels
    /// (`PUBLISH`, `SUBSCRIBE`, `PSUBSCRIBE`, or `@pubsub`) is refused: its author meant to
    /// confine them, and keys never do (the rule would never match them).
    fn channels(
        &mut self,
        at: &str,
        source: &RuleSource,
        action: Action,
        target: Target,
    ) -> Target {
        let unconfined =
            source.channels.is_none() && action == Action::Allow && source.keys.is_some();
        if let Some((index, entry)) = named_channel_command(source).filter(|_| unconfined) {
            self.error(
                &format!("{at}.commands.{index}"),
                format!(
                    "rule `{}`: `{entry}` reaches commands that name channels (PUBLISH, \
                     SUBSCRIBE, PSUBSCRIBE), which `keys:` does not confine: the rule would \
                     never allow them; give the rule `channels:` globs (e.g. the keys' own \
                     prefixes), or leave `{entry}` out",
                    source.id
                ),
            );
        }
        let what = format!("rule `{}`", source.id);
        self.with_channels(at, &what, source.channels.as_ref(), target)
    }

    /// `target` confined to the channel globs at `{at}.channels` (`what` names the rule or the
    /// invariant in messages): checked, and only on commands.
    fn with_channels(
        &mut self,
        at: &str,
        what: &str,
        globs: Option<&Vec<String>>,
        target: Target,
    ) -> Target {
        let Some(globs) = globs else {
            return target;
        };
        let mut target = target;
        match &mut target {
            Target::Commands { channels, .. } => {
                if globs.is_empty() {
                    self.error(
                        &format!("{at}.channels"),
                        format!(
                            "`channels` is empty: {what} would never match a command with channels"
                        ),
                    );
                }
                self.globs(&format!("{at}.channels"), globs);
                *channels = Some(globs.clone());
            }
            Target::Leases { .. } => self.error(
                &format!("{at}.channels"),
                format!("{what}: `channels` apply to commands, not leases"),
            ),
        }
        target
    }

    /// A principal some allow rule confines to keys must not get channels unconfined by another
    /// rule that says neither `keys:` nor `channels:` (the hole tenants policies had: acme's
    /// `PUBLISH globex:chan` reached globex). Such a rule is refused at its `commands:` entry;
    /// `channels: ["*"]` grants every channel on purpose.
    fn unconfined_channels(&mut self, sources: &[RuleSource], rules: &[Rule]) {
        let found = self.granted_to_confined(sources, rules, &CHANNEL_COMMANDS, |_, rule| {
            rule.matches_channels()
        });
        for grant in found {
            self.error(
                &grant.at,
                format!(
                    "rule `{}` grants {} on every channel to {}, whose keys rule `{}` \
                     confines: give it `channels:` globs (`[\"*\"]` to grant every channel on \
                     purpose), or leave the pub/sub commands out",
                    grant.rule, grant.command, grant.who, grant.keyed
                ),
            );
        }
    }

    /// Every allow rule without `keys:` (and not `exempt`) whose `commands:` reach one of `names`
    /// for a principal that another allow rule confines to keys: what the channel check above refuses.
    fn granted_to_confined(
        &self,
        sources: &[RuleSource],
        rules: &[Rule],
        names: &[&'static str],
        exempt: impl Fn(&RuleSource, &Rule) -> bool,
    ) -> Vec<ConfinedGrant> {
        let keyed: Vec<&Rule> = rules
            .iter()
            .filter(|rule| rule.action == Action::Allow && rule.matches_keys())
            .collect();
        let mut found = Vec::new();
        for (index, source) in sources.iter().enumerate() {
            let Some(rule) = rules.iter().find(|rule| rule.id == source.id) else {
                continue;
            };
            if rule.action != Action::Allow || rule.matches_keys() || exempt(source, rule) {
                continue;
            }
            let Some((entry, command)) = self.command_reached(source, names) else {
                continue;
            };
            let Some((who, keyed)) = confined_by(rule, &keyed) else {
                continue;
            };
            found.push(ConfinedGrant {
                at: format!("rules.{index}.commands.{entry}"),
                rule: rule.id.clone(),
                command,
                who,
                keyed: keyed.to_owned(),
            });
        }
        found
    }

    /// The first `commands` entry of `source` that reaches one of `names` (catalog names,
    /// `PARENT|SUB` for a subcommand), and that name: `*`, a category of it, the command itself,
    /// or its parent command (`FUNCTION` reaches every `FUNCTION` subcommand).
    fn command_reached(
        &self,
        source: &RuleSource,
        names: &[&'static str],
    ) -> Option<(usize, &'static str)> {
        let commands = source.commands.as_ref()?;
        commands.iter().enumerate().find_map(|(index, entry)| {
            names
                .iter()
                .find(|name| {
                    if entry == "*" {
                        return true;
                    }
                    if let Some(category) = entry.strip_prefix('@') {
                        return Category::from_name(category).is_some_and(|category| {
                            self.catalog.categories(name).contains(category)
                        });
                    }
                    let entry = entry.to_ascii_uppercase().replace(' ', "|");
                    entry == **name
                        || name
                            .split_once('|')
                            .is_some_and(|(parent, _)| parent == entry)
                })
                .map(|name| (index, *name))
        })
    }

    /// `scripts: unconstrained` on an allow rule that lets its principals run scripts takes them
    /// out of their scope (their scripts reach any key); anywhere else it does nothing, which is
    /// a warning. A key-constrained rule that allows scripts needs no such word: its principals'
    /// scripts run as their scope's Redis user, which Redis holds to the policy's key grants
    /// (`crate::scope`).
    fn scripts(&mut self, at: &str, source: &RuleSource, action: Action) {
        let granted = action == Action::Allow && self.script_granted(source).is_some();
        if !granted && source.scripts == Some(ScriptAccess::Unconstrained) {
            self.report(
                Severity::Warning,
                &format!("{at}.scripts"),
                format!(
                    "rule `{}`: `scripts: unconstrained` has no effect: the rule does not allow \
                     scripts",
                    source.id
                ),
            );
        }
    }

    /// The first `commands` entry that lets the rule match a script command (its index, the entry,
    /// and the command as a client writes it): one that runs code on keys (EVAL, FCALL and their
    /// variants; `*` and categories reach these), or any scripting command named outright
    /// (`SCRIPT`, `FUNCTION LOAD`).
    fn script_granted<'s>(&self, source: &'s RuleSource) -> Option<(usize, &'s str, String)> {
        let commands = source.commands.as_ref()?;
        commands.iter().enumerate().find_map(|(index, entry)| {
            let granted = if entry == "*" {
                self.scripting.iter().find(|(_, c)| c.keyed)
            } else if let Some(category) = entry.strip_prefix('@') {
                let category = Category::from_name(category)?;
                self.scripting
                    .iter()
                    .find(|(_, c)| c.keyed && c.categories.contains(category))
            } else {
                let name = entry.to_ascii_uppercase().replace(' ', "|");
                self.scripting.iter().find(|(script, _)| {
                    *script == name || script.split_once('|').is_some_and(|(p, _)| p == name)
                })
            };
            granted.map(|(script, _)| (index, entry.as_str(), script.replace('|', " ")))
        })
    }

    fn commands(
        &mut self,
        at: &str,
        commands: &[String],
        keys: &Option<Vec<String>>,
        lanes: &Option<Vec<String>>,
    ) -> Option<Target> {
        if commands.is_empty() {
            self.error(
                &format!("{at}.commands"),
                "`commands` is empty: the rule would never match".into(),
            );
        }
        let mut names = Vec::new();
        let mut categories = CategorySet::default();
        let mut any = false;
        for (index, command) in commands.iter().enumerate() {
            let here = format!("{at}.commands.{index}");
            if command == "*" {
                any = true;
            } else if let Some(category) = command.strip_prefix('@') {
                match Category::from_name(category) {
                    Some(category) => categories = categories.with(category),
                    None => self.error(
                        &here,
                        format!(
                            "unknown category `@{category}` (known: {})",
                            Category::ALL.map(|c| format!("@{}", c.as_str())).join(" ")
                        ),
                    ),
                }
            } else {
                let name = command.to_ascii_uppercase().replace(' ', "|");
                if self.catalog.knows(&name) {
                    names.push(name);
                } else {
                    self.error(
                        &here,
                        format!("unknown command `{command}`: the catalog does not know it"),
                    );
                }
            }
        }
        if let Some(keys) = keys {
            if keys.is_empty() {
                self.error(
                    &format!("{at}.keys"),
                    "`keys` is empty: the rule would never match a command with keys".into(),
                );
            }
            self.globs(&format!("{at}.keys"), keys);
        }
        let lanes = lanes.as_ref().map(|lanes| {
            lanes
                .iter()
                .enumerate()
                .fold(0u8, |mask, (index, lane)| match Lane::from_str(lane) {
                    Ok(lane) => mask | 1 << Lane::ALL.iter().position(|l| *l == lane).unwrap_or(0),
                    Err(error) => {
                        self.error(&format!("{at}.lanes.{index}"), error.to_string());
                        mask
                    }
                })
        });
        Some(Target::Commands {
            names,
            categories,
            any,
            keys: keys.clone(),
            channels: None,
            lanes,
        })
    }

    fn globs(&mut self, at: &str, globs: &[String]) {
        for (index, pattern) in globs.iter().enumerate() {
            if let Err(error) = glob::check(pattern.as_bytes()) {
                self.error(
                    &format!("{at}.{index}"),
                    format!(
                        "bad glob `{pattern}`: {} (at byte {})",
                        error.message, error.offset
                    ),
                );
            }
        }
    }

    /// Warns when an earlier rule matches everything `rule` matches, or when the check gives up.
    fn shadowed(&mut self, at: &str, rule: &Rule, earlier: &[Rule], shadows: &mut Shadows) {
        let message = match shadows.check(rule, earlier) {
            Shadow::Clear => return,
            Shadow::CoveredBy(index) => format!(
                "rule `{}` can never match: rule `{}` before it matches everything it does",
                rule.id, earlier[index].id
            ),
            Shadow::Exhausted => format!(
                "rules from `{}` on are not checked for being shadowed by earlier ones: the \
                 check spent its budget ({BUDGET} units of comparison work) on rules too alike to \
                 tell apart by principal, command or key; the policy compiles, but split it or \
                 make rules differ to get the check back",
                rule.id
            ),
        };
        self.report(Severity::Warning, at, message);
    }

    fn test(
        &mut self,
        index: usize,
        test: &TestSource,
        known: &HashSet<&str>,
        ids: &HashSet<&str>,
    ) -> Option<Expectation> {
        let at = format!("tests.{index}");
        if !known.contains(test.principal.as_str()) {
            self.error(
                &format!("{at}.principal"),
                format!("unknown principal `{}`", test.principal),
            );
        }
        if let Some(rule) = &test.rule {
            if rule != DEFAULT_DENY && !ids.contains(rule.as_str()) {
                self.error(&format!("{at}.rule"), format!("no rule with id `{rule}`"));
            }
        }
        let argv: Vec<String> = test.command.split_whitespace().map(str::to_owned).collect();
        if argv.is_empty() {
            self.error(&format!("{at}.command"), "empty command".into());
            return None;
        }
        Some(Expectation {
            principal: test.principal.clone(),
            argv,
            expect: test.expect,
            rule: test.rule.clone(),
            line: self.spans.at(&at).0,
        })
    }
}
