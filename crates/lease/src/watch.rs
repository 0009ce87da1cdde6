//! Holder changes of one resource as a stream (`LEASE WATCH`, `GET …/holders`): who holds it when
//! the watch starts, then every new holder (its fence and value: leader election's observe), every
//! release and every expiry, in the order they happened.
//!
//! Built on the resource's change channel, which the scripts publish to in the same atomic step as
//! the change (`acquired:<fence>:<ttl-ms>[:<value>]`, `released:<fence>`), so no acquisition or
//! release is missed while the subscription lives. Expiry publishes nothing (Redis expires the key
//! by itself), so a watcher reads the holder again when its TTL should have run out. Each read is
//! an inspect that also publishes a marker of its own on the channel, atomically with the read: the
//! messages ahead of the marker happened before the read, those after it after, so the read is
//! placed exactly in the stream. A holder still current when its read's marker arrives, and gone
//! in the read, expired (a release would have been published ahead of the marker); a new holder
//! announced while the last one was never released means the last one expired first. If the
//! subscription ends (the PUBSUB connection dropped, the watcher fell behind), messages may have
//! been missed: the stream says so (`interrupted`) and ends, and the caller watches again.
//!
//! Only exclusive leases are watched: a semaphore or read/write lease has many holders and its
//! scripts announce no acquisitions, so a watch of a resource held in a shared shape is refused,
//! and one whose resource is found held in a shared shape later ends (`interrupted`).

use std::convert::Infallible;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tollgate_lanes::{PubSub, Subscription, SubscriptionKind};

use crate::api::MAX_VALUE_LEN;
use crate::calls::Calls;
use crate::keys::LeaseKeys;
use crate::outcome::InspectOutcome;
use crate::places::Place;

/// Undelivered messages one watch may buffer before its subscription is dropped as lagging.
const MESSAGE_BUFFER: usize = 64;
/// Events one watch may buffer for a consumer that does not read.
const EVENT_BUFFER: usize = 64;
/// What one buffered message or event costs besides its value: its fence, TTL, names and framing.
const ITEM_OVERHEAD: usize = 256;
/// The most one watch holds for a consumer that does not read: its undelivered messages and its
/// unread events, each at most a value (`MAX_VALUE_LEN`) and its framing. The daemon reserves this
/// much of the clients' byte budget for as long as a watch lives.
pub const MOST_BUFFERED: usize = (MESSAGE_BUFFER + EVENT_BUFFER) * (MAX_VALUE_LEN + ITEM_OVERHEAD);
/// Read again this long after a holder's TTL should have run out, so that Redis has expired it.
const EXPIRY_SLACK: Duration = Duration::from_millis(1);
/// How often a watch of a free resource wakes with nothing to do (it only waits for messages).
const IDLE_CHECK: Duration = Duration::from_secs(3600);
/// How long a read's marker may take to come back on a live subscription.
const MARKER_WAIT: Duration = Duration::from_secs(10);

pub use tollgate_lease_api::api::HolderEvent;

/// Why a watch of a resource held in a shared shape is refused, or ends.
const SHARED: &str =
    "the resource is held as a semaphore or read/write lease; only exclusive leases can be watched";

/// Why a watch could not start; nothing is subscribed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot watch the resource: {0}")]
pub struct WatchUnavailable(pub String);

/// Why [`crate::LeaseService::watch`] started no watch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchRefused {
    /// The caller's OS user already has its share of watches open (`leases.max_watches_per_uid`),
    /// or the daemon its total (`leases.max_watches`): `limit` is the one reached.
    #[error("too many holder watches: at most {limit} open at once")]
    TooMany { limit: usize },
    #[error(transparent)]
    Unavailable(WatchUnavailable),
}

/// One open watch: its events, and its place among the watches (given back when it is dropped).
pub struct Watch {
    events: mpsc::Receiver<HolderEvent>,
    _place: Place,
}

impl Watch {
    pub(crate) fn new(events: mpsc::Receiver<HolderEvent>, place: Place) -> Watch {
        Watch {
            events,
            _place: place,
        }
    }

    /// The next holder change; `None` once the watch has ended.
    pub async fn recv(&mut self) -> Option<HolderEvent> {
        self.events.recv().await
    }

    /// [`Watch::recv`], polled.
    pub fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<HolderEvent>> {
        self.events.poll_recv(cx)
    }
}

/// A message on a resource's change channel.
#[derive(Debug, PartialEq)]
enum Change {
    Acquired {
        fence: u64,
        ttl: Duration,
        value: Option<String>,
    },
    Released {
        fence: u64,
    },
    Marker(String),
}

