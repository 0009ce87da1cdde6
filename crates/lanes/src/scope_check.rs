//! Whether the scope users an operator made on an external Redis (`tollgate redis-acl` prints
//! them) are there and out of the reserved keyspace, before their principals' scripts run as
//! them: the lease user asks `ACL DRYRUN` of each, on every master, as the reserved-keyspace
//! proof does of the lane users (`reach.rs`). Replicas are not asked: a promoted one is checked
//! at the next reload. A scope user's name is a digest of its grants, so one that
//! exists was cut from the same grants, unless someone edited it by hand: the probes catch the
//! edit that matters most.

use crate::reach::{admin_on, dryrun, DryRun, ReachError, Unanswered};
use crate::Lanes;
use tollgate_model::reserved::RESERVED_PREFIX;

/// What the servers hold of one scope user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeUserCheck {
    /// There, and refused the reserved keyspace, on every master: its principals' scripts may
    /// run as it.
    Ready,
    /// `server` has no such user (not made, or made for an older policy).
    Missing { server: String },
    /// It may run `probe` on the reserved keyspace on `server`: never used.
    ReachesReserved { server: String, probe: String },
    /// `server` answered the probe with something else (`reason`): not used.
    Unclear { server: String, reason: String },
}

/// The probes: read and write a reserved key.
fn probes() -> [Vec<String>; 2] {
    let key = format!("{RESERVED_PREFIX}probe");
    [
        vec!["GET".to_owned(), key.clone()],
        vec!["SET".to_owned(), key, "x".to_owned()],
    ]
}

/// Each of `users` checked on every master (a cluster's nodes each have their own users), as
/// the lease user, in order: the first finding that is not [`ScopeUserCheck::Ready`] stands.
pub async fn check_scope_users(
    leases: &Lanes,
    users: &[String],
) -> Result<Vec<ScopeUserCheck>, ReachError> {
    let unreachable = |server: &str, reason: String| ReachError::CannotCheck {
        server: server.to_owned(),
        reason,
    };
    let mut checks = vec![ScopeUserCheck::Ready; users.len()];
    if users.is_empty() {
        return Ok(checks);
    }
    let masters = leases
        .masters()
        .await
        .map_err(|error| unreachable("the master", error.to_string()))?;
    for master in masters {
        let (server, mut conn) = admin_on(leases, master)
            .await
            .map_err(|(server, reason)| unreachable(&server, reason))?;
        let mut failed = None;
        'users: for (user, check) in users.iter().zip(checks.iter_mut()) {
            if *check != ScopeUserCheck::Ready {
                continue;
            }
            for probe in probes() {
                let answer = match dryrun(&mut conn, user, &probe).await {
                    Ok(answer) => answer,
                    Err(Unanswered(reason)) => {
                        failed = Some(reason);
                        break 'users;
                    }
                };
                let server = server.clone();
                *check = match answer {
                    Ok(DryRun::Refused) => continue,
                    Ok(DryRun::Allowed) => ScopeUserCheck::ReachesReserved {
                        server,
                        probe: probe.join(" "),
                    },
                    // `ERR User '<name>' not found`.
                    Ok(DryRun::Unknown(reason)) if reason.contains("not found") => {
                        ScopeUserCheck::Missing { server }
                    }
                    Ok(DryRun::Unknown(reason)) | Err(reason) => {
                        ScopeUserCheck::Unclear { server, reason }
                    }
                };
                continue 'users;
            }
        }
        conn.release().await;
        if let Some(reason) = failed {
            return Err(unreachable(&server, reason));
        }
    }
    Ok(checks)
}
