//! Inside MULTI, commands the daemon answers itself (PING, ECHO, CLIENT SETNAME, SELECT 0 …) are
//! queued as Redis queues them: they answer `+QUEUED`, and their replies take their places in
//! EXEC's array, between the replies Redis gives for the commands it queued.

use bytes::{BufMut, Bytes, BytesMut};
use tollgate_resp::Limits;

/// The replies a transaction owes for its locally answered commands, by position in the queue.
#[derive(Debug, Default)]
pub struct QueuedLocally {
    /// Commands queued so far, by Redis and here.
    queued: usize,
    /// `(position in EXEC's array, reply)`, in queue order.
    replies: Vec<(usize, Bytes)>,
}

impl QueuedLocally {
    /// Redis answered `+QUEUED` to a forwarded command.
    pub fn queued_by_redis(&mut self) {
        self.queued += 1;
    }

    /// How many commands are queued.
    pub fn count(&self) -> usize {
        self.queued
    }

    /// A command answered here was queued; `reply` is its place in EXEC's array.
    pub fn queue(&mut self, reply: Bytes) {
        self.replies.push((self.queued, reply));
        self.queued += 1;
    }

    /// EXEC's reply as the client must read it: Redis's array with the local replies put back in
    /// their places. A reply that is not an array of Redis's queued commands (a null array because
    /// a WATCHed key changed, EXECABORT, or an array shorter than what Redis queued) is returned
    /// as it is: no command ran, so none of the local ones did either.
    pub fn splice(self, exec_reply: Bytes) -> Bytes {
        if self.replies.is_empty() {
            return exec_reply;
        }
        let Some(elements) = array_elements(&exec_reply) else {
            return exec_reply;
        };
        if elements.len() + self.replies.len() != self.queued {
            return exec_reply;
        }
        let mut out = BytesMut::with_capacity(exec_reply.len() + 64);
        out.put_u8(b'*');
        out.put_slice(self.queued.to_string().as_bytes());
        out.put_slice(b"\r\n");
        let mut local = self.replies.into_iter().peekable();
        let mut remote = elements.into_iter();
        for position in 0..self.queued {
            match local.next_if(|(at, _)| *at == position) {
                Some((_, reply)) => out.put_slice(&reply),
                None => {
                    if let Some(range) = remote.next() {
                        out.put_slice(&exec_reply[range]);
                    }
                }
            }
        }
        out.freeze()
    }
}

/// The byte ranges of the elements of a top-level array reply, or `None` if `reply` is not one.
fn array_elements(reply: &[u8]) -> Option<Vec<std::ops::Range<usize>>> {
    let rest = reply.strip_prefix(b"*")?;
    let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
    let count: usize = std::str::from_utf8(&rest[..line_end]).ok()?.parse().ok()?;
    let limits = Limits {
        max_frame_bytes: reply.len(),
        max_elements: usize::MAX,
        ..Limits::default()
    };
    let mut start = 1 + line_end + 2;
    let mut elements = Vec::with_capacity(count);
    for _ in 0..count {
        let len = tollgate_resp::frame_len(&reply[start..], &limits).ok()??;
        elements.push(start..start + len);
        start += len;
    }
    (start == reply.len()).then_some(elements)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spliced(queue: &[&str], exec_reply: &str) -> String {
        let mut queued = QueuedLocally::default();
        for entry in queue {
            match entry.strip_prefix("local:") {
                Some(reply) => queued.queue(Bytes::from(reply.to_owned())),
                None => queued.queued_by_redis(),
            }
        }
        let out = queued.splice(Bytes::from(exec_reply.to_owned()));
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn local_replies_take_their_places_between_redis_replies() {
        assert_eq!(
            spliced(
                &["local:+PONG\r\n", "redis", "local:$2\r\nhi\r\n", "redis"],
                "*2\r\n+OK\r\n*2\r\n:1\r\n$1\r\nv\r\n"
            ),
            "*4\r\n+PONG\r\n+OK\r\n$2\r\nhi\r\n*2\r\n:1\r\n$1\r\nv\r\n"
        );
    }

    #[test]
    fn a_transaction_of_local_commands_only_answers_them_all() {
        assert_eq!(
            spliced(&["local:+PONG\r\n", "local:+OK\r\n"], "*0\r\n"),
            "*2\r\n+PONG\r\n+OK\r\n"
        );
    }

    #[test]
    fn an_exec_that_ran_nothing_is_passed_through() {
        assert_eq!(spliced(&["local:+PONG\r\n", "redis"], "*-1\r\n"), "*-1\r\n");
        assert_eq!(spliced(&["local:+PONG\r\n"], "_\r\n"), "_\r\n");
        let abort = "-EXECABORT Transaction discarded because of previous errors.\r\n";
        assert_eq!(spliced(&["local:+PONG\r\n", "redis"], abort), abort);
    }

    #[test]
    fn a_reply_that_does_not_match_the_queue_is_passed_through_unchanged() {
        assert_eq!(
            spliced(&["local:+PONG\r\n", "redis"], "*2\r\n+OK\r\n+OK\r\n"),
            "*2\r\n+OK\r\n+OK\r\n"
        );
        assert_eq!(
            spliced(&["local:+PONG\r\n", "redis"], "*1\r\n$5\r\nab"),
            "*1\r\n$5\r\nab"
        );
    }
}
