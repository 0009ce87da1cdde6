//! The parts of a running daemon that both servers use, made once by the runtime ([`crate::runtime`])
//! and lent to the HTTP and RESP listeners behind one `Arc`.

use tollgate_lanes::Lanes;
use tollgate_lease::LeaseService;
use tollgate_policy::Admission;

use crate::lane_acl::LaneUsers;
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::server::http::Throttle;
use crate::server::identity::Identities;

/// What every listener shares.
pub struct Services {
    pub readiness: Readiness,
    pub metrics: Metrics,
    /// The only way to Redis (docs/lanes.md).
    pub lanes: Lanes,
    /// Leases on the lease service's own SCRIPT and PUBSUB lanes (docs/leases.md).
    pub leases: LeaseService,
    /// The policy every command and lease passes.
    pub admission: Admission,
    /// Callers' principals and who administers the daemon.
    pub identities: Identities,
    /// Spaces out policy reloads over HTTP (`admin.reload_interval`).
    pub reloads: Throttle,
    /// The lanes' Redis ACL users, kept in step with the policy.
    pub lane_users: LaneUsers,
}
