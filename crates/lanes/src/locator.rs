//! Where the master is right now. Standalone: a fixed address. Sentinel: asked of the sentinels and
//! followed through failovers. Every sentinel's events are watched (only the failover's leader
//! announces the promotion, and any of them may lead): `+failover-state-wait-promotion` (the leader
//! has just told a replica to stop replicating and take the role), `+promoted-slave` (it took it)
//! and `+switch-master` (the sentinels' configuration moved). The master's address is also asked of
//! one sentinel every few seconds, and at once when the master refuses a write with `-READONLY`.
//! Sentinels are logged in to when they ask for a password (so that they need not stay open to
//! every local user). Each move bumps a generation; connections remember the generation they were
//! opened in, and a move closes the old ones (their in-flight replies become indeterminate).
//!
//! Which answer to believe is [`Course`]'s job, pure and unit-tested: after an event moved the
//! daemon away from a master, sentinels that have not yet heard of the failover still name the old
//! one for a while, and believing them would send writes back to a demoted server.

use std::time::Duration;

use std::sync::Arc;

use bytes::BytesMut;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tollgate_resp::Frame;

use crate::credentials::Credentials;
use crate::error::OpenError;
use crate::life::Life;
use crate::stream::{ExchangeError, Stream};
use crate::{Endpoint, SentinelAuth};

/// How long one exchange with a sentinel may take.
const SENTINEL_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the master's address is re-checked even without a `+switch-master` message.
const RECHECK: Duration = Duration::from_secs(5);
/// Pause before trying the next sentinel after one failed.
const RETRY: Duration = Duration::from_millis(200);
/// How long answers naming a master the daemon left on a failover event are taken as stale. A
/// sentinel that did not lead the failover learns the new configuration from the leader's hello
/// messages (every 2 s); this is several of those. A `-READONLY` from the new master ends it early.
const STALE_FOR: Duration = Duration::from_secs(10);
/// The least time between two `-READONLY`-prompted questions to the sentinels (a flood of refused
/// writes asks once).
const SUSPECT_EVERY: Duration = Duration::from_millis(100);
/// The sentinel channels followed: see the module's header.
const EVENTS: [&str; 3] = [
    "+switch-master",
    "+promoted-slave",
    "+failover-state-wait-promotion",
];

#[derive(Debug, Clone)]
struct Located {
    /// `None` until a sentinel has named the master; afterwards the last one named.
    master: Option<Endpoint>,
    generation: u64,
}

/// No sentinel has named the master yet, so nothing can be sent.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no sentinel has named the master of `{group}` yet")]
pub(crate) struct NoMaster {
    group: String,
}

/// Why one sentinel stopped being useful, so the follower tries the next.
#[derive(Debug, thiserror::Error)]
enum SentinelError {
    #[error("sentinel {sentinel}: {source}")]
    Io {
        sentinel: Endpoint,
        source: std::io::Error,
    },
    #[error("sentinel {sentinel}: no answer within {SENTINEL_TIMEOUT:?}")]
    Timeout { sentinel: Endpoint },
    #[error("sentinel {sentinel}: {source}")]
    Exchange {
        sentinel: Endpoint,
        source: ExchangeError,
    },
    #[error("sentinel {sentinel} refused the login as `{user}`: {reason}")]
    Refused {
        sentinel: Endpoint,
        user: String,
        reason: String,
    },
    #[error("sentinel {sentinel}: unreadable master address")]
    UnreadableAddress { sentinel: Endpoint },
    #[error("sentinel {sentinel} does not know master `{group}`: {reply}")]
    UnknownGroup {
        sentinel: Endpoint,
        group: String,
        reply: String,
    },
}

pub(crate) struct Locator {
    current: watch::Receiver<Located>,
    /// Woken when the master refused a write as a replica would (`-READONLY`).
    suspect: Arc<Notify>,
    /// The Sentinel group's name, for the error while no master is known.
    group: String,
    /// Keeps a fixed (standalone) address alive; the Sentinel follower owns its own sender.
    _fixed: Option<watch::Sender<Located>>,
}

