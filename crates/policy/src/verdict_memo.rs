//! A YAML guard's verdicts kept for the commands whose verdict cannot depend on their arguments,
//! so that a `GET` of a principal whose rules look at no key costs a map lookup instead of a
//! WASM call (about 7,600 of the daemon's 21,500 instructions per unpipelined `GET`, counted by
//! `benches/instructions.py`).
//!
//! A YAML guard answers from the caller's principal, the command's canonical name, its lane and
//! categories, and its keys (`policies/modules/yaml-guard`). The host holds the same compiled
//! policy, and [`CompiledPolicy::decided_without_arguments`] (the same crate the guest runs) tells
//! when the first rule that can match such a command looks at no argument: then every command
//! of that principal, name, lane and categories gets the verdict the guard gave the first one,
//! and the guard's own answer is the one reused. The guard still decides every other command, and
//! an operator's module, which may answer otherwise from one call to the next, is always called.
//! That the verdict depends on the arguments is kept too, so that the rules are scanned for it
//! once per (principal, command), not on every command. Only answers are kept: a fault (a budget
//! run out) is judged again. One memo per guard of a
//! generation, so a reload starts empty. Bounded: at [`CAPACITY`] entries it starts over (the
//! names come from the catalogs and the principals from the policy, but a catalog module's names
//! are its own, and an unmapped peer's principal is its uid).

use std::cell::RefCell;

use parking_lot::RwLock;
use rustc_hash::FxHashMap;
use tollgate_policy_rules::CompiledPolicy;

use crate::described::Described;
use crate::heard::Heard;
use crate::sandbox::bindings::Lane;

/// The most (principal, command) verdicts one guard keeps.
const CAPACITY: usize = 4096;

/// One YAML guard's reusable verdicts, with the compiled policy that says which are reusable.
pub struct VerdictMemo {
    policy: CompiledPolicy,
    /// `None`: the verdict depends on the arguments; the guard is asked every time.
    verdicts: RwLock<FxHashMap<Box<[u8]>, Option<Heard>>>,
}

/// What the memo knows of a (principal, command).
#[derive(Debug, Clone)]
pub enum Recall {
    /// The guard's verdict, the same for every such command.
    Kept(Heard),
    /// Its verdict depends on the arguments: ask the guard, and there is nothing to remember.
    Ask,
    /// Not seen yet: ask the guard, then [`VerdictMemo::remember`] its answer.
    Unknown,
}

