//! Per-principal quotas a policy sets (`quotas:`), as compiled: rates of commands and of bytes,
//! each a token bucket, how many leases a principal may hold at once, and how long its scripts
//! may run. The daemon keeps the buckets and the held leases (`daemon/src/quotas`) and watches
//! the scripts (`tollgate_lanes::ScriptLimit`); this is what sizes them, whom they hold, and how
//! review, diff and explain word them.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// One entry of a policy's `quotas:` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Quota {
    pub id: String,
    /// The principals it holds, each to its own buckets. `None`: every principal, administrators
    /// excepted (a quota that names a principal holds that principal's administrators too).
    pub principals: Option<Vec<String>>,
    /// Commands (RESP commands, `LEASE` calls, HTTP lease requests) per second.
    pub commands: Option<Rate>,
    /// Request and reply bytes per second; a reply's bytes are owed once it has been read.
    pub bytes: Option<Rate>,
    /// Leases (exclusive, semaphore permits taken at once, read/write) held at once.
    pub leases: Option<u64>,
    /// How long one of its principals' scripts (`EVAL`, `FCALL` …) may run before the daemon
    /// stops it; acts only when shorter than the daemon's `resp.script_time_limit`.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub script_time_limit: Option<Duration>,
    /// Where it is written.
    pub line: usize,
}

/// The shortest script time limit, in the config or a quota: Redis looks at a running script's
/// time every 100,000 instructions (and reads a kill only then); a limit shorter than that is no
/// limit.
pub const MIN_SCRIPT_TIME_LIMIT: Duration = Duration::from_millis(10);

/// A token bucket's refill rate and depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rate {
    pub per_second: u64,
    /// How many may be taken at once from a full bucket.
    pub burst: u64,
}

/// What a quota limits, as its refusals and metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    Commands,
    Bytes,
    Leases,
}

impl Limit {
    pub const ALL: [Limit; 3] = [Limit::Commands, Limit::Bytes, Limit::Leases];
    /// The limits that are rates (token buckets).
    pub const RATES: [Limit; 2] = [Limit::Commands, Limit::Bytes];

    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Commands => "commands",
            Limit::Bytes => "bytes",
            Limit::Leases => "leases",
        }
    }
}

impl Quota {
    /// Whether it holds a caller of `principal` (`admin`: an administrator of the daemon).
    pub fn holds(&self, principal: &str, admin: bool) -> bool {
        match &self.principals {
            Some(names) => names.iter().any(|name| name == principal),
            None => !admin,
        }
    }

    /// The rate of `limit`, if it sets one (`Leases` is a count, never a rate).
    pub fn rate(&self, limit: Limit) -> Option<Rate> {
        match limit {
            Limit::Commands => self.commands,
            Limit::Bytes => self.bytes,
            Limit::Leases => None,
        }
    }

    /// Whether `other` holds the same principals to the same limits (wherever it is written).
    pub fn same_limits(&self, other: &Quota) -> bool {
        self.principals == other.principals
            && self.commands == other.commands
            && self.bytes == other.bytes
            && self.leases == other.leases
            && self.script_time_limit == other.script_time_limit
    }

    /// Whom it holds, as review shows it.
    pub fn whom(&self) -> String {
        match &self.principals {
            Some(names) => names.join(", "),
            None => "every principal but administrators".to_owned(),
        }
    }
}

/// How a quota differs between two policies: a row of `policy diff`'s plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "lowercase")]
pub enum QuotaChange {
    Added { new: Quota },
    Removed { old: Quota },
    Changed { old: Quota, new: Quota },
}

impl QuotaChange {
    /// The quotas whose id, principals or rates differ, by id, in the new policy's order and
    /// then the removed ones in the old's.
    pub fn between<'a>(
        old: impl IntoIterator<Item = &'a Quota>,
        new: impl IntoIterator<Item = &'a Quota>,
    ) -> Vec<QuotaChange> {
        let old: Vec<&Quota> = old.into_iter().collect();
        let new: Vec<&Quota> = new.into_iter().collect();
        let mut changes = Vec::new();
        for quota in &new {
            match old.iter().find(|o| o.id == quota.id) {
                None => changes.push(QuotaChange::Added {
                    new: (*quota).clone(),
                }),
                Some(before) if !before.same_limits(quota) => changes.push(QuotaChange::Changed {
                    old: (*before).clone(),
                    new: (*quota).clone(),
                }),
                Some(_) => {}
            }
        }
        for quota in old {
            if !new.iter().any(|n| n.id == quota.id) {
                changes.push(QuotaChange::Removed { old: quota.clone() });
            }
        }
        changes
    }
}

