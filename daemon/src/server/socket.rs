//! Binding a listening Unix socket safely: a stale socket left by a dead daemon is replaced, a socket
//! a live daemon still answers on is refused, a link or any other file in its place is refused (never
//! followed or removed), and the new file gets the configured mode and group.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::runtime_dir::{self, EntryError, Kind};

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{path}: another daemon is listening on this socket; stop it or choose another path")]
    InUse { path: PathBuf },
    #[error("{path}: cannot bind: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: unknown group `{group}`")]
    UnknownGroup { path: PathBuf, group: String },
    #[error("cannot bind over what is there: {0}")]
    Existing(#[from] EntryError),
}

/// The file of a bound listening socket; dropping it removes the file.
#[derive(Debug)]
pub struct SocketFile {
    pub path: PathBuf,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `path`, replacing a stale socket file but never one a live process answers on.
pub fn bind(
    path: &Path,
    mode: u32,
    group: Option<&str>,
) -> Result<(UnixListener, SocketFile), BindError> {
    let io_error = |source| BindError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io_error)?;
    }
    if runtime_dir::inspect(path, Kind::Socket)?.is_some() {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(BindError::InUse {
                    path: path.to_owned(),
                })
            }
            // Nobody answers: the file outlived its daemon.
            Err(_) => std::fs::remove_file(path).map_err(io_error)?,
        }
    }
    let listener = UnixListener::bind(path).map_err(io_error)?;
    let file = SocketFile {
        path: path.to_owned(),
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_error)?;
    if let Some(group) = group {
        let gid = nix::unistd::Group::from_name(group)
            .ok()
            .flatten()
            .ok_or_else(|| BindError::UnknownGroup {
                path: path.to_owned(),
                group: group.to_owned(),
            })?
            .gid;
        nix::unistd::chown(path, None, Some(gid))
            .map_err(|errno| io_error(io::Error::from(errno)))?;
    }
    Ok((listener, file))
}

/// The next client on `listener`, or `None` once `stop` is cancelled. A failed accept (out of file
/// descriptors, say) is logged and retried after a short pause instead of spinning.
pub async fn accept_until(
    listener: &UnixListener,
    stop: &tokio_util::sync::CancellationToken,
    what: &'static str,
) -> Option<tokio::net::UnixStream> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => return Some(stream),
                Err(error) => {
                    tracing::warn!(%error, listener = what, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            },
        }
    }
}
