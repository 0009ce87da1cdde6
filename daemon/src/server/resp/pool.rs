//! The bytes all RESP clients hold together, against `resp.budgets.total`, and each tenant's share
//! of them (a principal and one OS user of it), against `resp.budgets.per_uid`. A total shared
//! first-come is one that a single local user can take whole: with a share per tenant, a user
//! filling its share pauses (or, for a reply, disconnects) only its own clients, and the others
//! still find the rest of the total (issue 28).
//!
//! A client counts through its [`Account`]: every byte it holds goes to the total and to its
//! tenant's share at once, and leaves both at once. Memory a client can make the daemon hold
//! without passing through its account — a lease watch's buffers, filled for a reader that does
//! not read, over RESP or HTTP — is counted as a [`Reservation`] of the most it can come to, taken
//! when the watch starts and given back when it ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tollgate_model::Tenant;

use super::tenants::{Member, Tenants};
use crate::config::BudgetsConfig;

/// The least room worth a read when the total (or the share) is nearly used up.
pub const LEAST_READ: usize = 16 * 1024;

/// Which bound a take would have broken, and the bytes it would have held then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Over {
    /// All clients together, past `resp.budgets.total`.
    #[error("all clients' held bytes to {held} bytes, over resp.budgets.total ({allowed} bytes)")]
    Total { held: usize, allowed: usize },
    /// The client's tenant, past `resp.budgets.per_uid`.
    #[error(
        "this user's clients' held bytes to {held} bytes, over resp.budgets.per_uid ({allowed} bytes)"
    )]
    Share { held: usize, allowed: usize },
}

/// Bytes counted against one limit (0: none), with a wake-up for readers waiting for room.
struct Counter {
    limit: usize,
    used: AtomicUsize,
    /// Woken when bytes are given back while the counter is nearly full.
    freed: Notify,
}

impl Counter {
    fn new(limit: usize) -> Counter {
        Counter {
            limit,
            used: AtomicUsize::new(0),
            freed: Notify::new(),
        }
    }

    /// Adds `bytes`; `Err` with what would have been held (and nothing added) past the limit.
    fn take(&self, bytes: usize) -> Result<(), usize> {
        let now = self.used.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if self.limit > 0 && now > self.limit {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            return Err(now);
        }
        Ok(())
    }

    fn add(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::AcqRel);
    }

    fn give_back(&self, bytes: usize) {
        let before = self.used.fetch_sub(bytes, Ordering::AcqRel);
        if self.limit > 0 && before + LEAST_READ > self.limit {
            self.freed.notify_waiters();
        }
    }

    /// Room left; `usize::MAX` without a limit.
    fn free(&self) -> usize {
        match self.limit {
            0 => usize::MAX,
            limit => limit.saturating_sub(self.used.load(Ordering::Acquire)),
        }
    }

    /// Resolves once there is room for a read.
    async fn room(&self) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.free() >= LEAST_READ {
                return;
            }
            freed.await;
        }
    }
}

/// Every client's held bytes together, and each tenant's.
pub struct Pool {
    total: Counter,
    per_uid: usize,
    /// The shares of tenants with a client connected.
    shares: Arc<Tenants<Counter>>,
}

impl Pool {
    pub fn new(config: &BudgetsConfig) -> Arc<Pool> {
        Arc::new(Pool {
            total: Counter::new(config.total.0),
            per_uid: config.per_uid().0,
            shares: Arc::default(),
        })
    }

    /// The account of one more client of `tenant` (once per connection, not per command).
    pub fn account(self: &Arc<Self>, tenant: Tenant) -> Account {
        Account {
            pool: self.clone(),
            share: self.shares.join(tenant, || Counter::new(self.per_uid)),
        }
    }

    /// Holds `bytes` aside for `tenant` until the reservation is dropped; refused (nothing held)
    /// past the tenant's share or the total.
    pub fn reserve(self: &Arc<Self>, tenant: Tenant, bytes: usize) -> Result<Reservation, Over> {
        // Not a session: `/v1/principals` counts sessions from the members.
        let account = Account {
            pool: self.clone(),
            share: self.shares.hold(tenant, || Counter::new(self.per_uid)),
        };
        account.take(bytes)?;
        Ok(Reservation { account, bytes })
    }

    /// Whether a total is set (a share without one is still a limit: see [`Account::limited`]).
    fn limited(&self) -> bool {
        self.total.limit > 0 || self.per_uid > 0
    }

    /// Each connected tenant: its RESP sessions and the bytes they hold.
    pub fn census(&self) -> Vec<(Tenant, usize, usize)> {
        self.shares
            .census(|share| share.used.load(Ordering::Relaxed))
    }

    /// Bytes held for all clients now.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.total.used.load(Ordering::Acquire)
    }
}

/// Bytes held aside in the [`Pool`] for as long as this lives.
pub struct Reservation {
    account: Account,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.account.give_back(self.bytes);
    }
}

