//! What `GET /v1/lanes` and `/readyz` report: each lane's ceilings and the same live figures as
//! `/metrics`.

use serde::Serialize;
use tollgate_model::Lane;

use crate::error::Saturation;
use crate::life::LifeState;
use crate::metrics::{LaneMetrics, Rejection};

#[derive(Debug, Clone, Serialize)]
pub struct LanesStatus {
    pub state: LifeState,
    pub lanes: Vec<LaneStatus>,
}

impl LanesStatus {
    /// A cluster's lanes before any node's were opened: open, with no lanes yet.
    pub(crate) fn unopened() -> Self {
        LanesStatus {
            state: LifeState::Open,
            lanes: Vec::new(),
        }
    }
}

/// How a lane shares its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharing {
    /// Pipelined commands from many callers over a few connections.
    Multiplexed,
    /// One connection lent to one borrower.
    Exclusive,
    /// Subscriber connections with local fan-out.
    Shared,
}

#[derive(Debug, Clone, Serialize)]
pub struct LaneStatus {
    pub lane: Lane,
    pub sharing: Sharing,
    /// ACL user the lane's connections authenticate as (`default` when none is configured).
    pub user: String,
    pub max_connections: usize,
    /// Ceiling on commands in flight (multiplexed lanes).
    pub max_in_flight: Option<usize>,
    pub open: i64,
    /// Connections lent (exclusive), commands in flight (multiplexed) or local subscriptions (pubsub).
    pub in_use: i64,
    pub idle: i64,
    pub waiting: i64,
    pub rejections: Rejections,
    pub reconnects: u64,
    pub opened: u64,
    pub closed: u64,
    /// Why new connections are being refused right now, while Redis is unreachable.
    pub unavailable: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Rejections {
    pub wait_expired: u64,
    pub queue_full: u64,
    /// Borrowers whose principal held its whole share of the lane (exclusive lanes).
    pub principal_share: u64,
    pub unavailable: u64,
    pub closed: u64,
}

pub(crate) struct LaneFacts<'a> {
    pub(crate) lane: Lane,
    pub(crate) sharing: Sharing,
    pub(crate) user: Option<&'a str>,
    pub(crate) max_connections: usize,
    pub(crate) max_in_flight: Option<usize>,
    pub(crate) metrics: &'a LaneMetrics,
    pub(crate) unavailable: Option<String>,
}

impl LaneStatus {
    pub(crate) fn new(facts: LaneFacts<'_>) -> Self {
        let m = facts.metrics;
        LaneStatus {
            lane: facts.lane,
            sharing: facts.sharing,
            user: facts.user.unwrap_or("default").to_owned(),
            max_connections: facts.max_connections,
            max_in_flight: facts.max_in_flight,
            open: m.open.get(),
            in_use: m.in_use.get(),
            idle: m.idle.get(),
            waiting: m.waiting.get(),
            rejections: Rejections {
                wait_expired: m.rejections(Rejection::Saturated(Saturation::WaitExpired)),
                queue_full: m.rejections(Rejection::Saturated(Saturation::QueueFull)),
                principal_share: m.rejections(Rejection::Saturated(Saturation::PrincipalShare)),
                unavailable: m.rejections(Rejection::Unavailable),
                closed: m.rejections(Rejection::Closed),
            },
            reconnects: m.reconnects.get(),
            opened: m.opened.get(),
            closed: m.closed.get(),
            unavailable: facts.unavailable,
        }
    }
}
