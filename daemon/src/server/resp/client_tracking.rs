//! `CLIENT TRACKING`, `CACHING`, `GETREDIR` and `TRACKINGINFO` for a session: what the listener's
//! tracking (`tracking_hub.rs`) answers, written as Redis writes it. `TRACKING ON` while the
//! daemon's invalidation connection to Redis is not open becomes work in place, which waits for
//! it (boundedly) before tracking starts: a client is never told `OK` while writes to Redis would
//! go unseen.

use bytes::Bytes;
use tollgate_resp::Frame;

use super::clients::Client;
use super::local::Protocol;
use super::replies;
use super::schedule::{InPlace, Step};
use super::tracking_hub::{Answer, Answered, Hub};
use crate::tracking::{Invalidation, Message, TrackingInfo};

/// What `CLIENT <sub> <args…>` (`sub` one of the four) from session `me` becomes.
pub fn answer(hub: &Hub, me: &Client, sub: &[u8], args: &[&[u8]], protocol: Protocol) -> Step {
    match hub.command(me, sub, args) {
        Answered::Now(done) => Step::Reply(reply(done, protocol)),
        Answered::OnceOpen => Step::InPlace(InPlace::Tracking(
            args.iter().map(|arg| Bytes::copy_from_slice(arg)).collect(),
        )),
    }
}

/// An answer as the client reads it.
pub fn reply(done: Result<Answer, String>, protocol: Protocol) -> Bytes {
    match done {
        Ok(Answer::Ok) => replies::ok(),
        Ok(Answer::Redirect(id)) => replies::encode(&Frame::Integer(id)),
        Ok(Answer::Info(info)) => replies::encode(&info_frame(&info, protocol)),
        Err(error) => replies::error(error),
    }
}

/// An invalidation as Redis writes it (`sendTrackingMessage`): a RESP3 `invalidate` push, a
/// RESP2 message on `__redis__:invalidate`, or the RESP3 `tracking-redir-broken` push. A flush's
/// null is RESP3's `_` in a push and RESP2's `$-1` in a message.
pub fn message_frame(message: &Message) -> Frame {
    let bulk = |text: &'static str| Frame::Bulk(Bytes::from_static(text.as_bytes()));
    let keys = |invalidation: &Invalidation, null: Frame| match invalidation {
        Invalidation::Keys(keys) => Frame::Array(keys.iter().cloned().map(Frame::Bulk).collect()),
        Invalidation::Everything => null,
    };
    match message {
        Message::Push(invalidation) => {
            Frame::Push(vec![bulk("invalidate"), keys(invalidation, Frame::Null3)])
        }
        Message::PubSub(invalidation) => Frame::Array(vec![
            bulk("message"),
            bulk("__redis__:invalidate"),
            keys(invalidation, Frame::Null),
        ]),
        Message::RedirectBroken(id) => Frame::Push(vec![
            bulk("tracking-redir-broken"),
            Frame::Integer(i64::try_from(*id).unwrap_or(i64::MAX)),
        ]),
    }
}

/// `CLIENT TRACKINGINFO` as Redis writes it: a map of `flags` (a set in RESP3), `redirect` and
/// `prefixes`; in RESP2 the map's pairs in one array.
fn info_frame(info: &TrackingInfo, protocol: Protocol) -> Frame {
    let flags: Vec<Frame> = info
        .flags
        .iter()
        .map(|flag| Frame::Bulk(Bytes::from_static(flag.name().as_bytes())))
        .collect();
    let prefixes = Frame::Array(info.prefixes.iter().cloned().map(Frame::Bulk).collect());
    let pairs = [
        (
            "flags",
            match protocol {
                Protocol::Resp3 => Frame::Set(flags),
                Protocol::Resp2 => Frame::Array(flags),
            },
        ),
        ("redirect", Frame::Integer(info.redirect)),
        ("prefixes", prefixes),
    ]
    .map(|(name, value)| (Frame::Bulk(Bytes::from_static(name.as_bytes())), value));
    match protocol {
        Protocol::Resp3 => Frame::Map(pairs.into()),
        Protocol::Resp2 => Frame::Array(
            pairs
                .into_iter()
                .flat_map(|(name, value)| [name, value])
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(reply: &Bytes) -> String {
        String::from_utf8_lossy(reply).into_owned()
    }

    #[test]
    fn a_client_that_does_not_track_is_answered_as_redis_answers_it() {
        let info = |protocol| {
            text(&reply(
                Ok(Answer::Info(crate::tracking::Tracker::new(1).info(7))),
                protocol,
            ))
        };
        assert_eq!(
            info(Protocol::Resp2),
            "*6\r\n$5\r\nflags\r\n*1\r\n$3\r\noff\r\n$8\r\nredirect\r\n:-1\r\n$8\r\nprefixes\r\n*0\r\n"
        );
        assert_eq!(
            text(&reply(Ok(Answer::Redirect(-1)), Protocol::Resp2)),
            ":-1\r\n"
        );
        assert_eq!(
            text(&reply(Err("ERR x".into()), Protocol::Resp2)),
            "-ERR x\r\n"
        );
    }

    #[test]
    fn invalidations_are_written_as_redis_writes_them() {
        let write = |message: Message| {
            let mut out = bytes::BytesMut::new();
            tollgate_resp::encode(&message_frame(&message), &mut out);
            String::from_utf8_lossy(&out).into_owned()
        };
        let keys = Invalidation::Keys(vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        assert_eq!(
            write(Message::Push(keys.clone())),
            ">2\r\n$10\r\ninvalidate\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n"
        );
        assert_eq!(
            write(Message::Push(Invalidation::Everything)),
            ">2\r\n$10\r\ninvalidate\r\n_\r\n"
        );
        assert_eq!(
            write(Message::PubSub(keys)),
            "*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n"
        );
        assert_eq!(
            write(Message::PubSub(Invalidation::Everything)),
            "*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n$-1\r\n"
        );
        assert_eq!(
            write(Message::RedirectBroken(12)),
            ">2\r\n$21\r\ntracking-redir-broken\r\n:12\r\n"
        );
    }

    #[test]
    fn trackinginfo_is_a_map_with_a_set_of_flags_in_resp3() {
        let reply = reply(
            Ok(Answer::Info(crate::tracking::Tracker::new(1).info(7))),
            Protocol::Resp3,
        );
        assert_eq!(
            text(&reply),
            "%3\r\n$5\r\nflags\r\n~1\r\n$3\r\noff\r\n$8\r\nredirect\r\n:-1\r\n$8\r\nprefixes\r\n*0\r\n"
        );
    }
}