/// `+ quota acme-rate (acme): 2000 commands/s (burst 500)`, `- …: was …`, `~ …: old -> new`.
impl fmt::Display for QuotaChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaChange::Added { new } => {
                write!(f, "+ quota {} ({}): {new}", new.id, new.whom())
            }
            QuotaChange::Removed { old } => {
                write!(f, "- quota {} ({}): was {old}", old.id, old.whom())
            }
            QuotaChange::Changed { old, new } => {
                let whom = if old.principals == new.principals {
                    new.whom()
                } else {
                    format!("{} -> {}", old.whom(), new.whom())
                };
                write!(f, "~ quota {} ({whom}): {old} -> {new}", new.id)
            }
        }
    }
}

/// `2000 commands/s (burst 500), 10485760 bytes/s (burst 10485760), 100 leases held at once`.
impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits: Vec<String> = Limit::RATES
            .into_iter()
            .filter_map(|limit| {
                self.rate(limit).map(|rate| {
                    format!(
                        "{} {}/s (burst {})",
                        rate.per_second,
                        limit.as_str(),
                        rate.burst
                    )
                })
            })
            .chain(
                self.leases
                    .map(|leases| format!("{leases} leases held at once")),
            )
            .chain(self.script_time_limit.map(|limit| {
                format!(
                    "scripts stopped after {}",
                    humantime::format_duration(limit)
                )
            }))
            .collect();
        f.write_str(&limits.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(principals: Option<&[&str]>) -> Quota {
        Quota {
            id: "q".into(),
            principals: principals.map(|p| p.iter().map(|s| s.to_string()).collect()),
            commands: Some(Rate {
                per_second: 2000,
                burst: 500,
            }),
            bytes: None,
            leases: None,
            script_time_limit: None,
            line: 1,
        }
    }

    #[test]
    fn a_quota_without_principals_spares_administrators_and_one_naming_them_does_not() {
        let everyone = quota(None);
        assert!(everyone.holds("acme", false));
        assert!(!everyone.holds("acme", true));
        let acme = quota(Some(&["acme"]));
        assert!(acme.holds("acme", true));
        assert!(acme.holds("acme", false));
        assert!(!acme.holds("globex", false));
    }

    #[test]
    fn a_diff_names_added_removed_and_changed_quotas_and_not_moved_ones() {
        let mut kept = quota(Some(&["acme"]));
        kept.id = "kept".into();
        let mut moved = kept.clone();
        moved.line = 40;
        let mut gone = quota(None);
        gone.id = "gone".into();
        let mut before = quota(Some(&["acme"]));
        before.id = "rate".into();
        let mut after = before.clone();
        after.commands = Some(Rate {
            per_second: 100,
            burst: 10,
        });
        after.principals = Some(vec!["acme".into(), "globex".into()]);
        let mut added = quota(None);
        added.id = "new".into();
        let changes = QuotaChange::between([&kept, &gone, &before], [&moved, &after, &added]);
        let lines: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "~ quota rate (acme -> acme, globex): 2000 commands/s (burst 500) -> 100 commands/s (burst 10)",
                "+ quota new (every principal but administrators): 2000 commands/s (burst 500)",
                "- quota gone (every principal but administrators): was 2000 commands/s (burst 500)",
            ]
        );
    }

    #[test]
    fn a_quota_reads_as_its_limits() {
        let mut q = quota(None);
        assert_eq!(q.to_string(), "2000 commands/s (burst 500)");
        q.bytes = Some(Rate {
            per_second: 1024,
            burst: 1024,
        });
        assert_eq!(
            q.to_string(),
            "2000 commands/s (burst 500), 1024 bytes/s (burst 1024)"
        );
        q.leases = Some(100);
        assert_eq!(
            q.to_string(),
            "2000 commands/s (burst 500), 1024 bytes/s (burst 1024), 100 leases held at once"
        );
        q.commands = None;
        q.bytes = None;
        assert_eq!(q.to_string(), "100 leases held at once");
    }

    #[test]
    fn a_changed_lease_count_is_a_changed_quota() {
        let before = quota(Some(&["acme"]));
        let mut after = before.clone();
        after.leases = Some(3);
        assert!(!before.same_limits(&after));
        assert_eq!(
            QuotaChange::between([&before], [&after])[0].to_string(),
            "~ quota q (acme): 2000 commands/s (burst 500) -> 2000 commands/s (burst 500), 3 leases held at once"
        );
    }

    #[test]
    fn a_script_time_limit_reads_as_one_and_changing_it_is_a_changed_quota() {
        let before = quota(Some(&["acme"]));
        let mut after = before.clone();
        after.commands = None;
        after.script_time_limit = Some(Duration::from_millis(250));
        assert_eq!(after.to_string(), "scripts stopped after 250ms");
        assert!(!before.same_limits(&after));
        let mut longer = after.clone();
        longer.script_time_limit = Some(Duration::from_millis(400));
        assert_eq!(
            QuotaChange::between([&after], [&longer])[0].to_string(),
            "~ quota q (acme): scripts stopped after 250ms -> scripts stopped after 400ms"
        );
    }
}
