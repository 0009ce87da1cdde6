//! One client's pub/sub subscriptions: each is a [`Subscription`] on the shared PUBSUB lane, drained
//! by a small forwarder into this session's bounded queue. A client that does not keep up — its
//! queue is full, or the lane dropped its subscription as lagging or over its budget — is evicted
//! rather than buffered. A message counts against the client's budget from the lane's fan-out until
//! the session has written it into its own buffer ([`Held`]). A client holds at most
//! `resp.max_subscriptions`, and all clients of one user (a principal and one OS user of it) at
//! most `resp.max_subscriptions_per_uid` together ([`SubscriptionShares`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tollgate_lanes::{
    Budget, Held, LaneError, Message, PubSub, Subscription, SubscriptionEnded, SubscriptionKind,
};
use tollgate_model::Tenant;
use tollgate_resp::Frame;

use super::clients::Subscribed;
use super::local::Protocol;
use super::replies;
use super::tenants::{Member, Tenants};

/// Each user's subscriptions together, against `resp.max_subscriptions_per_uid`: under the default
/// policy every local user is the one principal, and one user's many clients must not hold every
/// subscription (each a forwarding task, buffers on the PUBSUB lane) the daemon can carry.
pub struct SubscriptionShares {
    /// `0`: no cap.
    cap: usize,
    tenants: Arc<Tenants<AtomicUsize>>,
}

impl SubscriptionShares {
    pub fn new(cap: usize) -> SubscriptionShares {
        SubscriptionShares {
            cap,
            tenants: Arc::default(),
        }
    }
}

/// One session's part in its user's count: joined at its first subscription, and what it has
/// added to the count (given back as its subscriptions end).
struct Share {
    count: Member<AtomicUsize>,
    counted: usize,
}

/// How many subscriptions a client may hold, and how many messages each may buffer.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub subscriptions: usize,
    pub buffer: usize,
}

pub struct Subscriptions {
    active: HashMap<(SubscriptionKind, Bytes), JoinHandle<()>>,
    shares: Arc<SubscriptionShares>,
    tenant: Tenant,
    share: Option<Share>,
    sender: mpsc::Sender<(Message, Option<Held>)>,
    receiver: mpsc::Receiver<(Message, Option<Held>)>,
    /// Cancelled when this client must be disconnected; `why` says for what.
    evicted: CancellationToken,
    why: Arc<Mutex<Option<Eviction>>>,
}

/// Why a subscriber is disconnected.
#[derive(Debug, Clone)]
pub enum Eviction {
    /// It did not keep up: told so in an error before the close.
    TooSlow(String),
    /// The shared subscription ended (Redis restarted, failed over, or the daemon is stopping):
    /// the connection is closed without a reply, as a lost Redis connection looks to a client, so
    /// that its reconnect logic runs.
    Ended(SubscriptionEnded),
}

impl std::fmt::Display for Eviction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Eviction::TooSlow(why) => f.write_str(why),
            Eviction::Ended(why) => write!(f, "{why}"),
        }
    }
}

impl Subscriptions {
    pub fn new(buffer: usize, shares: Arc<SubscriptionShares>, tenant: Tenant) -> Self {
        let (sender, receiver) = mpsc::channel(buffer.max(1));
        Self {
            active: HashMap::new(),
            shares,
            tenant,
            share: None,
            sender,
            receiver,
            evicted: CancellationToken::new(),
            why: Arc::new(Mutex::new(None)),
        }
    }

