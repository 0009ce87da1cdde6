//! What can go wrong when borrowing from a lane or sending on it, typed so that a caller can tell
//! "not sent, safe to retry" from "sent, outcome unknown".

use std::time::Duration;

use tollgate_model::Lane;

/// Why a lane turned a borrower away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Saturation {
    /// The borrower waited the lane's whole acquire timeout.
    WaitExpired,
    /// The wait queue was already full, so it was refused at once.
    QueueFull,
    /// The borrower (its principal and OS user) held its whole share of the lane for the whole
    /// acquire timeout.
    PrincipalShare,
}

impl Saturation {
    /// What the refusal adds to "lane … saturated" for the client.
    fn detail(self) -> &'static str {
        match self {
            Saturation::WaitExpired | Saturation::QueueFull => "",
            Saturation::PrincipalShare => {
                ": this user of the principal holds its whole share of the lane's connections"
            }
        }
    }
}

/// Borrowing or opening a channel failed; nothing was sent to Redis.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LaneError {
    #[error("lane {} saturated{}", lane.shout(), cause.detail())]
    Saturated {
        lane: Lane,
        waited: Duration,
        cause: Saturation,
    },
    #[error("redis unavailable (not sent): {reason}")]
    Unavailable { reason: String },
    #[error("lanes are closed (daemon shutting down)")]
    Closed,
    /// A scope's pool cannot be had (too many scopes have connections; no scopes on a cluster),
    /// or Redis refused a lent connection's login as the scope's user.
    #[error("scope {user}: {reason}")]
    Scope { user: String, reason: String },
    /// The cluster still redirected the command after this many redirects; Redis ran none of the
    /// attempts (a redirect is a refusal up front).
    #[error(
        "the cluster still redirects this command after {redirects} redirects (not run): {last}"
    )]
    Redirected { redirects: usize, last: String },
    /// One of the caller's scripts was stopped at its time limit, and its scripts are refused
    /// for a while after (`script_limit::Cooldown`).
    #[error(
        "this user's scripts are refused for {} ms more: one was stopped at its time limit \
         less than {:?} ago",
        remaining.as_millis().max(1),
        cooldown
    )]
    ScriptCooldown {
        remaining: Duration,
        cooldown: Duration,
    },
}

/// Sending a command failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// Nothing was written: the lane refused the command before it reached a connection.
    #[error(transparent)]
    NotSent(#[from] LaneError),
    /// The command was (or may have been) written; whether Redis ran it is unknown.
    #[error("redis reply lost (command may have run): {reason}")]
    Indeterminate { reason: String },
    /// The command ran, but its reply was dropped unrelayed: holding it would break the caller's
    /// [`Budget`](crate::Budget).
    #[error("reply dropped (the command ran): {0}")]
    OverBudget(#[from] crate::budget::OverBudget),
    /// A script ran past its caller's time limit and the daemon stopped it with `kill` (see
    /// `script_limit`). Redis stops only a script that has not written: it ran, and changed nothing.
    #[error("script stopped after {set_by} ({limit:?}) with {kill}; it wrote nothing")]
    ScriptStopped {
        limit: Duration,
        /// What set the limit (`ScriptLimit::set_by`).
        set_by: std::sync::Arc<str>,
        kill: crate::overrun::Kill,
    },
}

/// Whether a failed command can have run: what decides whether it may be sent again, and what a
/// caller is told. Every layer asks this rather than matching the error itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Nothing reached Redis: retrying is safe.
    NotSent,
    /// The bytes left; whether Redis ran the command is unknown.
    MaybeRan,
    /// Redis ran it; only its reply was not relayed.
    Ran,
}

impl CallError {
    pub fn delivery(&self) -> Delivery {
        match self {
            CallError::NotSent(_) => Delivery::NotSent,
            CallError::Indeterminate { .. } => Delivery::MaybeRan,
            CallError::OverBudget(_) | CallError::ScriptStopped { .. } => Delivery::Ran,
        }
    }
}

/// Why `Lanes::open` refused a configuration.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("lane {lane}: cannot read password file {path}: {source}")]
    PasswordFile {
        lane: Lane,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("lane {lane}: password_file is set but user is not")]
    PasswordWithoutUser { lane: Lane },
    #[error("a Sentinel topology needs at least one sentinel address")]
    NoSentinels,
    #[error("redis.sentinel: cannot read password file {path}: {source}")]
    SentinelPasswordFile {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("a cluster topology needs at least one seed node address")]
    NoSeeds,
    #[error(
        "`lanes.leases.database: {database}`: a Redis Cluster has only database 0; \
         the lease keys' reserved prefix keeps them apart there"
    )]
    DatabaseInCluster { database: u32 },
}
