//! State shared by the sessions of one tenant (a principal and one OS user of it), kept while the
//! tenant has a session: the share of the byte total (`pool.rs`) and the admission clock
//! (`admission_clock.rs`) are each one [`Tenants`] registry. A session joins once, when it starts,
//! and holds its [`Member`] for its life; the tenant's state is dropped with its last session.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use parking_lot::Mutex;
use tollgate_model::Tenant;

/// Each connected tenant's `T`, and how many sessions hold it.
pub struct Tenants<T> {
    map: Mutex<HashMap<Tenant, (Arc<T>, usize)>>,
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
        let state = {
            let mut map = self.map.lock();
            let (state, sessions) = map
                .entry(tenant.clone())
                .or_insert_with(|| (Arc::new(new()), 0));
            *sessions += 1;
            state.clone()
        };
        Member {
            tenants: self.clone(),
            state,
            tenant,
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
            .map(|(tenant, (state, sessions))| (tenant.clone(), *sessions, look(state)))
            .collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }
}

/// A session's hold on its tenant's `T`.
pub struct Member<T> {
    tenants: Arc<Tenants<T>>,
    state: Arc<T>,
    tenant: Tenant,
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
        if let Some((_, sessions)) = map.get_mut(&self.tenant) {
            *sessions -= 1;
            if *sessions == 0 {
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
}
