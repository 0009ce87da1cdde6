//! What a generation could admit, worked out from its YAML rules rather than asked of its guards:
//! for every principal, each catalog command and lane that some arguments could get through the
//! guard chain. The daemon cuts the lanes' Redis ACL users to it, so that what the policy allows
//! Redis allows too, and what no principal may run Redis refuses as well.
//!
//! It errs on the side of admitting. A rule with `keys:` may or may not match, depending on the
//! keys, so both ways are followed; two policy files are judged as if their keys were independent;
//! and operator guard modules, which no one can read, are taken to allow whatever no YAML guard
//! denies outright (they can only narrow that further).

use std::collections::BTreeSet;

use tollgate_model::Lane;
use tollgate_policy_rules::{
    channels, Action, Channels, CompiledPolicy, Mode, Request, Rule, Subject, Target,
};

use crate::decision::Descriptor;

/// A command Redis may be asked to run, as the catalogs describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissibleCommand {
    /// Canonical, upper case, subcommand after a bar: `CLIENT|LIST`.
    pub name: String,
    pub arity: i32,
    /// It runs code that calls other commands (EVAL, FCALL and their variants): those calls run
    /// on the script's connection, as its ACL user.
    pub runs_code: bool,
}

/// What one principal could be admitted to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrincipalReach {
    /// `None`: a caller no policy names (`uid:<n>`), whom only rules without `principals:` cover.
    pub principal: Option<String>,
    /// `(lane admitted on, index into [`Admissible::commands`])`.
    pub commands: BTreeSet<(Lane, usize)>,
}

/// Every principal's reach under one generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admissible {
    /// Every command the catalogs describe that Redis runs as named: a parent whose subcommands
    /// are listed (`CLIENT`) is left out, since Redis runs only its subcommands; one Redis also
    /// runs bare (`COMMAND`) is in, beside its subcommands, and stands for that bare form alone.
    pub commands: Vec<AdmissibleCommand>,
    pub principals: Vec<PrincipalReach>,
}

impl Admissible {
    /// The commands `reach` may run, with the lane each is admitted on.
    pub fn of<'a>(
        &'a self,
        reach: &'a PrincipalReach,
    ) -> impl Iterator<Item = (Lane, &'a AdmissibleCommand)> + 'a {
        reach
            .commands
            .iter()
            .map(|(lane, at)| (*lane, &self.commands[*at]))
    }
}

/// [`Admissible`] for `policies` (one YAML guard each, in chain order) and the catalog's
/// `descriptors`; `modules`: the chain also holds operator guard modules.
pub fn derive(
    policies: &[&CompiledPolicy],
    modules: bool,
    principals: &[&str],
    descriptors: &[Descriptor],
) -> Admissible {
    let guards: Vec<Unkeyed> = policies.iter().map(|policy| Unkeyed::of(policy)).collect();
    let runnable: Vec<&Descriptor> = descriptors
        .iter()
        .filter(|d| runs_bare(d) || !is_parent(&d.name, descriptors))
        .collect();
    let commands = runnable
        .iter()
        .map(|d| AdmissibleCommand {
            name: d.name.clone(),
            arity: d.arity,
            runs_code: d.traits.scripting && !d.keys.is_empty(),
        })
        .collect();
    let unnamed = unnamed(principals);
    let whom = principals
        .iter()
        .map(|p| (Some((*p).to_owned()), *p))
        .chain(std::iter::once((None, unnamed.as_str())));
    let principals = whom
        .map(|(principal, name)| {
            let mut commands = BTreeSet::new();
            for (at, descriptor) in runnable.iter().enumerate() {
                for lane in lanes(descriptor) {
                    let verdicts: Vec<Possible> = guards
                        .iter()
                        .map(|guard| guard.possible(name, descriptor, lane))
                        .collect();
                    let never_denied = verdicts.iter().all(|v| v.allow || v.abstain);
                    let allowed = modules || verdicts.iter().any(|v| v.allow);
                    if never_denied && allowed {
                        commands.insert((lane, at));
                    }
                }
            }
            PrincipalReach {
                principal,
                commands,
            }
        })
        .collect();
    Admissible {
        commands,
        principals,
    }
}

