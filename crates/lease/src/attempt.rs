//! Attempts: who holds (`owner`) and which logical operation (`operation_id`), chosen by the caller
//! before the first send so that a retry after a lost reply is recognised as the same attempt.
//! The daemon binds the owner to the caller's principal before it reaches Redis, so another
//! principal cannot renew or release a lease by guessing an owner token.

use serde::{Deserialize, Serialize};

/// The longest `owner` or `operation_id` accepted.
pub const MAX_ID_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attempt {
    pub owner: String,
    pub operation_id: String,
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

    /// The owner as stored in Redis: the principal, length-prefixed so that no choice of principal
    /// and owner can collide with another pair.
    pub fn bound_owner(&self, principal: &str) -> String {
        format!("{}:{principal}:{}", principal.len(), self.owner)
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

    #[test]
    fn the_same_owner_token_differs_between_principals() {
        let a = attempt("tok", "op");
        assert_ne!(a.bound_owner("alice"), a.bound_owner("bob"));
        // "a:b" + "c" must not equal "a" + "b:c".
        assert_ne!(
            attempt("c", "op").bound_owner("a:b"),
            attempt("b:c", "op").bound_owner("a")
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