/// One client's way into the [`Pool`]: its bytes count against the total and its tenant's share
/// (forgotten with the tenant's last client; what each client held was given back before: see
/// `ClientBudget`'s drop).
pub struct Account {
    pool: Arc<Pool>,
    share: Member<Counter>,
}

impl Account {
    /// Adds `bytes` to both; `Err` (and nothing added) when that would go past either.
    pub fn take(&self, bytes: usize) -> Result<(), Over> {
        self.share.take(bytes).map_err(|held| Over::Share {
            held,
            allowed: self.share.limit,
        })?;
        if let Err(held) = self.pool.total.take(bytes) {
            self.share.give_back(bytes);
            return Err(Over::Total {
                held,
                allowed: self.pool.total.limit,
            });
        }
        Ok(())
    }

    /// Adds `bytes` already in memory, or too few to refuse.
    pub fn add(&self, bytes: usize) {
        self.share.add(bytes);
        self.pool.total.add(bytes);
    }

    pub fn give_back(&self, bytes: usize) {
        self.pool.total.give_back(bytes);
        self.share.give_back(bytes);
    }

    /// Whether either bound is set; without one, reads are never held back for room.
    pub fn limited(&self) -> bool {
        self.pool.limited()
    }

    /// Room left under both.
    pub fn free(&self) -> usize {
        self.pool.total.free().min(self.share.free())
    }

    /// Resolves once both have room for a read.
    pub async fn room(&self) {
        loop {
            self.pool.total.room().await;
            self.share.room().await;
            if self.free() >= LEAST_READ {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ByteSize;

    #[test]
    fn a_reservation_counts_against_the_share_until_it_is_dropped() {
        let pool = pool(1000, 400);
        let first = pool.reserve(tenant(1), 300).expect("within the share");
        assert_eq!(
            pool.reserve(tenant(1), 200).err(),
            Some(Over::Share {
                held: 500,
                allowed: 400
            })
        );
        // Another user's share is its own.
        let other = pool.reserve(tenant(2), 300).expect("another user's share");
        assert_eq!(pool.used(), 600);
        drop(first);
        drop(other);
        assert_eq!(pool.used(), 0);
        assert!(pool.reserve(tenant(1), 400).is_ok());
        assert_eq!(pool.used(), 0, "given back as the reservation dropped");
    }

    fn pool(total: usize, per_uid: usize) -> Arc<Pool> {
        Pool::new(&BudgetsConfig {
            total: ByteSize(total),
            per_uid: Some(ByteSize(per_uid)),
            ..BudgetsConfig::default()
        })
    }

    use crate::server::resp::tenants::local as tenant;

    #[test]
    fn one_tenant_past_its_share_is_refused_and_another_still_takes_the_rest() {
        let pool = pool(1000, 400);
        let attacker = pool.account(tenant(2002));
        let other_client_of_the_attacker = pool.account(tenant(2002));
        let victim = pool.account(tenant(2001));
        attacker.take(300).unwrap();
        assert_eq!(
            other_client_of_the_attacker.take(101),
            Err(Over::Share {
                held: 401,
                allowed: 400
            })
        );
        assert_eq!(pool.used(), 300, "nothing of a refused take is kept");
        victim.take(400).unwrap();
        assert_eq!(victim.free(), 0);
        assert_eq!(attacker.free(), 100);
    }

    #[test]
    fn the_total_still_bounds_many_tenants_together() {
        let pool = pool(1000, 400);
        for uid in 0..2 {
            let account = pool.account(tenant(uid));
            account.take(400).unwrap();
            std::mem::forget(account);
        }
        let third = pool.account(tenant(9));
        assert_eq!(
            third.take(300),
            Err(Over::Total {
                held: 1100,
                allowed: 1000
            })
        );
        assert_eq!(third.free(), 200, "the total's room, under the share's");
        // Nothing of the refusal stays in the share either.
        third.take(200).unwrap();
    }

    #[test]
    fn a_tenant_s_share_is_forgotten_with_its_last_client() {
        let pool = pool(0, 100);
        let first = pool.account(tenant(1));
        let second = pool.account(tenant(1));
        first.add(60);
        assert_eq!(second.free(), 40, "both clients count against one share");
        first.give_back(60);
        drop(first);
        assert_eq!(pool.shares.len(), 1);
        drop(second);
        assert_eq!(pool.shares.len(), 0);
    }

    #[tokio::test]
    async fn a_reader_waiting_for_room_wakes_when_its_share_is_given_back() {
        let pool = pool(0, 4 * LEAST_READ);
        let holder = pool.account(tenant(1));
        let reader = pool.account(tenant(1));
        holder.add(4 * LEAST_READ);
        let waiting = tokio::spawn(async move {
            reader.room().await;
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        holder.give_back(2 * LEAST_READ);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .unwrap();
    }
}
