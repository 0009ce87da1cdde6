//! The lease service the daemon serves: binds attempts to the caller's identity (principal and
//! uid), checks requests against the configured bounds, waits for held leases (release
//! notification or holder expiry, whichever is first; one waiter per resource at a time), starts
//! watchdogs, and starts watches of holder changes (`watch.rs`). Waiters for a semaphore or
//! read/write lease keep strict arrival order: they line up before their first try, and the head
//! of the line stands at the head in Redis too, so that nobody, waiting or not, passes it
//! (`calls::shared`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::registry::Registry;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tollgate_lanes::{Lanes, PubSub, Subscription, SubscriptionKind};

use crate::api::{AcquireRequest, LeaseEvent, ReleaseRequest, RenewRequest, MAX_VALUE_LEN};
use crate::attempt::{Attempt, Identity};
use crate::calls::{BoundAttempt, Calls, Durability};
use crate::config::LeaseConfig;
use crate::holder::Holder;
use crate::keys::LeaseKeys;
use crate::keys_memo::KeysMemo;
use crate::metrics::LeaseMetrics;
use crate::outcome::{AcquireOutcome, InspectOutcome, ReleaseOutcome, RenewOutcome};
use crate::places::{AtLimit, Limits, Places};
use crate::queue::WaitLines;
use crate::resource::Resource;
use crate::scripts::ScriptRunner;
use crate::shape::{Shape, Shared};
use crate::state::Holding;
use crate::watch::{self, Watch, WatchRefused};
use crate::watchdog::{Guard, Watchdogs};
use crate::InvalidRequest;

#[derive(Clone)]
pub struct LeaseService {
    calls: Calls,
    pubsub: PubSub,
    config: LeaseConfig,
    lines: std::sync::Arc<WaitLines>,
    /// The keys of the resources named lately.
    keys: std::sync::Arc<KeysMemo>,
    watchdogs: Watchdogs,
    /// The holder watches open, per user of a principal.
    watches: Places,
    metrics: LeaseMetrics,
    shutdown: CancellationToken,
}

/// What the service holds and waits for right now, for `tollgate status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LeaseCensus {
    /// Leases this daemon keeps alive for their holders (watchdogs, session leases).
    pub kept: usize,
    /// Callers waiting for a held lease, over every resource.
    pub waiting: usize,
}

/// What one user of a principal holds of the service's bounded places, for `/v1/principals`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserPlaces {
    pub watchdogs: usize,
    pub watches: usize,
}

impl LeaseService {
    /// Each user's watchdogs and holder watches, for users holding any.
    pub fn places_by_user(&self) -> HashMap<Identity, UserPlaces> {
        let mut users: HashMap<Identity, UserPlaces> = HashMap::new();
        for (user, count) in self.watchdogs.by_user() {
            users.entry(user).or_default().watchdogs = count;
        }
        for (user, count) in self.watches.by_user() {
            users.entry(user).or_default().watches = count;
        }
        users
    }

    /// Whether a watchdog keeps `identity`'s lease of `resource` under `attempt` alive (the
    /// daemon's count of leases held under a quota asks).
    pub fn keeps(&self, identity: &Identity, resource: &Resource, attempt: &Attempt) -> bool {
        let key = (
            self.keys.keys(resource).lease.clone(),
            bind(identity, attempt),
        );
        self.watchdogs.guards(&key)
    }

    pub fn census(&self) -> LeaseCensus {
        LeaseCensus {
            kept: self.watchdogs.running(),
            waiting: self.lines.waiting(),
        }
    }

    pub fn new(lanes: &Lanes, config: LeaseConfig, registry: &mut Registry) -> LeaseService {
        LeaseService {
            calls: Calls::new(ScriptRunner::new(lanes.clone()), config.drift_budget),
            pubsub: lanes.pubsub(),
            config,
            lines: Default::default(),
            keys: Default::default(),
            watchdogs: Watchdogs::default(),
            watches: Places::default(),
            metrics: LeaseMetrics::register(registry),
            shutdown: CancellationToken::new(),
        }
    }