/// A name no principal has, for the callers the policies do not name.
fn unnamed(principals: &[&str]) -> String {
    let mut name = String::from("*unnamed*");
    while principals.contains(&name.as_str()) {
        name.push('*');
    }
    name
}

/// Whether `name` is a parent listed next to its subcommands (`CLIENT` beside `CLIENT|LIST`).
pub(crate) fn is_parent(name: &str, descriptors: &[Descriptor]) -> bool {
    !name.contains('|')
        && descriptors.iter().any(|d| {
            d.name
                .split_once('|')
                .is_some_and(|(parent, _)| parent == name)
        })
}

/// Whether Redis runs `descriptor` with no further argument (arity 1 or -1): a parent that does
/// (`COMMAND`, the only one in Redis 7.0) is a command of its own as well as its subcommands'.
pub(crate) fn runs_bare(descriptor: &Descriptor) -> bool {
    descriptor.arity.unsigned_abs() == 1
}

/// The lanes a command can be admitted on: the catalog's, and BLOCKING too for a command Redis
/// flags blocking, since some block only with an option (`XREAD … BLOCK`) that moves them there.
fn lanes(descriptor: &Descriptor) -> BTreeSet<Lane> {
    let mut lanes = BTreeSet::from([descriptor.lane]);
    if descriptor.traits.blocking {
        lanes.insert(Lane::Blocking);
    }
    lanes
}

/// The verdicts a guard could give a command, over every choice of its arguments.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Possible {
    allow: bool,
    deny: bool,
    abstain: bool,
}

/// One YAML policy with its rules' key globs set aside, so that [`Rule::matches`] tells whether a
/// rule matches apart from the keys; `keyed[i]`: rule `i` had globs.
struct Unkeyed {
    mode: Mode,
    rules: Vec<Rule>,
    keyed: Vec<Named>,
}

/// Whether a rule had key globs and channel globs (taken off for [`Unkeyed`]).
#[derive(Debug, Clone, Copy, Default)]
struct Named {
    keys: bool,
    channels: bool,
}

impl Unkeyed {
    fn of(policy: &CompiledPolicy) -> Unkeyed {
        let mut keyed = Vec::with_capacity(policy.rules.len());
        let rules = policy
            .rules
            .iter()
            .map(|rule| {
                let mut rule = rule.clone();
                let had = match &mut rule.target {
                    Target::Commands { keys, channels, .. } => {
                        let keyed = keys.take().is_some();
                        let channelled = channels.take().is_some();
                        Named {
                            keys: keyed,
                            channels: channelled,
                        }
                    }
                    Target::Leases { .. } => Named::default(),
                };
                keyed.push(had);
                rule
            })
            .collect();
        Unkeyed {
            mode: policy.mode,
            rules,
            keyed,
        }
    }

