//! A lane's ceiling with bounded, fair waiting: permits from a FIFO semaphore, a bounded number of
//! waiters, each for at most the acquire timeout. Past either bound the caller is refused with the lane
//! named. Every grant and refusal is counted here, so the lanes cannot forget to.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tollgate_model::Lane;

use crate::error::{LaneError, Saturation};
use crate::metrics::{LaneMetrics, Rejection};

pub(crate) struct Gate {
    lane: Lane,
    permits: Arc<Semaphore>,
    queue: Queue,
    timeout: Duration,
    metrics: LaneMetrics,
    /// A ceiling over this one and its siblings' (a cluster's daemon-wide one), entered after it.
    outer: Option<Arc<Gate>>,
}

/// Who bounds and counts the callers waiting at the gate.
pub(crate) enum Queue {
    /// The gate: at most this many wait, each counted in `lane_waiting` (exclusive lanes).
    Bounded(usize),
    /// The caller (multiplexed lanes count queued commands themselves, from the moment they are sent).
    External,
}

/// The right to use one unit of a lane's ceiling; counted in `lane_in_use` while held.
pub(crate) struct Permit {
    _permit: OwnedSemaphorePermit,
    /// Only the one gauge: a permit is taken and dropped per multiplexed command, and a clone of
    /// every lane metric handle there cost more than the command's own bookkeeping.
    in_use: Gauge,
    /// The outer gate's own permit, held as long as this one. Only its semaphore's: what is in
    /// use and how long it took is counted here, once.
    _outer: Option<OwnedSemaphorePermit>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.in_use.dec();
    }
}

impl Gate {
    pub(crate) fn new(
        lane: Lane,
        ceiling: usize,
        queue: Queue,
        timeout: Duration,
        metrics: LaneMetrics,
    ) -> Self {
        Gate {
            lane,
            permits: Arc::new(Semaphore::new(ceiling)),
            queue,
            timeout,
            metrics,
            outer: None,
        }
    }

    /// This gate under `outer`: a permit is granted only when `outer` grants one too, so that
    /// `outer`'s ceiling holds over every gate under it.
    pub(crate) fn under(self, outer: Option<Arc<Gate>>) -> Self {
        Gate { outer, ..self }
    }

    /// A permit without waiting, if one is free and nobody is queued ahead (here and outside).
    pub(crate) fn try_enter(&self) -> Option<Permit> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        let outer = match &self.outer {
            Some(outer) => Some(outer.permits.clone().try_acquire_owned().ok()?),
            None => None,
        };
        self.metrics.wait.immediate();
        Some(self.grant(permit, outer))
    }

    /// Waits in FIFO order until a permit is free or `since + timeout` passes; under an outer gate,
    /// then for the outer's, by the same deadline.
    pub(crate) async fn enter(&self, since: Instant) -> Result<Permit, LaneError> {
        if let Some(permit) = self.try_enter() {
            return Ok(permit);
        }
        let permit = self.enter_here(since).await?;
        let outer = match &self.outer {
            Some(outer) => Some(outer.enter_here(since).await?),
            None => None,
        };
        self.metrics.wait.observe(since.elapsed().as_secs_f64());
        Ok(self.grant(permit, outer))
    }

    /// This gate's own permit, waited for in line.
    async fn enter_here(&self, since: Instant) -> Result<OwnedSemaphorePermit, LaneError> {
        let counted = match self.queue {
            Queue::Bounded(queue_length) => {
                if self.metrics.waiting.inc() as usize >= queue_length {
                    self.metrics.waiting.dec();
                    return Err(self.saturated(since, Saturation::QueueFull));
                }
                true
            }
            Queue::External => false,
        };
        let acquired =
            tokio::time::timeout_at(since + self.timeout, self.permits.clone().acquire_owned())
                .await;
        if counted {
            self.metrics.waiting.dec();
        }
        match acquired {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_closed)) => {
                self.metrics.reject(Rejection::Closed);
                Err(LaneError::Closed)
            }
            Err(_elapsed) => Err(self.saturated(since, Saturation::WaitExpired)),
        }
    }

    /// Refuses all current and future waiters (the lanes are draining).
    pub(crate) fn close(&self) {
        self.permits.close();
    }

    fn grant(&self, permit: OwnedSemaphorePermit, outer: Option<OwnedSemaphorePermit>) -> Permit {
        self.metrics.in_use.inc();
        Permit {
            _permit: permit,
            in_use: self.metrics.in_use.clone(),
            _outer: outer,
        }
    }

    fn saturated(&self, since: Instant, cause: Saturation) -> LaneError {
        self.metrics.reject(Rejection::Saturated(cause));
        LaneError::Saturated {
            lane: self.lane,
            waited: since.elapsed(),
            cause,
        }
    }
}