    /// Channels and patterns (what `SUBSCRIBE` and `PSUBSCRIBE` count), or shard channels.
    pub fn count(&self, kind: SubscriptionKind) -> usize {
        let shard = kind == SubscriptionKind::Shard;
        self.active
            .keys()
            .filter(|(k, _)| (*k == SubscriptionKind::Shard) == shard)
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Channels, patterns and shard channels, each counted apart (as `CLIENT LIST` shows them).
    pub fn counts(&self) -> Subscribed {
        let mut counts = Subscribed::default();
        for (kind, _) in self.active.keys() {
            match kind {
                SubscriptionKind::Channel => counts.channels += 1,
                SubscriptionKind::Pattern => counts.patterns += 1,
                SubscriptionKind::Shard => counts.shards += 1,
            }
        }
        counts
    }

    /// The names of one kind, for an `UNSUBSCRIBE` without arguments.
    pub fn names(&self, kind: SubscriptionKind) -> Vec<Bytes> {
        self.active
            .keys()
            .filter(|(k, _)| *k == kind)
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// How many of `names` this client does not hold yet.
    pub fn new_names(&self, kind: SubscriptionKind, names: &[Bytes]) -> usize {
        let mut fresh: Vec<&Bytes> = names
            .iter()
            .filter(|name| !self.active.contains_key(&(kind, (*name).clone())))
            .collect();
        fresh.sort_unstable();
        fresh.dedup();
        fresh.len()
    }

    /// Every subscription this client holds, of all kinds.
    pub fn len(&self) -> usize {
        self.active.len()
    }

    /// Subscribes once per name; a second `SUBSCRIBE` of the same name only confirms again.
    async fn subscribe(
        &mut self,
        pubsub: &PubSub,
        kind: SubscriptionKind,
        name: Bytes,
        capacity: usize,
        budget: Arc<dyn Budget>,
    ) -> Result<(), LaneError> {
        let key = (kind, name.clone());
        if self.active.contains_key(&key) {
            return Ok(());
        }
        let subscription = pubsub
            .subscribe_charged(kind, name, capacity, budget)
            .await?;
        let forwarder = tokio::spawn(forward(
            subscription,
            self.sender.clone(),
            self.evicted.clone(),
            self.why.clone(),
        ));
        self.active.insert(key, forwarder);
        Ok(())
    }

    /// `SUBSCRIBE`/`PSUBSCRIBE`/`SSUBSCRIBE` (`argv`): every name or none, within `caps`; the
    /// reply confirms each name, or says why the lane could not subscribe it.
    pub async fn subscribe_all(
        &mut self,
        pubsub: &PubSub,
        kind: SubscriptionKind,
        argv: Vec<Bytes>,
        caps: Caps,
        budget: Arc<dyn Budget>,
        protocol: Protocol,
    ) -> Bytes {
        let fresh = self.new_names(kind, &argv[1..]);
        if self.len() + fresh > caps.subscriptions {
            return replies::too_many_subscriptions(fresh, caps.subscriptions);
        }
        if !self.reserve(fresh) {
            return replies::too_many_user_subscriptions(fresh, self.shares.cap);
        }
        let mut out = BytesMut::new();
        for name in argv.into_iter().skip(1) {
            let subscribed = self
                .subscribe(pubsub, kind, name.clone(), caps.buffer, budget.clone())
                .await;
            if let Err(error) = subscribed {
                out.extend_from_slice(&replies::lane_failed(&error));
                continue;
            }
            let word = confirmation_word(kind, true);
            let frame = confirmation(word, Some(name), self.count(kind), protocol);
            tollgate_resp::encode(&frame, &mut out);
        }
        // What the lane refused gives back its reserved place.
        self.recount();
        out.freeze()
    }

    /// Counts `fresh` more subscriptions in this user's share, or says no (counting nothing).
    fn reserve(&mut self, fresh: usize) -> bool {
        let cap = self.shares.cap;
        if cap == 0 || fresh == 0 {
            return true;
        }
        let share = self.share.get_or_insert_with(|| Share {
            count: self
                .shares
                .tenants
                .join(self.tenant.clone(), AtomicUsize::default),
            counted: 0,
        });
        let now = share.count.fetch_add(fresh, Ordering::AcqRel) + fresh;
        if now > cap {
            share.count.fetch_sub(fresh, Ordering::AcqRel);
            return false;
        }
        share.counted += fresh;
        true
    }

    /// Brings this session's part of its user's count to the subscriptions it holds.
    fn recount(&mut self) {
        let Some(share) = &mut self.share else { return };
        let held = self.active.len();
        match held.cmp(&share.counted) {
            std::cmp::Ordering::Greater => {
                share
                    .count
                    .fetch_add(held - share.counted, Ordering::AcqRel);
            }
            std::cmp::Ordering::Less => {
                share
                    .count
                    .fetch_sub(share.counted - held, Ordering::AcqRel);
            }
            std::cmp::Ordering::Equal => {}
        }
        share.counted = held;
    }

    /// `UNSUBSCRIBE`/`PUNSUBSCRIBE`/`SUNSUBSCRIBE` (`argv`): the names given, or all of the kind;
    /// each confirmed, and one confirmation with no name when there was none to drop.
    pub async fn unsubscribe_all(
        &mut self,
        pubsub: &PubSub,
        kind: SubscriptionKind,
        argv: Vec<Bytes>,
        protocol: Protocol,
    ) -> Bytes {
        let mut names: Vec<Bytes> = argv.into_iter().skip(1).collect();
        if names.is_empty() {
            names = self.names(kind);
        }
        let word = confirmation_word(kind, false);
        let mut out = BytesMut::new();
        if names.is_empty() {
            let frame = confirmation(word, None, self.count(kind), protocol);
            tollgate_resp::encode(&frame, &mut out);
        }
        for name in names {
            self.unsubscribe(pubsub, kind, &name).await;
            let frame = confirmation(word, Some(name), self.count(kind), protocol);
            tollgate_resp::encode(&frame, &mut out);
        }
        self.recount();
        out.freeze()
    }

    /// Stops delivering `name`; dropping the subscription unsubscribes on Redis if it was the last,
    /// and Redis has confirmed that when this returns (a `PUBLISH` right after the client's
    /// confirmation no longer counts the daemon's connection, as it would not count the client's).
    async fn unsubscribe(&mut self, pubsub: &PubSub, kind: SubscriptionKind, name: &Bytes) {
        if let Some(forwarder) = self.active.remove(&(kind, name.clone())) {
            forwarder.abort();
            // Cancelled, the task has dropped its subscription.
            let _ = forwarder.await;
            pubsub.unsubscribed(kind, name.clone()).await;
        }
    }

    pub fn clear(&mut self) {
        for (_, forwarder) in self.active.drain() {
            forwarder.abort();
        }
        self.recount();
    }

    /// The next message for this client, counted against its budget until the guard drops.
    pub async fn next(&mut self) -> Option<(Message, Option<Held>)> {
        self.receiver.recv().await
    }

    /// Cancelled when this client must be disconnected; [`Subscriptions::eviction_reason`] says why.
    pub fn eviction(&self) -> CancellationToken {
        self.evicted.clone()
    }

    pub fn eviction_reason(&self) -> Eviction {
        self.why
            .lock()
            .clone()
            .unwrap_or(Eviction::Ended(SubscriptionEnded::Closed))
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        self.clear();
    }
}

async fn forward(
    mut subscription: Subscription,
    sender: mpsc::Sender<(Message, Option<Held>)>,
    evicted: CancellationToken,
    why: Arc<Mutex<Option<Eviction>>>,
) {
    let reason = loop {
        match subscription.recv_held().await {
            Ok(message) => match sender.try_send(message) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    break Eviction::TooSlow(format!(
                        "subscriber too slow: {} messages waiting",
                        sender.max_capacity()
                    ))
                }
                // The session is gone; nothing to report.
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            },
            // Too slow, by count or by bytes: told why before the close.
            Err(ended @ (SubscriptionEnded::Lagged | SubscriptionEnded::OverBudget(_))) => {
                break Eviction::TooSlow(ended.to_string())
            }
            Err(ended) => break Eviction::Ended(ended),
        }
    };
    why.lock().get_or_insert(reason);
    evicted.cancel();
}

