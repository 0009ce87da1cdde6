//! Proof, before the daemon serves, that no Redis ACL user but the lease user can reach the
//! reserved keyspace: the lease user asks Redis `ACL DRYRUN <lane user> <probe>` for each client
//! lane and a set of probes (read, write and publish a reserved name; the server-wide commands that
//! ignore key patterns; `SELECT` of the lease database), and then the same of every other enabled
//! user `ACL LIST` shows (`default` included; the probes in `others.rs`), on every master and
//! every replica a master names in `ROLE`. Nothing is executed. An external Redis whose operator
//! gave the lanes broader users than `docs/lanes.md` says, or left another user (an open
//! `default`) able to reach the keyspace, is refused with the server, the user and the probe;
//! other users the operator named in `redis.trusted_users` are accepted with a warning.
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
use crate::others::{self, OtherUser};
use crate::stream::Stream;
use crate::{Borrowed, Endpoint, Lanes, LanesConfig, Route};

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
        "redis at {server} has ACL users that could reach the daemon's reserved keyspace \
         `{RESERVED_PREFIX}*` (leases and fence counters): {}; turn them off or narrow them \
         (`tollgate redis-acl` prints how for `default`), or, for a user only trusted hands \
         hold, name it in `redis.trusted_users` (see docs/lanes.md)",
        list(.users)
    )]
    OtherUsers {
        server: String,
        users: Vec<OtherUser>,
    },
    #[error(
        "cannot check the users of redis at {server} as the lease user: {reason} (the lease \
         user needs `+acl|dryrun +acl|list +role`, and must exist on every server, replicas \
         included; see docs/lanes.md)"
    )]
    CannotCheck { server: String, reason: String },
    #[error("cannot check the lane users: redis did not answer within {waited:?}: {reason}")]
    Unavailable { waited: Duration, reason: String },
}

fn list(users: &[OtherUser]) -> String {
    let users: Vec<String> = users.iter().map(OtherUser::to_string).collect();
    users.join("; ")
}

/// How long start-up waits for Redis to answer the check (a Sentinel group may not have named
/// its master yet).
pub const CHECK_PATIENCE: Duration = Duration::from_secs(10);

/// How long one exchange with a replica may take.
const REPLICA_TIMEOUT: Duration = Duration::from_secs(2);

/// Users besides the lanes' and the lease user's that may reach the reserved keyspace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vouched {
    /// Named by the operator (`redis.trusted_users`): each one that could reach the keyspace is
    /// logged as a warning instead of refusing the start.
    pub trusted: Vec<String>,
    /// The daemon's own (the embedded server's administrator): not judged.
    pub own: Vec<String>,
}

