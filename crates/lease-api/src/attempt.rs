//! Attempts: who holds (`owner`) and which logical operation (`operation_id`), chosen by the caller
//! before the first send so that a retry after a lost reply is recognised as the same attempt.
//! The daemon binds the owner to the caller's [`Identity`] (principal and uid) before it reaches
//! Redis, so neither another principal nor another OS user of the same principal can renew or
//! release a lease by guessing or reading an owner token.

use serde::{Deserialize, Serialize};
use tollgate_model::Caller;

/// The longest `owner` or `operation_id` accepted.
pub const MAX_ID_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attempt {
    pub owner: String,
    pub operation_id: String,
}

/// Who a lease belongs to: the caller's principal and the uid the kernel reported for it. Both
/// count, because one principal may cover many OS users (the default policy's `local`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub principal: String,
    pub uid: u32,
}

impl From<&Caller> for Identity {
    fn from(caller: &Caller) -> Identity {
        Identity {
            principal: caller.principal.clone(),
            uid: caller.uid,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must be 1 to {MAX_ID_LEN} letters, digits or . _ - :")]
pub struct InvalidAttempt {
    /// `owner` or `operation_id`.
    pub field: &'static str,
}

impl Attempt {
    /// Checks both identifiers; the error names the offending field.
    pub fn validate(&self) -> Result<(), InvalidAttempt> {
        for (field, value) in [("owner", &self.owner), ("operation_id", &self.operation_id)] {
            // The same narrow set as resource names keeps attempts safe in a query string.
            let plain = value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'));
            if value.is_empty() || value.len() > MAX_ID_LEN || !plain {
                return Err(InvalidAttempt { field });
            }
        }
        Ok(())
    }

    /// The owner as stored in Redis: `<len>:<principal>:<uid>:<owner>`. The principal is
    /// length-prefixed and the uid is digits ended by `:`, so no choice of principal, uid and owner
    /// can collide with another triple.
    pub fn bound_owner(&self, identity: &Identity) -> String {
        let Identity { principal, uid } = identity;
        // Into a string sized at once, the numbers written without `write!`'s formatting
        // machinery: this runs for every lease call.
        let mut digits = itoa::Buffer::new();
        let mut bound = String::with_capacity(principal.len() + self.owner.len() + 26);
        bound.push_str(digits.format(principal.len()));
        bound.push(':');
        bound.push_str(principal);
        bound.push(':');
        bound.push_str(digits.format(*uid));
        bound.push(':');
        bound.push_str(&self.owner);
        bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(owner: &str, operation_id: &str) -> Attempt {
        Attempt {
            owner: owner.into(),
            operation_id: operation_id.into(),
        }
    }

    fn who(principal: &str, uid: u32) -> Identity {
        Identity {
            principal: principal.into(),
            uid,
        }
    }

    #[test]
    fn the_bound_owner_is_the_stored_layout() {
        // What Redis holds: a daemon that bound owners otherwise would not recognise its holders.
        assert_eq!(
            attempt("tok-1", "op").bound_owner(&who("alice", 1000)),
            "5:alice:1000:tok-1"
        );
    }

    #[test]
    fn the_same_owner_token_differs_between_principals_and_uids() {
        let a = attempt("tok", "op");
        assert_ne!(
            a.bound_owner(&who("alice", 1000)),
            a.bound_owner(&who("bob", 1000))
        );
        // One principal, two OS users: two owners.
        assert_ne!(
            a.bound_owner(&who("local", 1000)),
            a.bound_owner(&who("local", 1001))
        );
        // "a:b" + "c" must not equal "a" + "b:c".
        assert_ne!(
            attempt("c", "op").bound_owner(&who("a:b", 1)),
            attempt("b:c", "op").bound_owner(&who("a", 1))
        );
        // The uid ends at the first `:` after the principal, so no digits move between uid and owner.
        assert_ne!(
            attempt("2:x", "op").bound_owner(&who("p", 1)),
            attempt("x", "op").bound_owner(&who("p", 12))
        );
    }

    #[test]
    fn validation_names_the_field() {
        assert_eq!(attempt("", "op").validate().unwrap_err().field, "owner");
        assert_eq!(
            attempt("o", "has space").validate().unwrap_err().field,
            "operation_id"
        );
        assert_eq!(
            attempt(&"x".repeat(MAX_ID_LEN + 1), "op")
                .validate()
                .unwrap_err()
                .field,
            "owner"
        );
        assert!(attempt("owner-1", "op-1").validate().is_ok());
    }
}
