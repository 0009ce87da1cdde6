//! Where the master is right now. Standalone: a fixed address. Sentinel: asked of the sentinels and
//! followed through failovers by a task subscribed to `+promoted-slave` (the replica took the
//! role) and `+switch-master` (with a periodic re-check in case a notification was missed), logged
//! in to the sentinels when they ask for a password (so that they need not stay open to every
//! local user). Each move bumps a generation; connections remember the generation
//! they were opened in, and a move closes the old ones (their in-flight replies become indeterminate).

use std::time::Duration;

use bytes::BytesMut;
use tokio::sync::watch;
use tokio::task::JoinSet;
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
                let follower = follow(
                    master.clone(),
                    sentinels.clone(),
                    credentials.clone(),
                    sender,
                );
                life.spawn_until_draining(drivers, follower);
                Locator {
                    current,
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

/// Follows the master of `name` through the sentinels until the lanes close.
async fn follow(
    name: String,
    sentinels: Vec<Endpoint>,
    credentials: Option<Credentials>,
    sender: watch::Sender<Located>,
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
    for sentinel in sentinels.iter().cycle() {
        let outcome = watch_sentinel(&name, sentinel, credentials.as_ref(), &publish).await;
        tracing::warn!(%sentinel, reason = %outcome, "sentinel connection ended; trying the next one");
        tokio::time::sleep(RETRY).await;
    }
}

/// Subscribes to `+switch-master` on one sentinel, asks it for the master, and follows it until the
/// connection fails; returns why it ended.
async fn watch_sentinel(
    name: &str,
    sentinel: &Endpoint,
    credentials: Option<&Credentials>,
    publish: &impl Fn(Endpoint),
) -> SentinelError {
    let mut events = match connect(sentinel, credentials).await {
        Ok(stream) => stream,
        Err(error) => return error,
    };
    let mut read = BytesMut::new();
    // `+promoted-slave` comes when the replica took the master's role, before the sentinels
    // reconfigure the rest and announce `+switch-master` (~1 s later): writes go to the new master
    // from the promotion on, not to the old one in between (issue 34).
    let subscribe = ["SUBSCRIBE", "+switch-master", "+promoted-slave"];
    if let Err(error) = events.exchange(&mut read, &subscribe).await {
        return exchange_failed(sentinel, error);
    }
    // Asked only after subscribing, so that a failover in between is not missed.
    loop {
        match ask_master(name, sentinel, credentials).await {
            Ok(master) => publish(master),
            Err(error) => return error,
        }
        let deadline = tokio::time::sleep(RECHECK);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                message = events.next_frame(&mut read) => match message {
                    Ok(frame) => {
                        let moved = switched_to(name, &frame).or_else(|| promoted(name, &frame));
                        if let Some(master) = moved {
                            publish(master);
                        }
                    }
                    Err(error) => return exchange_failed(sentinel, error),
                },
            }
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

/// `+promoted-slave` carries `slave <ip>:<port> <ip> <port> @ <name> <master-ip> <master-port>`:
/// the replica now master of `name`.
fn promoted(name: &str, frame: &Frame) -> Option<Endpoint> {
    let Frame::Array(items) = frame else {
        return None;
    };
    if items.first()?.as_bytes()?.as_ref() != b"message"
        || items.get(1)?.as_bytes()?.as_ref() != b"+promoted-slave"
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
    }
}
