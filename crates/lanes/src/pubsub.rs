//! PUBSUB: a few shared subscriber connections with local fan-out. Each name lives on one connection
//! (chosen by hash), is subscribed on Redis once however many local subscribers it has, and is
//! unsubscribed when the last of them goes. A subscriber that does not keep up loses its subscription
//! (`Lagged`) instead of making the daemon buffer without bound; a lost connection ends every
//! subscription on it (`Disconnected`), because messages may have been missed.
//!
//! On a cluster, a shard channel's slot can move to another master: Redis then drops the daemon's
//! subscription with an `sunsubscribe` nobody asked for (or answers a new `SSUBSCRIBE` with
//! `-MOVED`). The lane hands such a name's subscribers on ([`Moved`], through its [`Rehome`]) to be
//! subscribed again on the slot's new master ([`PubSubLane::adopt`]); they keep their subscriptions.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio::sync::{mpsc, oneshot};
use tollgate_model::{Lane, Protocol};
use tollgate_resp::Frame;
use tracing::Instrument;

use crate::budget::{Budget, Held, OverBudget};
use crate::conn::Conn;
use crate::connector::Connector;
use crate::error::LaneError;
use crate::life::Life;
use crate::metrics::{LaneMetrics, Rejection};
use crate::reply::reply_limits;
use crate::stream::Stream;
use crate::{Endpoint, Slot};

/// How many times in a row a shard channel's subscribers may be handed to another node before
/// Redis confirms them there; past it the slot map is not settling, and they end.
const MAX_MOVES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubscriptionKind {
    /// `SUBSCRIBE channel`
    Channel,
    /// `PSUBSCRIBE pattern`
    Pattern,
    /// `SSUBSCRIBE shard-channel`
    Shard,
}

/// One message delivered to a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub kind: SubscriptionKind,
    pub channel: Bytes,
    /// The pattern that matched, for [`SubscriptionKind::Pattern`].
    pub pattern: Option<Bytes>,
    pub payload: Bytes,
}

impl Message {
    /// The bytes it holds (what a subscriber's budget counts).
    pub fn size(&self) -> usize {
        self.channel.len() + self.pattern.as_ref().map_or(0, Bytes::len) + self.payload.len()
    }
}

/// Why a subscription delivers no more messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscriptionEnded {
    #[error("subscriber fell behind and its buffer overflowed; messages were dropped")]
    Lagged,
    /// Holding the next message would have broken the subscriber's budget; it was dropped.
    #[error("subscriber fell behind: {0}; messages were dropped")]
    OverBudget(OverBudget),
    #[error("subscriber connection lost: {reason}; messages may have been missed")]
    Disconnected { reason: String },
    #[error("lanes are closed (daemon shutting down)")]
    Closed,
}

type Key = (SubscriptionKind, Bytes);

/// A bounded receiver of messages for one name. Dropping it unsubscribes (on Redis, when it was the
/// last local subscriber of that name).
pub struct Subscription {
    receiver: mpsc::Receiver<(Message, Option<Held>)>,
    ended: Arc<Mutex<Option<SubscriptionEnded>>>,
    key: Key,
    id: u64,
    /// The connection the name lives on; another node's when its slot moved.
    home: Home,
    metrics: LaneMetrics,
}

/// A subscriber's connection, shared by the [`Subscription`] and its entry in the topic, so that a
/// move can tell the subscription where it went.
type Home = Arc<Mutex<Arc<Shard>>>;

/// Subscriber ids, unique across every lane: a moved subscriber keeps its id on its new lane.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl Subscription {
    /// The next message, in order; after the last one, why the subscription ended.
    pub async fn recv(&mut self) -> Result<Message, SubscriptionEnded> {
        self.recv_held().await.map(|(message, _held)| message)
    }

    /// [`Subscription::recv`], with the message still counted against the subscriber's budget
    /// (see [`PubSub::subscribe_charged`](crate::PubSub::subscribe_charged)) until the guard drops.
    pub async fn recv_held(&mut self) -> Result<(Message, Option<Held>), SubscriptionEnded> {
        match self.receiver.recv().await {
            Some(delivery) => Ok(delivery),
            None => Err(self
                .ended
                .lock()
                .clone()
                .unwrap_or(SubscriptionEnded::Closed)),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.metrics.in_use.dec();
        // Closed before the home is read: a move that carries this subscriber to another lane
        // meanwhile sees it gone there (see `PubSubLane::adopt`).
        self.receiver.close();
        let shard = self.home.lock().clone();
        let mut state = shard.state.lock();
        if let Some(topic) = state.topics.get_mut(&self.key) {
            topic.subscribers.retain(|s| s.id != self.id);
            if topic.subscribers.is_empty() {
                let unsubscribe = state.forget(self.key.clone());
                let _ = shard.control.send(unsubscribe);
            }
        }
    }
}