thread_local! {
    /// Scratch for the lookup key, so that a lookup allocates nothing.
    static KEY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl VerdictMemo {
    pub fn new(policy: CompiledPolicy) -> VerdictMemo {
        VerdictMemo {
            policy,
            verdicts: RwLock::new(FxHashMap::default()),
        }
    }

    /// What is known of the guard's verdict on a command of `principal` described by `described`.
    pub fn recall(&self, principal: &str, described: &Described) -> Recall {
        KEY.with_borrow_mut(|key| {
            key_of(key, principal, described);
            match self.verdicts.read().get(key.as_slice()) {
                Some(Some(verdict)) => Recall::Kept(verdict.clone()),
                Some(None) => Recall::Ask,
                None => Recall::Unknown,
            }
        })
    }

    /// Keeps `verdict`, the guard's answer on a command of `principal` described by `described`,
    /// when the policy proves every such command gets it, and otherwise that it must be asked.
    pub fn remember(&self, principal: &str, described: &Described, verdict: &Heard) {
        let reusable = self.policy.decided_without_arguments(
            principal,
            &described.native.name,
            described.native.categories,
            lane_index(described.wit.lane),
        );
        let key = KEY.with_borrow_mut(|key| {
            key_of(key, principal, described);
            Box::<[u8]>::from(key.as_slice())
        });
        let mut verdicts = self.verdicts.write();
        if verdicts.len() >= CAPACITY {
            verdicts.clear();
        }
        verdicts.insert(key, reusable.then(|| verdict.clone()));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.verdicts.read().len()
    }
}

/// Writes the memo key of (`principal`, `described`) into `key`: every input a YAML guard reads
/// but the arguments. A separator that no principal or name holds keeps `a`+`bc` from `ab`+`c`.
fn key_of(key: &mut Vec<u8>, principal: &str, described: &Described) {
    key.clear();
    key.extend_from_slice(principal.as_bytes());
    key.push(0xff);
    key.extend_from_slice(described.native.name.as_bytes());
    key.push(0xff);
    key.push(lane_index(described.wit.lane));
    key.extend_from_slice(&described.native.categories.0.to_le_bytes());
}

/// The lane's bit position in a rule's lane mask: WIT order, as the YAML guard numbers them.
fn lane_index(lane: Lane) -> u8 {
    match lane {
        Lane::Regular => 0,
        Lane::Blocking => 1,
        Lane::Transaction => 2,
        Lane::Script => 3,
        Lane::Pubsub => 4,
        Lane::Admin => 5,
    }
}

#[cfg(test)]
mod tests {
    use tollgate_policy_rules::{Action, CategorySet, Mode, Rule, Target};

    use super::*;
    use crate::sandbox::bindings::catalog::tollgate::policy::types::Denial;
    use crate::sandbox::bindings::{Categories, CommandFlags, Descriptor};

    fn descriptor(name: &str, lane: Lane) -> Described {
        Described::new(Descriptor {
            name: name.into(),
            lane,
            categories: Categories::READ,
            traits: CommandFlags::empty(),
            arity: -2,
            keys: Vec::new(),
            reuse: None,
        })
    }

    fn policy() -> CompiledPolicy {
        let rule = |id: &str, principals: Option<&str>, keys: Option<&str>, action| Rule {
            id: id.into(),
            principals: principals.map(|p| vec![p.to_owned()]),
            target: Target::Commands {
                names: vec!["GET".into()],
                categories: CategorySet::default(),
                any: false,
                keys: keys.map(|k| vec![k.to_owned()]),
                channels: None,
                lanes: None,
            },
            action,
            reason: "no".into(),
        };
        CompiledPolicy {
            mode: Mode::Enforce,
            rules: vec![
                rule("acme-keys", Some("acme"), Some("acme:*"), Action::Allow),
                rule("all", None, None, Action::Allow),
            ],
        }
    }

    #[test]
    fn keeps_only_verdicts_no_argument_can_change() {
        let memo = VerdictMemo::new(policy());
        let get = descriptor("GET", Lane::Regular);
        let allow = Heard::Allow("all".into());
        assert!(matches!(memo.recall("acme", &get), Recall::Unknown));
        memo.remember("acme", &get, &Heard::Allow("acme-keys".into()));
        assert!(
            matches!(memo.recall("acme", &get), Recall::Ask),
            "acme's GETs depend on their keys"
        );
        memo.remember("globex", &get, &allow);
        assert!(
            matches!(memo.recall("globex", &get), Recall::Kept(Heard::Allow(rule)) if &*rule == "all")
        );
        // Another lane or another principal is another entry.
        assert!(matches!(
            memo.recall("globex", &descriptor("GET", Lane::Script)),
            Recall::Unknown
        ));
        assert!(matches!(memo.recall("globe", &get), Recall::Unknown));
        let deny = Heard::from(crate::sandbox::bindings::Verdict::Deny(Denial {
            rule: "r".into(),
            reason: "no".into(),
        }));
        memo.remember("initech", &get, &deny);
        assert!(matches!(
            memo.recall("initech", &get),
            Recall::Kept(Heard::Deny(_))
        ));
    }

    #[test]
    fn starts_over_when_full() {
        let memo = VerdictMemo::new(policy());
        let get = descriptor("GET", Lane::Regular);
        for at in 0..CAPACITY + 10 {
            memo.remember(&format!("uid:{at}"), &get, &Heard::Abstain);
        }
        assert!(memo.len() <= CAPACITY);
        assert!(matches!(
            memo.recall(&format!("uid:{}", CAPACITY + 9), &get),
            Recall::Kept(_)
        ));
    }
}
