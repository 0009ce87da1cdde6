//! Resource names as callers write them: validated, so that a name is always one segment of an
//! HTTP path and never reaches Redis raw (the daemon derives its Redis keys from a digest, in
//! `tollgate_lease::keys`).

use std::fmt;

/// The longest resource name accepted.
pub const MAX_RESOURCE_LEN: usize = 200;

/// A validated resource name: 1 to [`MAX_RESOURCE_LEN`] bytes of `A-Z a-z 0-9 . _ - :`. The set
/// excludes `/` so that a name is always exactly one segment of an HTTP path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resource(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidResource {
    #[error("resource name is empty")]
    Empty,
    #[error("resource name is longer than {MAX_RESOURCE_LEN} bytes")]
    TooLong,
    #[error("resource name contains {0:?}; allowed are letters, digits and . _ - :")]
    BadCharacter(char),
}

impl Resource {
    pub fn parse(name: &str) -> Result<Resource, InvalidResource> {
        if name.is_empty() {
            return Err(InvalidResource::Empty);
        }
        if name.len() > MAX_RESOURCE_LEN {
            return Err(InvalidResource::TooLong);
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')))
        {
            return Err(InvalidResource::BadCharacter(bad));
        }
        Ok(Resource(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert_eq!(Resource::parse(""), Err(InvalidResource::Empty));
        assert_eq!(
            Resource::parse(&"a".repeat(MAX_RESOURCE_LEN + 1)),
            Err(InvalidResource::TooLong)
        );
        assert_eq!(
            Resource::parse("a/b"),
            Err(InvalidResource::BadCharacter('/'))
        );
        assert_eq!(
            Resource::parse("a{b}"),
            Err(InvalidResource::BadCharacter('{'))
        );
        assert!(Resource::parse("Job-7.nightly_run:eu").is_ok());
    }
}
