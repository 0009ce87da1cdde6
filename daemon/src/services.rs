//! The parts of a running daemon that both servers use, made once by the runtime ([`crate::runtime`])
//! and lent to the HTTP and RESP listeners behind one `Arc`.

use std::sync::Arc;

use tollgate_lanes::Lanes;
use tollgate_lease::LeaseService;
use tollgate_policy::Admission;

use crate::lane_acl::LaneUsers;
use crate::metrics::Metrics;
use crate::principal_gauges::PrincipalGauges;
use crate::quotas::Quotas;
use crate::readiness::Readiness;
use crate::reload::Reloader;
use crate::server::identity::Identities;
use crate::server::resp::admission_clock::AdmissionClocks;
use crate::server::resp::cached::NearCache;
use crate::server::resp::flights::Flights;
use crate::server::resp::namespace::Namespace;
use crate::server::resp::pool::Pool;

/// What every listener shares.
pub struct Services {
    pub readiness: Readiness,
    pub metrics: Metrics,
    /// The only way to Redis (docs/lanes.md).
    pub lanes: Lanes,
    /// The lease service's own lanes; also how `/v1/status` asks each master its version (their
    /// user may run `HELLO` whatever the policy admits).
    pub lease_lanes: Lanes,
    /// Leases on the lease service's own SCRIPT and PUBSUB lanes (docs/leases.md).
    pub leases: LeaseService,
    /// The policy every command and lease passes.
    pub admission: Admission,
    /// Callers' principals and who administers the daemon.
    pub identities: Identities,
    /// The one way to reload the policy (SIGHUP, `systemctl reload`, HTTP).
    pub reloader: Reloader,
    /// The lanes' Redis ACL users, kept in step with the policy.
    pub lane_users: LaneUsers,
    /// How Redis is reached: `embedded`, `standalone`, `sentinel` or `cluster`.
    pub redis_mode: &'static str,
    /// The budgets and limits in force, as `/v1/status` shows them.
    pub settings: serde_json::Value,
    /// Every RESP client's held bytes together (`resp.budgets.total`), and each user's share.
    pub pool: Arc<Pool>,
    /// Each user's commands in flight on the multiplexed lanes, against its share of each.
    pub flights: Flights,
    /// Each user's admission time, against its share of the workers.
    pub admission_clocks: Arc<AdmissionClocks>,
    /// The policy's quotas' buckets, per quota and principal.
    pub quotas: Arc<Quotas>,
    /// The near cache (docs/cache.md); `None` when `cache.keys` is empty, the default.
    pub cache: Option<NearCache>,
    /// `/v1/principals`' census per principal in `/metrics`, set at each scrape.
    pub principal_gauges: PrincipalGauges,
    /// Tenants' places in Redis's one namespace of scripts and libraries (`namespace.rs`).
    pub namespace: Arc<Namespace>,
}
