//! Lane configuration as operators write it (every field optional) and as the lanes use it (resolved
//! against each lane's defaults from docs/lanes.md's table).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use tollgate_model::reserved::DEFAULT_LEASE_DATABASE;
use tollgate_model::Lane;

/// The `lanes:` section of `tollgate.yaml`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LanesConfig {
    pub regular: LaneOverrides,
    pub blocking: LaneOverrides,
    pub transaction: LaneOverrides,
    pub script: LaneOverrides,
    pub pubsub: LaneOverrides,
    pub admin: LaneOverrides,
    /// The lease service's own connections, apart from every client lane.
    pub leases: LeaseConnections,
    /// The connections key-constrained principals' scripts run on, one pool per scope.
    pub scopes: ScopeSettings,
    /// The uid the Redis server must run as, checked (`SO_PEERCRED`) on every new connection before
    /// anything, a password first, is sent on it. The daemon sets its own uid for the embedded
    /// server it starts; the config file cannot set it.
    #[serde(skip)]
    pub server_uid: Option<u32>,
    /// How long Redis may take to answer a command on any lane before its connection is closed
    /// and the command fails as indeterminate (commands that say how long they take get their own
    /// deadline from their caller). Set by the daemon from `resp.command_timeout`; `None`: no limit.
    #[serde(skip)]
    pub command_timeout: Option<Duration>,
}

/// `lanes.leases`: how the lease service reaches Redis. Its user is the only one that may touch the
/// reserved keyspace (`docs/lanes.md`); its keys live in their own database.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConnections {
    /// Redis ACL user of the lease connections.
    pub user: Option<String>,
    /// File holding that user's password (first line).
    pub password_file: Option<PathBuf>,
    /// The database lease state lives in. Client lanes serve database 0 only and may not
    /// `SELECT`, so a database of its own keeps lease keys out of clients' `SCAN` and `KEYS`.
    pub database: u32,
}

impl Default for LeaseConnections {
    fn default() -> Self {
        Self {
            user: None,
            password_file: None,
            database: DEFAULT_LEASE_DATABASE,
        }
    }
}

/// `lanes.scopes`: the pools of the scopes' Redis users (docs/lanes.md, "Scopes").
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ScopeSettings {
    /// Most scopes with connections at once; a script of one more scope is refused, naming it.
    pub max: usize,
    /// Connections of each scope's pool, per protocol.
    pub connections: usize,
    /// How long a pool no session holds stays open.
    #[serde(with = "humantime_serde")]
    pub idle: Duration,
    /// On an external Redis, the directory of the scope users' password files
    /// (`<user>.password`, as `tollgate redis-acl --passwords` writes them); the operator makes
    /// the users. `None`: no scope users there, and scoped principals' scripts are refused. The
    /// embedded Redis ignores it: the daemon makes its scope users itself.
    pub passwords: Option<PathBuf>,
}

impl Default for ScopeSettings {
    fn default() -> Self {
        ScopeSettings {
            max: 64,
            connections: 1,
            idle: Duration::from_secs(60),
            passwords: None,
        }
    }
}

/// One lane as written in the config; what is left out takes the lane's default.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LaneOverrides {
    /// Redis ACL user for this lane's connections.
    pub user: Option<String>,
    /// File holding that user's password (first line); never the password itself in the config.
    pub password_file: Option<PathBuf>,
    /// Ceiling on connections to Redis.
    pub connections: Option<usize>,
    /// Ceiling on commands in flight (multiplexed lanes only).
    pub in_flight: Option<usize>,
    /// How long a borrower may wait for a connection before `LaneSaturated`.
    #[serde(with = "humantime_serde::option")]
    pub acquire_timeout: Option<Duration>,
    /// How many borrowers may wait at once before new ones are refused at once.
    pub queue_length: Option<usize>,
    /// Most connections of an exclusive lane lent to one user of a principal at once; on a
    /// multiplexed lane, most commands of one user outstanding on it (in flight or queued).
    pub per_principal: Option<usize>,
}

/// A lane's settings after defaults are applied.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneSettings {
    pub lane: Lane,
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
    pub connections: usize,
    pub in_flight: usize,
    pub acquire_timeout: Duration,
    pub queue_length: usize,
    /// Most connections one user of a principal may borrow at once (exclusive lanes), or most
    /// commands it may have outstanding (multiplexed lanes: the daemon's sessions hold back past it).
    pub per_principal: usize,
    /// See [`LanesConfig::command_timeout`].
    pub command_timeout: Option<Duration>,
}

