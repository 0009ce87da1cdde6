//! What a watchdog is bound to: the holder process, through a pidfd, which polls readable once the
//! process exits. A pidfd cannot be fooled by pid reuse: it names the process it was opened on.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

pub struct Holder {
    pid: u32,
    fd: AsyncFd<OwnedFd>,
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
        Ok(Holder { pid, fd })
    }

    /// Resolves once the holder process has exited.
    pub async fn gone(&self) {
        let _ = self.fd.readable().await;
    }

    pub fn pid(&self) -> u32 {
        self.pid
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
}