pub(crate) struct PubSubLane {
    shards: Vec<Arc<Shard>>,
    confirm_timeout: Duration,
    metrics: LaneMetrics,
    life: Arc<Life>,
}

struct Shard {
    state: Mutex<ShardState>,
    control: mpsc::UnboundedSender<Control>,
    rehome: Option<Rehome>,
}

/// Where a cluster node's lane sends the shard channels whose slot moved away from the node, to be
/// subscribed again on the slot's new master. One server has none: there such a name ends.
#[derive(Clone)]
pub(crate) struct Rehome {
    /// The node whose lane this is.
    pub(crate) from: Endpoint,
    pub(crate) sender: mpsc::UnboundedSender<Moved>,
}

/// A shard channel's subscribers that Redis let go of on `from`, because the channel's slot moved
/// away from it; on their way to the slot's new master.
pub(crate) struct Moved {
    pub(crate) from: Endpoint,
    key: Key,
    topic: Topic,
}

impl Moved {
    pub(crate) fn slot(&self) -> Slot {
        Slot::of(&self.key.1)
    }

    /// No new master takes them: every subscription of the name ends with `reason`.
    pub(crate) fn end(self, reason: String) {
        end_topic(self.topic, &SubscriptionEnded::Disconnected { reason });
    }
}

#[derive(Default)]
struct ShardState {
    topics: HashMap<Key, Topic>,
    /// Names whose last local subscriber left and whose unsubscribe is on its way to Redis: until
    /// Redis confirms it, Redis still counts the daemon's connection as subscribed.
    leaving: HashMap<Key, Leaving>,
}

#[derive(Default)]
struct Leaving {
    /// Unsubscribes sent or to be sent (a name can leave, return and leave again meanwhile).
    unsubscribes: usize,
    /// Told (or dropped) once the last of them is done with.
    waiters: Vec<oneshot::Sender<()>>,
}

impl ShardState {
    /// Forgets `key`, whose last local subscriber is gone; returns the unsubscribe to send.
    fn forget(&mut self, key: Key) -> Control {
        self.topics.remove(&key);
        self.leaving.entry(key.clone()).or_default().unsubscribes += 1;
        Control::Unsubscribe(key)
    }

    /// One unsubscribe of `key` is done with: Redis confirmed it, or it was not needed.
    fn left(&mut self, key: &Key) {
        if let Some(leaving) = self.leaving.get_mut(key) {
            leaving.unsubscribes -= 1;
            if leaving.unsubscribes == 0 {
                // Dropping the waiters' senders tells them.
                self.leaving.remove(key);
            }
        }
    }
}

#[derive(Default)]
struct Topic {
    subscribers: Vec<Subscriber>,
    confirmed: bool,
    waiters: Vec<oneshot::Sender<Result<(), LaneError>>>,
    /// How many times it was handed to another node since Redis last confirmed it.
    moves: usize,
}

struct Subscriber {
    id: u64,
    home: Home,
    sender: mpsc::Sender<(Message, Option<Held>)>,
    budget: Option<Arc<dyn Budget>>,
    ended: Arc<Mutex<Option<SubscriptionEnded>>>,
}

enum Control {
    Subscribe(Key),
    Unsubscribe(Key),
}

