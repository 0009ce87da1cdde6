//! What every session of the RESP listener shares: the daemon's [`Services`] (admission, the byte
//! total and admission clocks, identities, lanes, lease service), the listener's limits and budgets,
//! and its registry of sessions.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tollgate_resp::Limits;

use super::clients::Clients;
use super::cooldowns::Cooldowns;
use super::deadline;
use super::monitor::Monitors;
use super::subscriptions::SubscriptionShares;
use super::tracking_hub::Hub;
use crate::config::RespConfig;
use crate::server::limits::ConnectionLimits;
use crate::services::Services;

/// What every session shares.
pub struct FrontDoor {
    /// The parts the HTTP listener uses too; `LEASE …` is served by the same lease service.
    pub services: Arc<Services>,
    /// How many connections this listener holds (`limits:`).
    pub(super) connections: ConnectionLimits,
    pub(super) config: RespConfig,
    pub(super) deadlines: deadline::Deadlines,
    pub(super) limits: Limits,
    pub(super) next_client_id: AtomicU64,
    /// The live sessions, as `CLIENT LIST` shows them.
    pub(super) clients: Arc<Clients>,
    /// Sessions in `MONITOR`, and the stream of commands they see.
    pub(super) monitors: Arc<Monitors>,
    /// The socket's path, which `CLIENT LIST` shows as each session's address.
    pub(super) socket: String,
    /// Each user's subscriptions together, against `resp.max_subscriptions_per_uid`.
    pub(super) subscription_shares: Arc<SubscriptionShares>,
    /// Each user's script cooldown, after one of its scripts was stopped at its time limit.
    pub(super) cooldowns: Cooldowns,
    /// `CLIENT TRACKING` for the sessions.
    pub(super) tracking: Arc<Hub>,
}

impl FrontDoor {
    pub fn new(
        services: Arc<Services>,
        config: RespConfig,
        connections: ConnectionLimits,
        socket: String,
        stop: CancellationToken,
    ) -> Self {
        let subscriptions_per_uid = config.max_subscriptions_per_uid;
        // Only while scripts are stopped at all.
        let script_cooldown = match config.script_time_limit.is_zero() {
            true => std::time::Duration::ZERO,
            false => config.script_cooldown,
        };
        let clients: Arc<Clients> = Arc::default();
        let tracking = Hub::start(services.clone(), clients.clone(), stop);
        Self {
            services,
            connections,
            limits: config.limits(),
            deadlines: deadline::Deadlines::new(config.command_timeout, &config.command_deadlines),
            config,
            next_client_id: AtomicU64::new(1),
            clients,
            monitors: Arc::default(),
            socket,
            subscription_shares: Arc::new(SubscriptionShares::new(subscriptions_per_uid)),
            cooldowns: Cooldowns::new(script_cooldown),
            tracking,
        }
    }
}
