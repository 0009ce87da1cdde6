//! Least-privilege ACL users: what each lane's user and the lease service's user may do, and, for an
//! embedded Redis (which the daemon owns and therefore configures itself), creating them: one user
//! per lane plus the lease user, each with a random password kept in a 0600 file in the runtime
//! directory and handed to the lanes through the usual `user` / `password_file` settings.
//!
//! Client lanes' users reach every key and channel except the reserved keyspace
//! ([`complement_patterns`]); only the lease user reaches it.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use bytes::BytesMut;
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_model::Lane;
use tollgate_resp::Frame;

use tollgate_model::reserved::RESERVED_PREFIX;

use crate::reply::reply_limits;
use crate::stream::Stream;
use crate::{Endpoint, LanesConfig};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AclError {
    #[error("cannot reach redis at {endpoint} to create lane users: {reason}")]
    Redis { endpoint: Endpoint, reason: String },
    #[error("redis refused `ACL SETUSER {user}`: {reason}")]
    Refused { user: String, reason: String },
    #[error("cannot write lane password file {path}: {source}")]
    PasswordFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The lanes config with every lane's user and password file filled in.
#[derive(Debug, Clone)]
pub struct Provisioned {
    pub config: LanesConfig,
}

/// The ACL user name of a lane's connections.
pub fn user_name(lane: Lane) -> String {
    format!("tollgate-{}", lane.as_str())
}

/// The ACL user of the lease service's own connections: the only user that may reach the reserved
/// keyspace.
pub const LEASE_USER: &str = "tollgate-leases";

/// Commands no client lane may run whatever the policy says: they ignore key patterns and would
/// wipe, swap or open the lease service's database.
const RESERVED_GUARD: [&str; 3] = ["-flushall", "-swapdb", "-select"];

/// What each lane's user may do, as `ACL SETUSER` rules applied after `reset` (no keys, commands or
/// channels). Operators of an external Redis give their lane users the same (`docs/lanes.md`).
pub fn acl_rules(lane: Lane) -> Vec<String> {
    let (outside_reserved, commands): (bool, &[&str]) = match lane {
        // Application traffic: data commands outside the reserved keyspace, never scripts, admin
        // or dangerous commands.
        Lane::Regular | Lane::Blocking | Lane::Transaction => {
            (true, &["+@all", "-@scripting", "-@admin", "-@dangerous"])
        }
        // Scripts call data commands on the script user's authority, so its key patterns are what
        // keeps a script's `redis.call` out of the reserved keyspace.
        Lane::Script => (true, &["+@all", "-@admin", "-@dangerous"]),
        // Subscribing only. Redis matches a PSUBSCRIBE pattern literally against a user's channel
        // patterns, so this user keeps every channel; it cannot publish, and the lease service's
        // release notifications go by SPUBLISH, which no client subscription of another name hears.
        Lane::Pubsub => (
            false,
            &[
                "&*",
                "+subscribe",
                "+psubscribe",
                "+ssubscribe",
                "+unsubscribe",
                "+punsubscribe",
                "+sunsubscribe",
                "+ping",
                "+hello",
            ],
        ),
        // Read-only diagnostics; no keys at all.
        Lane::Admin => (
            false,
            &[
                "+info",
                "+ping",
                "+hello",
                "+client|list",
                "+client|info",
                "+slowlog|get",
                "+slowlog|len",
                "+latency|latest",
                "+latency|history",
                "+latency|doctor",
                "+memory|stats",
                "+memory|doctor",
                "+dbsize",
                "+command|docs",
                "+command|info",
                "+command|count",
                "+command|list",
                "+time",
                "+role",
                "+lastsave",
            ],
        ),
    };
    let mut rules = Vec::new();
    if outside_reserved {
        let patterns = complement_patterns(RESERVED_PREFIX);
        rules.extend(patterns.iter().map(|pattern| format!("~{pattern}")));
        rules.extend(patterns.iter().map(|pattern| format!("&{pattern}")));
    }
    rules.extend(commands.iter().map(|rule| (*rule).to_owned()));
    if outside_reserved {
        rules.extend(RESERVED_GUARD.iter().map(|rule| (*rule).to_owned()));
    }
    rules
}

/// The lease service's user: the reserved keyspace only, the commands its scripts and waits need,
/// and `ACL DRYRUN`, with which the daemon checks that no client lane user can reach that keyspace.
pub fn lease_acl_rules() -> Vec<String> {
    let prefix = escape_glob(RESERVED_PREFIX);
    [
        format!("~{prefix}*"),
        format!("&{prefix}*"),
        "+@all".into(),
        "-@admin".into(),
        "-@dangerous".into(),
        "+acl|dryrun".into(),
    ]
    .into()
}

/// Redis glob patterns that together match every name that does not start with `prefix`, and no
/// name that does: for each proper prefix `p` of `prefix` followed by the byte `c`, the names
/// `p[^c]*` (they leave the prefix at `c`) and `p` itself (they end inside it).
pub fn complement_patterns(prefix: &str) -> Vec<String> {
    let mut patterns = Vec::with_capacity(2 * prefix.len());
    for (at, next) in prefix.char_indices() {
        let head = escape_glob(&prefix[..at]);
        patterns.push(format!(
            "{head}[^{}]*",
            escape_glob(next.encode_utf8(&mut [0; 4]))
        ));
        // The empty key is left out: `ACL SETUSER` has no way to write an empty pattern.
        if at > 0 {
            patterns.push(head);
        }
    }
    patterns
}

/// `text` with Redis glob's special characters escaped, so that it matches only itself.
fn escape_glob(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Creates (or resets) one ACL user per lane and the lease service's user on every server in
/// `endpoints` (the same users and passwords on each, since Redis does not replicate ACLs: a
/// replica promoted by a failover must know them too), writes each password to
/// `<dir>/lane-<lane>.password` or `<dir>/leases.password` (0600), and returns `base` pointing every
/// lane and the lease connections at their users.
pub async fn provision(
    endpoints: &[Endpoint],
    dir: &Path,
    base: &LanesConfig,
) -> Result<Provisioned, AclError> {
    let mut config = base.clone();
    let mut users = Vec::new();
    for lane in Lane::ALL {
        let path = dir.join(format!("lane-{}.password", lane.as_str()));
        let overrides = config.overrides_mut(lane);
        overrides.user = Some(user_name(lane));
        overrides.password_file = Some(path.clone());
        users.push((user_name(lane), acl_rules(lane), path));
    }
    let path = dir.join("leases.password");
    config.leases.user = Some(LEASE_USER.to_owned());
    config.leases.password_file = Some(path.clone());
    users.push((LEASE_USER.to_owned(), lease_acl_rules(), path));

    let users: Vec<(String, Vec<String>, PathBuf, String)> = users
        .into_iter()
        .map(|(user, rules, path)| (user, rules, path, random_password()))
        .collect();
    for endpoint in endpoints {
        set_users(endpoint, &users).await?;
    }
    for (_, _, path, password) in &users {
        write_secret(path, password).map_err(|source| AclError::PasswordFile {
            path: path.clone(),
            source,
        })?;
    }
    Ok(Provisioned { config })
}

/// `ACL SETUSER <user> reset on ><password> <rules…>` for each user, on one server.
async fn set_users(
    endpoint: &Endpoint,
    users: &[(String, Vec<String>, PathBuf, String)],
) -> Result<(), AclError> {
    let unreachable = |reason: String| AclError::Redis {
        endpoint: endpoint.clone(),
        reason,
    };
    let mut stream = Stream::connect(endpoint)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    for (user, rules, _, password) in users {
        let secret = format!(">{password}");
        let mut argv = vec!["ACL", "SETUSER", user.as_str(), "reset", "on", &secret];
        argv.extend(rules.iter().map(String::as_str));
        let reply = call(&mut stream, &argv).await.map_err(unreachable)?;
        if let Frame::Error(reason) = reply {
            return Err(AclError::Refused {
                user: user.clone(),
                reason: String::from_utf8_lossy(&reason).into_owned(),
            });
        }
    }
    Ok(())
}

fn random_password() -> String {
    let bytes: [u8; 24] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_secret(path: &Path, secret: &str) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{secret}")
}

async fn call(stream: &mut Stream, argv: &[&str]) -> Result<Frame, String> {
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(argv, &mut out);
    stream.write_all(&out).await.map_err(|e| e.to_string())?;
    let mut read = BytesMut::new();
    loop {
        if let Some(frame) =
            tollgate_resp::parse(&mut read, &reply_limits()).map_err(|e| e.to_string())?
        {
            return Ok(frame);
        }
        if stream
            .read_buf(&mut read)
            .await
            .map_err(|e| e.to_string())?
            == 0
        {
            return Err("connection closed".into());
        }
    }
}
