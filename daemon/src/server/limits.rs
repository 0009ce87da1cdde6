//! How many connections one listener holds: a total cap and a cap per uid, from `limits:` in the
//! config. Administrators (`admin:`) are exempt from the per-uid cap, never from the total, so an
//! operator can get in while one user sits at its cap, yet nobody can exhaust the daemon.
//! A connection counts from its admission until its [`Permit`] is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::config::LimitsConfig;
use crate::server::identity::Identities;
use crate::server::occasional::Occasional;
use crate::server::peer::PeerCredentials;

/// At most one "refusing connections" warning per listener in this interval.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The connection counts of one listener.
#[derive(Clone)]
pub struct ConnectionLimits {
    counts: Arc<Mutex<Counts>>,
    /// The listener, for the log.
    what: &'static str,
    refusals: Arc<Occasional>,
    max_clients: usize,
    max_clients_per_uid: usize,
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_uid: HashMap<u32, usize>,
}

/// Whether the per-uid cap applies to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerUidCap {
    Applies,
    /// An administrator.
    Exempt,
}

/// Why a connection was refused; the text is what the client is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooMany {
    #[error("too many connections for uid {uid} (limit {limit})")]
    ForUid { uid: u32, limit: usize },
    #[error("too many connections (limit {limit})")]
    InTotal { limit: usize },
}

/// One admitted connection; dropping it frees its place.
pub struct Permit {
    counts: Arc<Mutex<Counts>>,
    uid: u32,
}

impl ConnectionLimits {
    pub fn new(config: &LimitsConfig, what: &'static str) -> Self {
        ConnectionLimits {
            counts: Arc::default(),
            what,
            refusals: Arc::new(Occasional::new(REFUSAL_LOG_INTERVAL)),
            max_clients: config.max_clients,
            max_clients_per_uid: config.max_clients_per_uid,
        }
    }

    /// Counts a new connection of `peer`, unless it would pass a cap (logged once per interval).
    pub fn admit(&self, peer: PeerCredentials, identities: &Identities) -> Result<Permit, TooMany> {
        let cap = match identities.admin(peer, "exceeding limits.max_clients_per_uid") {
            Ok(()) => PerUidCap::Exempt,
            Err(_) => PerUidCap::Applies,
        };
        let admitted = self.admit_uid(peer.uid, cap);
        if let Err(too_many) = &admitted {
            if let Some(refusals) = self.refusals.occurred() {
                tracing::warn!(
                    listener = self.what,
                    %too_many,
                    refusals,
                    "refusing connections past `limits:` (logged once per {REFUSAL_LOG_INTERVAL:?})"
                );
            }
        }
        admitted
    }

    fn admit_uid(&self, uid: u32, cap: PerUidCap) -> Result<Permit, TooMany> {
        let mut counts = lock(&self.counts);
        if counts.total >= self.max_clients {
            return Err(TooMany::InTotal {
                limit: self.max_clients,
            });
        }
        let held = counts.per_uid.get(&uid).copied().unwrap_or(0);
        if cap == PerUidCap::Applies && held >= self.max_clients_per_uid {
            return Err(TooMany::ForUid {
                uid,
                limit: self.max_clients_per_uid,
            });
        }
        counts.total += 1;
        counts.per_uid.insert(uid, held + 1);
        Ok(Permit {
            counts: self.counts.clone(),
            uid,
        })
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut counts = lock(&self.counts);
        counts.total = counts.total.saturating_sub(1);
        if let Some(held) = counts.per_uid.get_mut(&self.uid) {
            *held -= 1;
            if *held == 0 {
                counts.per_uid.remove(&self.uid);
            }
        }
    }
}

/// The counts stay consistent whatever panicked while holding the lock: every update is one step.
fn lock(counts: &Mutex<Counts>) -> MutexGuard<'_, Counts> {
    counts
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_uid: usize) -> ConnectionLimits {
        ConnectionLimits::new(
            &LimitsConfig {
                max_clients: total,
                max_clients_per_uid: per_uid,
                ..LimitsConfig::default()
            },
            "test",
        )
    }

    #[test]
    fn a_uid_at_its_cap_is_refused_until_one_of_its_connections_closes() {
        let limits = limits(10, 2);
        let first = limits.admit_uid(7, PerUidCap::Applies).unwrap();
        let _second = limits.admit_uid(7, PerUidCap::Applies).unwrap();
        let refused = limits.admit_uid(7, PerUidCap::Applies).err().unwrap();
        assert_eq!(refused, TooMany::ForUid { uid: 7, limit: 2 });
        assert_eq!(
            refused.to_string(),
            "too many connections for uid 7 (limit 2)"
        );
        // Another uid is not held up by the first one's cap.
        let _other = limits.admit_uid(8, PerUidCap::Applies).unwrap();
        drop(first);
        assert!(limits.admit_uid(7, PerUidCap::Applies).is_ok());
    }

    #[test]
    fn administrators_pass_the_per_uid_cap_but_not_the_total() {
        let limits = limits(3, 1);
        let held: Vec<Permit> = (0..3)
            .map(|_| limits.admit_uid(0, PerUidCap::Exempt).unwrap())
            .collect();
        assert_eq!(
            limits.admit_uid(0, PerUidCap::Exempt).err(),
            Some(TooMany::InTotal { limit: 3 })
        );
        assert_eq!(
            limits.admit_uid(9, PerUidCap::Applies).err(),
            Some(TooMany::InTotal { limit: 3 })
        );
        drop(held);
        assert_eq!(lock(&limits.counts).total, 0);
        assert!(lock(&limits.counts).per_uid.is_empty());
    }
}
