//! Proof, before the daemon serves, that no client lane's Redis ACL user can reach the reserved
//! keyspace: the lease user asks Redis `ACL DRYRUN <lane user> <probe>` for each client lane and a
//! set of probes (read, write and publish a reserved name; the server-wide commands that ignore key
//! patterns; `SELECT` of the lease database). Nothing is executed. An external Redis whose operator
//! gave the lanes broader users than `docs/lanes.md` says is refused with the user and the probe.
//!
//! And, in the same way, whether each lane's user may run exactly the commands the active policy
//! grants its lane ([`check_grants`]): a mismatch is reported, not refused.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tollgate_model::reserved::RESERVED_PREFIX;
use tollgate_model::{Exclusive, Lane, Protocol};
use tollgate_resp::Frame;

use crate::acl::may_run;
use crate::grants::LaneGrants;
use crate::{Borrowed, Lanes, LanesConfig, Route};

/// Why the daemon will not serve on this Redis.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReachError {
    #[error(
        "redis ACL user `{user}` of lane {lane} may run `{probe}`, so clients could reach the \
         daemon's reserved keyspace `{RESERVED_PREFIX}*`: give the lane users the rules in \
         docs/lanes.md"
    )]
    Reachable {
        lane: Lane,
        user: String,
        probe: String,
    },
    #[error(
        "cannot check the lane users with `ACL DRYRUN` as the lease user: {reason} (the lease \
         user needs `+acl|dryrun`; see docs/lanes.md)"
    )]
    CannotCheck { reason: String },
    #[error("cannot check the lane users: redis did not answer within {waited:?}: {reason}")]
    Unavailable { waited: Duration, reason: String },
}

/// How long start-up waits for Redis to answer the check (a Sentinel group may not have named
/// its master yet).
pub const CHECK_PATIENCE: Duration = Duration::from_secs(10);

/// [`check_once`], again every 100 ms while Redis cannot be reached, for up to `patience`.
pub async fn check_reserved_unreachable(
    leases: &Lanes,
    clients: &LanesConfig,
    patience: Duration,
) -> Result<(), ReachError> {
    let started = tokio::time::Instant::now();
    loop {
        match check_once(leases, clients).await {
            Err(Unanswered(reason)) if started.elapsed() < patience => {
                tracing::debug!(%reason, "redis not answering the keyspace check yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(Unanswered(reason)) => {
                return Err(ReachError::Unavailable {
                    waited: started.elapsed(),
                    reason,
                })
            }
            Ok(result) => return result,
        }
    }
}

/// The lanes could not reach Redis at all: worth trying again.
struct Unanswered(String);

/// Checks every client lane's user in `clients` through a connection of `leases`, on every
/// master (a cluster's nodes each have their own users).
async fn check_once(
    leases: &Lanes,
    clients: &LanesConfig,
) -> Result<Result<(), ReachError>, Unanswered> {
    let masters = (leases.masters().await).map_err(|error| Unanswered(error.to_string()))?;
    for master in masters {
        let checked = check_node(leases, master, clients).await?;
        if checked.is_err() {
            return Ok(checked);
        }
    }
    Ok(Ok(()))
}

/// [`check_once`] on the master `route` leads to.
async fn check_node(
    leases: &Lanes,
    route: Route,
    clients: &LanesConfig,
) -> Result<Result<(), ReachError>, Unanswered> {
    let mut conn = leases
        .borrow_at(route, Exclusive::Admin, Protocol::Resp2, None)
        .await
        .map_err(|error| Unanswered(error.to_string()))?;
    let result = async {
        for lane in Lane::ALL {
            let user = lane_user(clients, lane);
            for probe in probes(clients.leases.database) {
                match dryrun(&mut conn, &user, &probe).await? {
                    Ok(DryRun::Allowed) => {
                        return Ok(Err(ReachError::Reachable {
                            lane,
                            user,
                            probe: probe.join(" "),
                        }))
                    }
                    Ok(DryRun::Refused) => {}
                    Ok(DryRun::Unknown(reason)) | Err(reason) => {
                        return Ok(Err(ReachError::CannotCheck { reason }))
                    }
                }
            }
        }
        Ok(Ok(()))
    }
    .await;
    conn.release().await;
    result
}

/// The ACL user `lane` connects as; a lane without a user of its own connects as Redis's
/// `default` user.
fn lane_user(clients: &LanesConfig, lane: Lane) -> String {
    clients
        .settings(lane)
        .user
        .unwrap_or_else(|| "default".to_owned())
}

/// What `ACL DRYRUN` said of one command.
enum DryRun {
    Allowed,
    /// Redis says why the user may not: the answer wanted when probing the reserved keyspace.
    Refused,
    /// Redis could not judge it (a command it does not know, a wrong argument count).
    Unknown(String),
}

/// `ACL DRYRUN <user> <argv…>` on `conn`: `Err` when the check itself failed (the outer `Err`:
/// Redis could not be reached at all, worth trying again).
async fn dryrun(
    conn: &mut Borrowed,
    user: &str,
    argv: &[String],
) -> Result<Result<DryRun, String>, Unanswered> {
    let mut line = vec!["ACL".to_owned(), "DRYRUN".to_owned(), user.to_owned()];
    line.extend(argv.iter().cloned());
    let reply = conn
        .send(command(&line))
        .await
        .map_err(|error| Unanswered(error.to_string()))?;
    let frame = match reply.frame() {
        Ok(frame) => frame,
        Err(error) => return Ok(Err(error.to_string())),
    };
    Ok(match frame {
        Frame::Simple(ok) if ok.as_ref() == b"OK" => Ok(DryRun::Allowed),
        Frame::Bulk(_) => Ok(DryRun::Refused),
        Frame::Error(reason) if !reason.starts_with(b"NOPERM") => Ok(DryRun::Unknown(
            String::from_utf8_lossy(&reason).into_owned(),
        )),
        other => Err(describe(&other)),
    })
}

/// A lane user whose commands differ from the ones the policy's grants give its lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantMismatch {
    pub lane: Lane,
    pub user: String,
    /// Granted, but Redis refuses the user: clients get Redis's `NOPERM` for what the policy allows.
    pub too_narrow: Vec<String>,
    /// Not granted, yet Redis lets the user run it: Redis no longer backs the policy's refusals.
    pub too_wide: Vec<String>,
}