/// [`check_once`], again every 100 ms while Redis cannot be reached, for up to `patience`.
pub async fn check_reserved_unreachable(
    leases: &Lanes,
    clients: &LanesConfig,
    vouched: &Vouched,
    patience: Duration,
) -> Result<(), ReachError> {
    let started = tokio::time::Instant::now();
    loop {
        match check_once(leases, clients, vouched).await {
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
pub(crate) struct Unanswered(pub(crate) String);

/// One connection the check asks its questions on: a lease connection borrowed on a master, or a
/// stream of its own to a replica (the lanes open none there).
pub(crate) trait Asker {
    async fn ask(&mut self, argv: &[String]) -> Result<Frame, Unanswered>;
}

impl Asker for Borrowed {
    async fn ask(&mut self, argv: &[String]) -> Result<Frame, Unanswered> {
        let reply = self
            .send(command(argv))
            .await
            .map_err(|error| Unanswered(error.to_string()))?;
        reply.frame().map_err(|error| Unanswered(error.to_string()))
    }
}

/// A replica's stream, authenticated as the lease user.
pub(crate) struct Replica(Stream, BytesMut);

impl Asker for Replica {
    async fn ask(&mut self, argv: &[String]) -> Result<Frame, Unanswered> {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let Replica(stream, read) = self;
        match tokio::time::timeout(REPLICA_TIMEOUT, stream.exchange(read, &argv)).await {
            Ok(Ok(frame)) => Ok(frame),
            Ok(Err(error)) => Err(Unanswered(error.to_string())),
            Err(_) => Err(Unanswered(format!("no answer within {REPLICA_TIMEOUT:?}"))),
        }
    }
}

/// A lease ADMIN connection on `master`, and the server's name for messages; `Err`: the name and
/// why there is none.
pub(crate) async fn admin_on(
    leases: &Lanes,
    master: Route,
) -> Result<(String, Borrowed), (String, String)> {
    let server = match &master {
        Route::Node(endpoint) => endpoint.to_string(),
        _ => "the master".to_owned(),
    };
    match leases
        .borrow_at(master, Exclusive::Admin, Protocol::Resp2, None)
        .await
    {
        Ok(conn) => Ok((server, conn)),
        Err(error) => Err((server, error.to_string())),
    }
}

/// Checks every server: each master (a cluster's nodes each have their own users) through a
/// connection of `leases`, and each replica a master names in `ROLE` (a promoted replica serves
/// with its own users: Redis does not replicate ACLs) through a connection of its own.
async fn check_once(
    leases: &Lanes,
    clients: &LanesConfig,
    vouched: &Vouched,
) -> Result<Result<(), ReachError>, Unanswered> {
    let masters = (leases.masters().await).map_err(|error| Unanswered(error.to_string()))?;
    for master in masters {
        let (server, mut conn) = admin_on(leases, master)
            .await
            .map_err(|(_, reason)| Unanswered(reason))?;
        let checked = check_server(&mut conn, &server, clients, vouched).await;
        let replicas = match &checked {
            Ok(Ok(())) => replicas(&mut conn, &server).await,
            _ => Ok(Ok(Vec::new())),
        };
        conn.release().await;
        match checked? {
            Ok(()) => {}
            refused => return Ok(refused),
        }
        let replicas = match replicas? {
            Ok(replicas) => replicas,
            Err(error) => return Ok(Err(error)),
        };
        for replica in replicas {
            let server = replica.to_string();
            let mut stream = match open_replica(&replica, clients).await {
                Ok(stream) => stream,
                Err(reason) => return Ok(Err(ReachError::CannotCheck { server, reason })),
            };
            match check_server(&mut stream, &server, clients, vouched).await? {
                Ok(()) => {}
                refused => return Ok(refused),
            }
        }
    }
    Ok(Ok(()))
}

/// The lane users' probes, then every other enabled user's, on one server.
async fn check_server(
    asker: &mut impl Asker,
    server: &str,
    clients: &LanesConfig,
    vouched: &Vouched,
) -> Result<Result<(), ReachError>, Unanswered> {
    let cannot = |reason| ReachError::CannotCheck {
        server: server.to_owned(),
        reason,
    };
    for lane in Lane::ALL {
        let user = lane_user(clients, lane);
        for probe in probes(clients.leases.database) {
            match dryrun(asker, &user, &probe).await? {
                Ok(DryRun::Allowed) => {
                    return Ok(Err(ReachError::Reachable {
                        lane,
                        user,
                        probe: probe.join(" "),
                    }))
                }
                Ok(DryRun::Refused) => {}
                Ok(DryRun::Unknown(reason)) | Err(reason) => return Ok(Err(cannot(reason))),
            }
        }
    }
    let listed = match asker.ask(&["ACL".into(), "LIST".into()]).await? {
        Frame::Array(lines) => lines
            .iter()
            .filter_map(|line| Some(String::from_utf8_lossy(line.as_bytes()?).into_owned()))
            .collect::<Vec<_>>(),
        other => return Ok(Err(cannot(describe(&other)))),
    };
    let mut ours = daemon_user_names(clients);
    ours.extend(vouched.own.iter().cloned());
    let mut reaching = Vec::new();
    for user in others::enabled(&listed) {
        if ours.contains(&user.name) {
            continue;
        }
        for probe in others::probes(clients.leases.database) {
            match dryrun(asker, &user.name, &probe).await? {
                Ok(DryRun::Allowed) => {
                    reaching.push(OtherUser {
                        name: user.name.clone(),
                        probe: probe.join(" "),
                        open: user.open,
                    });
                    break;
                }
                Ok(DryRun::Refused) => {}
                // A probe this server cannot judge (SPUBLISH before 7.0, say) proves nothing either way.
                Ok(DryRun::Unknown(reason)) => {
                    tracing::debug!(%server, user = %user.name, %reason, "probe not judged");
                }
                Err(reason) => return Ok(Err(cannot(reason))),
            }
        }
    }
    let (accepted, refused): (Vec<OtherUser>, Vec<OtherUser>) = reaching
        .into_iter()
        .partition(|user| vouched.trusted.contains(&user.name));
    for user in accepted {
        tracing::warn!(
            %server,
            user = %user.name,
            probe = %user.probe,
            open = user.open,
            "redis ACL user {user}: it could reach the reserved keyspace `{RESERVED_PREFIX}*`; \
             accepted because `redis.trusted_users` names it"
        );
    }
    if refused.is_empty() {
        Ok(Ok(()))
    } else {
        Ok(Err(ReachError::OtherUsers {
            server: server.to_owned(),
            users: refused,
        }))
    }
}

/// The users the daemon connects as: each lane's (`default` for a lane without one) and the lease
/// user; they are judged by the lane probes (the lease user not at all: it owns the keyspace).
fn daemon_user_names(clients: &LanesConfig) -> Vec<String> {
    let mut names: Vec<String> = Lane::ALL
        .into_iter()
        .map(|lane| lane_user(clients, lane))
        .collect();
    names.push(
        clients
            .leases
            .user
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
    );
    names
}

/// The replicas a master names in `ROLE` (`master`, offset, then `[ip, port, offset]` each).
pub(crate) async fn replicas(
    master: &mut impl Asker,
    server: &str,
) -> Result<Result<Vec<Endpoint>, ReachError>, Unanswered> {
    let role = master.ask(&["ROLE".into()]).await?;
    let cannot = |reason: String| ReachError::CannotCheck {
        server: server.to_owned(),
        reason,
    };
    let Frame::Array(items) = &role else {
        return Ok(Err(cannot(describe(&role))));
    };
    let Some(Frame::Array(replicas)) = items.get(2) else {
        // Not a master (a replica named by mistake): it lists no replicas of its own.
        return Ok(Ok(Vec::new()));
    };
    let mut found = Vec::new();
    for replica in replicas {
        let text = |at: usize| match replica {
            Frame::Array(fields) => fields
                .get(at)
                .and_then(Frame::as_bytes)
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        };
        let (Some(host), Some(port)) = (text(0), text(1)) else {
            return Ok(Err(cannot(format!("unreadable ROLE reply {role:?}"))));
        };
        match port.parse::<u16>() {
            Ok(port) if port != 0 => found.push(Endpoint::Tcp { host, port }),
            _ => {
                return Ok(Err(cannot(format!(
                    "its replica at {host} listens on no TCP port ({port}), so its users cannot \
                     be checked"
                ))))
            }
        }
    }
    Ok(Ok(found))
}

/// A connection to `replica` as the lease user (RESP2), or why there is none.
pub(crate) async fn open_replica(
    replica: &Endpoint,
    clients: &LanesConfig,
) -> Result<Replica, String> {
    let leases = clients.for_leases().settings(Lane::Admin);
    let credentials = crate::node::credentials(&leases).map_err(|error| error.to_string())?;
    let connect = async {
        let stream = Stream::connect(replica)
            .await
            .map_err(|error| error.to_string())?;
        let mut replica = Replica(stream, BytesMut::new());
        let mut hello = vec!["HELLO".to_owned(), "2".to_owned()];
        if let Some(credentials) = credentials {
            hello.extend(["AUTH".into(), credentials.user, credentials.password]);
        }
        match replica.ask(&hello).await {
            Ok(Frame::Error(reason)) => Err(String::from_utf8_lossy(&reason).into_owned()),
            Ok(_) => Ok(replica),
            Err(Unanswered(reason)) => Err(reason),
        }
    };
    match tokio::time::timeout(REPLICA_TIMEOUT, connect).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {REPLICA_TIMEOUT:?}")),
    }
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
pub(crate) enum DryRun {
    Allowed,
    /// Redis says why the user may not: the answer wanted when probing the reserved keyspace.
    Refused,
    /// Redis could not judge it (a command it does not know, a wrong argument count).
    Unknown(String),
}

/// `ACL DRYRUN <user> <argv…>` on `conn`: `Err` when the check itself failed (the outer `Err`:
/// Redis could not be reached at all, worth trying again).
pub(crate) async fn dryrun(
    conn: &mut impl Asker,
    user: &str,
    argv: &[String],
) -> Result<Result<DryRun, String>, Unanswered> {
    let mut line = vec!["ACL".to_owned(), "DRYRUN".to_owned(), user.to_owned()];
    line.extend(argv.iter().cloned());
    let frame = conn.ask(&line).await?;
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
    let unreachable = |reason: String| ReachError::CannotCheck {
        server: "the master".to_owned(),
        reason,
    };
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
