//! `CLIENT TRACKING`, `CACHING`, `GETREDIR` and `TRACKINGINFO` for a session, which never tracks
//! yet: the daemon's clients read through connections shared with every other client, so Redis's
//! own tracking of those connections would tell no client anything, and the daemon's tracking
//! (`crate::tracking`) is not wired into the sessions yet (issue 29). What a client that does not
//! track can be told is told as Redis tells it, with Redis's checks and words: `GETREDIR` is -1,
//! `TRACKINGINFO` says `off`, `CACHING` is Redis's "not in tracking mode" error, `TRACKING OFF`
//! (its options checked as Redis checks them) is `OK`. `TRACKING ON` is refused, saying why.

use bytes::Bytes;
use tollgate_resp::Frame;

use super::local::Protocol;
use super::replies;
use crate::tracking::{ClientId, Directory, Peer, Tracker, TrackingInfo};

/// The reply to `CLIENT <sub> <args…>` (`sub` one of the four) from session `id`; `exists`: whether
/// a session `REDIRECT` may name is connected.
pub fn answer(
    sub: &[u8],
    args: &[&[u8]],
    id: ClientId,
    protocol: Protocol,
    exists: &dyn Fn(ClientId) -> bool,
) -> Bytes {
    // This session alone, never tracking: Redis's answers for a client in that state.
    let mut tracker = Tracker::new(1);
    let is = |word: &[u8]| sub.eq_ignore_ascii_case(word);
    if is(b"GETREDIR") {
        return replies::encode(&Frame::Integer(tracker.getredir(id)));
    }
    if is(b"TRACKINGINFO") {
        return replies::encode(&info_frame(&tracker.info(id), protocol));
    }
    if is(b"CACHING") {
        return match tracker.caching(id, args) {
            Ok(()) => replies::ok(),
            Err(error) => replies::error(error.to_string()),
        };
    }
    if args
        .first()
        .is_some_and(|switch| switch.eq_ignore_ascii_case(b"ON"))
    {
        return replies::error(
            "ERR tollgate: CLIENT TRACKING ON is not available yet: connections to Redis are \
             shared between clients, and the daemon does not track for them yet"
                .to_owned(),
        );
    }
    match tracker.tracking(id, args, &Sessions(exists)) {
        Ok(()) => replies::ok(),
        Err(error) => replies::error(error.to_string()),
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

/// The sessions a `REDIRECT` may name.
struct Sessions<'a>(&'a dyn Fn(ClientId) -> bool);

impl Directory for Sessions<'_> {
    fn peer(&self, id: ClientId) -> Option<Peer> {
        (self.0)(id).then_some(Peer {
            protocol: Protocol::Resp2,
            subscribed: false,
        })
    }

    fn may_read(&self, _client: ClientId, _key: &[u8]) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(reply: &Bytes) -> String {
        String::from_utf8_lossy(reply).into_owned()
    }

    const ME: ClientId = 7;

    fn answered(sub: &str, args: &[&str]) -> String {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        text(&answer(sub.as_bytes(), &args, ME, Protocol::Resp2, &|id| {
            id == 9
        }))
    }

    #[test]
    fn a_client_that_does_not_track_is_answered_as_redis_answers_it() {
        assert_eq!(answered("GETREDIR", &[]), ":-1\r\n");
        assert_eq!(
            answered("trackinginfo", &[]),
            "*6\r\n$5\r\nflags\r\n*1\r\n$3\r\noff\r\n$8\r\nredirect\r\n:-1\r\n$8\r\nprefixes\r\n*0\r\n"
        );
        assert!(
            answered("CACHING", &["yes"]).starts_with("-ERR CLIENT CACHING can be called only"),
            "{}",
            answered("CACHING", &["yes"])
        );
        assert_eq!(answered("TRACKING", &["off"]), "+OK\r\n");
        assert_eq!(answered("TRACKING", &["off", "REDIRECT", "9"]), "+OK\r\n");
        // Redis checks a REDIRECT even when turning tracking off.
        let missing = answered("TRACKING", &["off", "REDIRECT", "8"]);
        assert!(missing.starts_with("-ERR"), "{missing}");
        let on = answered("TRACKING", &["on"]);
        assert!(on.starts_with("-ERR tollgate: CLIENT TRACKING ON"), "{on}");
    }

    #[test]
    fn trackinginfo_is_a_map_with_a_set_of_flags_in_resp3() {
        let reply = answer(b"TRACKINGINFO", &[], ME, Protocol::Resp3, &|_| false);
        assert_eq!(
            text(&reply),
            "%3\r\n$5\r\nflags\r\n~1\r\n$3\r\noff\r\n$8\r\nredirect\r\n:-1\r\n$8\r\nprefixes\r\n*0\r\n"
        );
    }
}
