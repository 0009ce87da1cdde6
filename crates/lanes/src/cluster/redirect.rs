//! Reading a cluster node's redirects out of an error reply's bytes: `-MOVED <slot> <endpoint>`,
//! `-ASK <slot> <endpoint>`, `-TRYAGAIN …` and `-CLUSTERDOWN …`. In cluster mode every reply passes
//! through [`redirect`], so anything else is turned away on its first bytes. A redirect that cannot
//! be followed (a bad slot, an unknown hostname `?`) reads as no redirect: the client sees the
//! server's error as it is.

use super::Slot;
use crate::Endpoint;

/// What a node told us to do instead of serving a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// The slot lives on `to` now: refresh the map and send it there.
    Moved { slot: Slot, to: Endpoint },
    /// The slot is being migrated and this key is (maybe) on `to` already: send `ASKING` and the
    /// command there, once, without changing the map.
    Ask { slot: Slot, to: Endpoint },
    /// A multi-key command met a slot being migrated with its keys split: retry after a pause.
    TryAgain,
    /// The cluster (or this slot) is not served right now.
    ClusterDown,
}

/// The redirect in `reply`, a whole reply frame as received from the node at `answered` (which
/// stands in for the host of a `:port` endpoint, Redis 7's unknown endpoint); `None` for any other
/// reply.
pub(crate) fn redirect(reply: &[u8], answered: &Endpoint) -> Option<Redirect> {
    // The cheap test every reply pays: an error whose first letter starts one of the four words.
    let [b'-', first, ..] = reply else {
        return None;
    };
    if !matches!(first, b'M' | b'A' | b'T' | b'C') {
        return None;
    }
    let line = reply[1..].strip_suffix(b"\r\n")?;
    let (word, rest) = match line.iter().position(|&b| b == b' ') {
        Some(space) => (&line[..space], &line[space + 1..]),
        None => (line, &[][..]),
    };
    match word {
        b"MOVED" => target(rest, answered).map(|(slot, to)| Redirect::Moved { slot, to }),
        b"ASK" => target(rest, answered).map(|(slot, to)| Redirect::Ask { slot, to }),
        b"TRYAGAIN" => Some(Redirect::TryAgain),
        b"CLUSTERDOWN" => Some(Redirect::ClusterDown),
        _ => None,
    }
}

/// `<slot> <endpoint>`; the endpoint is `host:port`, `[v6]:port`, bare IPv6 `::1:port`, or `:port`.
fn target(rest: &[u8], answered: &Endpoint) -> Option<(Slot, Endpoint)> {
    let rest = std::str::from_utf8(rest).ok()?;
    let (slot, endpoint) = rest.split_once(' ')?;
    let slot = Slot::new(slot.parse().ok()?)?;
    let (host, port) = endpoint.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|&port| port != 0)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let host = match (host, answered) {
        ("", Endpoint::Tcp { host, .. }) => host.clone(),
        // `?`: the node prefers hostnames and has none; there is nowhere to go.
        ("", Endpoint::Unix(_)) | ("?", _) => return None,
        _ if host.contains(' ') => return None,
        (host, _) => host.to_owned(),
    };
    Some((slot, Endpoint::Tcp { host, port }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> Endpoint {
        Endpoint::Tcp {
            host: host.into(),
            port,
        }
    }

    fn read(reply: &str) -> Option<Redirect> {
        redirect(reply.as_bytes(), &tcp("10.0.0.9", 7000))
    }

    fn slot(n: u16) -> Slot {
        Slot::new(n).unwrap()
    }

    #[test]
    fn reads_moved_and_ask_with_every_endpoint_form() {
        assert_eq!(
            read("-MOVED 3999 127.0.0.1:6381\r\n"),
            Some(Redirect::Moved {
                slot: slot(3999),
                to: tcp("127.0.0.1", 6381)
            })
        );
        assert_eq!(
            read("-ASK 16383 redis-2.internal:6379\r\n"),
            Some(Redirect::Ask {
                slot: slot(16383),
                to: tcp("redis-2.internal", 6379)
            })
        );
        // Redis 7's unknown endpoint: the same host as the node that answered.
        assert_eq!(
            read("-MOVED 0 :6390\r\n"),
            Some(Redirect::Moved {
                slot: slot(0),
                to: tcp("10.0.0.9", 6390)
            })
        );
        for v6 in ["-MOVED 12 ::1:6381\r\n", "-MOVED 12 [::1]:6381\r\n"] {
            assert_eq!(
                read(v6),
                Some(Redirect::Moved {
                    slot: slot(12),
                    to: tcp("::1", 6381)
                }),
                "{v6}"
            );
        }
        assert_eq!(
            read("-ASK 5 fe80::1:2:7001\r\n"),
            Some(Redirect::Ask {
                slot: slot(5),
                to: tcp("fe80::1:2", 7001)
            })
        );
    }

    #[test]
    fn reads_tryagain_and_clusterdown_whatever_follows() {
        assert_eq!(
            read("-TRYAGAIN Multiple keys request during rehashing of slot\r\n"),
            Some(Redirect::TryAgain)
        );
        assert_eq!(
            read("-CLUSTERDOWN Hash slot not served\r\n"),
            Some(Redirect::ClusterDown)
        );
        assert_eq!(read("-CLUSTERDOWN\r\n"), Some(Redirect::ClusterDown));
    }

    #[test]
    fn other_replies_are_not_redirects() {
        for reply in [
            "+OK\r\n",
            "$5\r\nMOVED\r\n",
            "-ERR unknown command\r\n",
            "-MOVEDX 1 h:1\r\n",
            "-ASKING\r\n",
            "-TRYAGAINX\r\n",
            "-CROSSSLOT Keys in request don't hash to the same slot\r\n",
            "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            "!21\r\nMOVED 1 127.0.0.1:1\r\n",
            "",
            "-",
        ] {
            assert_eq!(read(reply), None, "{reply:?}");
        }
    }

    #[test]
    fn redirects_that_cannot_be_followed_read_as_none() {
        for reply in [
            "-MOVED 16384 127.0.0.1:6381\r\n",
            "-MOVED -1 127.0.0.1:6381\r\n",
            "-MOVED 1 127.0.0.1:0\r\n",
            "-MOVED 1 127.0.0.1:65536\r\n",
            "-MOVED 1 127.0.0.1\r\n",
            "-MOVED 1\r\n",
            "-MOVED\r\n",
            "-MOVED 1 ?:6379\r\n",
            "-MOVED 1 two words:6379\r\n",
            "-ASK x 127.0.0.1:6381\r\n",
            "-MOVED 3999 127.0.0.1:6381",
        ] {
            assert_eq!(read(reply), None, "{reply:?}");
        }
        let over_unix = Endpoint::Unix("/run/redis.sock".into());
        assert_eq!(redirect(b"-MOVED 1 :6379\r\n", &over_unix), None);
        assert_eq!(
            redirect(b"-ASK 1 \xff\xfe:6379\r\n", &tcp("10.0.0.9", 7000)),
            None
        );
    }
}
