//! A guard's verdict as the chain hears it. The WIT `verdict` owns its strings; here an allow's
//! rule name is shared by reference count, so that the memo, a pipelined run's commands and the
//! decisions they end in hand one name around instead of a copy each (a `String` clone and free
//! per admitted command was 2.7% of a pipelined `GET` served from the near cache).

use std::sync::Arc;

use crate::sandbox::bindings::catalog::tollgate::policy::types::Denial;
use crate::sandbox::bindings::Verdict;

/// [`Verdict`], cheap to clone.
#[derive(Debug, Clone)]
pub enum Heard {
    /// Allowed by this rule.
    Allow(Arc<str>),
    /// Says nothing of it.
    Abstain,
    /// Refused by this rule, for this reason.
    Deny(Arc<Denial>),
}

impl From<Verdict> for Heard {
    fn from(verdict: Verdict) -> Heard {
        match verdict {
            Verdict::Allow(rule) => Heard::Allow(rule.into()),
            Verdict::Abstain => Heard::Abstain,
            Verdict::Deny(denial) => Heard::Deny(Arc::new(denial)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verdict_is_heard_as_the_guard_gave_it() {
        assert!(
            matches!(Heard::from(Verdict::Allow("r1".into())), Heard::Allow(rule) if &*rule == "r1")
        );
        assert!(matches!(Heard::from(Verdict::Abstain), Heard::Abstain));
        let denial = Denial {
            rule: "r2".into(),
            reason: "no".into(),
        };
        assert!(matches!(
            Heard::from(Verdict::Deny(denial)),
            Heard::Deny(d) if d.rule == "r2" && d.reason == "no"
        ));
    }
}
