//! A user and password to log in with: a lane's, or the sentinels'.

/// The user and password a lane authenticates with.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    /// The user only: the password stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish()
    }
}
