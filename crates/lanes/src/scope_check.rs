//! Whether the scope users an operator made on an external Redis (`tollgate redis-acl` prints
//! them) are there and out of the reserved keyspace, before their principals' scripts run as
//! them: the lease user asks `ACL DRYRUN` of each, on every master and replica, as the
//! reserved-keyspace proof does of the lane users (`reach.rs`). A scope user's name is a digest of its grants, so one that
//! exists was cut from the same grants, unless someone edited it by hand: the probes catch the
//! edit that matters most.

use crate::reach::{
    admin_on, dryrun, open_replica, replicas, Asker, DryRun, ReachError, Unanswered,
};
use crate::{Lanes, LanesConfig};
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

/// Each of `users` checked on every server (a cluster's nodes each have their own users, and a
/// promoted replica serves with its own: Redis does not replicate ACLs), as the lease user, in
/// order: the first finding that is not [`ScopeUserCheck::Ready`] stands. The masters through
/// `leases`, each replica a master names in `ROLE` through a connection of its own (`clients`:
/// the lease user's login), as the reserved-keyspace proof reaches them.
pub async fn check_scope_users(
    leases: &Lanes,
    clients: &LanesConfig,
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
        let checked = check_on(&mut conn, &server, users, &mut checks).await;
        let found = match checked {
            Ok(()) => replicas(&mut conn, &server).await,
            Err(unanswered) => Err(unanswered),
        };
        conn.release().await;
        let found = match found {
            Ok(Ok(found)) => found,
            Ok(Err(error)) => return Err(error),
            Err(Unanswered(reason)) => return Err(unreachable(&server, reason)),
        };
        for replica in found {
            let server = replica.to_string();
            let mut stream = open_replica(&replica, clients)
                .await
                .map_err(|reason| unreachable(&server, reason))?;
            check_on(&mut stream, &server, users, &mut checks)
                .await
                .map_err(|Unanswered(reason)| unreachable(&server, reason))?;
        }
    }
    Ok(checks)
}

/// Each of `users` still [`ScopeUserCheck::Ready`] probed on one server (`server`, by name).
async fn check_on(
    asker: &mut impl Asker,
    server: &str,
    users: &[String],
    checks: &mut [ScopeUserCheck],
) -> Result<(), Unanswered> {
    'users: for (user, check) in users.iter().zip(checks.iter_mut()) {
        if *check != ScopeUserCheck::Ready {
            continue;
        }
        for probe in probes() {
            let server = server.to_owned();
            *check = match dryrun(asker, user, &probe).await? {
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
    Ok(())
}