/// The one server a [`Node`](crate::node::Node)'s lanes talk to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Server {
    /// At a fixed address: a standalone server, or one master of a cluster.
    Fixed(Endpoint),
    /// The master of a Sentinel group, wherever the sentinels say it is.
    Sentinel {
        master: String,
        sentinels: Vec<Endpoint>,
        /// Who the daemon logs in to the sentinels as; `None`: sentinels open to everyone.
        credentials: Option<Credentials>,
    },
}

/// The user and password `auth` names, the password read from its file now (the daemon keeps it
/// and never reads the file again, as the lanes do with theirs).
pub(crate) fn sentinel_credentials(auth: &SentinelAuth) -> Result<Option<Credentials>, OpenError> {
    let Some(path) = &auth.password_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|source| OpenError::SentinelPasswordFile {
        path: path.clone(),
        source,
    })?;
    Ok(Some(Credentials {
        user: auth.user.clone().unwrap_or_else(|| "default".to_owned()),
        password: text.lines().next().unwrap_or_default().to_owned(),
    }))
}

impl Locator {
    pub(crate) fn start(
        server: &Server,
        life: &std::sync::Arc<Life>,
        drivers: &mut JoinSet<()>,
    ) -> Locator {
        match server {
            Server::Fixed(endpoint) => {
                let (fixed, current) = watch::channel(Located {
                    master: Some(endpoint.clone()),
                    generation: 0,
                });
                Locator {
                    current,
                    suspect: Arc::new(Notify::new()),
                    group: String::new(),
                    _fixed: Some(fixed),
                }
            }
            Server::Sentinel {
                master,
                sentinels,
                credentials,
            } => {
                let (sender, current) = watch::channel(Located {
                    master: None,
                    generation: 0,
                });
                let suspect = Arc::new(Notify::new());
                let follower = follow(
                    master.clone(),
                    sentinels.clone(),
                    credentials.clone(),
                    sender,
                    suspect.clone(),
                );
                life.spawn_until_draining(drivers, follower);
                Locator {
                    current,
                    suspect,
                    group: master.clone(),
                    _fixed: None,
                }
            }
        }
    }

    /// The master's address now and the generation it belongs to.
    pub(crate) fn current(&self) -> Result<(Endpoint, u64), NoMaster> {
        let located = self.current.borrow();
        match &located.master {
            Some(endpoint) => Ok((endpoint.clone(), located.generation)),
            None => Err(NoMaster {
                group: self.group.clone(),
            }),
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.current.borrow().generation
    }

    /// The master answered a write `-READONLY`: it is a replica now, so the sentinels are asked at
    /// once instead of at the next re-check (nothing happens for a fixed address).
    pub(crate) fn refused_write(&self) {
        self.suspect.notify_one();
    }

    /// Resolves once the master has moved away from `generation` (never, for a fixed address).
    pub(crate) async fn moved(&self, generation: u64) {
        let mut current = self.current.clone();
        if current
            .wait_for(|l| l.generation != generation)
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }
}

/// What a sentinel's event says about the master of the followed group.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// A replica is taking the master's role (`+failover-state-wait-promotion`) or took it
    /// (`+promoted-slave`): announced by the failover's leader only.
    Promoted(Endpoint),
    /// The sentinels' configuration names a new master (`+switch-master`).
    Switched(Endpoint),
}

/// Which master to use, given what the sentinels said and when. Pure: the follower feeds it events
/// and answers and publishes what it returns.
#[derive(Debug, Default)]
struct Course {
    master: Option<Endpoint>,
    /// The master an event moved away from, and until when answers naming it are stale.
    left: Option<(Endpoint, Instant)>,
}

impl Course {
    /// An event: the master to move to, if it is a move.
    fn event(&mut self, event: Event, now: Instant) -> Option<Endpoint> {
        let (Event::Promoted(to) | Event::Switched(to)) = event;
        if self.master.as_ref() == Some(&to) {
            return None;
        }
        self.left = self.master.take().map(|old| (old, now + STALE_FOR));
        self.master = Some(to.clone());
        Some(to)
    }

    /// A sentinel named `named` as the master: the master to move to, if it is a move and the
    /// answer is not stale.
    fn answered(&mut self, named: Endpoint, now: Instant) -> Option<Endpoint> {
        if self.master.as_ref() == Some(&named) {
            return None;
        }
        if let Some((left, until)) = &self.left {
            if *left == named && now < *until {
                tracing::debug!(%named, "a sentinel still names the master left on a failover; not followed");
                return None;
            }
        }
        self.left = None;
        self.master = Some(named.clone());
        Some(named)
    }

