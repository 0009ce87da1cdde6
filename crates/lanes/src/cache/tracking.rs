//! The near cache's one connection to Redis: RESP3, `CLIENT TRACKING ON`, every fill read sent on
//! it (`GET key` and `PTTL key`, so that an entry is not served past the key's expiry, whose
//! invalidation Redis's sampling active expiry may send late). Redis writes a key's `invalidate`
//! push on the connection that read the key, in order with that connection's replies, so a reply
//! that arrives with no invalidation of its key before it is Redis's value as of that point of the
//! stream; the store's tickets ([`super::store`]) refuse a fill that an invalidation overtook. A
//! lost connection (or a new one) empties the cache: what the old one tracked, and what changed
//! while none did, is unknown. So does a Sentinel switch: the connection is closed when the master
//! moves, and opened to the new one.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tollgate_resp::{Frame, Limits};

use std::sync::Arc;

use super::{Bulk, Cache, Cause, Fetched, Fill, FillLost, Hash, Read, Ticket, Value};
use crate::conn::Conn;
use crate::connector::Connector;
use crate::tracking_conn::{self, Lost};

/// What the connection calls itself (`CLIENT LIST` on Redis).
pub(super) const NAME: &str = "tollgate-cache";
/// First pause after a failed attempt; doubled per failure up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(25);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Keeps the tracking connection open until `stop`: opens it, serves fills on it, and after a loss
/// empties the cache and opens it again. `up` is told when it is open and tracking, and when it
/// no longer is (`Cache::set_tracking` on one server; a cluster counts its masters').
pub(super) async fn drive(
    cache: Cache,
    connector: std::sync::Arc<Connector>,
    timeout: Option<Duration>,
    mut queue: mpsc::Receiver<Fill>,
    up: Arc<dyn Fn(bool) + Send + Sync>,
    stop: CancellationToken,
) {
    let mut pause = FIRST_PAUSE;
    let mut failing = false;
    loop {
        let opened = tokio::select! {
            () = stop.cancelled() => return,
            opened = open(&connector) => opened,
        };
        let lost = match opened {
            Ok(conn) => {
                // Whatever was kept before is of a connection that no longer tracks it.
                cache.flush(Cause::Connection);
                up(true);
                if std::mem::take(&mut failing) {
                    tracing::info!("tracking connection open again");
                }
                pause = FIRST_PAUSE;
                let on = On {
                    cache: &cache,
                    connector: &connector,
                    timeout,
                };
                let lost = serve(on, conn, &mut queue, &stop).await;
                up(false);
                cache.flush(Cause::Connection);
                lost
            }
            Err(lost) => Err(lost),
        };
        // Reads queued meanwhile are read as if uncached by their sessions.
        while let Ok(fill) = queue.try_recv() {
            cache.complete(&fill.key, fill.ticket, None, None);
            let _ = fill.reply.send(Err(FillLost));
        }
        if stop.is_cancelled() {
            return;
        }
        if let Err(lost) = lost {
            if !failing {
                let what = "near cache off until its tracking connection is open";
                tracing::warn!(error = %lost, "{what}");
                failing = true;
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// A connection of the REGULAR lane's user, named [`NAME`], speaking RESP3, tracking.
async fn open(connector: &Connector) -> Result<Conn, Lost> {
    let tracking: [&[u8]; 3] = [b"CLIENT", b"TRACKING", b"ON"];
    tracking_conn::open(connector, NAME, "CLIENT TRACKING ON", &tracking).await
}

/// Serves fills on `conn` until it is lost (`Err`) or the cache stops (`Ok`). Every fill still
/// waiting when it ends is told [`FillLost`].
/// What serving a connection needs besides it.
struct On<'a> {
    cache: &'a Cache,
    connector: &'a Connector,
    /// REGULAR's command timeout: a fill unanswered for longer replaces the connection (as a
    /// lane's would be), emptying the cache.
    timeout: Option<Duration>,
}

async fn serve(
    on: On<'_>,
    conn: Conn,
    queue: &mut mpsc::Receiver<Fill>,
    stop: &CancellationToken,
) -> Result<(), Lost> {
    let On {
        cache,
        connector,
        timeout,
    } = on;
    let generation = conn.generation();
    let (stream, mut read, _open) = conn.into_parts();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let ended = async {
        let mut out = BytesMut::new();
        let limits = Limits {
            max_elements: usize::MAX,
            ..Limits::default()
        };
        loop {
            // Frames already read (the handshake's leftovers, or a read's) first.
            while let Some(frame) = tollgate_resp::parse(&mut read, &limits)? {
                take(cache, frame, &mut waiting)?;
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                // A demoted master still answers reads and tracks, but behind the new one: a
                // fill there could keep a value older than a write already acknowledged.
                () = connector.moved(generation) => return Err(Lost::Moved),
                () = overdue(waiting.front(), timeout) => {
                    return Err(Lost::Timeout(timeout.unwrap_or_default()));
                }
                fill = queue.recv() => {
                    let Some(fill) = fill else { return Ok(()) };
                    // Every fill queued meanwhile goes out in the same write.
                    let mut next = Some(fill);
                    while let Some(fill) = next {
                        encode_read(&fill.key, &fill.read, &mut out);
                        tollgate_resp::encode_command(&[b"PTTL".as_slice(), &fill.key], &mut out);
                        waiting.push_back(Waiting::new(fill));
                        next = queue.try_recv().ok();
                    }
                    writer.write_all(&out).await?;
                    let written = tokio::time::Instant::now();
                    for waiting in waiting.iter_mut().rev().take_while(|w| w.written.is_none()) {
                        waiting.written = Some(written);
                    }
                    out.clear();
                }
                got = reader.read_buf(&mut read) => {
                    if got? == 0 {
                        return Err(Lost::Eof);
                    }
                }
            }
        }
    }
    .await;
    for waiting in waiting.drain(..) {
        cache.complete(&waiting.key, waiting.ticket, None, None);
        if let Some(reply) = waiting.reply {
            let _ = reply.send(Err(FillLost));
        }
    }
    ended
}

/// A fill on the wire: `GET key` then `PTTL key`, answered in that order.
struct Waiting {
    key: Bytes,
    read: Read,
    ticket: Ticket,
    /// Taken when `GET`'s reply is passed on (the session need not wait for `PTTL`'s).
    reply: Option<oneshot::Sender<Result<Fetched, FillLost>>>,
    /// `GET`'s reply, once it came: the value to keep, or `None` (an error: nothing kept).
    got: Option<Option<Value>>,
    /// When it was written to Redis.
    written: Option<tokio::time::Instant>,
}

/// Resolves once the oldest fill has waited past `timeout` (never without one, or a fill).
async fn overdue(oldest: Option<&Waiting>, timeout: Option<Duration>) {
    match (oldest.and_then(|waiting| waiting.written), timeout) {
        (Some(written), Some(timeout)) => tokio::time::sleep_until(written + timeout).await,
        _ => std::future::pending().await,
    }
}

impl Waiting {
    fn new(fill: Fill) -> Self {
        Waiting {
            key: fill.key,
            read: fill.read,
            ticket: fill.ticket,
            reply: Some(fill.reply),
            got: None,
            written: None,
        }
    }
}

/// One frame from the tracking connection: an invalidation, or a reply to the oldest fill (its
/// `GET`'s, passed on at once, or its `PTTL`'s, which completes it).
fn take(cache: &Cache, frame: Frame, waiting: &mut VecDeque<Waiting>) -> Result<(), Lost> {
    if let Frame::Push(items) = frame {
        invalidated(cache, items);
        return Ok(());
    }
    let oldest = waiting.front_mut().ok_or(Lost::OutOfStep)?;
    let Some(got) = oldest.got.take() else {
        if redirected(&frame) {
            // A cluster's slot moved (or is moving) away from this master: the session reads
            // the key as if uncached, on its slot's master; nothing is kept.
            oldest.got = Some(None);
            if let Some(reply) = oldest.reply.take() {
                let _ = reply.send(Err(FillLost));
            }
            return Ok(());
        }
        let (fetched, kept) = fetched(frame, &oldest.read);
        oldest.got = Some(kept);
        if let Some(reply) = oldest.reply.take() {
            // A session that stopped waiting (its deadline passed) no longer listens.
            let _ = reply.send(Ok(fetched));
        }
        return Ok(());
    };
    let done = waiting.pop_front().expect("the oldest fill is there");
    // An invalidation between the two replies made the ticket stale already.
    let (kept, expires_in) = match (got, frame) {
        (Some(value), Frame::Integer(-1)) => (Some(value), None),
        (Some(value), Frame::Integer(ms)) if ms >= 0 => {
            (Some(value), Some(Duration::from_millis(ms.unsigned_abs())))
        }
        // -2: the key is gone (a missing value stays missing: kept, as does a hash read with no
        // field present, which is what a missing key answers); an error (a user without PTTL):
        // nothing is known of its expiry, so it is not kept.
        (Some(Value::Missing), Frame::Integer(-2)) => (Some(Value::Missing), None),
        (Some(Value::Hash(hash)), Frame::Integer(-2)) if hash.is_empty() => {
            (Some(Value::Missing), None)
        }
        _ => (None, None),
    };
    cache.complete(&done.key, done.ticket, kept, expires_in);
    Ok(())
}

/// Whether a reply is a cluster's redirect (or its refusal while a slot moves or the cluster is
/// down): the key is not this master's to answer now.
fn redirected(frame: &Frame) -> bool {
    let (Frame::Error(text) | Frame::BulkError(text)) = frame else {
        return false;
    };
    ["MOVED ", "ASK ", "TRYAGAIN ", "CLUSTERDOWN "]
        .iter()
        .any(|word| text.starts_with(word.as_bytes()))
}

/// The fill's read of `key`: `GET`, `HMGET` or `HGETALL`.
fn encode_read(key: &Bytes, read: &Read, out: &mut BytesMut) {
    match read {
        Read::Get => tollgate_resp::encode_command(&[b"GET".as_slice(), key], out),
        Read::Fields(fields) => {
            let mut argv: Vec<&[u8]> = vec![b"HMGET", key];
            argv.extend(fields.iter().map(|field| field.as_ref()));
            tollgate_resp::encode_command(&argv, out);
        }
        Read::Hash => tollgate_resp::encode_command(&[b"HGETALL".as_slice(), key], out),
    }
}

/// A read's reply as the session gets it, and what of it may be kept.
fn fetched(frame: Frame, read: &Read) -> (Fetched, Option<Value>) {
    let fetched = match (frame, read) {
        (Frame::Error(text) | Frame::BulkError(text), _) => Fetched::Refused(error_line(&text)),
        (Frame::Bulk(bytes), Read::Get) => Fetched::Value(Value::String(Bulk::new(&bytes))),
        (Frame::Null | Frame::Null3, Read::Get) => Fetched::Value(Value::Missing),
        (Frame::Array(values), Read::Fields(fields)) if values.len() == fields.len() => {
            match fields
                .iter()
                .zip(values)
                .map(|(field, value)| match value {
                    Frame::Bulk(bytes) => Some((field.clone(), Some(bytes))),
                    Frame::Null | Frame::Null3 => Some((field.clone(), None)),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
            {
                Some(answers) => Fetched::Value(Value::Hash(Arc::new(Hash::fields(answers)))),
                None => unexpected("HMGET"),
            }
        }
        (Frame::Map(pairs), Read::Hash) => {
            match pairs
                .into_iter()
                .map(|(field, value)| match (field, value) {
                    (Frame::Bulk(field), Frame::Bulk(value)) => Some((field, value)),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
            {
                Some(pairs) => Fetched::Value(Value::Hash(Arc::new(Hash::whole(pairs)))),
                None => unexpected("HGETALL"),
            }
        }
        (other, read) => Fetched::Refused(error_line(
            format!("ERR tollgate: unexpected reply to {read:?} from redis: {other:?}").as_bytes(),
        )),
    };
    let kept = match &fetched {
        Fetched::Value(value) => Some(value.clone()),
        Fetched::Refused(_) => None,
    };
    (fetched, kept)
}

fn unexpected(command: &str) -> Fetched {
    Fetched::Refused(error_line(
        format!("ERR tollgate: unexpected reply to {command} from redis").as_bytes(),
    ))
}

/// `invalidate` pushes: `[invalidate, [key …]]`, or `[invalidate, null]` when Redis flushed its
/// keys (or, with a full tracking table, forgot them). Other pushes are not for the cache.
fn invalidated(cache: &Cache, items: Vec<Frame>) {
    let mut items = items.into_iter();
    let is_invalidate = items
        .next()
        .as_ref()
        .and_then(Frame::as_bytes)
        .is_some_and(|kind| kind.eq_ignore_ascii_case(b"invalidate"));
    if !is_invalidate {
        return;
    }
    match items.next() {
        Some(Frame::Array(keys) | Frame::Set(keys)) => {
            for key in keys {
                match key.as_bytes() {
                    Some(key) => cache.invalidate(key, Cause::Redis),
                    None => cache.flush(Cause::Redis),
                }
            }
        }
        // Null, or anything this reader does not expect: everything, to be sure.
        _ => cache.flush(Cause::Flush),
    }
}

fn error_line(text: &[u8]) -> Bytes {
    let mut line = BytesMut::with_capacity(text.len() + 3);
    line.extend_from_slice(b"-");
    line.extend_from_slice(text);
    line.extend_from_slice(b"\r\n");
    line.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_reply_is_passed_on_as_one_line() {
        assert_eq!(
            error_line(b"WRONGTYPE Operation against a key holding the wrong kind of value"),
            &b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"[..]
        );
    }

    fn bulk(text: &str) -> Frame {
        Frame::Bulk(Bytes::copy_from_slice(text.as_bytes()))
    }

    #[test]
    fn hash_reads_are_kept_as_the_fields_they_answered() {
        let fields = Read::Fields(vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        let (got, kept) = fetched(Frame::Array(vec![bulk("1"), Frame::Null3]), &fields);
        let Fetched::Value(Value::Hash(hash)) = got else {
            panic!("HMGET's reply is a hash's fields");
        };
        assert_eq!(hash.field(b"a"), Some(Some(Bytes::from_static(b"1"))));
        assert_eq!(hash.field(b"b"), Some(None));
        assert_eq!(hash.field(b"c"), None);
        assert!(kept.is_some());
        // A reply of the wrong shape is refused, never kept.
        let (got, kept) = fetched(Frame::Array(vec![bulk("1")]), &fields);
        assert!(matches!(got, Fetched::Refused(_)) && kept.is_none());

        let (got, _) = fetched(
            Frame::Map(vec![(bulk("z"), bulk("26")), (bulk("a"), bulk("1"))]),
            &Read::Hash,
        );
        let Fetched::Value(Value::Hash(hash)) = got else {
            panic!("HGETALL's reply is the whole hash");
        };
        assert_eq!(
            hash.all(),
            Some(vec![
                (Bytes::from_static(b"z"), Bytes::from_static(b"26")),
                (Bytes::from_static(b"a"), Bytes::from_static(b"1"))
            ])
        );
        let wrong = Frame::Error(Bytes::from_static(b"WRONGTYPE Operation against a key"));
        let (got, kept) = fetched(wrong, &Read::Hash);
        assert!(matches!(got, Fetched::Refused(line) if line.starts_with(b"-WRONGTYPE")));
        assert!(kept.is_none());
    }
}
