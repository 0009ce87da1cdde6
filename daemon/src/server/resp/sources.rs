//! What a session waits on between two turns of its loop (`session.rs`), polled by hand.
//!
//! A session waits on up to thirteen sources: its ends (eviction, kill, budget breach, stop), the
//! next reply owed, `CLIENT UNBLOCK`, its socket's write room and input, a paused client's hang-up,
//! pushed messages, lease watches, `MONITOR` lines and room in the budget pool. `tokio::select!`
//! built every branch's future on each wait, the disabled ones too, and moved them all into one
//! state: about 2,300 instructions per request of an unpipelined client, a fifth of the daemon's
//! whole cost. Here the hot sources (the ends, replies, the socket) are polled directly, and the
//! rare ones are made only when live (`Option` slots, `None` costing nothing). The order is the
//! session's biased one: the ends first, so that a busy session is still ended at once.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use tollgate_lanes::Quiet;
use tollgate_resp::Frame;

use super::budget::{Breach, ClientBudget};
use super::clients::UnblockMode;
use tollgate_lanes::{Held, Message};

/// The source that ended a wait, with what it brought.
pub enum Woke {
    End(End),
    Reply(Bytes),
    Unblocked(UnblockMode),
    Writable(io::Result<()>),
    Read(io::Result<usize>),
    HungUp,
    Message(Message, Option<Held>),
    Watched(Frame),
    Monitored(Bytes),
    PoolRoom,
    /// Invalidations were posted to the session's mailbox (`CLIENT TRACKING`).
    Tracked,
}

/// What ends a session from outside, in the order it is checked.
pub enum End {
    Evicted,
    Killed,
    Breached(Breach),
    Stopped,
}

/// The session's ends as one [`Quiet`] future: a poll costs one check however many ends there
/// are (four `Quiet`s were 600 instructions per request), and the ends themselves are polled only
/// after one of them woke the task. `stop` is `None` once the daemon's stop was seen: the session
/// then finishes what it read, and only the other ends remain.
pub fn ends(
    eviction: CancellationToken,
    killed: CancellationToken,
    budget: Arc<ClientBudget>,
    stop: Option<CancellationToken>,
) -> Quiet<impl Future<Output = End>> {
    Quiet::new(async move {
        let stopped = async {
            match &stop {
                Some(stop) => stop.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = eviction.cancelled() => End::Evicted,
            () = killed.cancelled() => End::Killed,
            breach = budget.breached() => End::Breached(breach),
            () = stopped => End::Stopped,
        }
    })
}

/// Polls the future in `slot`, if there is one; once it is ready the slot is emptied, so that a
/// source that answered (or said it has nothing more, as `select!` disables a branch whose
/// pattern does not match) is not polled again in the same wait.
#[inline]
pub fn poll_slot<F: Future>(
    mut slot: Pin<&mut Option<F>>,
    cx: &mut Context<'_>,
) -> Poll<F::Output> {
    let Some(future) = slot.as_mut().as_pin_mut() else {
        return Poll::Pending;
    };
    let output = std::task::ready!(future.poll(cx));
    slot.set(None);
    Poll::Ready(output)
}

/// Reads at most `room` bytes into `input` (all that is ready when `room` is larger than the
/// space `input` has, as a plain read does), without a future. Through `AsyncRead`, not
/// `try_read_buf`: a read that fills less than it was offered drains the socket, and `AsyncRead`
/// then clears the readiness, where `try_read_buf` would leave it set and the next read would be
/// a syscall that says `EAGAIN` (one per unpipelined request).
pub fn poll_read(
    reader: &mut OwnedReadHalf,
    input: &mut BytesMut,
    room: usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    let reader = Pin::new(reader);
    if input.capacity() - input.len() <= room {
        tokio_util::io::poll_read_buf(reader, cx, input)
    } else {
        tokio_util::io::poll_read_buf(reader, cx, &mut input.limit(room))
    }
}

/// Resolves when the socket may take more of what the session owes its client.
pub fn poll_writable(writer: &OwnedWriteHalf, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    let stream: &UnixStream = writer.as_ref();
    stream.poll_write_ready(cx)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::future::poll_fn;
    use std::pin::pin;

    #[tokio::test]
    async fn a_slot_answers_once_then_stays_pending() {
        let mut slot = pin!(Some(async { 7 }));
        assert_eq!(poll_fn(|cx| poll_slot(slot.as_mut(), cx)).await, 7);
        assert!(slot.is_none(), "emptied once ready");
        let again = poll_fn(|cx| Poll::Ready(poll_slot(slot.as_mut(), cx))).await;
        assert!(again.is_pending(), "an empty slot is never ready");
    }

    #[tokio::test]
    async fn a_read_takes_at_most_its_room_and_sees_the_end() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (mut reader, _writer) = ours.into_split();
        theirs.try_write(b"0123456789").unwrap();
        let mut input = BytesMut::with_capacity(64);
        let read = poll_fn(|cx| poll_read(&mut reader, &mut input, 4, cx)).await;
        assert_eq!(read.unwrap(), 4);
        assert_eq!(&input[..], b"0123");
        let read = poll_fn(|cx| poll_read(&mut reader, &mut input, 64, cx)).await;
        assert_eq!(read.unwrap(), 6, "the rest, however much room there is");
        drop(theirs);
        let read = poll_fn(|cx| poll_read(&mut reader, &mut input, 64, cx)).await;
        assert_eq!(read.unwrap(), 0, "the peer's close reads as the end");
    }

    #[tokio::test]
    async fn a_read_waits_for_input_rather_than_returning_nothing() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (mut reader, _writer) = ours.into_split();
        let mut input = BytesMut::with_capacity(64);
        let first = poll_fn(|cx| Poll::Ready(poll_read(&mut reader, &mut input, 64, cx))).await;
        assert!(first.is_pending(), "nothing sent yet");
        theirs.try_write(b"x").unwrap();
        let read = poll_fn(|cx| poll_read(&mut reader, &mut input, 64, cx)).await;
        assert_eq!(read.unwrap(), 1);
    }
}
