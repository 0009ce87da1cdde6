//! A command Redis refused `BUSY` while the daemon was stopping a script past its time limit, sent
//! again once the script has stopped. Redis answers `BUSY` to every command it reads while a
//! script runs past its `busy-reply-threshold`, the moment the daemon's kill is read among them;
//! such a command did not run, and the caller should not see a script the daemon stopped.
//!
//! Sent again only when it keeps the caller's order: when the caller has sent nothing on the
//! channel since (a later command may have run already), and only after a stop the script watch
//! made (a `BUSY` of a script nobody stops, one that cannot be stopped or another client's, is
//! Redis's answer and the caller's to see).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::error::CallError;
use crate::multiplex::{NodeChannel, NodeSend};
use crate::overrun;
use crate::reply::Reply;

/// How many times one command is sent again: a second script stopped right after the first.
const TIMES: usize = 2;

/// What sending a command again needs.
pub(crate) struct Again {
    pub(crate) channel: NodeChannel,
    pub(crate) command: Bytes,
    pub(crate) deadline: Option<Duration>,
    /// The command's number among the channel's sends, and the channel's count of sends.
    pub(crate) sequence: u64,
    pub(crate) sent: Arc<AtomicU64>,
}

impl Again {
    /// Whether the caller has sent nothing on the channel since this command.
    fn still_last(&self) -> bool {
        self.sent.load(Ordering::Relaxed) == self.sequence
    }
}

/// `first`'s outcome, or, when it was refused `BUSY` while a script was being stopped, that of the
/// command sent again.
pub(crate) async fn after_stop(first: NodeSend, again: Again) -> Result<Reply, CallError> {
    let mut outcome = first.await;
    for _ in 0..TIMES {
        let busy = matches!(&outcome, Ok(reply) if overrun::is_busy_reply(reply.bytes()));
        if !busy || !again.still_last() {
            return outcome;
        }
        let Some(watch) = again.channel.script_watch() else {
            return outcome;
        };
        // Checked again after the wait: the caller may have sent more meanwhile.
        if !watch.after_stop().await || !again.still_last() {
            return outcome;
        }
        tracing::debug!("sending again a command redis refused BUSY while a script was stopped");
        outcome = again
            .channel
            .send_within(again.command.clone(), again.deadline)
            .await;
    }
    outcome
}
