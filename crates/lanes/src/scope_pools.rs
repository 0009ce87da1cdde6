//! The scopes' pools: for each scope user (`scope_acl`), a small multiplexed pool of connections
//! logged in as that user, on which its principals' script commands run (SCRIPT's channel, for
//! them). A pool opens on first use, counts against `lanes.scopes.max` (one more is refused,
//! naming the scope), and is closed once no session has held it for `lanes.scopes.idle`. Its
//! scripts are watched and stopped past their time limit like SCRIPT's (the node's script watch
//! and kill connection: `SCRIPT KILL` stops whichever script runs, whoever runs it).
//!
//! A pool's connections are outside SCRIPT's ceiling: at most `max` pools of `connections` per
//! protocol each.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tollgate_model::Protocol;

use crate::ceilings::Outer;
use crate::config::{LaneSettings, ScopeSettings};
use crate::connector::Connector;
use crate::credentials::Credentials;
use crate::error::LaneError;
use crate::life::Life;
use crate::locator::Locator;
use crate::metrics::LaneMetrics;
use crate::multiplex::{MultiplexedLane, NodeChannel, Scripts};

/// A scope user and its password, as the daemon provisioned it.
#[derive(Clone, PartialEq, Eq)]
pub struct ScopeLogin {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for ScopeLogin {
    /// The user only: the password stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopeLogin")
            .field("user", &self.user)
            .finish()
    }
}

pub(crate) struct ScopePools {
    settings: ScopeSettings,
    /// SCRIPT's settings, with the scopes' connection count.
    lane: LaneSettings,
    locator: Arc<Locator>,
    server_uid: Option<u32>,
    metrics: LaneMetrics,
    scripts: Scripts,
    node: Arc<Life>,
    pools: Mutex<HashMap<String, Pool>>,
}

struct Pool {
    lane: Arc<MultiplexedLane>,
    password: String,
    life: Arc<Life>,
    /// Since when no session has held the pool.
    unheld_since: Option<Instant>,
    drivers: JoinSet<()>,
}

impl Pool {
    /// Whether some session holds a channel on it (beyond the pool and its drivers).
    fn held(&self, connections: usize) -> bool {
        Arc::strong_count(&self.lane) > 1 + connections * Protocol::ALL.len()
    }

    fn close(self) {
        self.life.start_draining();
        self.life.kill();
        self.lane.close_gate();
        // Dropping the drivers' set stops any driver still running.
        drop(self.drivers);
    }
}

impl ScopePools {
    pub(crate) fn new(
        settings: ScopeSettings,
        script: &LaneSettings,
        locator: Arc<Locator>,
        server_uid: Option<u32>,
        metrics: LaneMetrics,
        scripts: Scripts,
        node: Arc<Life>,
    ) -> ScopePools {
        let lane = LaneSettings {
            connections: settings.connections.max(1),
            ..script.clone()
        };
        ScopePools {
            settings,
            lane,
            locator,
            server_uid,
            metrics,
            scripts,
            node,
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// A channel on `login`'s pool speaking `protocol`, the pool opened if it is not.
    pub(crate) fn channel(
        &self,
        login: &ScopeLogin,
        protocol: Protocol,
    ) -> Result<NodeChannel, LaneError> {
        if !self.node.is_open() {
            return Err(LaneError::Closed);
        }
        let mut pools = self.pools.lock();
        // A user given a new password (set again after a reload) gets new connections.
        if pools
            .get(&login.user)
            .is_some_and(|pool| pool.password != login.password)
        {
            if let Some(pool) = pools.remove(&login.user) {
                pool.close();
            }
        }
        if let Some(pool) = pools.get_mut(&login.user) {
            pool.unheld_since = None;
            return Ok(pool.lane.channel(protocol));
        }
        if pools.len() >= self.settings.max {
            self.sweep(&mut pools, Duration::ZERO);
        }
        if pools.len() >= self.settings.max {
            return Err(LaneError::Scope {
                user: login.user.clone(),
                reason: format!(
                    "{} scopes (lanes.scopes.max) have connections already; its scripts cannot \
                     run until one closes",
                    self.settings.max
                ),
            });
        }
        let pool = self.open(login);
        let channel = pool.lane.channel(protocol);
        pools.insert(login.user.clone(), pool);
        Ok(channel)
    }

    fn open(&self, login: &ScopeLogin) -> Pool {
        let connector = Connector::new(
            "tollgate-scope",
            self.locator.clone(),
            Some(Credentials {
                user: login.user.clone(),
                password: login.password.clone(),
            }),
            None,
            self.server_uid,
            self.metrics.clone(),
        );
        let life = Arc::new(Life::new());
        let mut drivers = JoinSet::new();
        let lane = MultiplexedLane::start(
            &self.lane,
            Arc::new(connector),
            self.metrics.clone(),
            life.clone(),
            self.scripts.clone(),
            Outer::default(),
            &mut drivers,
        );
        tracing::info!(user = %login.user, "scope pool opened");
        Pool {
            lane,
            password: login.password.clone(),
            life,
            unheld_since: None,
            drivers,
        }
    }

    /// Closes every pool no session has held for `idle`.
    fn sweep(&self, pools: &mut HashMap<String, Pool>, idle: Duration) {
        let now = Instant::now();
        let connections = self.lane.connections;
        let mut idle_users = Vec::new();
        for (user, pool) in pools.iter_mut() {
            if pool.held(connections) {
                pool.unheld_since = None;
                continue;
            }
            let since = *pool.unheld_since.get_or_insert(now);
            if now.duration_since(since) >= idle {
                idle_users.push(user.clone());
            }
        }
        for user in idle_users {
            if let Some(pool) = pools.remove(&user) {
                tracing::info!(%user, "scope pool closed: no session held it");
                pool.close();
            }
        }
    }

    /// Sweeps every `idle / 2` (at least each second) until the node drains.
    pub(crate) async fn keep_swept(self: Arc<Self>) {
        let every = (self.settings.idle / 2).max(Duration::from_secs(1));
        let mut ticks = tokio::time::interval(every);
        loop {
            ticks.tick().await;
            let mut pools = self.pools.lock();
            self.sweep(&mut pools, self.settings.idle);
        }
    }

    /// How many pools are open (for tests and status).
    pub(crate) fn open_pools(&self) -> usize {
        self.pools.lock().len()
    }

    /// Closes every pool (the node is closing).
    pub(crate) fn close_all(&self) {
        let pools: Vec<Pool> = self.pools.lock().drain().map(|(_, pool)| pool).collect();
        for pool in pools {
            pool.close();
        }
    }
}