impl PubSubLane {
    /// Starts the lane's `connections` drivers; on a cluster node, `rehome` takes the shard
    /// channels whose slot moved away.
    pub(crate) fn start(
        connections: usize,
        confirm_timeout: Duration,
        connector: Arc<Connector>,
        metrics: LaneMetrics,
        life: Arc<Life>,
        rehome: Option<Rehome>,
        drivers: &mut tokio::task::JoinSet<()>,
    ) -> Arc<Self> {
        let shards = (0..connections)
            .map(|connection| {
                let (control, receiver) = mpsc::unbounded_channel();
                let shard = Arc::new(Shard {
                    state: Mutex::new(ShardState::default()),
                    control,
                    rehome: rehome.clone(),
                });
                let span = tracing::info_span!("lane", lane = %Lane::Pubsub, connection);
                drivers.spawn(
                    drive(shard.clone(), receiver, connector.clone(), life.clone())
                        .instrument(span),
                );
                shard
            })
            .collect();
        Arc::new(PubSubLane {
            shards,
            confirm_timeout,
            metrics,
            life,
        })
    }

    /// Subscribes to `name`; resolves once Redis confirmed the subscription, so that no message
    /// published after this returns is missed.
    pub(crate) async fn subscribe(
        &self,
        kind: SubscriptionKind,
        name: Bytes,
        capacity: usize,
        budget: Option<Arc<dyn Budget>>,
    ) -> Result<Subscription, LaneError> {
        if !self.life.is_open() {
            self.metrics.reject(Rejection::Closed);
            return Err(LaneError::Closed);
        }
        let key = (kind, name);
        let shard = self.shard_of(&key).clone();
        let (sender, receiver) = mpsc::channel(capacity.max(1));
        let ended = Arc::new(Mutex::new(None));
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let home = Arc::new(Mutex::new(shard.clone()));
        let confirmation = {
            let mut state = shard.state.lock();
            let fresh = !state.topics.contains_key(&key);
            let topic = state.topics.entry(key.clone()).or_default();
            topic.subscribers.push(Subscriber {
                id,
                home: home.clone(),
                sender,
                budget,
                ended: ended.clone(),
            });
            let confirmation = (!topic.confirmed).then(|| {
                let (waiter, confirmation) = oneshot::channel();
                topic.waiters.push(waiter);
                confirmation
            });
            if fresh {
                let _ = shard.control.send(Control::Subscribe(key.clone()));
            }
            confirmation
        };
        self.metrics.in_use.inc();
        // Built before waiting so that every way out of this function unsubscribes cleanly.
        let subscription = Subscription {
            receiver,
            ended,
            key,
            id,
            home,
            metrics: self.metrics.clone(),
        };
        if let Some(confirmation) = confirmation {
            match tokio::time::timeout(self.confirm_timeout, confirmation).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(error))) => return Err(self.rejected(error)),
                Ok(Err(_)) => return Err(self.rejected(LaneError::Closed)),
                Err(_) => {
                    return Err(self.rejected(LaneError::Unavailable {
                        reason: format!(
                            "redis did not confirm the subscription within {:?}",
                            self.confirm_timeout
                        ),
                    }))
                }
            }
        }
        Ok(subscription)
    }

    /// Takes in `moved`'s subscribers, whose slot is now this node's, and subscribes them here:
    /// their subscriptions go on, their waiters are answered once Redis confirms.
    pub(crate) fn adopt(&self, moved: Moved) {
        let Moved { key, mut topic, .. } = moved;
        if !self.life.is_open() {
            end_topic(topic, &SubscriptionEnded::Closed);
            return;
        }
        let shard = self.shard_of(&key).clone();
        let mut state = shard.state.lock();
        for subscriber in &topic.subscribers {
            *subscriber.home.lock() = shard.clone();
        }
        // Dropped on the way, while its home still named the old lane: nobody else removes it.
        topic
            .subscribers
            .retain(|subscriber| !subscriber.sender.is_closed());
        match state.topics.get_mut(&key) {
            // Subscribed here meanwhile by a subscriber routed by a fresher map.
            Some(here) => {
                if here.confirmed {
                    for waiter in topic.waiters.drain(..) {
                        let _ = waiter.send(Ok(()));
                    }
                }
                here.subscribers.append(&mut topic.subscribers);
                here.waiters.append(&mut topic.waiters);
            }
            None if topic.subscribers.is_empty() => {}
            None => {
                topic.confirmed = false;
                state.topics.insert(key.clone(), topic);
                let _ = shard.control.send(Control::Subscribe(key));
            }
        }
    }

    fn rejected(&self, error: LaneError) -> LaneError {
        let cause = match error {
            LaneError::Closed => Rejection::Closed,
            _ => Rejection::Unavailable,
        };
        self.metrics.reject(cause);
        error
    }

    /// Resolves once Redis has confirmed the daemon's unsubscribe of `name` after its last local
    /// subscriber left (at once when none is on its way), or when the confirmation timeout passes
    /// or the connection is lost: Redis no longer counts the daemon as subscribed to it.
    pub(crate) async fn unsubscribed(&self, kind: SubscriptionKind, name: Bytes) {
        let key = (kind, name);
        let told = {
            let mut state = self.shard_of(&key).state.lock();
            state.leaving.get_mut(&key).map(|leaving| {
                let (waiter, told) = oneshot::channel();
                leaving.waiters.push(waiter);
                told
            })
        };
        if let Some(told) = told {
            let _ = tokio::time::timeout(self.confirm_timeout, told).await;
        }
    }

    /// How many local subscribers `name` has, if the daemon's own subscription to it is active in
    /// Redis (so Redis counts the daemon's connection once for all of them).
    pub(crate) fn local_subscribers(&self, kind: SubscriptionKind, name: Bytes) -> Option<usize> {
        let key = (kind, name);
        let state = self.shard_of(&key).state.lock();
        let topic = state.topics.get(&key)?;
        topic.confirmed.then_some(topic.subscribers.len())
    }

    /// Every active pattern subscription with its number of local subscribers.
    pub(crate) fn patterns(&self) -> Vec<(Bytes, usize)> {
        let mut patterns = Vec::new();
        for shard in &self.shards {
            let state = shard.state.lock();
            patterns.extend(
                state
                    .topics
                    .iter()
                    .filter(|((kind, _), topic)| {
                        *kind == SubscriptionKind::Pattern && topic.confirmed
                    })
                    .map(|((_, pattern), topic)| (pattern.clone(), topic.subscribers.len())),
            );
        }
        patterns
    }

    fn shard_of(&self, key: &Key) -> &Arc<Shard> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        key.1.hash(&mut hasher);
        &self.shards[hasher.finish() as usize % self.shards.len()]
    }
}