/// A delivered message as the client expects it: a push in RESP3, an array in RESP2.
pub fn message_frame(message: Message, protocol: Protocol) -> Frame {
    let bulk = Frame::Bulk;
    let items = match (message.kind, message.pattern) {
        (SubscriptionKind::Pattern, Some(pattern)) => vec![
            bulk(Bytes::from_static(b"pmessage")),
            bulk(pattern),
            bulk(message.channel),
            bulk(message.payload),
        ],
        (SubscriptionKind::Shard, _) => vec![
            bulk(Bytes::from_static(b"smessage")),
            bulk(message.channel),
            bulk(message.payload),
        ],
        _ => vec![
            bulk(Bytes::from_static(b"message")),
            bulk(message.channel),
            bulk(message.payload),
        ],
    };
    out_of_band(items, protocol)
}

/// `subscribe`/`unsubscribe` confirmations (and `LEASE WATCH`'s): `[kind, name, count]`.
pub(super) fn confirmation(
    kind: &'static str,
    name: Option<Bytes>,
    count: usize,
    protocol: Protocol,
) -> Frame {
    out_of_band(
        vec![
            Frame::Bulk(Bytes::from_static(kind.as_bytes())),
            name.map(Frame::Bulk)
                .unwrap_or_else(|| super::local::null(protocol)),
            Frame::Integer(count as i64),
        ],
        protocol,
    )
}

pub(super) fn out_of_band(items: Vec<Frame>, protocol: Protocol) -> Frame {
    match protocol {
        Protocol::Resp3 => Frame::Push(items),
        Protocol::Resp2 => Frame::Array(items),
    }
}

/// `(kind, true)` for the subscribe commands' confirmations, `(kind, false)` for the unsubscribes'.
fn confirmation_word(kind: SubscriptionKind, subscribe: bool) -> &'static str {
    match (kind, subscribe) {
        (SubscriptionKind::Channel, true) => "subscribe",
        (SubscriptionKind::Pattern, true) => "psubscribe",
        (SubscriptionKind::Shard, true) => "ssubscribe",
        (SubscriptionKind::Channel, false) => "unsubscribe",
        (SubscriptionKind::Pattern, false) => "punsubscribe",
        (SubscriptionKind::Shard, false) => "sunsubscribe",
    }
}