impl std::fmt::Display for GrantMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redis ACL user `{}` of lane {}", self.user, self.lane)?;
        if !self.too_narrow.is_empty() {
            write!(
                f,
                " is too narrow for the policy: it may not run {}",
                self.too_narrow.join(" ")
            )?;
        }
        if !self.too_wide.is_empty() {
            let joint = if self.too_narrow.is_empty() { "" } else { ";" };
            write!(
                f,
                "{joint} is too wide for the policy: it may run {}",
                self.too_wide.join(" ")
            )?;
        }
        write!(
            f,
            " (`tollgate redis-acl` prints the users the policy needs)"
        )
    }
}

/// Asks Redis, through a connection of `leases`, whether each client lane's user in `clients` may
/// run exactly what [`acl_rules`](crate::acl_rules) gives it under `grants`: each known command once,
/// with placeholder arguments (`0`), none of which names the reserved keyspace. Commands Redis
/// cannot judge (unknown to this server) are left out. Nothing is executed.
pub async fn check_grants(
    leases: &Lanes,
    clients: &LanesConfig,
    grants: &LaneGrants,
) -> Result<Vec<GrantMismatch>, ReachError> {
    let unreachable = |reason: String| ReachError::CannotCheck { reason };
    let mut conn = leases
        .borrow(Exclusive::Admin)
        .await
        .map_err(|error| unreachable(error.to_string()))?;
    let mut mismatches = Vec::new();
    let result = async {
        for lane in Lane::ALL {
            let user = lane_user(clients, lane);
            let (mut too_narrow, mut too_wide) = (Vec::new(), Vec::new());
            for (name, arity) in grants.known() {
                if ACL_EXEMPT.contains(&name) {
                    continue;
                }
                let wanted = may_run(lane, grants, name);
                let probe = placeholder_argv(name, arity);
                let answer = dryrun(&mut conn, &user, &probe)
                    .await
                    .map_err(|Unanswered(reason)| reason)?;
                match (answer?, wanted) {
                    (DryRun::Allowed, false) => too_wide.push(name.to_owned()),
                    (DryRun::Refused, true) => too_narrow.push(name.to_owned()),
                    _ => {}
                }
            }
            if !too_narrow.is_empty() || !too_wide.is_empty() {
                mismatches.push(GrantMismatch {
                    lane,
                    user,
                    too_narrow,
                    too_wide,
                });
            }
        }
        Ok::<(), String>(())
    }
    .await;
    conn.release().await;
    result.map_err(unreachable)?;
    Ok(mismatches)
}

/// Commands Redis lets every user run, whatever its rules: nothing to check.
const ACL_EXEMPT: [&str; 3] = ["auth", "quit", "reset"];

/// `client|list` with arity -2 as `client list`; every further argument Redis requires as `0`.
fn placeholder_argv(name: &str, arity: i32) -> Vec<String> {
    let mut argv: Vec<String> = name.split('|').map(str::to_owned).collect();
    let wanted = arity.unsigned_abs() as usize;
    while argv.len() < wanted {
        argv.push("0".to_owned());
    }
    argv
}

/// The commands no client lane's user may run.
fn probes(lease_database: u32) -> Vec<Vec<String>> {
    let reserved = format!("{RESERVED_PREFIX}probe");
    let mut probes: Vec<Vec<String>> = vec![
        vec!["GET".into(), reserved.clone()],
        vec!["SET".into(), reserved.clone(), "x".into()],
        vec!["DEL".into(), "decoy".into(), reserved.clone()],
        vec!["PUBLISH".into(), reserved.clone(), "x".into()],
        vec!["SPUBLISH".into(), reserved, "x".into()],
        vec!["FLUSHALL".into()],
        vec!["SWAPDB".into(), "0".into(), lease_database.to_string()],
    ];
    if lease_database != 0 {
        probes.push(vec!["SELECT".into(), lease_database.to_string()]);
    }
    probes
}

fn command(argv: &[String]) -> Bytes {
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(argv, &mut out);
    out.freeze()
}

fn describe(frame: &Frame) -> String {
    match frame.as_bytes() {
        Some(bytes) => format!("redis: {}", String::from_utf8_lossy(bytes)),
        None => format!("redis: unexpected reply {frame:?}"),
    }
}