    /// The master refused a write as a replica: the next answer is believed whatever it names.
    fn refused_write(&mut self) {
        self.left = None;
    }
}

/// Follows the master of `name` through the sentinels until the lanes close.
async fn follow(
    name: String,
    sentinels: Vec<Endpoint>,
    credentials: Option<Credentials>,
    sender: watch::Sender<Located>,
    suspect: Arc<Notify>,
) {
    // While the sentinels cannot be asked, the last known master stays in use.
    let publish = |master: Endpoint| {
        sender.send_if_modified(|located| {
            let moved = located.master.as_ref() != Some(&master);
            if moved {
                located.generation += 1;
                tracing::info!(%master, "redis master located");
                located.master = Some(master);
            }
            moved
        });
    };
    let (events_in, mut events) = mpsc::channel(64);
    // Dropped with this future (when the lanes close), which ends the watchers.
    let mut watchers = JoinSet::new();
    for sentinel in &sentinels {
        watchers.spawn(watch_events(
            name.clone(),
            sentinel.clone(),
            credentials.clone(),
            events_in.clone(),
        ));
    }
    drop(events_in);
    let mut course = Course::default();
    let mut last_suspect: Option<Instant> = None;
    for sentinel in sentinels.iter().cycle() {
        // This sentinel is asked every RECHECK (and on a refused write) until it fails.
        loop {
            match ask_master(&name, sentinel, credentials.as_ref()).await {
                Ok(named) => {
                    if let Some(master) = course.answered(named, Instant::now()) {
                        publish(master);
                    }
                }
                Err(error) => {
                    tracing::warn!(%sentinel, reason = %error, "sentinel did not answer; asking the next one");
                    tokio::time::sleep(RETRY).await;
                    break;
                }
            }
            let recheck = tokio::time::sleep(RECHECK);
            tokio::pin!(recheck);
            loop {
                tokio::select! {
                    _ = &mut recheck => break,
                    _ = suspect.notified() => {
                        if last_suspect.is_none_or(|at| at.elapsed() >= SUSPECT_EVERY) {
                            last_suspect = Some(Instant::now());
                            course.refused_write();
                            break;
                        }
                    }
                    Some(event) = events.recv() => {
                        if let Some(master) = course.event(event, Instant::now()) {
                            publish(master);
                        }
                    }
                }
            }
        }
    }
}

/// Forwards one sentinel's events about `name` to the follower, reconnecting after failures, until
/// the follower is gone.
async fn watch_events(
    name: String,
    sentinel: Endpoint,
    credentials: Option<Credentials>,
    forward: mpsc::Sender<Event>,
) {
    loop {
        let ended = subscribed(&name, &sentinel, credentials.as_ref(), &forward).await;
        if forward.is_closed() {
            return;
        }
        tracing::warn!(%sentinel, reason = %ended, "sentinel events ended; subscribing again");
        tokio::time::sleep(RETRY).await;
    }
}

/// Subscribes to [`EVENTS`] on one sentinel and forwards them until the connection fails (or the
/// follower is gone); returns why it ended.
async fn subscribed(
    name: &str,
    sentinel: &Endpoint,
    credentials: Option<&Credentials>,
    forward: &mpsc::Sender<Event>,
) -> SentinelError {
    let mut events = match connect(sentinel, credentials).await {
        Ok(stream) => stream,
        Err(error) => return error,
    };
    let mut read = BytesMut::new();
    let mut subscribe = vec!["SUBSCRIBE"];
    subscribe.extend(EVENTS);
    if let Err(error) = events.exchange(&mut read, &subscribe).await {
        return exchange_failed(sentinel, error);
    }
    loop {
        match events.next_frame(&mut read).await {
            Ok(frame) => {
                let event = switched_to(name, &frame)
                    .map(Event::Switched)
                    .or_else(|| promoted(name, &frame).map(Event::Promoted));
                if let Some(event) = event {
                    if forward.send(event).await.is_err() {
                        return SentinelError::Io {
                            sentinel: sentinel.clone(),
                            source: std::io::Error::other("the lanes closed"),
                        };
                    }
                }
            }
            Err(error) => return exchange_failed(sentinel, error),
        }
    }
}

