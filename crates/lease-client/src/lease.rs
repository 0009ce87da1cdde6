//! A held lease on the client side: its fence, its state (ACTIVE, UNCERTAIN, LOST, RELEASED) and
//! the calls that move it. From LOST or RELEASED nothing is sent: the call returns
//! [`ClientError::Terminal`] at once.

use std::time::{Duration, Instant};

use tollgate_lease_api::api::{AcquireRequest, ReleaseRequest, RenewRequest};
use tollgate_lease_api::{
    AcquireOutcome, Attempt, Holding, LeaseState, ReleaseOutcome, RenewOutcome, Resource,
};

use crate::client::{Answer, LeaseClient};
use crate::error::ClientError;
use crate::events::Events;

/// What an acquire came to: a lease, or the outcome that says why not.
pub enum Acquisition {
    Held(Lease),
    NotHeld(AcquireOutcome),
}

impl LeaseClient {
    /// Acquires and, when held, returns a [`Lease`] that tracks its state. (Here rather than with
    /// the raw calls so that the client does not depend on the lease it hands out.)
    pub async fn acquire(
        &self,
        resource: &Resource,
        request: &AcquireRequest,
    ) -> Result<Acquisition, ClientError> {
        let answer = self.acquire_raw(resource, request).await?;
        Ok(Lease::from_answer(self.clone(), resource, request, answer))
    }
}

pub struct Lease {
    client: LeaseClient,
    resource: Resource,
    attempt: Attempt,
    holding: Holding,
    replayed: bool,
}

impl Lease {
    pub(crate) fn from_answer(
        client: LeaseClient,
        resource: &Resource,
        request: &AcquireRequest,
        answer: Answer<AcquireOutcome>,
    ) -> Acquisition {
        let (fence, valid_for, replayed) = match answer.outcome {
            AcquireOutcome::Acquired { fence, valid_for } => (fence, valid_for, false),
            AcquireOutcome::Replayed { fence, valid_for } => (fence, valid_for, true),
            other => return Acquisition::NotHeld(other),
        };
        Acquisition::Held(Lease {
            client,
            resource: resource.clone(),
            attempt: request.attempt.clone(),
            holding: Holding::new(fence, answer.sent_at, valid_for),
            replayed,
        })
    }

    pub fn fence(&self) -> u64 {
        self.holding.fence()
    }

    pub fn resource(&self) -> &Resource {
        &self.resource
    }

    pub fn attempt(&self) -> &Attempt {
        &self.attempt
    }

    /// Whether the acquire found this attempt already holding (an earlier reply was lost).
    pub fn was_replayed(&self) -> bool {
        self.replayed
    }

    pub fn state(&mut self) -> LeaseState {
        self.holding.state(Instant::now())
    }

    /// Validity left, counted conservatively from when the last confirming call was sent.
    pub fn remaining(&mut self) -> Duration {
        self.holding.remaining(Instant::now())
    }

    pub async fn renew(&mut self, ttl: Duration) -> Result<RenewOutcome, ClientError> {
        self.holding.may_send(Instant::now())?;
        let request = RenewRequest {
            attempt: self.attempt.clone(),
            ttl,
        };
        let answer = self.client.renew_raw(&self.resource, &request).await?;
        self.holding.on_renew(answer.sent_at, &answer.outcome);
        Ok(answer.outcome)
    }

    pub async fn release(&mut self) -> Result<ReleaseOutcome, ClientError> {
        self.holding.may_send(Instant::now())?;
        let request = ReleaseRequest {
            attempt: self.attempt.clone(),
        };
        let answer = self.client.release_raw(&self.resource, &request).await?;
        self.holding.on_release(&answer.outcome);
        Ok(answer.outcome)
    }

    /// The daemon watchdog's events for this lease (when it was acquired with `watchdog`).
    pub async fn events(&self) -> Result<Events, ClientError> {
        self.client.events(&self.resource, &self.attempt).await
    }

    /// Marks the lease LOST after the caller learned so elsewhere (an event), so nothing more is sent.
    pub fn mark_lost(&mut self) {
        self.holding.on_renew(
            Instant::now(),
            &RenewOutcome::Lost {
                reason: tollgate_lease_api::LostReason::Absent,
            },
        );
    }
}
