//! Least-privilege ACL users for the lanes of an embedded Redis, which the daemon owns and therefore
//! configures itself: one user per lane with a random password, kept in a 0600 file in the runtime
//! directory and handed to the lanes through the usual `user` / `password_file` settings.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use bytes::BytesMut;
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_model::Lane;
use tollgate_resp::Frame;

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

/// What each lane's user may do, as `ACL SETUSER` rules applied after `reset` (no keys, commands or
/// channels). Operators of an external Redis can give their lane users the same.
pub fn acl_rules(lane: Lane) -> &'static [&'static str] {
    match lane {
        // Application traffic: data commands, never scripts, admin or dangerous commands.
        Lane::Regular | Lane::Blocking | Lane::Transaction => {
            &["~*", "&*", "+@all", "-@scripting", "-@admin", "-@dangerous"]
        }
        // Scripts call data commands on the script user's authority.
        Lane::Script => &["~*", "&*", "+@all", "-@admin", "-@dangerous"],
        Lane::Pubsub => &["&*", "+@pubsub", "+hello", "+ping"],
        // Read-only diagnostics; no keys at all.
        Lane::Admin => &[
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
    }
}

/// Creates (or resets) one ACL user per lane on the server at `endpoint`, writes each password to
/// `<dir>/lane-<lane>.password` (0600), and returns `base` pointing every lane at its user.
pub async fn provision(
    endpoint: &Endpoint,
    dir: &Path,
    base: &LanesConfig,
) -> Result<Provisioned, AclError> {
    let unreachable = |reason: String| AclError::Redis {
        endpoint: endpoint.clone(),
        reason,
    };
    let mut stream = Stream::connect(endpoint)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let mut config = base.clone();
    for lane in Lane::ALL {
        let user = user_name(lane);
        let password = random_password();
        let secret = format!(">{password}");
        let mut argv = vec![
            "ACL",
            "SETUSER",
            user.as_str(),
            "reset",
            "on",
            secret.as_str(),
        ];
        argv.extend_from_slice(acl_rules(lane));
        let reply = call(&mut stream, &argv).await.map_err(unreachable)?;
        if let Frame::Error(reason) = reply {
            return Err(AclError::Refused {
                user,
                reason: String::from_utf8_lossy(&reason).into_owned(),
            });
        }
        let path = dir.join(format!("lane-{}.password", lane.as_str()));
        write_secret(&path, &password).map_err(|source| AclError::PasswordFile {
            path: path.clone(),
            source,
        })?;
        let overrides = config.overrides_mut(lane);
        overrides.user = Some(user);
        overrides.password_file = Some(path);
    }
    Ok(Provisioned { config })
}

fn random_password() -> String {
    let bytes: [u8; 24] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a fresh 0600 file. Unlinking first and creating exclusively, without following a link,
/// means a link or a file someone else made at `path` is never written through: creation fails.
fn write_secret(path: &Path, secret: &str) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
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
