//! What a lease call through the client can fail with, short of an outcome.

use tollgate_lease_api::Terminal;

use crate::transport::TransportError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon answered with an error that no retry can fix (bad input, denied, unknown path).
    #[error(
        "daemon refused the request ({status}{}): {message}",
        field.as_deref().map(|f| format!(", field `{f}`")).unwrap_or_default()
    )]
    Rejected {
        status: u16,
        /// The request field the daemon named, if any.
        field: Option<String>,
        message: String,
    },
    #[error("unreadable reply from the daemon: {0}")]
    BadReply(String),
    #[error(transparent)]
    Terminal(#[from] Terminal),
    #[error(transparent)]
    Transport(#[from] TransportError),
}
