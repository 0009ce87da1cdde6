//! A property test of the lease service against a real `redis-server`: random interleavings of
//! acquire (with and without a connection-bound watchdog), replay, renew, release, expiry (time
//! passing) and kill (a holder that vanishes, or hangs up) by five actors on one resource held
//! exclusively, as a semaphore or as a read/write lease. After every step the safety invariant of
//! the shape holds twice over: among the actors that believe they hold (their validity, counted
//! from the moment they sent, not yet spent) and among the holders Redis shows (INSPECT): at most
//! one for an exclusive lease, at most N permits taken for a semaphore, never a writer with anyone
//! for a read/write lease. Every fence handed out is larger than every earlier one on the resource.
//! Seeded and sized like the fuzz suite: `TOLLGATE_FUZZ_CASES`, `TOLLGATE_FUZZ_SEED`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tokio_util::sync::CancellationToken;
use tollgate_lease::api::{AcquireRequest, ReleaseRequest, RenewRequest};
use tollgate_lease::{
    AcquireOutcome, Attempt, Holder, HolderMode, Holding, InspectOutcome, LeaseState, Mode,
    Resource,
};

use crate::lease::{who, Fixture};

#[path = "../fuzz/support.rs"]
mod runner;

const ACTORS: usize = 5;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Exclusive,
    Semaphore(u32),
    ReadWrite,
}

#[derive(Debug, Clone)]
enum Step {
    /// A new attempt, or the same one again (a replay) while the actor believes it holds.
    Acquire {
        actor: usize,
        ttl_ms: u64,
        count: u32,
        write: bool,
        bound: bool,
    },
    Renew {
        actor: usize,
        ttl_ms: u64,
    },
    Release {
        actor: usize,
    },
    /// The actor vanishes: a bound lease's connection closes, any other is left to its TTL.
    Kill {
        actor: usize,
    },
    Sleep {
        ms: u64,
    },
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Exclusive),
        (2u32..=3).prop_map(Kind::Semaphore),
        Just(Kind::ReadWrite),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let actor = 0..ACTORS;
    prop_oneof![
        5 => (actor.clone(), 60u64..400, 1u32..=3, any::<bool>(), any::<bool>()).prop_map(
            |(actor, ttl_ms, count, write, bound)| Step::Acquire { actor, ttl_ms, count, write, bound }
        ),
        2 => (actor.clone(), 60u64..400).prop_map(|(actor, ttl_ms)| Step::Renew { actor, ttl_ms }),
        2 => actor.clone().prop_map(|actor| Step::Release { actor }),
        1 => actor.prop_map(|actor| Step::Kill { actor }),
        2 => (0u64..150).prop_map(|ms| Step::Sleep { ms }),
    ]
}

/// What one actor holds, as it knows it.
#[derive(Default)]
struct Actor {
    attempt: Option<Attempt>,
    holding: Option<(Holding, u32, bool)>,
    /// The connections of its bound leases; closed when it is killed.
    sessions: Vec<CancellationToken>,
    attempts: u32,
}

impl Actor {
    /// Permits it believes it holds and whether as the writer, as of `now`.
    fn believes(&mut self, now: Instant) -> Option<(u32, bool)> {
        let (holding, count, write) = self.holding.as_mut()?;
        matches!(
            holding.state(now),
            LeaseState::Active | LeaseState::Uncertain
        )
        .then_some((*count, *write))
    }
}

struct Case<'a> {
    fx: &'a Fixture,
    kind: Kind,
    resource: Resource,
    actors: Vec<Actor>,
    last_fence: u64,
    next_session: u64,
}

fn fail(message: String) -> TestCaseError {
    TestCaseError::fail(message)
}

