//! A tenant's share of an exclusive lane: at most so many of the lane's connections lent to one
//! [`Tenant`] (a principal and one OS user of it) at once, so that one user's long blocking
//! commands (or pinned transactions) cannot take every connection of the lane from everyone else —
//! not even from other users of the same principal, which under the default policy is every local
//! user. A tenant past its share waits, in order, for one of its own connections to come back, up
//! to the lane's acquire timeout.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tollgate_model::Tenant;

pub(crate) struct Shares {
    /// Connections one tenant may hold at once.
    share: usize,
    timeout: Duration,
    /// The tenants holding (or waiting for) a connection, each with its share's permits.
    held: Mutex<HashMap<Tenant, Arc<Semaphore>>>,
    /// Shares over this one and its siblings' (a cluster's daemon-wide ones), entered after it.
    outer: Option<Arc<Shares>>,
}

/// One tenant's hold on one unit of its share; given back when dropped.
pub(crate) struct Share {
    permit: Option<OwnedSemaphorePermit>,
    tenant: Tenant,
    shares: Arc<Shares>,
    /// The outer share's unit, held as long as this one.
    _outer: Option<Box<Share>>,
}

/// The tenant already holds its whole share and none came back in time.
#[derive(Debug)]
pub(crate) struct ShareTaken;

impl Shares {
    pub(crate) fn new(share: usize, timeout: Duration) -> Arc<Self> {
        Shares::under(share, timeout, None)
    }

    /// Shares under `outer`: a unit is granted only when `outer` grants one too, so that a
    /// tenant's share of `outer` holds over every lane under it.
    pub(crate) fn under(share: usize, timeout: Duration, outer: Option<Arc<Shares>>) -> Arc<Self> {
        Arc::new(Shares {
            share,
            timeout,
            held: Mutex::new(HashMap::new()),
            outer,
        })
    }

    /// One unit of `tenant`'s share, waiting until `since` plus the acquire timeout.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        tenant: &Tenant,
        since: Instant,
    ) -> Result<Share, ShareTaken> {
        let semaphore = self
            .held
            .lock()
            .entry(tenant.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
            .clone();
        let acquired = tokio::time::timeout_at(since + self.timeout, semaphore.acquire_owned())
            .await
            .ok()
            .and_then(Result::ok);
        // Built in either case, so that the map entry is dropped with the last one who used it.
        let mut share = Share {
            permit: acquired,
            tenant: tenant.clone(),
            shares: self.clone(),
            _outer: None,
        };
        if share.permit.is_none() {
            return Err(ShareTaken);
        }
        if let Some(outer) = &self.outer {
            // One level only (the outer shares have none), so the boxed recursion ends there.
            share._outer = Some(Box::new(Box::pin(outer.enter(tenant, since)).await?));
        }
        Ok(share)
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock();
        drop(self.permit.take());
        // Only the map still knows the semaphore: nobody holds or waits for this tenant's share.
        if held
            .get(&self.tenant)
            .is_some_and(|semaphore| Arc::strong_count(semaphore) == 1)
        {
            held.remove(&self.tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(principal: &str, uid: u32) -> Tenant {
        Tenant {
            principal: principal.into(),
            uid,
        }
    }

    #[tokio::test]
    async fn a_tenant_gets_its_share_and_no_more_while_others_get_theirs() {
        let shares = Shares::new(2, Duration::from_millis(50));
        let a = tenant("a", 1);
        let first = shares.enter(&a, Instant::now()).await.unwrap();
        let _second = shares.enter(&a, Instant::now()).await.unwrap();
        assert!(shares.enter(&a, Instant::now()).await.is_err());
        let _other = shares.enter(&tenant("b", 2), Instant::now()).await.unwrap();
        drop(first);
        let _third = shares.enter(&a, Instant::now()).await.unwrap();
    }

    /// Two OS users of one principal (every local user, under the default policy) have a share
    /// each: one filling its own leaves the other's whole.
    #[tokio::test]
    async fn two_users_of_one_principal_have_a_share_each() {
        let shares = Shares::new(1, Duration::from_millis(50));
        let _attacker = shares
            .enter(&tenant("local", 2002), Instant::now())
            .await
            .unwrap();
        assert!(shares
            .enter(&tenant("local", 2002), Instant::now())
            .await
            .is_err());
        assert!(shares
            .enter(&tenant("local", 2001), Instant::now())
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn a_tenant_with_nothing_held_leaves_nothing_behind() {
        let shares = Shares::new(1, Duration::from_millis(50));
        let a = tenant("a", 1);
        let held = shares.enter(&a, Instant::now()).await.unwrap();
        assert!(shares.enter(&a, Instant::now()).await.is_err());
        assert_eq!(shares.held.lock().len(), 1);
        drop(held);
        assert!(shares.held.lock().is_empty());
    }
}
