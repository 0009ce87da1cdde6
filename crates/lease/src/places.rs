//! Places in a pool the lease service bounds (watchdogs, holder watches), shared by who is
//! asking: at most `total` taken at once, and at most `per_uid` by one OS user of one principal
//! (an [`Identity`]). Per user, not per principal, because one principal may cover every local
//! user (the default policy's `local`): then one user filling a per-principal share would refuse
//! every other user. A [`Place`] is given back when dropped.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::attempt::Identity;

/// How many places may be taken: in all, and by one user of one principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_uid: usize,
}

/// No place: the user already holds its share, or the pool its total (`limit` is the one
/// reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtLimit {
    pub limit: usize,
}

/// One bounded pool's count of taken places.
#[derive(Clone, Default)]
pub struct Places {
    taken: Arc<Mutex<Taken>>,
}

#[derive(Default)]
struct Taken {
    /// Per user of a principal; absent means zero.
    by_user: HashMap<Identity, usize>,
    total: usize,
}

/// One taken place, given back when dropped.
pub struct Place {
    places: Places,
    holder: Identity,
}

impl Places {
    /// A place for `holder`, unless it already holds `limits.per_uid` or the pool
    /// `limits.total`.
    pub fn take(&self, holder: &Identity, limits: Limits) -> Result<Place, AtLimit> {
        let mut taken = self.taken.lock();
        let mine = taken.by_user.get(holder).copied().unwrap_or(0);
        if mine >= limits.per_uid {
            return Err(AtLimit {
                limit: limits.per_uid,
            });
        }
        if taken.total >= limits.total {
            return Err(AtLimit {
                limit: limits.total,
            });
        }
        taken.by_user.insert(holder.clone(), mine + 1);
        taken.total += 1;
        Ok(Place {
            places: self.clone(),
            holder: holder.clone(),
        })
    }

    /// Places taken now, by each user that holds any.
    pub fn by_user(&self) -> Vec<(Identity, usize)> {
        let taken = self.taken.lock();
        taken
            .by_user
            .iter()
            .map(|(user, places)| (user.clone(), *places))
            .collect()
    }

    /// Places taken now, by everyone.
    #[cfg(test)]
    fn taken(&self) -> usize {
        self.taken.lock().total
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut taken = self.places.taken.lock();
        if let Some(mine) = taken.by_user.get_mut(&self.holder) {
            *mine -= 1;
            if *mine == 0 {
                taken.by_user.remove(&self.holder);
            }
            taken.total -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(principal: &str, uid: u32) -> Identity {
        Identity {
            principal: principal.into(),
            uid,
        }
    }

    const LIMITS: Limits = Limits {
        total: 3,
        per_uid: 2,
    };

    #[test]
    fn a_user_gets_at_most_its_share_and_gets_it_back() {
        let places = Places::default();
        let alice = user("local", 1000);
        let first = places.take(&alice, LIMITS).unwrap();
        let _second = places.take(&alice, LIMITS).unwrap();
        assert_eq!(
            places.take(&alice, LIMITS).err(),
            Some(AtLimit { limit: 2 })
        );
        drop(first);
        assert!(places.take(&alice, LIMITS).is_ok());
        let none = Limits {
            total: 3,
            per_uid: 0,
        };
        assert_eq!(places.take(&alice, none).err(), Some(AtLimit { limit: 0 }));
    }

    /// Issue 28's attack: one user of the principal every local user shares takes its whole
    /// share; another user of the same principal still gets a place, and the total holds for all.
    #[test]
    fn one_user_filling_its_share_leaves_places_for_another_user_of_the_same_principal() {
        let places = Places::default();
        let attacker = user("local", 2002);
        let _a1 = places.take(&attacker, LIMITS).unwrap();
        let _a2 = places.take(&attacker, LIMITS).unwrap();
        assert_eq!(
            places.take(&attacker, LIMITS).err(),
            Some(AtLimit { limit: 2 })
        );
        let victim = places.take(&user("local", 2001), LIMITS);
        assert!(victim.is_ok(), "the victim's place");
        let mut by_user = places.by_user();
        by_user.sort_by_key(|(user, _)| user.uid);
        assert_eq!(
            by_user,
            [(user("local", 2001), 1), (user("local", 2002), 2)]
        );
        assert_eq!(
            places.take(&user("local", 2003), LIMITS).err(),
            Some(AtLimit { limit: 3 }),
            "the total holds"
        );
        drop(victim);
        let later = places.take(&user("local", 2003), LIMITS);
        assert!(later.is_ok(), "a place given back is taken again");
        assert_eq!(places.taken(), 3);
        drop(later);
        assert_eq!(places.taken(), 2);
    }
}
