//! Noticing a client that has gone while its session reads nothing from it: paused at its output
//! budget, or waiting for room under `resp.budgets.total`. A session that does not read never sees
//! the end of its input, so without this a hung-up client's held bytes stayed counted against every
//! other client's total until a soft limit's `soft_for` ran out (or forever, with none set).
//!
//! While paused the session asks the kernel every [`CHECK_EVERY`] whether the peer is gone: a Unix
//! stream whose peer closed reports `POLLHUP`. A peer that only shut down its writing half is still
//! there to read replies, so it is kept, as it is while reading. The commands it sent and the daemon
//! had not read yet are not run: nobody is left to read their replies. (Redis, which always reads,
//! would run them; a client paused here holds as much as the budgets allow, and its socket may hold
//! more.)

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use tokio::net::unix::OwnedReadHalf;
use tokio::time::{Interval, MissedTickBehavior};

/// How often a paused session looks for its client's hang-up.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// A paused session's look-out on its client's socket. It keeps the descriptor, not a borrow of
/// the reader (which the session's reads borrow mutably in the same wait, `sources.rs`): the
/// session owns the reader for as long as it holds this.
pub struct HangUp {
    fd: RawFd,
    /// Made the first time the session pauses (most never do).
    every: Option<Interval>,
}

impl HangUp {
    pub fn new(reader: &OwnedReadHalf) -> Self {
        let stream: &tokio::net::UnixStream = reader.as_ref();
        HangUp {
            fd: stream.as_raw_fd(),
            every: None,
        }
    }

    /// Resolves once the client is gone. Cancel-safe: a session polls it only while it reads
    /// nothing, from a wait that turns per reply.
    pub async fn gone(&mut self) {
        let every = self.every.get_or_insert_with(|| {
            let mut every = tokio::time::interval(CHECK_EVERY);
            every.set_missed_tick_behavior(MissedTickBehavior::Delay);
            every
        });
        loop {
            every.tick().await;
            if peer_gone(self.fd) {
                return;
            }
        }
    }
}

/// Whether the stream's peer has closed it (`POLLHUP`), not merely shut down its writing half.
fn peer_gone(fd: RawFd) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd; its descriptor is the session's open socket (see `HangUp`), and a
    // zero timeout never blocks.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready == 1 && poll.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::UnixStream;

    #[tokio::test]
    async fn a_closed_peer_is_gone_and_an_open_or_half_closed_one_is_not() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (reader, _writer) = ours.into_split();
        let fd = HangUp::new(&reader).fd;
        assert!(!peer_gone(fd));
        // Unread input does not hide a hang-up, nor count as one.
        theirs.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
        assert!(!peer_gone(fd));
        // Shut for writing: still there to read the replies.
        theirs.shutdown().await.unwrap();
        assert!(!peer_gone(fd));
        drop(theirs);
        assert!(peer_gone(fd));
    }

    #[tokio::test]
    async fn a_paused_session_is_told_within_one_check() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (reader, _writer) = ours.into_split();
        let mut hang_up = HangUp::new(&reader);
        let open = tokio::time::timeout(3 * CHECK_EVERY, hang_up.gone()).await;
        assert!(open.is_err(), "an open client is not gone");
        drop(theirs);
        tokio::time::timeout(2 * CHECK_EVERY, hang_up.gone())
            .await
            .expect("told within one check");
    }
}
