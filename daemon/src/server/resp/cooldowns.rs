//! Each user's script cooldown (`resp.script_cooldown`): once a script of one user of a principal
//! is stopped at `resp.script_time_limit`, that user's scripts are refused for the cooldown. The
//! limit bounds one script; without this, a user sending its runaway script again as soon as it
//! is stopped held Redis's one thread nearly all the time (`benches/soak.py`'s `lua-loop`: another
//! user's GETs answered about once a second). The cooldown is kept while it runs even when the
//! user has no session left, so reconnecting does not end it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tollgate_lanes::Cooldown;
use tollgate_model::Tenant;

pub struct Cooldowns {
    /// `0`: no cooldown.
    after: Duration,
    by_tenant: Mutex<ByTenant>,
}

#[derive(Default)]
struct ByTenant {
    cooldowns: HashMap<Tenant, Arc<Cooldown>>,
    /// How many entries the map may reach before the unused ones are forgotten.
    prune_at: usize,
}

/// Entries past which the map is first pruned.
const PRUNE_FROM: usize = 64;

impl Cooldowns {
    pub fn new(after: Duration) -> Cooldowns {
        Cooldowns {
            after,
            by_tenant: Mutex::new(ByTenant {
                cooldowns: HashMap::new(),
                prune_at: PRUNE_FROM,
            }),
        }
    }

    /// `tenant`'s cooldown, shared by all its sessions; `None` when cooldowns are off.
    pub fn of(&self, tenant: &Tenant) -> Option<Arc<Cooldown>> {
        if self.after.is_zero() {
            return None;
        }
        let mut by_tenant = self.by_tenant.lock();
        if by_tenant.cooldowns.len() >= by_tenant.prune_at {
            // Forgotten only when no session holds it and it is not running: then a new one is
            // the same as the old.
            by_tenant.cooldowns.retain(|_, cooldown| {
                Arc::strong_count(cooldown) > 1 || cooldown.remaining().is_some()
            });
            by_tenant.prune_at = (by_tenant.cooldowns.len() * 2).max(PRUNE_FROM);
        }
        let cooldown = by_tenant
            .cooldowns
            .entry(tenant.clone())
            .or_insert_with(|| Arc::new(Cooldown::new(self.after)));
        Some(cooldown.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::resp::tenants::local as tenant;

    #[tokio::test]
    async fn a_users_cooldown_outlives_its_sessions_while_it_runs() {
        let cooldowns = Cooldowns::new(Duration::from_secs(5));
        let first = cooldowns.of(&tenant(1)).expect("on");
        first.start();
        drop(first);
        // Enough other users to prune: the running cooldown is kept, the idle ones go.
        for uid in 100..100 + PRUNE_FROM as u32 {
            cooldowns.of(&tenant(uid));
        }
        cooldowns.of(&tenant(999));
        assert!(cooldowns.by_tenant.lock().cooldowns.len() < PRUNE_FROM);
        let again = cooldowns.of(&tenant(1)).expect("on");
        assert!(
            again.remaining().is_some(),
            "reconnecting ended the cooldown"
        );
        assert!(cooldowns.of(&tenant(2)).unwrap().remaining().is_none());
        assert!(Cooldowns::new(Duration::ZERO).of(&tenant(1)).is_none());
    }
}