    /// First match decides: a rule that matches whatever the keys ends the scan; one whose key
    /// globs may or may not match adds its verdict and lets the scan go on; no match abstains.
    fn possible(&self, principal: &str, descriptor: &Descriptor, lane: Lane) -> Possible {
        let no_keys: [&[u8]; 0] = [];
        let request = Request {
            principal,
            subject: Subject::Command {
                name: &descriptor.name,
                categories: descriptor.categories,
                // Lanes in WIT order, as the YAML guard numbers them.
                lane: lane as u8,
                keys: &no_keys,
                channels: Channels::none(),
            },
        };
        let names_channels = channels::positions(&descriptor.name, usize::MAX).is_some();
        let mut possible = Possible::default();
        for (rule, named) in self.rules.iter().zip(&self.keyed) {
            if !rule.matches(&request) {
                continue;
            }
            // A key glob matches only a command that names keys, a channel glob one that
            // names channels.
            let keyed = named.keys || named.channels;
            if keyed
                && !(named.keys && !descriptor.keys.is_empty() || named.channels && names_channels)
            {
                continue;
            }
            match (rule.action, self.mode) {
                // Under `mode: audit` a denial lets the command through.
                (Action::Allow, _) | (Action::Deny, Mode::Audit) => possible.allow = true,
                (Action::Deny, Mode::Enforce) => possible.deny = true,
            }
            if !keyed {
                return possible;
            }
        }
        possible.abstain = true;
        possible
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{KeyAccess, Traits};
    use tollgate_policy_rules::{Category, CategorySet};

    fn command(name: &str, lane: Lane, categories: &[Category], keyed: bool) -> Descriptor {
        Descriptor {
            name: name.into(),
            lane,
            categories: categories.iter().copied().collect::<CategorySet>(),
            traits: Traits::default(),
            arity: if keyed { 2 } else { 1 },
            keys: if keyed {
                vec![KeyAccess {
                    position: 1,
                    read: true,
                    write: false,
                }]
            } else {
                Vec::new()
            },
        }
    }

    fn catalog() -> Vec<Descriptor> {
        let mut eval = command("EVAL", Lane::Script, &[Category::Scripting], true);
        eval.traits.scripting = true;
        let mut xread = command("XREAD", Lane::Regular, &[Category::Stream], true);
        xread.traits.blocking = true;
        // Redis runs CLIENT only with a subcommand, COMMAND bare too.
        let mut client = command("CLIENT", Lane::Regular, &[Category::Slow], false);
        client.arity = -2;
        vec![
            command("GET", Lane::Regular, &[Category::Read], true),
            command("SORT", Lane::Regular, &[Category::Write], true),
            command("KEYS", Lane::Regular, &[Category::Keyspace], false),
            command("FLUSHDB", Lane::Regular, &[Category::Keyspace], false),
            client,
            command("CLIENT|LIST", Lane::Admin, &[Category::Connection], false),
            command("COMMAND", Lane::Regular, &[Category::Connection], false),
            command(
                "COMMAND|DOCS",
                Lane::Regular,
                &[Category::Connection],
                false,
            ),
            eval,
            xread,
        ]
    }

    fn rule(
        id: &str,
        principals: Option<&[&str]>,
        names: &[&str],
        categories: &[Category],
        keys: Option<&[&str]>,
        action: Action,
    ) -> Rule {
        Rule {
            id: id.into(),
            principals: principals.map(|p| p.iter().map(|s| (*s).to_owned()).collect()),
            target: Target::Commands {
                names: names.iter().map(|s| (*s).to_owned()).collect(),
                categories: categories.iter().copied().collect(),
                any: names == ["*"],
                keys: keys.map(|k| k.iter().map(|s| (*s).to_owned()).collect()),
                channels: None,
                lanes: None,
            },
            action,
            reason: id.into(),
        }
    }

    fn policy(rules: Vec<Rule>) -> CompiledPolicy {
        CompiledPolicy {
            mode: Mode::Enforce,
            rules,
        }
    }

    /// `principal`'s commands as `LANE NAME` (principal `None`: the unnamed).
    fn reach(admissible: &Admissible, principal: Option<&str>) -> Vec<String> {
        let reach = admissible
            .principals
            .iter()
            .find(|r| r.principal.as_deref() == principal)
            .expect("a reach per principal");
        admissible
            .of(reach)
            .map(|(lane, command)| format!("{} {}", lane.shout(), command.name))
            .collect()
    }

    #[test]
    fn allow_all_admits_every_command_and_only_the_parents_redis_runs_bare() {
        let all = policy(vec![rule("all", None, &["*"], &[], None, Action::Allow)]);
        let admissible = derive(&[&all], false, &["app"], &catalog());
        assert_eq!(
            reach(&admissible, Some("app")),
            [
                "REGULAR GET",
                "REGULAR SORT",
                "REGULAR KEYS",
                "REGULAR FLUSHDB",
                "REGULAR COMMAND",
                "REGULAR COMMAND|DOCS",
                "REGULAR XREAD",
                "BLOCKING XREAD",
                "SCRIPT EVAL",
                "ADMIN CLIENT|LIST",
            ]
        );
        assert!(admissible.commands.iter().all(|c| c.name != "CLIENT"));
        assert_eq!(reach(&admissible, None), reach(&admissible, Some("app")));
        let eval = admissible.commands.iter().find(|c| c.name == "EVAL");
        assert!(eval.is_some_and(|c| c.runs_code));
    }

    #[test]
    fn an_outright_denial_removes_a_command_and_default_deny_admits_nothing_unnamed() {
        let guarded = policy(vec![
            rule(
                "no-keys",
                None,
                &["KEYS", "FLUSHDB"],
                &[],
                None,
                Action::Deny,
            ),
            rule("app", Some(&["app"]), &["*"], &[], None, Action::Allow),
        ]);
        let admissible = derive(&[&guarded], false, &["app"], &catalog());
        let app = reach(&admissible, Some("app"));
        assert!(!app
            .iter()
            .any(|c| c.ends_with(" KEYS") || c.ends_with(" FLUSHDB")));
        assert!(app.contains(&"REGULAR GET".to_owned()));
        assert_eq!(reach(&admissible, None), Vec::<String>::new());
    }

    #[test]
    fn key_globs_admit_a_command_some_keys_get_through() {
        let tenant = policy(vec![
            rule(
                "protected",
                None,
                &["GET"],
                &[],
                Some(&["secret:*"]),
                Action::Deny,
            ),
            rule(
                "tenant",
                None,
                &[],
                &[Category::Read, Category::Keyspace],
                Some(&["acme:*"]),
                Action::Allow,
            ),
        ]);
        let admissible = derive(&[&tenant], false, &["app"], &catalog());
        // GET acme:1 is allowed past the key-dependent denial; KEYS names no key, so the tenant's
        // key glob can never allow it.
        assert_eq!(reach(&admissible, Some("app")), ["REGULAR GET"]);
    }

    /// A YAML guard whose only rule denies SORT.
    fn deny_sort() -> CompiledPolicy {
        policy(vec![rule(
            "no-sort",
            None,
            &["SORT"],
            &[],
            None,
            Action::Deny,
        )])
    }

    #[test]
    fn every_guard_must_be_able_to_let_it_through() {
        let allow = policy(vec![rule("all", None, &["*"], &[], None, Action::Allow)]);
        let deny_sort = deny_sort();
        let admissible = derive(&[&allow, &deny_sort], false, &["app"], &catalog());
        let app = reach(&admissible, Some("app"));
        assert!(!app.contains(&"REGULAR SORT".to_owned()), "{app:?}");
        assert!(app.contains(&"REGULAR GET".to_owned()), "{app:?}");
    }

    #[test]
    fn operator_modules_may_allow_what_no_yaml_guard_denies() {
        let deny_sort = deny_sort();
        let without = derive(&[&deny_sort], false, &["app"], &catalog());
        assert_eq!(reach(&without, Some("app")), Vec::<String>::new());
        let with = derive(&[&deny_sort], true, &["app"], &catalog());
        let app = reach(&with, Some("app"));
        assert!(app.contains(&"REGULAR GET".to_owned()), "{app:?}");
        assert!(!app.contains(&"REGULAR SORT".to_owned()), "{app:?}");
    }

    #[test]
    fn audit_mode_denials_let_commands_through() {
        let mut audited = policy(vec![
            rule("no-keys", None, &["KEYS"], &[], None, Action::Deny),
            rule("get", None, &["GET"], &[], None, Action::Allow),
        ]);
        audited.mode = Mode::Audit;
        let admissible = derive(&[&audited], false, &["app"], &catalog());
        assert_eq!(
            reach(&admissible, Some("app")),
            ["REGULAR GET", "REGULAR KEYS"]
        );
    }

    #[test]
    fn lane_rules_and_principals_narrow_what_is_admitted() {
        let mut blocking_only = rule(
            "xread",
            Some(&["worker"]),
            &["XREAD"],
            &[],
            None,
            Action::Allow,
        );
        if let Target::Commands { lanes, .. } = &mut blocking_only.target {
            *lanes = Some(1 << Lane::Blocking as u8);
        }
        let admissible = derive(
            &[&policy(vec![blocking_only])],
            false,
            &["app", "worker"],
            &catalog(),
        );
        assert_eq!(reach(&admissible, Some("worker")), ["BLOCKING XREAD"]);
        assert_eq!(reach(&admissible, Some("app")), Vec::<String>::new());
    }
}