    /// Acquires for `identity`, waiting up to `request.wait`. With `holder`, a watchdog keeps the
    /// lease for as long as the holder lives.
    pub async fn acquire(
        &self,
        identity: &Identity,
        resource: &Resource,
        request: &AcquireRequest,
        holder: Option<Holder>,
    ) -> Result<AcquireOutcome, InvalidRequest> {
        check_attempt(&request.attempt)?;
        self.check_ttl(request.ttl)?;
        let shape = request.shape()?;
        if let Some(value) = &request.value {
            if value.len() > MAX_VALUE_LEN {
                return Err(InvalidRequest {
                    field: "value",
                    message: format!("at most {MAX_VALUE_LEN} bytes"),
                });
            }
            // Leader election's value names the one holder; a shared resource has many.
            if shape != Shape::Exclusive {
                return Err(InvalidRequest {
                    field: "value",
                    message: "only an exclusive lease keeps a value".into(),
                });
            }
        }
        if request.wait > self.config.max_wait {
            return Err(InvalidRequest {
                field: "wait_ms",
                message: format!("at most {} ms", self.config.max_wait.as_millis()),
            });
        }
        let keys = self.keys.keys(resource);
        let attempt = bind(identity, &request.attempt);
        let slot = match &holder {
            Some(_) => match self.watchdogs.reserve(
                identity,
                &(keys.lease.clone(), attempt.clone()),
                Limits {
                    total: self.config.max_watchdogs,
                    per_uid: self.config.max_watchdogs_per_uid,
                },
            ) {
                Ok(slot) => slot,
                Err(AtLimit { limit }) => {
                    let outcome = AcquireOutcome::TooManyWatchdogs { limit };
                    self.metrics.outcome("acquire", &outcome);
                    return Ok(outcome);
                }
            },
            None => None,
        };
        let deadline = Instant::now() + request.wait;
        let outcome = match shape {
            Shape::Exclusive => {
                self.acquire_waiting(&keys, &attempt, request, deadline)
                    .await
            }
            Shape::Shared(shape) => {
                self.acquire_shared(&keys, &attempt, request, shape, deadline)
                    .await
            }
        };
        self.metrics.outcome("acquire", &outcome);
        if let (
            Some(holder),
            Some(slot),
            AcquireOutcome::Acquired { fence, valid_for }
            | AcquireOutcome::Replayed { fence, valid_for },
        ) = (holder, slot, &outcome)
        {
            let now = Instant::now();
            self.watchdogs.start(
                Guard {
                    calls: self.calls.clone(),
                    keys,
                    attempt,
                    ttl: request.ttl,
                    holding: Holding::new(*fence, now, *valid_for),
                    holder,
                    hold_until: now + self.config.max_hold,
                    metrics: self.metrics.clone(),
                },
                slot,
                &self.shutdown,
            );
        }
        Ok(outcome)
    }

    pub async fn renew(
        &self,
        identity: &Identity,
        resource: &Resource,
        request: &RenewRequest,
    ) -> Result<RenewOutcome, InvalidRequest> {
        check_attempt(&request.attempt)?;
        self.check_ttl(request.ttl)?;
        let attempt = bind(identity, &request.attempt);
        let outcome = self
            .calls
            .renew(&self.keys.keys(resource), &attempt, request.ttl)
            .await;
        self.metrics.outcome("renew", &outcome);
        Ok(outcome)
    }

    /// Releases, stopping the lease's watchdog first so it does not renew what is being let go.
    pub async fn release(
        &self,
        identity: &Identity,
        resource: &Resource,
        request: &ReleaseRequest,
    ) -> Result<ReleaseOutcome, InvalidRequest> {
        check_attempt(&request.attempt)?;
        let keys = self.keys.keys(resource);
        let attempt = bind(identity, &request.attempt);
        let outcome = self.calls.release(&keys, &attempt).await;
        if matches!(
            outcome,
            ReleaseOutcome::Released | ReleaseOutcome::AlreadyAbsent
        ) {
            self.watchdogs.stop(&keys.lease, &attempt);
        }
        self.metrics.outcome("release", &outcome);
        Ok(outcome)
    }

    pub async fn inspect(
        &self,
        identity: &Identity,
        resource: &Resource,
        attempt: Option<&Attempt>,
    ) -> Result<InspectOutcome, InvalidRequest> {
        if let Some(attempt) = attempt {
            check_attempt(attempt)?;
        }
        let bound = attempt.map(|attempt| bind(identity, attempt));
        let outcome = self
            .calls
            .inspect(&self.keys.keys(resource), bound.as_ref())
            .await;
        self.metrics.outcome("inspect", &outcome);
        Ok(outcome)
    }