/// A connection to `sentinel`, logged in as `credentials` when there are some (`AUTH`, which both
/// `requirepass` and an ACL user take; sentinels answer `HELLO` too, but `AUTH` is enough).
async fn connect(
    sentinel: &Endpoint,
    credentials: Option<&Credentials>,
) -> Result<Stream, SentinelError> {
    let open = async {
        let mut stream = Stream::connect(sentinel)
            .await
            .map_err(|source| SentinelError::Io {
                sentinel: sentinel.clone(),
                source,
            })?;
        if let Some(credentials) = credentials {
            let mut read = BytesMut::new();
            let auth = ["AUTH", &credentials.user, &credentials.password];
            match stream.exchange(&mut read, &auth).await {
                Ok(Frame::Error(reason)) => {
                    return Err(SentinelError::Refused {
                        sentinel: sentinel.clone(),
                        user: credentials.user.clone(),
                        reason: String::from_utf8_lossy(&reason).into_owned(),
                    })
                }
                Ok(_) => {}
                Err(error) => return Err(exchange_failed(sentinel, error)),
            }
        }
        Ok(stream)
    };
    match tokio::time::timeout(SENTINEL_TIMEOUT, open).await {
        Ok(result) => result,
        Err(_) => Err(SentinelError::Timeout {
            sentinel: sentinel.clone(),
        }),
    }
}

async fn ask_master(
    name: &str,
    sentinel: &Endpoint,
    credentials: Option<&Credentials>,
) -> Result<Endpoint, SentinelError> {
    let mut stream = connect(sentinel, credentials).await?;
    let mut read = BytesMut::new();
    let ask = ["SENTINEL", "get-master-addr-by-name", name];
    let reply = tokio::time::timeout(SENTINEL_TIMEOUT, stream.exchange(&mut read, &ask))
        .await
        .map_err(|_| SentinelError::Timeout {
            sentinel: sentinel.clone(),
        })?
        .map_err(|error| exchange_failed(sentinel, error))?;
    match reply {
        Frame::Array(items) => {
            address(items.first(), items.get(1)).ok_or_else(|| SentinelError::UnreadableAddress {
                sentinel: sentinel.clone(),
            })
        }
        other => Err(SentinelError::UnknownGroup {
            sentinel: sentinel.clone(),
            group: name.to_owned(),
            reply: format!("{other:?}"),
        }),
    }
}

/// `+switch-master` carries `<name> <old-ip> <old-port> <new-ip> <new-port>`.
fn switched_to(name: &str, frame: &Frame) -> Option<Endpoint> {
    let Frame::Array(items) = frame else {
        return None;
    };
    if items.first()?.as_bytes()?.as_ref() != b"message" {
        return None;
    }
    let payload = String::from_utf8(items.get(2)?.as_bytes()?.to_vec()).ok()?;
    let fields: Vec<&str> = payload.split(' ').collect();
    match fields.as_slice() {
        [group, _, _, host, port] if *group == name => Some(Endpoint::Tcp {
            host: (*host).to_owned(),
            port: port.parse().ok()?,
        }),
        _ => None,
    }
}

/// `+promoted-slave` and `+failover-state-wait-promotion` carry
/// `slave <ip>:<port> <ip> <port> @ <name> <master-ip> <master-port>`: the replica taking (or that
/// took) the master's role of `name`.
fn promoted(name: &str, frame: &Frame) -> Option<Endpoint> {
    let Frame::Array(items) = frame else {
        return None;
    };
    let channel = items.get(1)?.as_bytes()?.as_ref();
    if items.first()?.as_bytes()?.as_ref() != b"message"
        || !matches!(
            channel,
            b"+promoted-slave" | b"+failover-state-wait-promotion"
        )
    {
        return None;
    }
    let payload = String::from_utf8(items.get(2)?.as_bytes()?.to_vec()).ok()?;
    let fields: Vec<&str> = payload.split(' ').collect();
    match fields.as_slice() {
        ["slave", _, host, port, "@", group, _, _] if *group == name => Some(Endpoint::Tcp {
            host: (*host).to_owned(),
            port: port.parse().ok()?,
        }),
        _ => None,
    }
}

