//! One client connection's memory of the lease resources the policy admitted it to, so that a
//! client taking and releasing the same resource again and again asks the guards once per policy
//! generation instead of twice per pair. Kept only for a generation whose guards are all YAML
//! guards: those answer from the caller and the resource alone (the rules compiled into them), so
//! the remembered answer is the answer they would give. An operator's module may answer otherwise
//! from one call to the next, so with one in the chain every lease is judged afresh. Only
//! admissions are kept: a denial is rare where speed matters, and a fault (a budget run out) must
//! be judged again. Bounded: at [`CAPACITY`] resources the memory starts over.

use rustc_hash::FxHashMap;
use tollgate_model::Caller;

use crate::decision::Decision;

/// The most resources one connection remembers.
const CAPACITY: usize = 256;

/// What one client was admitted to, under one generation. Empty until first used.
#[derive(Default)]
pub struct LeaseMemo {
    /// The generation and caller the admissions were given under.
    under: Option<(u64, Caller)>,
    admitted: FxHashMap<String, Decision>,
}

impl LeaseMemo {
    /// The admission remembered for `resource`, if it was given to `caller` under `generation`;
    /// anything remembered under another generation or caller is forgotten.
    pub(crate) fn recall(
        &mut self,
        generation: u64,
        caller: &Caller,
        resource: &str,
    ) -> Option<Decision> {
        match &self.under {
            Some((number, who)) if *number == generation && who == caller => {
                self.admitted.get(resource).cloned()
            }
            _ => {
                self.admitted.clear();
                self.under = Some((generation, caller.clone()));
                None
            }
        }
    }

    /// Remembers `decision` for `resource` if it admits: after [`LeaseMemo::recall`] with the same
    /// generation and caller.
    pub(crate) fn remember(&mut self, resource: &str, decision: &Decision) {
        if !matches!(decision, Decision::Admitted { .. }) {
            return;
        }
        if self.admitted.len() >= CAPACITY {
            self.admitted.clear();
        }
        self.admitted.insert(resource.to_owned(), decision.clone());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::decision::{Denial, DenyCause, Descriptor};
    use crate::sandbox::bindings;

    fn caller(principal: &str) -> Caller {
        Caller {
            principal: principal.into(),
            uid: 1000,
            gid: 1000,
            pid: 42,
        }
    }

    fn admitted() -> Decision {
        let descriptor = Descriptor::from(&bindings::Descriptor {
            name: "LEASE".into(),
            lane: bindings::Lane::Script,
            categories: bindings::Categories::empty(),
            traits: bindings::CommandFlags::WRITE,
            arity: 2,
            keys: vec![],
            reuse: None,
        });
        Decision::Admitted {
            lane: descriptor.lane,
            descriptor: Arc::new(descriptor),
            rule: "leases".into(),
        }
    }

    #[test]
    fn an_admission_is_recalled_for_the_same_generation_caller_and_resource_only() {
        let mut memo = LeaseMemo::default();
        let app = caller("app");
        assert!(memo.recall(1, &app, "orders:1").is_none());
        memo.remember("orders:1", &admitted());
        assert!(matches!(
            memo.recall(1, &app, "orders:1"),
            Some(Decision::Admitted { .. })
        ));
        assert!(memo.recall(1, &app, "orders:2").is_none());
        assert!(memo.recall(1, &caller("other"), "orders:1").is_none());
        // The other caller's recall forgot the first one's admissions.
        assert!(memo.recall(1, &app, "orders:1").is_none());
        memo.remember("orders:1", &admitted());
        // A reload: the next generation's guards decide again.
        assert!(memo.recall(2, &app, "orders:1").is_none());
        assert!(memo.recall(2, &app, "orders:1").is_none());
    }

    #[test]
    fn denials_are_never_remembered() {
        let mut memo = LeaseMemo::default();
        let app = caller("app");
        memo.recall(1, &app, "orders:1");
        let denied = Decision::Denied(Box::new(Denial {
            rule: "sandbox".into(),
            module: "yaml-guard:p.yaml".into(),
            reason: "ran out of its budget".into(),
            cause: DenyCause::Deadline,
            command: "LEASE".into(),
        }));
        memo.remember("orders:1", &denied);
        assert!(memo.recall(1, &app, "orders:1").is_none());
    }

    #[test]
    fn the_memory_stays_bounded() {
        let mut memo = LeaseMemo::default();
        let app = caller("app");
        memo.recall(1, &app, "r");
        for n in 0..=CAPACITY {
            memo.remember(&format!("r{n}"), &admitted());
        }
        assert!(memo.admitted.len() <= CAPACITY);
        assert!(memo.recall(1, &app, &format!("r{CAPACITY}")).is_some());
    }
}
