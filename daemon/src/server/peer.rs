//! Who is on the other end of a Unix socket: the kernel's `SO_PEERCRED` (uid, gid, pid), read once
//! per connection. No password travels on the local socket; identity is the process itself (its
//! principal is derived in [`super::identity`]).

use std::io;

use tokio::net::UnixStream;

/// The credentials the kernel recorded when the peer connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// Reads `SO_PEERCRED` of a connected Unix stream.
pub fn peer_credentials(stream: &UnixStream) -> io::Result<PeerCredentials> {
    let credentials = stream.peer_cred()?;
    Ok(PeerCredentials {
        uid: credentials.uid(),
        gid: credentials.gid(),
        // Linux always reports the pid; a missing one would be a kernel without SO_PEERCRED pids.
        pid: credentials
            .pid()
            .and_then(|pid| u32::try_from(pid).ok())
            .unwrap_or(0),
    })
}
