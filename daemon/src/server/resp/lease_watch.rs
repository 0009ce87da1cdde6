//! `LEASE WATCH <resource>` and `LEASE UNWATCH [<resource> …]`: a connection's streams of holder
//! changes (the lease service's watches, see `tollgate_lease::watch`). Like `SUBSCRIBE`, `WATCH`
//! answers with a confirmation, `["watch", <resource>, <watches>]`, and the connection enters watch
//! mode: every change arrives as `["lease", <resource>, <event>]`, a push frame in RESP3 (other
//! commands may go on meanwhile) and an array in RESP2 (where, as when subscribed, only `LEASE
//! WATCH`, `LEASE UNWATCH`, `PING`, `QUIT` and `RESET` are accepted until the last watch ends). A
//! watch ends with `UNWATCH` (confirmed as `["unwatch", <resource>, <watches left>]`), `RESET`,
//! the connection's close, or after an `interrupted` event (the daemon lost track; watch again).
//! Watching is admitted by the policy's `leases:` rules for the resource, like `INSPECT`.

use std::sync::Arc;
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use tollgate_lease::watch::{HolderEvent, Watch, WatchRefused, MOST_BUFFERED};
use tollgate_lease::{Identity, Resource};
use tollgate_model::Caller;
use tollgate_policy::Decision;
use tollgate_resp::Frame;

use super::front::FrontDoor;
use super::lease::resource;
use super::lease_reply::frame;
use super::local::Protocol;
use super::pool::{Pool, Reservation};
use super::replies;
use super::subscriptions::{confirmation, out_of_band};

/// Watches one connection may hold at once.
pub const MAX_WATCHES: usize = 64;

/// The connection's watches, in the order they were made.
#[derive(Default)]
pub struct Watches {
    /// Each watch with the bytes its buffers may come to, held in the byte budget while it lives.
    watching: Vec<(Resource, Watch, Reservation)>,
}

impl Watches {
    pub fn is_empty(&self) -> bool {
        self.watching.is_empty()
    }

    pub fn clear(&mut self) {
        self.watching.clear();
    }

    /// The next change on any watch, framed for the client; a watch whose stream ended is dropped.
    /// Pending forever with no watches.
    pub async fn next(&mut self, protocol: Protocol) -> Frame {
        let (resource, event) = std::future::poll_fn(|cx| {
            let mut index = 0;
            while index < self.watching.len() {
                match self.watching[index].1.poll_recv(cx) {
                    Poll::Ready(Some(event)) => {
                        return Poll::Ready((self.watching[index].0.clone(), event))
                    }
                    // Ended after its `interrupted` event: nothing more comes.
                    Poll::Ready(None) => drop(self.watching.remove(index)),
                    Poll::Pending => index += 1,
                }
            }
            Poll::Pending
        })
        .await;
        event_frame(&resource, &event, protocol)
    }
}

/// Runs `LEASE WATCH|UNWATCH …` (`argv`, as `kind.rs` found it) and returns the reply to write.
pub async fn run(
    front: &FrontDoor,
    caller: &Caller,
    watches: &mut Watches,
    protocol: Protocol,
    argv: &[&[u8]],
) -> Bytes {
    let (Some(sub), Some(names)) = (argv.get(1), argv.get(2..)) else {
        return replies::error("ERR wrong number of arguments for 'lease' command".to_owned());
    };
    if sub.eq_ignore_ascii_case(b"UNWATCH") {
        return unwatch(watches, names, protocol);
    }
    let [name] = names else {
        return replies::error(
            "ERR wrong number of arguments for 'lease|watch' command".to_owned(),
        );
    };
    let resource = match resource(name) {
        Ok(resource) => resource,
        Err(message) => return replies::error(message),
    };
    if let Decision::Denied(denial) = front
        .services
        .admission
        .admit_lease(caller, resource.as_str())
    {
        return replies::denied(argv, &denial);
    }
    if !watches.watching.iter().any(|(r, ..)| *r == resource) {
        if watches.watching.len() >= MAX_WATCHES {
            return replies::error(format!(
                "ERR tollgate: a connection may watch at most {MAX_WATCHES} resources"
            ));
        }
        let reserved = match reserve(&front.services.pool, caller) {
            Ok(reserved) => reserved,
            Err(refused) => return replies::error(format!("BUSY tollgate: {refused}")),
        };
        match front
            .services
            .leases
            .watch(&Identity::from(caller), &resource)
            .await
        {
            Ok(events) => watches.watching.push((resource.clone(), events, reserved)),
            Err(WatchRefused::TooMany { limit }) => {
                return replies::error(format!(
                    "BUSY tollgate: this user of the principal already has {limit} holder \
                     watches open (leases.max_watches_per_uid), or the daemon has \
                     (leases.max_watches)"
                ))
            }
            Err(WatchRefused::Unavailable(error)) => {
                return replies::error(format!("UNAVAILABLE tollgate: {error}"))
            }
        }
    }
    let name = Bytes::from(resource.as_str().to_owned());
    replies::encode(&confirmation(
        "watch",
        Some(name),
        watches.watching.len(),
        protocol,
    ))
}

