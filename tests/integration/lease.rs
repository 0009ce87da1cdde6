//! The lease service against a real `redis-server` through real lanes: every outcome, fencing,
//! replay validity, a reply lost in transit, NOSCRIPT after a restart, waiting, the watchdog.
//! HTTP, the client library and `lease run` are covered in `lease_http.rs` and `lease_run.rs`.

use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use tollgate_lanes::{Endpoint, Lanes, LanesConfig, Topology};
use tollgate_lease::api::{AcquireRequest, LeaseEvent, ReleaseRequest, RenewRequest};
use tollgate_lease::{
    AcquireOutcome, Attempt, Holder, Identity, InspectOutcome, LeaseConfig, LeaseKeys,
    LeaseService, LostReason, ReleaseOutcome, RenewOutcome, Resource,
};
use tollgate_testkit::RedisServer;

pub struct Fixture {
    pub redis: RedisServer,
    pub leases: LeaseService,
}

impl Fixture {
    pub fn start() -> Fixture {
        Self::on(RedisServer::start())
    }

    pub fn on(redis: RedisServer) -> Fixture {
        Self::configured(
            redis,
            LeaseConfig {
                min_ttl: Duration::from_millis(50),
                ..LeaseConfig::default()
            },
        )
    }

    pub fn configured(redis: RedisServer, config: LeaseConfig) -> Fixture {
        let mut registry = Registry::default();
        let lanes = Lanes::open(
            &Topology::Standalone(Endpoint::Unix(redis.socket().to_owned())),
            &crate::support::daemon::as_testkit_admin(&redis, LanesConfig::default()),
            &mut registry,
        )
        .expect("open lanes");
        let leases = LeaseService::new(&lanes, config, &mut registry);
        Fixture { redis, leases }
    }

    pub async fn acquire(&self, principal: &str, attempt: &Attempt, ttl_ms: u64) -> AcquireOutcome {
        self.acquire_waiting(principal, attempt, ttl_ms, 0).await
    }

    pub async fn acquire_waiting(
        &self,
        principal: &str,
        attempt: &Attempt,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> AcquireOutcome {
        self.leases
            .acquire(
                &who(principal),
                &resource(),
                &request(attempt, ttl_ms, wait_ms),
                None,
            )
            .await
            .expect("valid request")
    }

    pub async fn renew(&self, principal: &str, attempt: &Attempt, ttl_ms: u64) -> RenewOutcome {
        let request = RenewRequest {
            attempt: attempt.clone(),
            ttl: Duration::from_millis(ttl_ms),
        };
        self.leases
            .renew(&who(principal), &resource(), &request)
            .await
            .expect("valid request")
    }

    pub async fn release(&self, principal: &str, attempt: &Attempt) -> ReleaseOutcome {
        let request = ReleaseRequest {
            attempt: attempt.clone(),
        };
        self.leases
            .release(&who(principal), &resource(), &request)
            .await
            .expect("valid request")
    }

    pub async fn inspect(&self, principal: &str, attempt: Option<&Attempt>) -> InspectOutcome {
        self.leases
            .inspect(&who(principal), &resource(), attempt)
            .await
            .expect("valid request")
    }

    /// The server's own remaining time of the lease, in milliseconds.
    pub fn server_pttl(&self) -> i64 {
        let reply = self
            .redis
            .inline(&format!("PTTL {}", LeaseKeys::of(&resource()).lease));
        reply
            .trim()
            .trim_start_matches(':')
            .parse()
            .expect("PTTL reply")
    }

    /// How often Redis ran `command` (from INFO commandstats), e.g. `evalsha` or `script|load`.
    pub fn calls(&self, command: &str) -> u64 {
        command_calls(&self.redis, command)
    }
}

pub fn command_calls(redis: &RedisServer, command: &str) -> u64 {
    let stats = redis.inline("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
        .unwrap_or(0)
}

/// `principal` as one OS user (uid 1000): the tests that need two uids say so.
pub fn who(principal: &str) -> Identity {
    Identity {
        principal: principal.to_owned(),
        uid: 1000,
    }
}

pub fn resource() -> Resource {
    Resource::parse("orders:nightly").unwrap()
}

pub fn attempt(owner: &str, operation_id: &str) -> Attempt {
    Attempt {
        owner: owner.into(),
        operation_id: operation_id.into(),
    }
}

pub fn request(attempt: &Attempt, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        attempt: attempt.clone(),
        ttl: Duration::from_millis(ttl_ms),
        wait: Duration::from_millis(wait_ms),
        watchdog: false,
        replicas: 0,
        value: None,
        permits: None,
        count: None,
        mode: None,
    }
}

fn held(outcome: &AcquireOutcome) -> (u64, Duration) {
    match outcome {
        AcquireOutcome::Acquired { fence, valid_for }
        | AcquireOutcome::Replayed { fence, valid_for } => (*fence, *valid_for),
        other => panic!("expected the lease to be held, got {other:?}"),
    }
}

/// A lease `alice` holds with a watchdog bound to a `sleep` process that the test controls.
struct Watched {
    holder: std::process::Child,
    fence: u64,
    events: tokio::sync::broadcast::Receiver<LeaseEvent>,
}

impl Watched {
    async fn start(fx: &Fixture, attempt: &Attempt, ttl_ms: u64) -> Watched {
        let holder = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut request = request(attempt, ttl_ms, 0);
        request.watchdog = true;
        let bound = Holder::process(holder.id()).unwrap();
        let outcome = fx
            .leases
            .acquire(&who("alice"), &resource(), &request, Some(bound))
            .await
            .unwrap();
        let (fence, _) = held(&outcome);
        let events = fx
            .leases
            .events(&who("alice"), &resource(), attempt)
            .unwrap()
            .expect("watched");
        Watched {
            holder,
            fence,
            events,
        }
    }