impl Shard {
    /// Ends every subscription with `why` and forgets all names (the connection that held them is gone).
    fn end_all(&self, why: &SubscriptionEnded) {
        let topics = {
            let mut state = self.state.lock();
            // The connection that held them is gone, and with it what Redis counted.
            state.leaving.clear();
            std::mem::take(&mut state.topics)
        };
        for (_, topic) in topics {
            end_topic(topic, why);
        }
    }

    /// Redis let go of `key` (taken out of the state already) because its slot left this node:
    /// its subscribers go on to the slot's new master, or end where there is no cluster to follow.
    fn moved(&self, key: Key, mut topic: Topic) {
        topic.moves += 1;
        let reason = match &self.rehome {
            None => {
                "redis dropped the subscription: its slot moved away from the server".to_owned()
            }
            Some(_) if topic.moves > MAX_MOVES => format!(
                "the shard channel's slot moved {MAX_MOVES} times without a master confirming it"
            ),
            Some(rehome) => {
                let moved = Moved {
                    from: rehome.from.clone(),
                    key,
                    topic,
                };
                if let Err(unsent) = rehome.sender.send(moved) {
                    // The cluster's lanes are closing.
                    end_topic(unsent.0.topic, &SubscriptionEnded::Closed);
                }
                return;
            }
        };
        end_topic(topic, &SubscriptionEnded::Disconnected { reason });
    }
}

fn end_topic(topic: Topic, why: &SubscriptionEnded) {
    for subscriber in topic.subscribers {
        *subscriber.ended.lock() = Some(why.clone());
    }
    let error = match why {
        SubscriptionEnded::Closed => LaneError::Closed,
        other => LaneError::Unavailable {
            reason: other.to_string(),
        },
    };
    for waiter in topic.waiters {
        let _ = waiter.send(Err(error.clone()));
    }
}

