//! What admission answers: a command admitted with its descriptor and lane, or a denial that
//! names the rule, the module and the cause.

use std::fmt;

use serde::Serialize;
use tollgate_model::Lane;
use tollgate_policy_rules::channels::Kind;
use tollgate_policy_rules::{Category, CategorySet};

use crate::sandbox::bindings;

#[derive(Debug, Clone)]
pub enum Decision {
    Admitted {
        descriptor: std::sync::Arc<Descriptor>,
        lane: Lane,
        /// The rule that allowed it (the first guard's that did; `audit:<id>` under `mode: audit`),
        /// shared with the guard's memo: not copied per command.
        rule: std::sync::Arc<str>,
    },
    /// Boxed: a refusal is the rare answer, and a decision travels with every admitted command of
    /// a pipelined batch (32 bytes rather than 112).
    Denied(Box<Denial>),
}

/// Why a command was refused. The front door answers
/// `-NOPERM tollgate: rule <rule> denies <command>: <reason>` (see [`Denial`]'s `Display`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub rule: String,
    pub module: String,
    pub reason: String,
    pub cause: DenyCause,
    /// The canonical name, or the name as sent when the catalog does not know it.
    pub command: String,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rule {} denies {}: {}",
            self.rule, self.command, self.reason
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DenyCause {
    /// A rule denied it.
    Rule,
    /// No guard allowed it (policies are default-deny).
    NoRule,
    /// No catalog knows the command.
    UnknownCommand,
    /// The command has too few or too many arguments for its arity (Redis would refuse it too).
    WrongArity,
    /// The module trapped.
    Trap,
    /// The module ran out of its budget: fuel, or the wall-clock deadline.
    Deadline,
    /// The module tried to grow past its memory cap.
    OutOfMemory,
    /// The module's answer was unusable (too large, impossible key positions), or argv was empty.
    Malformed,
    /// It names the daemon's reserved keyspace, which no policy can grant.
    Reserved,
}

impl DenyCause {
    /// Every cause a denial can have.
    pub const ALL: [DenyCause; 9] = [
        DenyCause::Rule,
        DenyCause::NoRule,
        DenyCause::UnknownCommand,
        DenyCause::WrongArity,
        DenyCause::Trap,
        DenyCause::Deadline,
        DenyCause::OutOfMemory,
        DenyCause::Malformed,
        DenyCause::Reserved,
    ];

    /// Whether a module failed (as opposed to a rule or the catalog deciding).
    pub fn is_fault(self) -> bool {
        matches!(
            self,
            DenyCause::Trap | DenyCause::Deadline | DenyCause::OutOfMemory | DenyCause::Malformed
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DenyCause::Rule => "rule",
            DenyCause::NoRule => "no-rule",
            DenyCause::UnknownCommand => "unknown-command",
            DenyCause::WrongArity => "wrong-arity",
            DenyCause::Trap => "trap",
            DenyCause::Deadline => "deadline",
            DenyCause::OutOfMemory => "out-of-memory",
            DenyCause::Malformed => "malformed",
            DenyCause::Reserved => "reserved",
        }
    }
}

/// What the command does, from Redis's flags and categories.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Traits {
    pub write: bool,
    pub readonly: bool,
    pub admin: bool,
    pub blocking: bool,
    pub dangerous: bool,
    pub pubsub: bool,
    pub scripting: bool,
    pub transaction: bool,
}

/// One key of a command: its index in argv and how the command uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KeyAccess {
    pub position: usize,
    pub read: bool,
    pub write: bool,
}

/// A command as the catalog describes it, with key positions resolved for the argv it came with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Descriptor {
    /// Canonical, upper case, subcommand after a bar: `CLIENT|LIST`.
    pub name: String,
    pub lane: Lane,
    #[serde(serialize_with = "category_names")]
    pub categories: CategorySet,
    pub traits: Traits,
    pub arity: i32,
    pub keys: Vec<KeyAccess>,
}

impl Descriptor {
    /// The arguments of `argv` that are keys, in argv order.
    pub fn keys<'a, A>(&'a self, argv: &'a [A]) -> impl Iterator<Item = &'a A> + 'a {
        self.keys.iter().filter_map(|key| argv.get(key.position))
    }

    /// What request classes split this command by: its channels when it names plain channels
    /// or patterns (`PUBLISH`, `PSUBSCRIBE`), else its keys. The decision log records these, so
    /// that a replay finds the class a request was in.
    pub fn named<'a, A>(&'a self, argv: &'a [A]) -> Vec<&'a A> {
        match tollgate_policy_rules::channels::of(&self.name, argv) {
            Some((Kind::Plain | Kind::Pattern, channels)) => channels.iter().collect(),
            _ => self.keys(argv).collect(),
        }
    }
}

fn category_names<S: serde::Serializer>(set: &CategorySet, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(set.iter().map(Category::as_str))
}

pub(crate) fn lane_from_wit(lane: bindings::Lane) -> Lane {
    match lane {
        bindings::Lane::Regular => Lane::Regular,
        bindings::Lane::Blocking => Lane::Blocking,
        bindings::Lane::Transaction => Lane::Transaction,
        bindings::Lane::Script => Lane::Script,
        bindings::Lane::Pubsub => Lane::Pubsub,
        bindings::Lane::Admin => Lane::Admin,
    }
}

impl From<&bindings::Descriptor> for Descriptor {
    fn from(d: &bindings::Descriptor) -> Descriptor {
        use bindings::{Categories as C, CommandFlags as F};
        const CATEGORIES: [(C, Category); 21] = [
            (C::KEYSPACE, Category::Keyspace),
            (C::READ, Category::Read),
            (C::WRITE, Category::Write),
            (C::SET, Category::Set),
            (C::SORTEDSET, Category::Sortedset),
            (C::LIST, Category::List),
            (C::HASH, Category::Hash),
            (C::STRING, Category::String),
            (C::BITMAP, Category::Bitmap),
            (C::HYPERLOGLOG, Category::Hyperloglog),
            (C::GEO, Category::Geo),
            (C::STREAM, Category::Stream),
            (C::PUBSUB, Category::Pubsub),
            (C::ADMIN, Category::Admin),
            (C::FAST, Category::Fast),
            (C::SLOW, Category::Slow),
            (C::BLOCKING, Category::Blocking),
            (C::DANGEROUS, Category::Dangerous),
            (C::CONNECTION, Category::Connection),
            (C::TRANSACTION, Category::Transaction),
            (C::SCRIPTING, Category::Scripting),
        ];
        let flags = d.traits;
        Descriptor {
            name: d.name.clone(),
            lane: lane_from_wit(d.lane),
            categories: CATEGORIES
                .iter()
                .filter(|(flag, _)| d.categories.contains(*flag))
                .map(|(_, category)| *category)
                .collect(),
            traits: Traits {
                write: flags.contains(F::WRITE),
                readonly: flags.contains(F::READONLY),
                admin: flags.contains(F::ADMIN),
                blocking: flags.contains(F::BLOCKING),
                dangerous: flags.contains(F::DANGEROUS),
                pubsub: flags.contains(F::PUBSUB),
                scripting: flags.contains(F::SCRIPTING),
                transaction: flags.contains(F::TRANSACTION),
            },
            arity: d.arity,
            keys: d
                .keys
                .iter()
                .map(|k| KeyAccess {
                    position: k.position as usize,
                    read: k.access.contains(bindings::Access::READ),
                    write: k.access.contains(bindings::Access::WRITE),
                })
                .collect(),
        }
    }
}
