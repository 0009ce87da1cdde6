//! Why a session ended before its client quit or the daemon stopped, as its last log line says.

use super::budget::Breach;
use super::subscriptions::Eviction;

/// Why a session ended before its client quit or the daemon stopped.
#[derive(Debug, thiserror::Error)]
pub enum Ended {
    #[error("client closed the connection")]
    Closed,
    #[error("client closed the connection while a command was awaited")]
    ClosedWhileAwaited,
    #[error("read failed: {0}")]
    ReadFailed(std::io::Error),
    #[error("write failed: {0}")]
    WriteFailed(std::io::Error),
    /// A subscriber that did not keep up, or whose subscription ended.
    #[error("{0}")]
    Evicted(Eviction),
    #[error("killed by CLIENT KILL")]
    Killed,
    #[error("{0}")]
    OverBudget(Breach),
}
