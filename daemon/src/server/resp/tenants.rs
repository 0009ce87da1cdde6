//! State shared by the sessions of one tenant (a principal and one OS user of it), kept while the
//! tenant has a session: the share of the byte total (`pool.rs`) and the admission clock
//! (`admission_clock.rs`) are each one [`Tenants`] registry. A session joins once, when it starts,
//! and holds its [`Member`] for its life; the tenant's state is dropped with its last session.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use parking_lot::Mutex;
use tollgate_model::Tenant;

/// Each connected tenant's `T`, and how many sessions and other holders (a lease watch's
/// reservation of bytes, say) hold it.
pub struct Tenants<T> {
    map: Mutex<HashMap<Tenant, (Arc<T>, Holders)>>,
}

/// Who holds a tenant's `T`: it is dropped when both are none.
#[derive(Default, Clone, Copy)]
struct Holders {
    sessions: usize,
    others: usize,
}

impl<T> Default for Tenants<T> {
    fn default() -> Self {
        Tenants {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Tenants<T> {
    /// One more session of `tenant`: its `T`, made by `new` if it is the first.
    pub fn join(self: &Arc<Self>, tenant: Tenant, new: impl FnOnce() -> T) -> Member<T> {
        self.enter(tenant, new, true)
    }

    /// A hold on `tenant`'s `T` that is not a session (not counted in the census's sessions).
    pub fn hold(self: &Arc<Self>, tenant: Tenant, new: impl FnOnce() -> T) -> Member<T> {
        self.enter(tenant, new, false)
    }

    fn enter(
        self: &Arc<Self>,
        tenant: Tenant,
        new: impl FnOnce() -> T,
        session: bool,
    ) -> Member<T> {
        let state = {
            let mut map = self.map.lock();
            let (state, holders) = map
                .entry(tenant.clone())
                .or_insert_with(|| (Arc::new(new()), Holders::default()));
            match session {
                true => holders.sessions += 1,
                false => holders.others += 1,
            }
            state.clone()
        };
        Member {
            tenants: self.clone(),
            state,
            tenant,
            session,
        }
    }

    /// How many connected tenants `counts` says yes to.
    pub fn count(&self, mut counts: impl FnMut(&T) -> bool) -> usize {
        self.map
            .lock()
            .values()
            .filter(|(state, _)| counts(state))
            .count()
    }

    /// Each connected tenant, its sessions and what `look` reads of its `T`.
    pub fn census<R>(&self, mut look: impl FnMut(&T) -> R) -> Vec<(Tenant, usize, R)> {
        self.map
            .lock()
            .iter()
            .map(|(tenant, (state, holders))| (tenant.clone(), holders.sessions, look(state)))
            .collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }
}

/// A session's (or another holder's) hold on its tenant's `T`.
pub struct Member<T> {
    tenants: Arc<Tenants<T>>,
    state: Arc<T>,
    tenant: Tenant,
    session: bool,
}

impl<T> Deref for Member<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.state
    }
}

impl<T> Drop for Member<T> {
    fn drop(&mut self) {
        let mut map = self.tenants.map.lock();
        if let Some((_, holders)) = map.get_mut(&self.tenant) {
            match self.session {
                true => holders.sessions -= 1,
                false => holders.others -= 1,
            }
            if holders.sessions == 0 && holders.others == 0 {
                map.remove(&self.tenant);
            }
        }
    }
}

/// The tenant of `uid` under the default policy's one principal, for tests.
#[cfg(test)]
pub fn local(uid: u32) -> Tenant {
    Tenant {
        principal: "local".to_owned(),
        uid,
    }
}

#[cfg(test)]
mod tests {
    use super::local as tenant;
    use super::*;

    #[test]
    fn sessions_of_one_tenant_share_its_state_until_the_last_leaves() {
        let tenants = Arc::new(Tenants::<std::sync::atomic::AtomicUsize>::default());
        let first = tenants.join(tenant(1), Default::default);
        let second = tenants.join(tenant(1), || unreachable!("made once"));
        let other = tenants.join(tenant(2), Default::default);
        first.fetch_add(5, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(second.load(std::sync::atomic::Ordering::Relaxed), 5);
        assert_eq!(other.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(
            tenants.count(|n| n.load(std::sync::atomic::Ordering::Relaxed) > 0),
            1
        );
        let mut census = tenants.census(|n| n.load(std::sync::atomic::Ordering::Relaxed));
        census.sort_by_key(|(tenant, _, _)| tenant.uid);
        assert_eq!(census, [(tenant(1), 2, 5), (tenant(2), 1, 0)]);
        drop(first);
        assert_eq!(tenants.len(), 2);
        drop(second);
        assert_eq!(tenants.len(), 1);
        drop(other);
        assert_eq!(tenants.len(), 0);
    }

    #[test]
    fn a_hold_that_is_not_a_session_keeps_the_state_but_is_not_counted_as_one() {
        let tenants = Arc::new(Tenants::<std::sync::atomic::AtomicUsize>::default());
        let session = tenants.join(tenant(1), Default::default);
        let held = tenants.hold(tenant(1), || unreachable!("made once"));
        held.fetch_add(7, std::sync::atomic::Ordering::Relaxed);
        let census = tenants.census(|n| n.load(std::sync::atomic::Ordering::Relaxed));
        assert_eq!(census, [(tenant(1), 1, 7)]);
        drop(session);
        // The hold alone keeps the tenant's state, and what it counts.
        let census = tenants.census(|n| n.load(std::sync::atomic::Ordering::Relaxed));
        assert_eq!(census, [(tenant(1), 0, 7)]);
        let again = tenants.join(tenant(1), || unreachable!("still there"));
        assert_eq!(again.load(std::sync::atomic::Ordering::Relaxed), 7);
        drop((held, again));
        assert_eq!(tenants.len(), 0);
    }
}