    /// The next event that is not a routine renewal (within 5 s).
    async fn next_news(&mut self) -> Option<LeaseEvent> {
        loop {
            match tokio::time::timeout(Duration::from_secs(5), self.events.recv()).await {
                Ok(Ok(LeaseEvent::Renewed { .. })) => continue,
                Ok(Ok(event)) => return Some(event),
                _ => return None,
            }
        }
    }

    fn kill_holder(&mut self) {
        self.holder.kill().unwrap();
        self.holder.wait().unwrap();
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

#[tokio::test]
async fn every_outcome_of_the_four_calls() {
    let fx = Fixture::start();
    let a = attempt("alice-token", "op-1");
    assert_eq!(fx.inspect("alice", None).await, InspectOutcome::Free);

    let AcquireOutcome::Acquired { fence, valid_for } = fx.acquire("alice", &a, 10_000).await
    else {
        panic!("first acquire acquires");
    };
    let first_fence = fence;
    assert!(first_fence >= 1);
    assert!(
        valid_for <= Duration::from_millis(10_000 - 10),
        "drift budget is taken off"
    );

    let contended = fx
        .acquire("bob", &attempt("bob-token", "op-1"), 10_000)
        .await;
    let AcquireOutcome::Contended { retry_after } = contended else {
        panic!("another owner is contended, got {contended:?}");
    };
    assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_millis(10_000));
    assert_eq!(
        fx.acquire("alice", &attempt("alice-token", "op-2"), 10_000)
            .await,
        AcquireOutcome::Conflict,
        "same owner, another operation"
    );
    assert!(
        matches!(
            fx.acquire("mallory", &a, 10_000).await,
            AcquireOutcome::Contended { .. }
        ),
        "the same owner token under another principal is another owner"
    );

    assert!(matches!(
        fx.renew("alice", &a, 10_000).await,
        RenewOutcome::Renewed { .. }
    ));
    assert_eq!(
        fx.renew("mallory", &a, 10_000).await,
        RenewOutcome::Lost {
            reason: LostReason::NotOwner
        }
    );
    assert_eq!(fx.release("mallory", &a).await, ReleaseOutcome::NotOwner);
    match fx.inspect("alice", Some(&a)).await {
        InspectOutcome::Held {
            fence,
            yours,
            remaining,
            value,
        } => {
            assert_eq!((fence, yours, value), (first_fence, true, None));
            assert!(remaining <= Duration::from_millis(10_000));
        }
        other => panic!("expected held, got {other:?}"),
    }
    assert!(matches!(
        fx.inspect("bob", Some(&a)).await,
        InspectOutcome::Held { yours: false, .. }
    ));

    assert_eq!(fx.release("alice", &a).await, ReleaseOutcome::Released);
    assert_eq!(fx.release("alice", &a).await, ReleaseOutcome::AlreadyAbsent);
    assert_eq!(
        fx.renew("alice", &a, 10_000).await,
        RenewOutcome::Lost {
            reason: LostReason::Absent
        }
    );
    assert_eq!(fx.inspect("alice", None).await, InspectOutcome::Free);

    let (next, _) = held(
        &fx.acquire("bob", &attempt("bob-token", "op-1"), 10_000)
            .await,
    );
    assert_eq!(next, first_fence + 1, "each new holder gets a larger fence");
}

#[tokio::test]
async fn replay_returns_the_same_fence_with_the_servers_remaining_time() {
    let fx = Fixture::start();
    let a = attempt("alice-token", "op-1");
    let (fence, _) = held(&fx.acquire("alice", &a, 2_000).await);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let replay = fx.acquire("alice", &a, 2_000).await;
    let pttl_after = fx.server_pttl();
    let AcquireOutcome::Replayed {
        fence: again,
        valid_for,
    } = replay
    else {
        panic!("the same attempt replays, got {replay:?}");
    };
    assert_eq!(again, fence);
    assert!(
        valid_for.as_millis() as i64 <= pttl_after,
        "replay validity {valid_for:?} must not exceed the server's PTTL {pttl_after} ms"
    );
    assert!(
        valid_for < Duration::from_millis(1_500),
        "not the requested 2 s again"
    );
}

/// The default policy makes every local user the one principal `local`: the uid still tells two
/// users' leases apart, so the same owner token from another uid is another owner.
#[tokio::test]
async fn one_principal_under_two_uids_is_two_owners() {
    let fx = Fixture::start();
    let a = attempt("shared-token", "op-1");
    let first = Identity {
        principal: "local".into(),
        uid: 1000,
    };
    let second = Identity {
        principal: "local".into(),
        uid: 1001,
    };
    let acquire = |who: Identity| {
        let leases = fx.leases.clone();
        let request = request(&a, 10_000, 0);
        async move {
            leases
                .acquire(&who, &resource(), &request, None)
                .await
                .unwrap()
        }
    };
    held(&acquire(first.clone()).await);
    assert!(
        matches!(
            acquire(second.clone()).await,
            AcquireOutcome::Contended { .. }
        ),
        "another uid's retry of the same attempt is not a replay"
    );
    let renew = RenewRequest {
        attempt: a.clone(),
        ttl: Duration::from_millis(10_000),
    };
    assert_eq!(
        fx.leases.renew(&second, &resource(), &renew).await.unwrap(),
        RenewOutcome::Lost {
            reason: LostReason::NotOwner
        }
    );
    let release = ReleaseRequest { attempt: a.clone() };
    assert_eq!(
        fx.leases
            .release(&second, &resource(), &release)
            .await
            .unwrap(),
        ReleaseOutcome::NotOwner
    );
    assert!(matches!(
        fx.leases
            .inspect(&second, &resource(), Some(&a))
            .await
            .unwrap(),
        InspectOutcome::Held { yours: false, .. }
    ));
    assert!(matches!(
        fx.leases
            .inspect(&first, &resource(), Some(&a))
            .await
            .unwrap(),
        InspectOutcome::Held { yours: true, .. }
    ));
    assert_eq!(
        fx.leases
            .release(&first, &resource(), &release)
            .await
            .unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test]
async fn a_reply_lost_in_transit_then_a_retry_with_the_same_attempt_holds_exactly_once() {
    let fx = Fixture::start();
    let a = attempt("alice-token", "op-1");
    // Load the acquire script, so the cut-off call is a plain EVALSHA that runs.
    let warm_up = Resource::parse("warm-up").unwrap();
    let warm = request(&attempt("warm", "up"), 10_000, 0);
    held(
        &fx.leases
            .acquire(&who("alice"), &warm_up, &warm, None)
            .await
            .unwrap(),
    );

    // Writes stall on the server; the call goes out, then the caller gives up on the reply.
    fx.redis.inline("CLIENT PAUSE 400 WRITE");
    let cut =
        tokio::time::timeout(Duration::from_millis(100), fx.acquire("alice", &a, 10_000)).await;
    assert!(cut.is_err(), "the reply was not awaited");
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Redis ran the acquisition after all; the retry finds it instead of taking a second one.
    let retry = fx.acquire("alice", &a, 10_000).await;
    let AcquireOutcome::Replayed { fence, .. } = retry else {
        panic!("got {retry:?}");
    };
    let counter = fx
        .redis
        .inline(&format!("GET {}", LeaseKeys::of(&resource()).fence));
    assert!(
        counter.contains(&format!("\r\n{fence}\r\n")),
        "fence counter moved once: {counter:?}"
    );
}

#[tokio::test]
async fn a_reply_that_arrives_after_the_validity_ran_out_is_indeterminate_not_held() {
    let fx = Fixture::start();
    let a = attempt("alice-token", "op-1");
    held(&fx.acquire("alice", &a, 10_000).await);
    // Redis stalls longer than the TTL asked for: the script runs once the pause ends, but the
    // daemon cannot count on a lease whose reply took longer than the lease is valid.
    fx.redis.inline("CLIENT PAUSE 700 WRITE");
    let renewed = fx.renew("alice", &a, 300).await;
    assert!(
        matches!(&renewed, RenewOutcome::Indeterminate { reason } if reason.contains("ran out")),
        "{renewed:?}"
    );
    assert_eq!(fx.release("alice", &a).await, ReleaseOutcome::Released);
    let b = attempt("bob-token", "op-1");
    fx.redis.inline("CLIENT PAUSE 700 WRITE");
    let late = fx.acquire("bob", &b, 300).await;
    assert!(
        matches!(&late, AcquireOutcome::Indeterminate { reason } if reason.contains("ran out")),
        "{late:?}"
    );
    // Retrying with the same attempt learns what Redis holds: the 300 ms lease ran out meanwhile,
    // so the retry takes a fresh one, with time left to use.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let (_, valid_for) = held(&fx.acquire("bob", &b, 10_000).await);
    assert!(valid_for > Duration::from_secs(9), "{valid_for:?}");
}

#[tokio::test]
async fn redis_restarted_mid_lease_reloads_each_script_once() {
    let mut fx = Fixture::start();
    let a = attempt("alice-token", "op-1");
    let (before, _) = held(&fx.acquire("alice", &a, 10_000).await);
    fx.redis.restart();

    // Until the lane has reconnected, calls fail without being sent.
    let deadline = Instant::now() + Duration::from_secs(10);
    let outcome = loop {
        match fx.renew("alice", &a, 10_000).await {
            RenewOutcome::Unavailable { .. } | RenewOutcome::Indeterminate { .. }
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => break other,
        }
    };
    // The restarted server kept no data, so the lease is gone, and the renew says so.
    assert_eq!(
        outcome,
        RenewOutcome::Lost {
            reason: LostReason::Absent
        }
    );
    let (fence, _) = held(&fx.acquire("alice", &a, 10_000).await);
    assert!(
        fence > before,
        "without persistence the counter is lost, and starts again above every fence ({fence} after {before})"
    );
    assert!(matches!(
        fx.renew("alice", &a, 10_000).await,
        RenewOutcome::Renewed { .. }
    ));
    assert_eq!(
        fx.calls("script|load"),
        2,
        "one load per script used since the restart"
    );
    let errors = fx.redis.inline("INFO errorstats");
    assert!(
        errors.contains("errorstat_NOSCRIPT:count=2"),
        "one NOSCRIPT per script: {errors}"
    );
}

#[tokio::test]
async fn unavailable_means_not_sent_while_redis_is_down() {
    let mut fx = Fixture::start();
    let a = attempt("alice-token", "op-1");
    held(&fx.acquire("alice", &a, 10_000).await);
    fx.redis.kill();
    // The first call may have been in flight when the connection broke; after that, nothing is sent.
    let _ = fx.renew("alice", &a, 10_000).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(
        fx.acquire("alice", &a, 10_000).await,
        AcquireOutcome::Unavailable { .. }
    ));
    assert!(matches!(
        fx.renew("alice", &a, 10_000).await,
        RenewOutcome::Unavailable { .. }
    ));
    assert!(matches!(
        fx.release("alice", &a).await,
        ReleaseOutcome::Unavailable { .. }
    ));
    assert!(matches!(
        fx.inspect("alice", None).await,
        InspectOutcome::Unavailable { .. }
    ));
}

#[tokio::test]
async fn a_waiter_gets_the_lease_promptly_after_release() {
    let fx = std::sync::Arc::new(Fixture::start());
    let holder = attempt("alice-token", "op-1");
    let (first_fence, _) = held(&fx.acquire("alice", &holder, 30_000).await);
    let waiter = {
        let fx = fx.clone();
        tokio::spawn(async move {
            let outcome = fx
                .acquire_waiting("bob", &attempt("bob-token", "op-1"), 30_000, 20_000)
                .await;
            (outcome, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter waits while the lease is held"
    );
    let released_at = Instant::now();
    assert_eq!(fx.release("alice", &holder).await, ReleaseOutcome::Released);
    let (outcome, acquired_at) = waiter.await.unwrap();
    assert_eq!(held(&outcome).0, first_fence + 1);
    // Woken by the release notification: long before the 30 s TTL or the 20 s wait would end.
    assert!(acquired_at.duration_since(released_at) < Duration::from_secs(5));
}

#[tokio::test]
async fn a_waiter_gets_the_lease_when_the_holder_expires() {
    let fx = Fixture::start();
    let (first_fence, _) = held(
        &fx.acquire("alice", &attempt("alice-token", "op-1"), 400)
            .await,
    );
    let started = Instant::now();
    let outcome = fx
        .acquire_waiting("bob", &attempt("bob-token", "op-1"), 10_000, 10_000)
        .await;
    assert_eq!(held(&outcome).0, first_fence + 1);
    let waited = started.elapsed();
    // Nobody released: the holder's PTTL woke the waiter once it ran out, well before the wait ended.
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

#[tokio::test]
async fn a_wait_that_runs_out_is_contended() {
    let fx = Fixture::start();
    held(
        &fx.acquire("alice", &attempt("alice-token", "op-1"), 10_000)
            .await,
    );
    let outcome = fx
        .acquire_waiting("bob", &attempt("bob-token", "op-1"), 10_000, 300)
        .await;
    assert!(
        matches!(outcome, AcquireOutcome::Contended { .. }),
        "got {outcome:?}"
    );
}

#[tokio::test]
async fn many_waiters_are_handed_the_lease_one_at_a_time_without_a_stampede() {
    const WAITERS: usize = 6;
    let fx = std::sync::Arc::new(Fixture::start());
    let first = attempt("alice-token", "op-1");
    let (first_fence, _) = held(&fx.acquire("alice", &first, 30_000).await);
    let before = fx.calls("evalsha");
    let mut tasks = Vec::new();
    for n in 0..WAITERS {
        let fx = fx.clone();
        tasks.push(tokio::spawn(async move {
            let mine = attempt(&format!("waiter-{n}"), "op-1");
            let (fence, _) = held(&fx.acquire_waiting("w", &mine, 30_000, 20_000).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(fx.release("w", &mine).await, ReleaseOutcome::Released);
            fence
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    fx.release("alice", &first).await;
    let mut fences = Vec::new();
    for task in tasks {
        fences.push(task.await.unwrap());
    }
    fences.sort_unstable();
    assert_eq!(
        fences,
        (first_fence + 1..first_fence + 1 + WAITERS as u64).collect::<Vec<_>>(),
        "each holder its own fence"
    );
    // Per waiter about four calls: a first try, a try at the head of the line, the winning try and
    // its release. A stampede would add a try by every waiter on every release (15 more here).
    let used = fx.calls("evalsha") - before;
    assert!(
        used <= (5 * WAITERS + 2) as u64,
        "{used} script calls for {WAITERS} waiters"
    );
}

#[tokio::test]
async fn unconfirmed_replicas_undo_the_acquisition() {
    let fx = Fixture::start();
    let mut request = request(&attempt("alice-token", "op-1"), 10_000, 0);
    request.replicas = 1;
    let outcome = fx
        .leases
        .acquire(&who("alice"), &resource(), &request, None)
        .await
        .unwrap();
    let AcquireOutcome::Unavailable { reason } = outcome else {
        panic!("a server without replicas cannot confirm, got {outcome:?}");
    };
    assert!(reason.contains("0 of 1 replicas"), "{reason}");
    assert_eq!(
        fx.inspect("alice", None).await,
        InspectOutcome::Free,
        "nothing stays held"
    );
}

#[tokio::test]
async fn the_watchdog_renews_while_the_holder_lives_and_releases_when_it_dies() {
    let fx = Fixture::start();
    let a = attempt("alice-token", "op-1");
    let mut watched = Watched::start(&fx, &a, 600).await;

    // Three TTLs later the lease is still held: the watchdog renewed it.
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    assert!(matches!(
        fx.inspect("alice", Some(&a)).await,
        InspectOutcome::Held { yours: true, .. }
    ));
    assert!(matches!(
        watched.events.recv().await.unwrap(),
        LeaseEvent::Renewed { .. }
    ));

    watched.kill_holder();
    let fence = watched.fence;
    assert_eq!(
        watched.next_news().await,
        Some(LeaseEvent::Released { fence })
    );
    assert_eq!(fx.inspect("alice", None).await, InspectOutcome::Free);
}

#[tokio::test]
async fn the_watchdog_reports_a_lost_lease_and_stops() {
    let fx = Fixture::start();
    let a = attempt("alice-token", "op-1");
    let mut watched = Watched::start(&fx, &a, 600).await;
    fx.redis
        .inline(&format!("DEL {}", LeaseKeys::of(&resource()).lease));
    let fence = watched.fence;
    assert_eq!(
        watched.next_news().await,
        Some(LeaseEvent::Lost {
            fence,
            reason: LostReason::Absent
        })
    );
    assert!(
        fx.leases
            .events(&who("alice"), &resource(), &a)
            .unwrap()
            .is_none(),
        "the watchdog ended"
    );
}

#[tokio::test]
async fn the_watchdog_stops_at_the_maximum_hold_time() {
    let fx = Fixture::configured(
        RedisServer::start(),
        LeaseConfig {
            min_ttl: Duration::from_millis(50),
            max_hold: Duration::from_millis(1_000),
            ..LeaseConfig::default()
        },
    );
    let mut watched = Watched::start(&fx, &attempt("alice-token", "op-1"), 400).await;
    let fence = watched.fence;
    assert_eq!(
        watched.next_news().await,
        Some(LeaseEvent::MaxHoldReached { fence })
    );
    // Nobody renews any more, so the lease runs out by its TTL although the holder lives on.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(fx.inspect("alice", None).await, InspectOutcome::Free);
}

/// Every reserved key in databases 0 and 1, where the lease service's lanes may keep them.
async fn reserved_keys(redis: &RedisServer) -> Vec<String> {
    let mut keys = Vec::new();
    for db in [0, 1] {
        let url = redis.url_in(db);
        let client = redis::Client::open(url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let found: Vec<String> = redis::cmd("KEYS")
            .arg("tollgate:*")
            .query_async(&mut conn)
            .await
            .unwrap();
        keys.extend(found);
    }
    keys
}

/// Thousands of resources used once, released or left to expire, leave no key of their own behind
/// (only the bounded bucket counters), and a resource used again still gets rising fences.
#[tokio::test]
async fn fence_state_does_not_pile_up_and_fences_still_rise() {
    const RESOURCES: usize = 3000;
    let fx = Fixture::start();
    let reused = Resource::parse("orders:reused").unwrap();
    let mut last_fence = 0;
    for n in 0..RESOURCES {
        let resource = Resource::parse(&format!("orders:once-{n}")).unwrap();
        let a = attempt("alice", &format!("op-{n}"));
        // Every tenth is left to expire instead of being released.
        let ttl = if n % 10 == 0 { 50 } else { 10_000 };
        let who = who("alice");
        let outcome = fx
            .leases
            .acquire(&who, &resource, &request(&a, ttl, 0), None)
            .await
            .unwrap();
        held(&outcome);
        if n % 10 != 0 {
            let release = ReleaseRequest { attempt: a };
            let released = fx.leases.release(&who, &resource, &release).await.unwrap();
            assert_eq!(released, ReleaseOutcome::Released);
        }
        if n % 500 == 0 {
            let a = attempt("bob", &format!("reuse-{n}"));
            let (fence, _) = held(
                &fx.leases
                    .acquire(&who, &reused, &request(&a, 10_000, 0), None)
                    .await
                    .unwrap(),
            );
            assert!(fence > last_fence, "{fence} after {last_fence}");
            last_fence = fence;
            let release = ReleaseRequest { attempt: a };
            fx.leases.release(&who, &reused, &release).await.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let keys = reserved_keys(&fx.redis).await;
    let counters: Vec<&String> = keys
        .iter()
        .filter(|key| key.starts_with("tollgate:lease:{") && key.ends_with("}:fence"))
        .collect();
    assert_eq!(
        counters.len(),
        keys.len(),
        "only bucket counters are left: {:?}",
        keys.iter().find(|key| !key.ends_with("}:fence"))
    );
    assert!(
        counters.len() <= usize::from(tollgate_lease::FENCE_BUCKETS),
        "{} counters for {RESOURCES} resources",
        counters.len()
    );
}