    /// The watchdog's events for a lease `identity` holds with `attempt`; `None` when no watchdog
    /// guards it.
    pub fn events(
        &self,
        identity: &Identity,
        resource: &Resource,
        attempt: &Attempt,
    ) -> Result<Option<broadcast::Receiver<LeaseEvent>>, InvalidRequest> {
        check_attempt(attempt)?;
        let key = (
            self.keys.keys(resource).lease.clone(),
            bind(identity, attempt),
        );
        Ok(self.watchdogs.subscribe(&key))
    }

    /// Follows who holds `resource` for `identity`: its holder now, then every change (see
    /// `watch.rs`). The watch ends when it is dropped, or after an `interrupted` event. Refused,
    /// with nothing subscribed, when the caller's user already has `leases.max_watches_per_uid`
    /// watches open or the daemon `leases.max_watches`.
    pub async fn watch(
        &self,
        identity: &Identity,
        resource: &Resource,
    ) -> Result<Watch, WatchRefused> {
        let limits = Limits {
            total: self.config.max_watches,
            per_uid: self.config.max_watches_per_uid,
        };
        let place = self
            .watches
            .take(identity, limits)
            .map_err(|AtLimit { limit }| WatchRefused::TooMany { limit })?;
        let events = watch::start(
            &self.calls,
            &self.pubsub,
            LeaseKeys::clone(&self.keys.keys(resource)),
            &self.shutdown,
        )
        .await
        .map_err(WatchRefused::Unavailable)?;
        Ok(Watch::new(events, place))
    }

    /// Daemon shutdown: stops every watchdog (their leases run out by TTL) and every wait.
    pub fn close(&self) {
        self.shutdown.cancel();
    }

    fn check_ttl(&self, ttl: Duration) -> Result<(), InvalidRequest> {
        if ttl < self.config.min_ttl || ttl > self.config.max_ttl {
            return Err(InvalidRequest {
                field: "ttl_ms",
                message: format!(
                    "must be between {} and {} ms",
                    self.config.min_ttl.as_millis(),
                    self.config.max_ttl.as_millis()
                ),
            });
        }
        Ok(())
    }

    /// Tries once; while contended and before `deadline`, waits at the head of the resource's
    /// line for the release notification or the holder's expiry, then tries again.
    async fn acquire_waiting(
        &self,
        keys: &LeaseKeys,
        attempt: &BoundAttempt,
        request: &AcquireRequest,
        deadline: Instant,
    ) -> AcquireOutcome {
        let durability = Durability {
            replicas: request.replicas,
            timeout: self.config.replica_timeout,
        };
        let value = request.value.as_deref();
        let outcome = self
            .calls
            .acquire(keys, attempt, request.ttl, durability, value)
            .await;
        if !matches!(outcome, AcquireOutcome::Contended { .. }) || Instant::now() >= deadline {
            return outcome;
        }
        let Ok(_turn) =
            tokio::time::timeout_at(deadline.into(), self.lines.enter(&keys.lease)).await
        else {
            return outcome;
        };
        self.retry_until(keys, deadline, || {
            self.calls
                .acquire(keys, attempt, request.ttl, durability, value)
        })
        .await
    }

    /// A semaphore or read/write lease: tries once without waiting; otherwise lines up first and,
    /// at the head of the line, tries while standing at its head in Redis until served or
    /// `deadline`, then leaves the head.
    async fn acquire_shared(
        &self,
        keys: &LeaseKeys,
        attempt: &BoundAttempt,
        request: &AcquireRequest,
        shape: Shared,
        deadline: Instant,
    ) -> AcquireOutcome {
        let once = |stand_for| {
            self.calls
                .acquire_shared(keys, attempt, request.ttl, shape, stand_for)
        };
        if request.wait.is_zero() {
            return once(None).await;
        }
        let Ok(_turn) =
            tokio::time::timeout_at(deadline.into(), self.lines.enter(&keys.lease)).await
        else {
            // The line did not move in time; say how things stand without taking anyone's turn.
            return once(None).await;
        };
        let mut standing = Standing {
            calls: self.calls.clone(),
            keys: keys.clone(),
            attempt: attempt.clone(),
            left: false,
        };
        let outcome = self
            .retry_until(keys, deadline, || {
                once(Some(deadline.saturating_duration_since(Instant::now())))
            })
            .await;
        match outcome {
            // The script that served the attempt left the head of the line itself.
            AcquireOutcome::Acquired { .. } => standing.left = true,
            // Before the next in line gets its turn.
            _ => standing.leave().await,
        }
        outcome
    }

