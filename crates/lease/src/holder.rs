//! What a watchdog is bound to: the holder process, through a pidfd, which polls readable once the
//! process exits (a pidfd cannot be fooled by pid reuse: it names the process it was opened on); or
//! one client connection, through a token its session cancels when the connection ends (the
//! etcd/Consul session model, for pooled and long-lived clients whose process outlives the lease).

use std::fmt;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio_util::sync::CancellationToken;

pub struct Holder {
    kind: Kind,
}

enum Kind {
    Process { pid: u32, fd: AsyncFd<OwnedFd> },
    Connection { id: u64, closed: CancellationToken },
}

impl Holder {
    /// Binds to process `pid` through a pidfd; fails if it is already gone.
    pub fn process(pid: u32) -> io::Result<Holder> {
        let pid_arg = libc::pid_t::try_from(pid)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid_arg, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        let raw = i32::try_from(raw).expect("file descriptors fit in an i32");
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the AsyncFd takes ownership of `fd`, so the descriptor stays open for exactly as
        // long as it is registered.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|error| io::Error::other(error.to_string()))?;
        Ok(Holder {
            kind: Kind::Process { pid, fd },
        })
    }

    /// Binds to client connection `id`, gone once `closed` is cancelled.
    pub fn connection(id: u64, closed: CancellationToken) -> Holder {
        Holder {
            kind: Kind::Connection { id, closed },
        }
    }

    /// Resolves once the holder process has exited or its connection has closed.
    pub async fn gone(&self) {
        match &self.kind {
            Kind::Process { fd, .. } => {
                let _ = fd.readable().await;
            }
            Kind::Connection { closed, .. } => closed.cancelled().await,
        }
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Process { pid, .. } => write!(f, "process {pid}"),
            Kind::Connection { id, .. } => write!(f, "RESP connection {id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_pidfd_tells_when_the_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let holder = Holder::process(child.id()).unwrap();
        let early = tokio::time::timeout(Duration::from_millis(50), holder.gone()).await;
        assert!(early.is_err(), "a live process is not gone");
        child.kill().unwrap();
        tokio::time::timeout(Duration::from_secs(5), holder.gone())
            .await
            .expect("gone after kill");
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn a_connection_is_gone_once_its_session_cancels() {
        let closed = CancellationToken::new();
        let holder = Holder::connection(7, closed.clone());
        let early = tokio::time::timeout(Duration::from_millis(20), holder.gone()).await;
        assert!(early.is_err(), "an open connection is not gone");
        closed.cancel();
        tokio::time::timeout(Duration::from_secs(5), holder.gone())
            .await
            .expect("gone after the session ends");
        assert_eq!(holder.to_string(), "RESP connection 7");
    }
}
