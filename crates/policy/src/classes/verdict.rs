//! What the class analyses say of one request class: the decision a generation gives it
//! ([`Verdict`]) and the request that stands for it ([`Witness`]), replayable with `tollgate policy
//! explain`. Plain data, apart from the analyses (`classes/mod.rs`) that compute them, so that
//! reports built on them (invariants, replay) and the errors that carry those reports depend on
//! nothing that builds generations.

use serde::Serialize;

use crate::decision::DenyCause;

/// One generation's decision, as review and diff compare them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Verdict {
    pub allowed: bool,
    pub rule: String,
    /// The module that denied, when one did.
    pub module: Option<String>,
    /// Why it denied, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<DenyCause>,
    /// The operator guard modules that took part: opaque to this analysis, so the decision is
    /// known for the witness only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sampled: Vec<String>,
}

impl Verdict {
    /// Whether two verdicts decide alike by the same rule.
    pub fn same(&self, other: &Verdict) -> bool {
        self.allowed == other.allowed && self.rule == other.rule
    }

    /// Whether no rule of a policy decided: a denial by default (no rule allowed) or by the host
    /// (the reserved keyspace, a command no catalog knows or of the wrong arity).
    pub fn by_default_or_host(&self) -> bool {
        matches!(
            self.cause,
            Some(
                DenyCause::NoRule
                    | DenyCause::Reserved
                    | DenyCause::UnknownCommand
                    | DenyCause::WrongArity
            )
        )
    }

    pub fn word(&self) -> &'static str {
        if self.allowed {
            "allow"
        } else {
            "deny"
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.word(), self.rule)
    }
}

/// A request that stands for its class, replayable with `tollgate policy explain`.
#[derive(Debug, Clone, Serialize)]
pub struct Witness {
    pub uid: u32,
    pub gid: u32,
    /// The principal under each generation.
    pub principals: Vec<String>,
    /// The command (canonical name) or `LEASE`.
    pub command: String,
    pub lane: Option<&'static str>,
    pub keys: Vec<String>,
    /// The argv replayed; `None` when no form of the command the catalog describes holds these
    /// keys (it was judged from the catalog's descriptor, as review does).
    pub argv: Option<Vec<String>>,
}

impl Witness {
    /// `--principal app -- SET app:x v` (or `--uid 1000 --gid 65534` when the generations map
    /// the peer to different principals or to none).
    pub fn replay(&self) -> String {
        format!("{} -- {}", self.peer(), self.request())
    }

    /// `--principal app`, or `--uid 1000 --gid 65534` when the generations map the peer to
    /// different principals or to none.
    pub fn peer(&self) -> String {
        peer_flags(self.uid, self.gid, &self.principals)
    }

    /// `SET app:x v`, shell-quoted.
    pub fn request(&self) -> String {
        let words = |words: &[String]| words.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ");
        match &self.argv {
            Some(argv) => words(argv),
            None => format!(
                "{} {}  (no argv found; judged from the descriptor)",
                self.command,
                words(&self.keys)
            ),
        }
    }
}

/// A shell word for `text`.
fn quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":_-.,/@+=|".contains(&b));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// How `policy explain` is told the peer `uid`/`gid` whose principal under each generation is
/// `principals`: by name when they agree on a mapped one.
pub(super) fn peer_flags(uid: u32, gid: u32, principals: &[String]) -> String {
    let same = principals.windows(2).all(|w| w[0] == w[1]);
    match principals.first() {
        Some(name) if same && !name.starts_with("uid:") => format!("--principal {name}"),
        _ => format!("--uid {uid} --gid {gid}"),
    }
}
