//! Binding a listening Unix socket safely: a stale socket left by a dead daemon is replaced, a socket
//! a live daemon still answers on is refused, a link or any other file in its place is refused (never
//! followed or removed), and the new file gets the configured mode and group. Accepting on it
//! survives a full descriptor table ([`Acceptor`]).

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use std::time::Duration;

use futures::FutureExt;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::runtime_dir::{self, EntryError, Kind};
use crate::server::occasional::Occasional;

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

/// The file of a listening socket; dropping it removes the file if the daemon bound it.
#[derive(Debug)]
pub struct SocketFile {
    pub path: PathBuf,
    /// Bound by the daemon (and so removed by it), not passed by systemd, whose file it is.
    pub owned: bool,
}

impl SocketFile {
    /// A listener systemd bound and passed (socket activation): served on, never removed.
    pub fn inherited(
        listener: std::os::unix::net::UnixListener,
    ) -> io::Result<(UnixListener, SocketFile)> {
        let path = listener
            .local_addr()?
            .as_pathname()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("(unnamed socket from systemd)"));
        let listener = UnixListener::from_std(listener)?;
        Ok((listener, SocketFile { path, owned: false }))
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
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
        owned: true,
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

/// How long accepting pauses after a failure, so that a full descriptor table is not spun on.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
/// At most one "accept failed" warning per listener in this interval.
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Accepts clients on one listener and rides out a full descriptor table (`EMFILE`, `ENFILE`): it
/// keeps one descriptor in reserve (`/dev/null`), and when accepting fails for want of one, gives
/// up the reserve to accept the waiting client and close it at once — the client sees its
/// connection end instead of hanging in the backlog — then takes the reserve back.
pub struct Acceptor {
    listener: UnixListener,
    what: &'static str,
    reserve: Option<std::fs::File>,
    failures: Occasional,
}

impl Acceptor {
    pub fn new(listener: UnixListener, what: &'static str) -> Self {
        Acceptor {
            listener,
            what,
            reserve: open_reserve(),
            failures: Occasional::new(ACCEPT_LOG_INTERVAL),
        }
    }

    /// The next client, or `None` once `stop` is cancelled.
    pub async fn accept_until(&mut self, stop: &CancellationToken) -> Option<UnixStream> {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return None,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => return Some(stream),
                    Err(error) => self.failed(error).await,
                },
            }
        }
    }

    async fn failed(&mut self, error: io::Error) {
        let out_of_descriptors = matches!(
            error.raw_os_error(),
            Some(libc::EMFILE) | Some(libc::ENFILE)
        );
        let shed = if out_of_descriptors {
            self.shed_one()
        } else {
            Shed::Nothing
        };
        if let Some(failures) = self.failures.occurred() {
            tracing::warn!(
                %error,
                listener = self.what,
                failures,
                ?shed,
                "accept failed (logged once per {ACCEPT_LOG_INTERVAL:?})"
            );
        }
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    }

    /// Spends the reserve descriptor on the client waiting first, closing it unserved.
    fn shed_one(&mut self) -> Shed {
        if self.reserve.take().is_none() {
            self.reserve = open_reserve();
            return Shed::NoReserve;
        }
        // The failed accept left the listener readable, so one poll finds the waiting client.
        let shed = match self.listener.accept().now_or_never() {
            Some(Ok((stream, _))) => {
                drop(stream);
                Shed::Closed
            }
            _ => Shed::Nothing,
        };
        self.reserve = open_reserve();
        shed
    }
}

/// What a full descriptor table cost a waiting client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shed {
    /// Not a shortage of descriptors, or no client was waiting.
    Nothing,
    /// A waiting client was accepted and closed at once.
    Closed,
    /// The reserve descriptor could not be had back since the last shortage.
    NoReserve,
}

fn open_reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}