impl Case<'_> {
    fn request(&self, attempt: &Attempt, ttl_ms: u64, count: u32, write: bool) -> AcquireRequest {
        let (permits, count, mode) = match self.kind {
            Kind::Exclusive => (None, None, None),
            Kind::Semaphore(permits) => (Some(permits), Some(count.min(permits)), None),
            Kind::ReadWrite => (
                None,
                None,
                Some(if write { Mode::Write } else { Mode::Read }),
            ),
        };
        AcquireRequest {
            attempt: attempt.clone(),
            ttl: Duration::from_millis(ttl_ms),
            wait: Duration::ZERO,
            watchdog: false,
            replicas: 0,
            value: None,
            permits,
            count,
            mode,
        }
    }

    fn principal(actor: usize) -> String {
        format!("actor{actor}")
    }

    async fn run(&mut self, step: &Step) -> Result<(), TestCaseError> {
        match *step {
            Step::Acquire {
                actor,
                ttl_ms,
                count,
                write,
                bound,
            } => self.acquire(actor, ttl_ms, count, write, bound).await,
            Step::Renew { actor, ttl_ms } => {
                let Some(attempt) = self.actors[actor].attempt.clone() else {
                    return Ok(());
                };
                let sent_at = Instant::now();
                let request = RenewRequest {
                    attempt,
                    ttl: Duration::from_millis(ttl_ms),
                };
                let outcome = self
                    .fx
                    .leases
                    .renew(&who(&Self::principal(actor)), &self.resource, &request)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                if let Some((holding, ..)) = self.actors[actor].holding.as_mut() {
                    holding.on_renew(sent_at, &outcome);
                }
                Ok(())
            }
            Step::Release { actor } => {
                let Some(attempt) = self.actors[actor].attempt.take() else {
                    return Ok(());
                };
                let outcome = self
                    .fx
                    .leases
                    .release(
                        &who(&Self::principal(actor)),
                        &self.resource,
                        &ReleaseRequest { attempt },
                    )
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                if let Some((mut holding, ..)) = self.actors[actor].holding.take() {
                    holding.on_release(&outcome);
                }
                Ok(())
            }
            Step::Kill { actor } => {
                let gone = std::mem::take(&mut self.actors[actor]);
                for session in gone.sessions {
                    session.cancel();
                }
                self.actors[actor].attempts = gone.attempts;
                Ok(())
            }
            Step::Sleep { ms } => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(())
            }
        }
    }

    async fn acquire(
        &mut self,
        actor: usize,
        ttl_ms: u64,
        count: u32,
        write: bool,
        bound: bool,
    ) -> Result<(), TestCaseError> {
        let believed = self.actors[actor].believes(Instant::now());
        let replaying = believed.is_some();
        let (count, write) = believed.unwrap_or((count, write));
        let attempt = match (&self.actors[actor].attempt, replaying) {
            (Some(attempt), true) => attempt.clone(),
            _ => {
                let state = &mut self.actors[actor];
                state.attempts += 1;
                Attempt {
                    owner: format!("a{actor}"),
                    operation_id: format!("op{}", state.attempts),
                }
            }
        };
        let request = self.request(&attempt, ttl_ms, count, write);
        let holder = (bound && !replaying).then(|| {
            let closed = CancellationToken::new();
            self.actors[actor].sessions.push(closed.clone());
            self.next_session += 1;
            Holder::connection(self.next_session, closed)
        });
        let sent_at = Instant::now();
        let outcome = self
            .fx
            .leases
            .acquire(
                &who(&Self::principal(actor)),
                &self.resource,
                &request,
                holder,
            )
            .await
            .map_err(|e| fail(e.to_string()))?;
        let count = request.count.unwrap_or(1);
        match outcome {
            AcquireOutcome::Acquired { fence, valid_for } => {
                if replaying {
                    return Err(fail(format!(
                        "actor {actor} still believed it held, yet acquired anew (fence {fence})"
                    )));
                }
                if fence <= self.last_fence {
                    return Err(fail(format!(
                        "fence {fence} after fence {}",
                        self.last_fence
                    )));
                }
                self.last_fence = fence;
                let state = &mut self.actors[actor];
                state.attempt = Some(attempt);
                state.holding = Some((Holding::new(fence, sent_at, valid_for), count, write));
            }
            AcquireOutcome::Replayed { fence, .. } => {
                let known = self.actors[actor].holding.as_ref().map(|h| h.0.fence());
                if replaying && known != Some(fence) {
                    return Err(fail(format!(
                        "replay answered fence {fence}, the actor holds {known:?}"
                    )));
                }
            }
            AcquireOutcome::Contended { .. } | AcquireOutcome::Conflict => {
                if replaying {
                    return Err(fail(format!(
                        "actor {actor} believed it held, yet its replay was {outcome:?}"
                    )));
                }
            }
            // Held, but not long enough to count on by the time the reply came (a short TTL on a
            // loaded machine): the actor believes no more than before, and keeps the attempt to
            // renew or release it.
            AcquireOutcome::Indeterminate { .. } => {
                self.actors[actor].attempt = Some(attempt);
            }
            other => return Err(fail(format!("unexpected {other:?}"))),
        }
        Ok(())
    }

    /// The shape's invariant over the actors' beliefs and over what Redis shows.
    async fn check(&mut self) -> Result<(), TestCaseError> {
        let now = Instant::now();
        let believed: Vec<(u32, bool)> = self
            .actors
            .iter_mut()
            .filter_map(|actor| actor.believes(now))
            .collect();
        self.admissible(&believed, "believed")?;
        let shown = match self
            .fx
            .leases
            .inspect(&who("observer"), &self.resource, None)
            .await
            .map_err(|e| fail(e.to_string()))?
        {
            InspectOutcome::Free => Vec::new(),
            InspectOutcome::Held { fence, .. } => {
                if !matches!(self.kind, Kind::Exclusive) {
                    return Err(fail(format!("{:?} held exclusively", self.kind)));
                }
                vec![(1, false, fence)]
            }
            InspectOutcome::HeldShared { holders, .. } => holders
                .iter()
                .map(|h| (h.count, h.mode == HolderMode::Write, h.fence))
                .collect(),
            other => return Err(fail(format!("inspect answered {other:?}"))),
        };
        // A fence handed out in a reply that did not count (indeterminate) is an earlier fence too.
        self.last_fence = shown
            .iter()
            .map(|(.., fence)| *fence)
            .fold(self.last_fence, u64::max);
        let shown: Vec<(u32, bool)> = shown.into_iter().map(|(c, w, _)| (c, w)).collect();
        self.admissible(&shown, "shown by INSPECT")
    }

    fn admissible(&self, holders: &[(u32, bool)], whose: &str) -> Result<(), TestCaseError> {
        let taken: u32 = holders.iter().map(|h| h.0).sum();
        let writers = holders.iter().filter(|h| h.1).count();
        let fine = match self.kind {
            Kind::Exclusive => holders.len() <= 1,
            Kind::Semaphore(permits) => taken <= permits,
            Kind::ReadWrite => writers == 0 || holders.len() == 1,
        };
        match fine {
            true => Ok(()),
            false => Err(fail(format!(
                "{:?}: holders {whose}: {holders:?}",
                self.kind
            ))),
        }
    }

    /// Ends the case: closes every bound lease so that no watchdog outlives it.
    fn close(&mut self) {
        for actor in &mut self.actors {
            for session in actor.sessions.drain(..) {
                session.cancel();
            }
        }
    }
}

#[test]
fn lease_props_every_shape_keeps_its_invariant_under_random_interleavings() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fx = runtime.block_on(async { Fixture::start() });
    let cases = AtomicUsize::new(0);
    runner::check(
        48,
        (kind(), prop::collection::vec(step(), 1..30)),
        |(kind, steps)| {
            let n = cases.fetch_add(1, Ordering::SeqCst);
            runtime.block_on(async {
                let mut case = Case {
                    fx: &fx,
                    kind,
                    resource: Resource::parse(&format!("props:{n}")).unwrap(),
                    actors: (0..ACTORS).map(|_| Actor::default()).collect(),
                    last_fence: 0,
                    next_session: 0,
                };
                let mut result = Ok(());
                for step in &steps {
                    result = case.run(step).await;
                    if result.is_ok() {
                        result = case.check().await;
                    }
                    if result.is_err() {
                        break;
                    }
                }
                case.close();
                result
            })
        },
    );
    assert!(cases.load(Ordering::SeqCst) >= 1);
}
