//! What `/readyz` checks: the daemon has finished starting (a policy is loaded), the lanes are open,
//! and Redis answers a PING sent through the REGULAR lane as its ACL user within a short deadline,
//! and another through the lease service's own lanes as the lease user;
//! any lane that cannot connect right now is named, and so is an embedded server that is down and
//! being restarted. Each problem is reported as a sentence.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate_lanes::{Lanes, LifeState};

use crate::supervisor::ChildPid;

/// How long `/readyz` waits for Redis before calling it unavailable.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

pub struct Readiness {
    lanes: Lanes,
    /// The lease service's own lanes.
    lease_lanes: Lanes,
    /// The embedded server's pid, when the daemon runs one.
    embedded: Option<ChildPid>,
    started: AtomicBool,
}

impl Readiness {
    pub fn new(lanes: Lanes, lease_lanes: Lanes, embedded: Option<ChildPid>) -> Self {
        Self {
            lanes,
            lease_lanes,
            embedded,
            started: AtomicBool::new(false),
        }
    }

    /// Marks start-up as complete (policy loaded, every listener up).
    pub fn mark_started(&self) {
        self.started.store(true, Ordering::Release);
    }

    /// Every reason the daemon is not ready; empty when it is.
    pub async fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.started.load(Ordering::Acquire) {
            problems.push("starting: policy not loaded yet".to_owned());
        }
        let status = self.lanes.status();
        if status.state != LifeState::Open {
            problems.push("lanes are closing: the daemon is shutting down".to_owned());
            return problems;
        }
        if self
            .embedded
            .as_ref()
            .is_some_and(|pid| pid.get().is_none())
        {
            problems.push("embedded redis-server exited; it is being restarted".to_owned());
        }
        let (clients, leases) = tokio::join!(
            self.lanes.ping(PROBE_TIMEOUT),
            self.lease_lanes.ping(PROBE_TIMEOUT)
        );
        if let Err(error) = clients {
            problems.push(format!("redis unavailable: {error}"));
        }
        if let Err(error) = leases {
            problems.push(format!("redis unavailable to the lease service: {error}"));
        }
        unavailable_lanes(&status, "lane", &mut problems);
        unavailable_lanes(&self.lease_lanes.status(), "lease lane", &mut problems);
        problems
    }
}

/// A sentence for each lane of `status` that cannot connect right now.
fn unavailable_lanes(status: &tollgate_lanes::LanesStatus, what: &str, problems: &mut Vec<String>) {
    for lane in &status.lanes {
        if let Some(reason) = &lane.unavailable {
            problems.push(format!(
                "{what} {} unavailable: {reason}",
                lane.lane.shout()
            ));
        }
    }
}