    /// Tries with `try_once` until it is not contended or `deadline` passes, waking for the release
    /// notification or the holder's expiry, whichever is first.
    async fn retry_until<F, Fut>(
        &self,
        keys: &LeaseKeys,
        deadline: Instant,
        mut try_once: F,
    ) -> AcquireOutcome
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = AcquireOutcome>,
    {
        let mut released = self.subscribe(keys).await;
        loop {
            // Subscribed before trying, so a release between the try and the wait is not missed.
            let outcome = try_once().await;
            let AcquireOutcome::Contended { retry_after } = outcome else {
                return outcome;
            };
            let wake = deadline.min(Instant::now() + retry_after.max(Duration::from_millis(1)));
            tokio::select! {
                // A stopping daemon answers with what it knows rather than hold up the drain.
                () = self.shutdown.cancelled() => return outcome,
                ended = next_release(&mut released) => {
                    // A subscription that ended may have missed messages; expiry still wakes us.
                    if ended {
                        released = None;
                    }
                }
                () = tokio::time::sleep_until(wake.into()) => {}
            }
            if Instant::now() >= deadline {
                return outcome;
            }
        }
    }

    /// The release channel; without it (PUBSUB lane down) waiting falls back to the holder's expiry.
    async fn subscribe(&self, keys: &LeaseKeys) -> Option<Subscription> {
        let channel = Bytes::from(keys.channel.clone());
        match self
            .pubsub
            .subscribe(SubscriptionKind::Shard, channel, 4)
            .await
        {
            Ok(subscription) => Some(subscription),
            Err(error) => {
                tracing::warn!(%error, "cannot subscribe to lease releases; waiting for expiry only");
                None
            }
        }
    }
}

/// A waiter at the head of a shared resource's line, until it leaves the head in Redis: when served
/// (the acquire script leaves it), when it gives up or times out (`leave`, before the next waiter's
/// turn), or when the caller goes away mid-wait (dropped: left in a task of its own), so that the
/// line moves on at once rather than when the head's standing runs out.
struct Standing {
    calls: Calls,
    keys: LeaseKeys,
    attempt: BoundAttempt,
    left: bool,
}

impl Standing {
    async fn leave(&mut self) {
        self.left = true;
        withdraw(&self.calls, &self.keys, &self.attempt).await;
    }
}

impl Drop for Standing {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        // Without a runtime (the daemon is gone) the head's standing runs out by itself.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (calls, keys, attempt) = (self.calls.clone(), self.keys.clone(), self.attempt.clone());
        runtime.spawn(async move { withdraw(&calls, &keys, &attempt).await });
    }
}

async fn withdraw(calls: &Calls, keys: &LeaseKeys, attempt: &BoundAttempt) {
    if let Err(error) = calls.withdraw(keys, attempt).await {
        tracing::warn!(%error, "cannot leave the head of a lease's line; it runs out by itself");
    }
}

/// Resolves on the next release message (`false`) or when the subscription ends (`true`); never
/// without a subscription. The channel's other announcements (acquisitions, watchers' markers)
/// free nothing, so they wake nobody; any `released…` does (the exclusive lease's `released:<fence>`
/// or another script's plain `released`).
async fn next_release(subscription: &mut Option<Subscription>) -> bool {
    let Some(subscription) = subscription else {
        return std::future::pending().await;
    };
    loop {
        match subscription.recv().await {
            Ok(message) if message.payload.starts_with(b"released") => return false,
            Ok(_) => {}
            Err(_) => return true,
        }
    }
}

fn bind(identity: &Identity, attempt: &Attempt) -> BoundAttempt {
    BoundAttempt {
        owner: attempt.bound_owner(identity),
        operation_id: attempt.operation_id.clone(),
    }
}

fn check_attempt(attempt: &Attempt) -> Result<(), InvalidRequest> {
    attempt.validate().map_err(|error| InvalidRequest {
        field: match error.field {
            "owner" => "attempt.owner",
            _ => "attempt.operation_id",
        },
        message: error.to_string(),
    })
}