/// Room in the byte budget for the most a watch may buffer for a reader that does not read, held
/// until the watch ends (RESP's `LEASE WATCH` and HTTP's `…/holders` alike); refused with why.
pub(crate) fn reserve(pool: &Arc<Pool>, caller: &Caller) -> Result<Reservation, String> {
    pool.reserve(caller.tenant(), MOST_BUFFERED)
        .map_err(|over| {
            format!(
                "a holder watch may hold {MOST_BUFFERED} bytes for a reader that does not read, \
             which would take {over}"
            )
        })
}

/// Ends the named watches (all without names), confirming each as `UNSUBSCRIBE` does.
fn unwatch(watches: &mut Watches, names: &[&[u8]], protocol: Protocol) -> Bytes {
    let named: Vec<Bytes> = match names {
        [] => watches
            .watching
            .iter()
            .map(|(resource, ..)| Bytes::from(resource.as_str().to_owned()))
            .collect(),
        names => names
            .iter()
            .map(|name| Bytes::copy_from_slice(name))
            .collect(),
    };
    let mut out = BytesMut::new();
    if named.is_empty() {
        tollgate_resp::encode(&confirmation("unwatch", None, 0, protocol), &mut out);
    }
    for name in named {
        watches
            .watching
            .retain(|(resource, ..)| resource.as_str().as_bytes() != name);
        let left = watches.watching.len();
        tollgate_resp::encode(
            &confirmation("unwatch", Some(name), left, protocol),
            &mut out,
        );
    }
    out.freeze()
}

/// `["lease", <resource>, <event>]`, the event as a map (flat array in RESP2), `event` first.
fn event_frame(resource: &Resource, event: &HolderEvent, protocol: Protocol) -> Frame {
    let value = serde_json::to_value(event).expect("holder events always serialise");
    out_of_band(
        vec![
            Frame::Bulk(Bytes::from_static(b"lease")),
            Frame::Bulk(Bytes::from(resource.as_str().to_owned())),
            frame(value, protocol),
        ],
        protocol,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_change_is_framed_like_a_pubsub_message_with_the_event_first() {
        let resource = Resource::parse("jobs:leader").unwrap();
        let event = HolderEvent::Held {
            fence: 9,
            value: Some("node-a".into()),
            remaining: Duration::from_millis(500),
        };
        let bulk = |s: &str| Frame::Bulk(Bytes::from(s.to_owned()));
        let Frame::Array(items) = event_frame(&resource, &event, Protocol::Resp2) else {
            panic!("an array in RESP2");
        };
        assert_eq!(items[..2], [bulk("lease"), bulk("jobs:leader")]);
        let Frame::Array(fields) = &items[2] else {
            panic!("a flat array of fields");
        };
        assert_eq!(fields[..2], [bulk("event"), bulk("held")]);
        assert!(matches!(
            event_frame(&resource, &event, Protocol::Resp3),
            Frame::Push(_)
        ));
    }
}