async fn drive(
    shard: Arc<Shard>,
    mut control: mpsc::UnboundedReceiver<Control>,
    connector: Arc<Connector>,
    life: Arc<Life>,
) {
    loop {
        let first = tokio::select! {
            biased;
            _ = life.draining().cancelled() => break,
            command = control.recv() => match command {
                Some(Control::Subscribe(key)) => key,
                // Nothing is subscribed while disconnected.
                Some(Control::Unsubscribe(key)) => {
                    shard.state.lock().left(&key);
                    continue;
                }
                None => break,
            },
        };
        // The lane reads messages itself and hands them on decoded: RESP2 is its own protocol.
        match connector.connect(Protocol::Resp2).await {
            Ok(conn) => {
                let span = conn.span();
                let reason = serve(&shard, conn, first, &mut control, &life, &connector)
                    .instrument(span)
                    .await;
                if let Some(reason) = reason {
                    connector.note_lost();
                    shard.end_all(&SubscriptionEnded::Disconnected { reason });
                }
            }
            Err(error) => shard.end_all(&SubscriptionEnded::Disconnected {
                reason: error.to_string(),
            }),
        }
    }
    shard.end_all(&SubscriptionEnded::Closed);
}

/// Serves one connection until it is lost (returns why) or the lanes close (returns `None`).
async fn serve(
    shard: &Shard,
    conn: Conn,
    first: Key,
    control: &mut mpsc::UnboundedReceiver<Control>,
    life: &Life,
    connector: &Connector,
) -> Option<String> {
    let moved = connector.moved(conn.generation());
    tokio::pin!(moved);
    let (stream, mut read, _tracked) = conn.into_parts();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut unconfirmed = VecDeque::new();
    let mut pending = vec![Control::Subscribe(first)];
    loop {
        for command in pending.drain(..) {
            if let Err(error) = apply(shard, command, &mut writer, &mut unconfirmed).await {
                return Some(error.to_string());
            }
        }
        tokio::select! {
            biased;
            _ = life.draining().cancelled() => return None,
            _ = &mut moved => return Some("the redis master moved to another server".into()),
            command = control.recv() => match command {
                Some(command) => pending.push(command),
                None => return None,
            },
            n = reader.read_buf(&mut read) => match n {
                Ok(0) => return Some("connection closed by redis".into()),
                Err(error) => return Some(error.to_string()),
                Ok(_) => loop {
                    match tollgate_resp::parse(&mut read, &reply_limits()) {
                        Ok(Some(frame)) => pending.extend(handle(shard, frame, &mut unconfirmed)),
                        Ok(None) => break,
                        Err(error) => return Some(format!("redis sent an unreadable message: {error}")),
                    }
                },
            },
        }
    }
}

/// Writes the Redis command for `command`, unless it no longer needs one.
async fn apply(
    shard: &Shard,
    command: Control,
    writer: &mut WriteHalf<Stream>,
    unconfirmed: &mut VecDeque<Key>,
) -> std::io::Result<()> {
    let (verb, key): (&[u8], Key) = match command {
        Control::Subscribe(key) => {
            let wanted = shard
                .state
                .lock()
                .topics
                .get(&key)
                .is_some_and(|t| !t.confirmed);
            if !wanted {
                return Ok(());
            }
            unconfirmed.push_back(key.clone());
            let verb: &[u8] = match key.0 {
                SubscriptionKind::Channel => b"SUBSCRIBE",
                SubscriptionKind::Pattern => b"PSUBSCRIBE",
                SubscriptionKind::Shard => b"SSUBSCRIBE",
            };
            (verb, key)
        }
        Control::Unsubscribe(key) => {
            let resubscribed = {
                let mut state = shard.state.lock();
                let resubscribed = state.topics.contains_key(&key);
                if resubscribed {
                    state.left(&key);
                }
                resubscribed
            };
            if resubscribed {
                // Subscribed again before we got here: keep it.
                return Ok(());
            }
            let verb: &[u8] = match key.0 {
                SubscriptionKind::Channel => b"UNSUBSCRIBE",
                SubscriptionKind::Pattern => b"PUNSUBSCRIBE",
                SubscriptionKind::Shard => b"SUNSUBSCRIBE",
            };
            (verb, key)
        }
    };
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(&[verb, &key.1[..]], &mut out);
    writer.write_all(&out).await
}

