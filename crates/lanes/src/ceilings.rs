//! A cluster's daemon-wide ceilings. Each master's lanes keep their own ceilings, as the lanes to
//! one server do; these hold across all of them, so that a cluster of N masters never takes more
//! of a lane than one server would get: an exclusive lane's `connections` and `per_principal`, a
//! multiplexed lane's `in_flight`. (A multiplexed lane's `connections` and PUBSUB's stay per node:
//! every master needs its own connections to be reached at all.) A node's gate is entered first,
//! then the cluster's, with the same deadline; see [`Gate::under`] and [`Shares::under`].

use std::sync::Arc;

use tollgate_model::Lane;

use crate::config::LanesConfig;
use crate::gate::{Gate, Queue};
use crate::metrics::Families;
use crate::share::Shares;

/// The ceilings a node's lane sits under; none on one server.
#[derive(Clone, Default)]
pub(crate) struct Outer {
    pub(crate) gate: Option<Arc<Gate>>,
    pub(crate) shares: Option<Arc<Shares>>,
}

/// The daemon-wide ceiling of every lane that has one.
pub(crate) struct Ceilings {
    lanes: Vec<(Lane, Outer)>,
}

impl Ceilings {
    pub(crate) fn new(config: &LanesConfig, families: &Families) -> Ceilings {
        let lanes = Lane::ALL
            .into_iter()
            .filter_map(|lane| {
                let settings = config.settings(lane);
                // Only its waiters and refusals are counted through these: a node's gate takes the
                // outer permit itself and counts what is in use and how long it took, once.
                let metrics = families.lane(lane);
                let (ceiling, queue, shares) = match lane {
                    Lane::Regular | Lane::Script => (settings.in_flight, Queue::External, None),
                    Lane::Blocking | Lane::Transaction | Lane::Admin => (
                        settings.connections,
                        Queue::Bounded(settings.queue_length),
                        Some(Shares::new(
                            settings.per_principal,
                            settings.acquire_timeout,
                        )),
                    ),
                    Lane::Pubsub => return None,
                };
                let gate = Gate::new(lane, ceiling, queue, settings.acquire_timeout, metrics);
                let outer = Outer {
                    gate: Some(Arc::new(gate)),
                    shares,
                };
                Some((lane, outer))
            })
            .collect();
        Ceilings { lanes }
    }

    /// What `lane` of every node sits under.
    pub(crate) fn of(&self, lane: Lane) -> Outer {
        self.lanes
            .iter()
            .find(|(of, _)| *of == lane)
            .map(|(_, outer)| outer.clone())
            .unwrap_or_default()
    }
}