impl Change {
    fn parse(payload: &[u8]) -> Option<Change> {
        let text = std::str::from_utf8(payload).ok()?;
        let (kind, rest) = text.split_once(':')?;
        match kind {
            "acquired" => {
                let mut parts = rest.splitn(3, ':');
                let fence = parts.next()?.parse().ok()?;
                let ttl = Duration::from_millis(parts.next()?.parse().ok()?);
                let value = parts.next().map(str::to_owned);
                Some(Change::Acquired { fence, ttl, value })
            }
            "released" => Some(Change::Released {
                fence: rest.parse().ok()?,
            }),
            "sync" => Some(Change::Marker(rest.to_owned())),
            _ => None,
        }
    }
}

/// What the watcher believes holds the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Belief {
    Free,
    /// Held with `fence`, whose TTL runs out around `until` unless renewed.
    Held {
        fence: u64,
        until: Instant,
    },
}

/// Starts watching `keys`: subscribed before this returns, so nothing after it is missed.
pub async fn start(
    calls: &Calls,
    pubsub: &PubSub,
    keys: LeaseKeys,
    shutdown: &CancellationToken,
) -> Result<mpsc::Receiver<HolderEvent>, WatchUnavailable> {
    if let InspectOutcome::HeldShared { .. } = calls.inspect(&keys, None).await {
        return Err(WatchUnavailable(SHARED.to_owned()));
    }
    let subscription = pubsub
        .subscribe(
            SubscriptionKind::Shard,
            Bytes::from(keys.channel.clone()),
            MESSAGE_BUFFER,
        )
        .await
        .map_err(|error| WatchUnavailable(error.to_string()))?;
    let (events, receiver) = mpsc::channel(EVENT_BUFFER);
    let mut watcher = Watcher {
        calls: calls.clone(),
        keys,
        subscription,
        events,
    };
    let stop = shutdown.child_token();
    tokio::spawn(async move {
        let reason = tokio::select! {
            () = stop.cancelled() => "the daemon is stopping".to_owned(),
            reason = watcher.run() => reason,
        };
        // Nobody to tell when the consumer is gone.
        let _ = watcher
            .events
            .send(HolderEvent::Interrupted { reason })
            .await;
    });
    Ok(receiver)
}

struct Watcher {
    calls: Calls,
    keys: LeaseKeys,
    subscription: Subscription,
    events: mpsc::Sender<HolderEvent>,
}

/// Why a watch stops streaming: the consumer went away, or the watch lost track.
enum Stop {
    Gone,
    LostTrack(String),
}

impl Watcher {
    /// Streams changes until the consumer goes away or the watch loses track (the reason).
    async fn run(&mut self) -> String {
        match self.follow().await {
            Err(Stop::Gone) => "the watcher went away".to_owned(),
            Err(Stop::LostTrack(reason)) => reason,
            Ok(never) => match never {},
        }
    }

    async fn follow(&mut self) -> Result<Infallible, Stop> {
        // Messages ahead of the first read are in it already, so they are passed over.
        let (read, _) = self.read_placed().await?;
        let mut belief = match read {
            InspectOutcome::Held {
                fence,
                remaining,
                value,
                ..
            } => {
                self.emit(HolderEvent::Held {
                    fence,
                    value,
                    remaining,
                })
                .await?;
                Belief::Held {
                    fence,
                    until: Instant::now() + remaining,
                }
            }
            InspectOutcome::Free => {
                self.emit(HolderEvent::Free).await?;
                Belief::Free
            }
            InspectOutcome::HeldShared { .. } => return Err(Stop::LostTrack(SHARED.to_owned())),
            InspectOutcome::Unavailable { reason } => return Err(Stop::LostTrack(reason)),
        };
        loop {
            let expiry = match belief {
                Belief::Held { until, .. } => until + EXPIRY_SLACK,
                // Nothing can expire: only messages matter.
                Belief::Free => Instant::now() + IDLE_CHECK,
            };
            let change = tokio::select! {
                () = self.events.closed() => return Err(Stop::Gone),
                message = self.subscription.recv() => match message {
                    Ok(message) => Change::parse(&message.payload),
                    Err(ended) => return Err(Stop::LostTrack(ended.to_string())),
                },
                () = tokio::time::sleep_until(expiry.into()) => None,
            };
            belief = match change {
                Some(change) => self.apply(belief, change).await?,
                None => self.check_expiry(belief).await?,
            };
        }
    }