/// Acts on one frame from the subscriber connection; returns follow-up commands (unsubscribing names
/// whose last subscriber just went away).
fn handle(shard: &Shard, frame: Frame, unconfirmed: &mut VecDeque<Key>) -> Option<Control> {
    let items = match frame {
        Frame::Array(items) | Frame::Push(items) => items,
        error @ (Frame::Error(_) | Frame::BulkError(_)) => {
            // Errors answer subscribe commands in order: the oldest unconfirmed one was refused.
            let key = unconfirmed.pop_front()?;
            let reason =
                String::from_utf8_lossy(error.as_bytes().map(|b| &b[..]).unwrap_or_default())
                    .into_owned();
            let topic = shard.state.lock().topics.remove(&key)?;
            // A shard channel's slot that is another node's (the map routing here was stale).
            if key.0 == SubscriptionKind::Shard
                && reason.starts_with("MOVED ")
                && shard.rehome.is_some()
            {
                shard.moved(key, topic);
                return None;
            }
            let why = SubscriptionEnded::Disconnected {
                reason: format!("redis refused the subscription: {reason}"),
            };
            end_topic(topic, &why);
            return None;
        }
        _ => return None,
    };
    let text = |i: usize| items.get(i).and_then(Frame::as_bytes).cloned();
    let kind_word = text(0)?;
    let (kind, confirm) = match &kind_word[..] {
        b"subscribe" => (SubscriptionKind::Channel, true),
        b"psubscribe" => (SubscriptionKind::Pattern, true),
        b"ssubscribe" => (SubscriptionKind::Shard, true),
        b"message" => (SubscriptionKind::Channel, false),
        b"pmessage" => (SubscriptionKind::Pattern, false),
        b"smessage" => (SubscriptionKind::Shard, false),
        unsubscribed @ (b"unsubscribe" | b"punsubscribe" | b"sunsubscribe") => {
            let kind = match unsubscribed {
                b"unsubscribe" => SubscriptionKind::Channel,
                b"punsubscribe" => SubscriptionKind::Pattern,
                _ => SubscriptionKind::Shard,
            };
            let key = (kind, text(1)?);
            let mut state = shard.state.lock();
            // No unsubscribe of ours on its way: Redis let go of it by itself, which it does to a
            // shard channel whose slot leaves the node (`removeChannelsInSlot`).
            let unasked = kind == SubscriptionKind::Shard && !state.leaving.contains_key(&key);
            let moved = match unasked {
                true => state.topics.remove(&key),
                false => None,
            };
            match moved {
                Some(topic) => {
                    drop(state);
                    shard.moved(key, topic);
                }
                None => state.left(&key),
            }
            return None;
        }
        _ => return None,
    };
    let mut state = shard.state.lock();
    if confirm {
        let key = (kind, text(1)?);
        unconfirmed.retain(|k| *k != key);
        if let Some(topic) = state.topics.get_mut(&key) {
            topic.confirmed = true;
            topic.moves = 0;
            for waiter in topic.waiters.drain(..) {
                let _ = waiter.send(Ok(()));
            }
        }
        return None;
    }
    let message = match kind {
        SubscriptionKind::Pattern => Message {
            kind,
            pattern: text(1),
            channel: text(2)?,
            payload: text(3)?,
        },
        _ => Message {
            kind,
            pattern: None,
            channel: text(1)?,
            payload: text(2)?,
        },
    };
    let key = (
        kind,
        message
            .pattern
            .clone()
            .unwrap_or_else(|| message.channel.clone()),
    );
    let topic = state.topics.get_mut(&key)?;
    let size = message.size();
    topic.subscribers.retain(|subscriber| {
        // Counted before it is queued, so that a refused message is never held.
        let held = match &subscriber.budget {
            Some(budget) => match Held::new(budget, size) {
                Ok(held) => Some(held),
                Err(over) => {
                    *subscriber.ended.lock() = Some(SubscriptionEnded::OverBudget(over));
                    return false;
                }
            },
            None => None,
        };
        match subscriber.sender.try_send((message.clone(), held)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                *subscriber.ended.lock() = Some(SubscriptionEnded::Lagged);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    });
    if topic.subscribers.is_empty() {
        return Some(state.forget(key));
    }
    None
}
