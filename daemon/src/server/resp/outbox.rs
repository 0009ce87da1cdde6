//! A session's replies on their way to its client: the bytes not yet written, when to write them,
//! and writes that never wait for the client. The session's loop writes what the socket takes
//! while it goes on reading, so a client still busy writing a long pipeline (which reads nothing
//! until it is done) is read all the same; only the output budget pauses reading, never a write.

use std::io;

use bytes::{Buf, BytesMut};
use tokio::net::unix::OwnedWriteHalf;
use tokio::time::error::Elapsed;

use super::budget;
use super::schedule::Schedule;

/// Write once this much is buffered, even with replies of the same run still to come.
pub const WRITE_AT: usize = 64 * 1024;

#[derive(Default)]
pub struct Outbox {
    bytes: BytesMut,
    /// Something was buffered that must not wait for the replies owed (a pushed message).
    urgent: bool,
    /// How many bytes at the start of `bytes` finish a frame already partly written (0: `bytes`
    /// starts where a frame starts), so that what is dropped unsent never cuts a frame in two.
    rest: usize,
}

impl Outbox {
    /// A reply, written with the rest of its run (see [`Outbox::wants_write`]).
    pub fn reply(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// A message pushed to the client (pub/sub, MONITOR, a lease watch): written at once.
    pub fn message(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
        self.urgent = true;
    }

    /// The buffer itself, to encode a message into (then [`Outbox::message`] with nothing).
    pub fn buffer(&mut self) -> &mut BytesMut {
        self.urgent = true;
        &mut self.bytes
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Drops what is buffered (a client disconnected over its budget is sent only why).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.urgent = false;
        self.rest = 0;
    }

    /// Drops what the client has not been sent, except the end of a frame it has already been
    /// sent part of: a message written after this (the reason for a disconnection) then starts
    /// where a frame starts, not inside another one's bytes.
    pub fn discard_unsent(&mut self) {
        self.bytes.truncate(self.rest);
        self.urgent = false;
    }

    /// Moves [`Outbox::rest`] past `written` bytes about to be dropped from the front. Only a
    /// write the socket took part of gets here (a full write clears), so the frames are measured
    /// only when the client is not keeping up, never on the path of a reply written whole.
    fn note_written(&mut self, written: usize) {
        if written <= self.rest {
            self.rest -= written;
            return;
        }
        let limits = tollgate_resp::Limits {
            max_frame_bytes: usize::MAX,
            max_elements: usize::MAX,
            ..tollgate_resp::Limits::default()
        };
        let mut at = self.rest;
        loop {
            match tollgate_resp::frame_len(&self.bytes[at..], &limits) {
                Ok(Some(len)) if at + len < written => at += len,
                Ok(Some(len)) => {
                    self.rest = at + len - written;
                    return;
                }
                // Not measurable (cannot happen for frames the daemon encoded): keep everything.
                _ => {
                    self.rest = self.bytes.len() - written;
                    return;
                }
            }
        }
    }

    /// Whether what is buffered is to be written now: every reply as soon as Redis gives it,
    /// except that the replies of one pipelined run on a multiplexed lane, which Redis answers
    /// together, are written together (up to [`WRITE_AT`]): a pipeline costs one write, not one
    /// per reply. A reply followed by a blocking command, or a command on another connection, is
    /// never held for it.
    pub fn wants_write(&self, schedule: &Schedule) -> bool {
        !self.bytes.is_empty()
            && (self.urgent || self.bytes.len() >= WRITE_AT || !schedule.continues_run())
    }

    /// Writes what the socket takes now, without waiting. `Ok` also when some is left (the socket
    /// is full: wait for [`OwnedWriteHalf::writable`] and call again).
    pub fn write_ready(&mut self, writer: &OwnedWriteHalf) -> io::Result<()> {
        while !self.bytes.is_empty() {
            match writer.try_write(&self.bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(written) if written == self.bytes.len() => self.clear(),
                Ok(written) => {
                    self.note_written(written);
                    self.bytes.advance(written);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        budget::trim(&mut self.bytes, 0);
        Ok(())
    }

    /// Writes everything, waiting for the client: only for last words, bounded by the caller.
    pub async fn write_all(&mut self, writer: &OwnedWriteHalf) -> io::Result<()> {
        loop {
            self.write_ready(writer)?;
            if self.bytes.is_empty() {
                return Ok(());
            }
            writer.writable().await?;
        }
    }

    /// [`Outbox::write_all`] for at most `limit`.
    pub async fn last_words(
        &mut self,
        writer: &OwnedWriteHalf,
        limit: std::time::Duration,
    ) -> Result<io::Result<()>, Elapsed> {
        tokio::time::timeout(limit, self.write_all(writer)).await
    }
}