fn address(host: Option<&Frame>, port: Option<&Frame>) -> Option<Endpoint> {
    let host = String::from_utf8(host?.as_bytes()?.to_vec()).ok()?;
    let port = std::str::from_utf8(port?.as_bytes()?).ok()?.parse().ok()?;
    Some(Endpoint::Tcp { host, port })
}

fn exchange_failed(sentinel: &Endpoint, source: ExchangeError) -> SentinelError {
    SentinelError::Exchange {
        sentinel: sentinel.clone(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_switch_master_for_our_group_only() {
        let message = |payload: &str| {
            Frame::Array(vec![
                Frame::Bulk("message".into()),
                Frame::Bulk("+switch-master".into()),
                Frame::Bulk(payload.to_owned().into()),
            ])
        };
        assert_eq!(
            switched_to(
                "mymaster",
                &message("mymaster 127.0.0.1 6379 127.0.0.1 6380")
            ),
            Some(Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 6380
            })
        );
        assert_eq!(
            switched_to("mymaster", &message("other 127.0.0.1 6379 127.0.0.1 6380")),
            None
        );
    }

    #[test]
    fn reads_promoted_slave_for_our_group_only() {
        let message = |channel: &str, payload: &str| {
            Frame::Array(vec![
                Frame::Bulk("message".into()),
                Frame::Bulk(channel.to_owned().into()),
                Frame::Bulk(payload.to_owned().into()),
            ])
        };
        let payload = "slave 127.0.0.1:6380 127.0.0.1 6380 @ mymaster 127.0.0.1 6379";
        assert_eq!(
            promoted("mymaster", &message("+promoted-slave", payload)),
            Some(Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 6380
            })
        );
        assert_eq!(
            promoted("other", &message("+promoted-slave", payload)),
            None
        );
        // The same words on another channel, or a master's event, are not a promotion.
        assert_eq!(
            promoted("mymaster", &message("+switch-master", payload)),
            None
        );
        let master = "master mymaster 127.0.0.1 6379 @ mymaster 127.0.0.1 6379";
        assert_eq!(
            promoted("mymaster", &message("+promoted-slave", master)),
            None
        );
        // The leader's word that it told the replica to take the role counts the same.
        assert_eq!(
            promoted(
                "mymaster",
                &message("+failover-state-wait-promotion", payload)
            ),
            Some(Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 6380
            })
        );
        assert_eq!(
            promoted(
                "mymaster",
                &message("+failover-state-send-slaveof-noone", payload)
            ),
            None,
            "before the replica is told, the old master is still the master"
        );
    }

    fn at(port: u16) -> Endpoint {
        Endpoint::Tcp {
            host: "127.0.0.1".into(),
            port,
        }
    }

    #[test]
    fn an_answer_naming_the_master_left_on_a_promotion_is_stale_for_a_while() {
        let start = Instant::now();
        let mut course = Course::default();
        assert_eq!(course.answered(at(1), start), Some(at(1)));
        assert_eq!(course.event(Event::Promoted(at(2)), start), Some(at(2)));
        // A sentinel that did not lead the failover still names the old master.
        assert_eq!(course.answered(at(1), start + Duration::from_secs(1)), None);
        // The same promotion announced again, or switched by the others, is not a move.
        assert_eq!(course.event(Event::Switched(at(2)), start), None);
        assert_eq!(course.answered(at(2), start + Duration::from_secs(2)), None);
        assert_eq!(course.answered(at(1), start + Duration::from_secs(3)), None);
        // Past the bound the sentinels' word is the configuration again (a failover undone).
        assert_eq!(course.answered(at(1), start + STALE_FOR), Some(at(1)));
    }

    #[test]
    fn a_refused_write_makes_the_next_answer_believed() {
        let start = Instant::now();
        let mut course = Course::default();
        course.answered(at(1), start);
        course.event(Event::Promoted(at(2)), start);
        course.refused_write();
        assert_eq!(course.answered(at(1), start), Some(at(1)));
    }

    #[test]
    fn an_answer_naming_a_third_server_is_followed_at_once() {
        let start = Instant::now();
        let mut course = Course::default();
        course.answered(at(1), start);
        course.event(Event::Promoted(at(2)), start);
        assert_eq!(course.answered(at(3), start), Some(at(3)));
        // And the stale guard went with it: the first master may be named again.
        assert_eq!(course.answered(at(1), start), Some(at(1)));
    }
}