impl LanesConfig {
    pub fn overrides(&self, lane: Lane) -> &LaneOverrides {
        match lane {
            Lane::Regular => &self.regular,
            Lane::Blocking => &self.blocking,
            Lane::Transaction => &self.transaction,
            Lane::Script => &self.script,
            Lane::Pubsub => &self.pubsub,
            Lane::Admin => &self.admin,
        }
    }

    pub fn overrides_mut(&mut self, lane: Lane) -> &mut LaneOverrides {
        match lane {
            Lane::Regular => &mut self.regular,
            Lane::Blocking => &mut self.blocking,
            Lane::Transaction => &mut self.transaction,
            Lane::Script => &mut self.script,
            Lane::Pubsub => &mut self.pubsub,
            Lane::Admin => &mut self.admin,
        }
    }

    /// The settings of one lane: what the operator wrote, else docs/lanes.md's default.
    pub fn settings(&self, lane: Lane) -> LaneSettings {
        let written = self.overrides(lane);
        let (connections, in_flight) = default_ceiling(lane);
        let connections = written.connections.unwrap_or(connections);
        let in_flight = written.in_flight.unwrap_or(in_flight);
        let queue_length = written.queue_length.unwrap_or(1024);
        // An exclusive lane's share is of its connections; a multiplexed lane's, of the commands
        // it accepts, half of them: every session of a user past its share may still send one,
        // so what the user holds is its share plus one per session, and half of REGULAR's 2,048
        // plus `limits.max_clients_per_uid` (1,000) still leaves the others room. A quarter
        // would hold back one user's ordinary pipelining (50 clients at `-P 16` keep 800 in
        // flight): measured 10-30% more CPU per pipelined command, for no other user's gain.
        let share = match lane {
            Lane::Regular | Lane::Script => (in_flight.saturating_add(queue_length) / 2).max(1),
            Lane::Blocking | Lane::Transaction | Lane::Pubsub | Lane::Admin => {
                default_share(connections)
            }
        };
        LaneSettings {
            lane,
            user: written.user.clone(),
            password_file: written.password_file.clone(),
            connections,
            per_principal: written.per_principal.unwrap_or(share),
            in_flight,
            acquire_timeout: written.acquire_timeout.unwrap_or(Duration::from_secs(2)),
            queue_length,
            command_timeout: self.command_timeout,
        }
    }

    /// The lanes the lease service opens for itself: every lane authenticates as the lease user
    /// (only SCRIPT, PUBSUB and ADMIN are used), with the client lanes' ceilings.
    pub fn for_leases(&self) -> LanesConfig {
        let as_lease_user = |lane: &LaneOverrides| LaneOverrides {
            user: self.leases.user.clone(),
            password_file: self.leases.password_file.clone(),
            ..lane.clone()
        };
        LanesConfig {
            regular: as_lease_user(&self.regular),
            blocking: as_lease_user(&self.blocking),
            transaction: as_lease_user(&self.transaction),
            script: as_lease_user(&self.script),
            pubsub: as_lease_user(&self.pubsub),
            admin: as_lease_user(&self.admin),
            leases: self.leases.clone(),
            scopes: self.scopes.clone(),
            server_uid: self.server_uid,
            command_timeout: self.command_timeout,
        }
    }

    /// Problems a YAML parser cannot see: zero ceilings and the like.
    pub fn validate(&self) -> Result<(), ZeroSetting> {
        for lane in Lane::ALL {
            let settings = self.settings(lane);
            let zero = [
                ("connections", settings.connections),
                ("in_flight", settings.in_flight),
                ("per_principal", settings.per_principal),
            ]
            .into_iter()
            .find(|(_, value)| *value == 0);
            if let Some((setting, _)) = zero {
                return Err(ZeroSetting { lane, setting });
            }
        }
        Ok(())
    }
}

/// A lane setting the YAML types allow but no lane can work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lanes.{lane}.{setting} must be at least 1")]
pub struct ZeroSetting {
    pub lane: Lane,
    pub setting: &'static str,
}

/// Three quarters of an exclusive lane's connections (at least one): no user of a principal holds
/// every connection of a lane that has more than one.
fn default_share(connections: usize) -> usize {
    (connections.saturating_mul(3) / 4).max(1)
}

/// docs/lanes.md's table: (connections, commands in flight per lane).
fn default_ceiling(lane: Lane) -> (usize, usize) {
    match lane {
        Lane::Regular => (4, 1024),
        Lane::Blocking => (32, 1),
        Lane::Transaction => (16, 1),
        Lane::Script => (2, 256),
        Lane::Pubsub => (4, 1),
        Lane::Admin => (2, 1),
    }
}
