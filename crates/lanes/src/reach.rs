//! Proof, before the daemon serves, that no client lane's Redis ACL user can reach the reserved
//! keyspace: the lease user asks Redis `ACL DRYRUN <lane user> <probe>` for each client lane and a
//! set of probes (read, write and publish a reserved name; the server-wide commands that ignore key
//! patterns; `SELECT` of the lease database). Nothing is executed. An external Redis whose operator
//! gave the lanes broader users than `docs/lanes.md` says is refused with the user and the probe.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tollgate_model::reserved::RESERVED_PREFIX;
use tollgate_model::Lane;
use tollgate_resp::Frame;

use crate::{Lanes, LanesConfig};

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

/// Checks every client lane's user in `clients` through a connection of `leases`.
async fn check_once(
    leases: &Lanes,
    clients: &LanesConfig,
) -> Result<Result<(), ReachError>, Unanswered> {
    let cannot = |reason: String| ReachError::CannotCheck { reason };
    let mut conn = leases
        .borrow(Lane::Admin)
        .await
        .map_err(|error| Unanswered(error.to_string()))?;
    let result = async {
        for lane in Lane::ALL {
            // A lane without a user of its own connects as Redis's `default` user.
            let user = clients
                .settings(lane)
                .user
                .unwrap_or_else(|| "default".to_owned());
            for probe in probes(clients.leases.database) {
                let mut argv = vec!["ACL".to_owned(), "DRYRUN".to_owned(), user.clone()];
                argv.extend(probe.iter().cloned());
                let reply = match conn.send(command(&argv)).await {
                    Ok(reply) => reply,
                    Err(error) => return Err(Unanswered(error.to_string())),
                };
                let frame = match reply.frame() {
                    Ok(frame) => frame,
                    Err(error) => return Ok(Err(cannot(error.to_string()))),
                };
                match frame {
                    Frame::Simple(ok) if ok.as_ref() == b"OK" => {
                        return Ok(Err(ReachError::Reachable {
                            lane,
                            user,
                            probe: probe.join(" "),
                        }))
                    }
                    // Redis says why the user may not: that is the answer wanted.
                    Frame::Bulk(_) => {}
                    other => return Ok(Err(cannot(describe(&other)))),
                }
            }
        }
        Ok(Ok(()))
    }
    .await;
    conn.release().await;
    result
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