    /// At a holder's expected expiry: read it again, placed in the stream, and decide.
    async fn check_expiry(&mut self, belief: Belief) -> Result<Belief, Stop> {
        let Belief::Held { fence, .. } = belief else {
            return Ok(belief);
        };
        let (read, before) = self.read_placed().await?;
        let mut now = belief;
        for change in before {
            now = self.apply(now, change).await?;
        }
        // Anything announced ahead of the read already moved the belief on; else the read decides.
        if !matches!(now, Belief::Held { fence: held, .. } if held == fence) {
            return Ok(now);
        }
        match read {
            InspectOutcome::Held {
                fence: held,
                remaining,
                ..
            } if held == fence => Ok(Belief::Held {
                fence,
                until: Instant::now() + remaining,
            }),
            InspectOutcome::HeldShared { .. } => Err(Stop::LostTrack(SHARED.to_owned())),
            InspectOutcome::Unavailable { reason } => Err(Stop::LostTrack(reason)),
            // Gone, and no release was published ahead of the read: its TTL ran out.
            _ => {
                self.emit(HolderEvent::Expired { fence }).await?;
                Ok(Belief::Free)
            }
        }
    }

    /// The belief after one announced change, emitting what it tells.
    async fn apply(&mut self, belief: Belief, change: Change) -> Result<Belief, Stop> {
        match (belief, change) {
            (
                _,
                Change::Acquired {
                    fence: new,
                    ttl,
                    value,
                },
            ) => {
                match belief {
                    // Fences only rise: an older announcement is already accounted for.
                    Belief::Held { fence, .. } if new <= fence => return Ok(belief),
                    // A new holder while the last was never released: the last one expired.
                    Belief::Held { fence, .. } => {
                        self.emit(HolderEvent::Expired { fence }).await?;
                    }
                    Belief::Free => {}
                }
                self.emit(HolderEvent::Held {
                    fence: new,
                    value,
                    remaining: ttl,
                })
                .await?;
                Ok(Belief::Held {
                    fence: new,
                    until: Instant::now() + ttl,
                })
            }
            (Belief::Held { fence, .. }, Change::Released { fence: released })
                if released == fence =>
            {
                self.emit(HolderEvent::Released { fence }).await?;
                Ok(Belief::Free)
            }
            // Other watchers' markers, and releases already accounted for.
            _ => Ok(belief),
        }
    }

    async fn emit(&self, event: HolderEvent) -> Result<(), Stop> {
        self.events.send(event).await.map_err(|_| Stop::Gone)
    }

    /// Reads the holder with a marker of its own, and the announcements that came ahead of it.
    async fn read_placed(&mut self) -> Result<(InspectOutcome, Vec<Change>), Stop> {
        let marker = marker();
        let read = self.calls.observe(&self.keys, &marker).await;
        if let InspectOutcome::Unavailable { reason } = read {
            // The marker may never come: the script did not run, or its reply was lost.
            return Err(Stop::LostTrack(reason));
        }
        let mut before = Vec::new();
        let deadline = Instant::now() + MARKER_WAIT;
        loop {
            let message = tokio::select! {
                () = self.events.closed() => return Err(Stop::Gone),
                message = self.subscription.recv() => message,
                () = tokio::time::sleep_until(deadline.into()) => {
                    return Err(Stop::LostTrack(format!("the read's marker did not come back within {MARKER_WAIT:?}")));
                }
            };
            let message = message.map_err(|ended| Stop::LostTrack(ended.to_string()))?;
            match Change::parse(&message.payload) {
                Some(Change::Marker(seen)) if seen == marker => return Ok((read, before)),
                Some(Change::Marker(_)) | None => {}
                Some(change) => before.push(change),
            }
        }
    }
}

/// A marker no other watcher, of this daemon or another, publishes.
fn marker() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    let random = std::collections::hash_map::RandomState::new().hash_one(count);
    format!("{}-{count}-{random:016x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_are_read_with_their_value_whole() {
        assert_eq!(
            Change::parse(b"acquired:17:5000:host:8080"),
            Some(Change::Acquired {
                fence: 17,
                ttl: Duration::from_millis(5000),
                value: Some("host:8080".into())
            })
        );
        assert_eq!(
            Change::parse(b"acquired:18:100"),
            Some(Change::Acquired {
                fence: 18,
                ttl: Duration::from_millis(100),
                value: None
            })
        );
        assert_eq!(
            Change::parse(b"released:17"),
            Some(Change::Released { fence: 17 })
        );
        assert_eq!(
            Change::parse(b"sync:1-2-ab"),
            Some(Change::Marker("1-2-ab".into()))
        );
        assert_eq!(Change::parse(b"released"), None);
        assert_eq!(Change::parse(b"acquired:x:1"), None);
    }

    #[test]
    fn events_are_named_and_carry_the_value_only_when_there_is_one() {
        let held = HolderEvent::Held {
            fence: 3,
            value: None,
            remaining: Duration::from_millis(900),
        };
        assert_eq!(
            serde_json::to_value(&held).unwrap(),
            serde_json::json!({"event": "held", "fence": 3, "remaining_ms": 900})
        );
        assert_eq!(
            serde_json::to_value(HolderEvent::Expired { fence: 3 }).unwrap(),
            serde_json::json!({"event": "expired", "fence": 3})
        );
        assert_ne!(marker(), marker());
    }
}
