//! The lanes' Redis ACL users under the active policy: which commands each lane's user is granted,
//! and keeping the users in step when the policy is reloaded — set again on an embedded Redis,
//! checked with `ACL DRYRUN` on an external one.
//!
//! A lane's user gets every command some principal could be admitted to run ([`Admissible`]) that
//! the front door sends on that lane ([`Route`]). Because a session that holds a TRANSACTION
//! connection (after WATCH or MULTI) sends everything there, that user gets every command that
//! reaches Redis at all. A script's `redis.call`s run as the SCRIPT (or TRANSACTION) user, so the
//! SCRIPT user also gets everything the principals that may run scripts may run themselves: a
//! script can do what its caller could do command by command, and no more than that.

use std::sync::Arc;
use std::time::Duration;

use tollgate_lanes::{Endpoint, LaneGrants, Lanes, LanesConfig, ProvisionedUsers, ScopeLogin};
use tollgate_model::Lane;
use tollgate_policy::{Admissible, Admission, Generation, PolicyConfig, PolicyError};

use crate::embedded;
use crate::scope_users::{Provisioning, ScopeLogins};
use crate::server::resp::Route;

/// The grants of the lanes' users under `admissible`.
pub fn grants(admissible: &Admissible) -> LaneGrants {
    let mut grants = LaneGrants::default();
    for command in &admissible.commands {
        grants.know(&command.name, command.arity);
    }
    for reach in &admissible.principals {
        let runs_scripts = admissible
            .of(reach)
            .any(|(lane, command)| lane == Lane::Script && command.runs_code);
        for (lane, command) in admissible.of(reach) {
            let route = Route::of(&command.name, lane);
            match route {
                Route::Subscription => grants.grant(Lane::Pubsub, &command.name),
                Route::Lane(lane) => {
                    grants.grant(lane, &command.name);
                    grants.grant(Lane::Transaction, &command.name);
                }
                Route::ServedWith(sends) => {
                    for send in sends {
                        grants.grant(Lane::Regular, send);
                    }
                }
                Route::Answered => {}
            }
            // Inside a script even the commands the daemon answers itself (PING, ECHO) reach
            // Redis; subscribing does not exist there, and a raw flush of the clients' database
            // runs on no client lane (the front door serves FLUSHDB key by key).
            let raw_flush = matches!(command.name.as_str(), "FLUSHDB" | "FLUSHALL");
            if runs_scripts && route != Route::Subscription && !raw_flush {
                grants.grant(Lane::Script, &command.name);
            }
        }
    }
    grants
}

/// The grants under the policy `config` describes, compiled as the daemon would compile it.
pub fn grants_for(config: &PolicyConfig) -> Result<LaneGrants, PolicyError> {
    Ok(grants(&compiled(config)?.admissible()))
}

/// The policy `config` describes, compiled as the daemon would compile it.
pub fn compiled(config: &PolicyConfig) -> Result<Arc<Generation>, PolicyError> {
    let mut registry = prometheus_client::registry::Registry::default();
    Ok(Admission::load(config, &mut registry)?.current())
}

/// Keeps the lanes' users, and the scopes' (`scope_users`), in step with the policy; cheap to
/// clone.
#[derive(Clone)]
pub struct LaneUsers(Arc<Keeper>, ScopeLogins);

enum Keeper {
    /// The daemon made the users, and makes them again.
    Embedded {
        users: ProvisionedUsers,
        endpoint: Endpoint,
        /// The script time limit its `busy-reply-threshold` is kept at (`embedded::kept_script_limit`).
        script_limit: Option<Duration>,
    },
    /// The operator made them: the daemon checks them, as the lease user.
    External {
        lease_lanes: Lanes,
        clients: Box<LanesConfig>,
    },
}

impl LaneUsers {
    pub fn embedded(
        users: ProvisionedUsers,
        endpoint: Endpoint,
        script_limit: Option<Duration>,
    ) -> LaneUsers {
        LaneUsers(
            Arc::new(Keeper::Embedded {
                users,
                endpoint,
                script_limit,
            }),
            ScopeLogins::default(),
        )
    }

    pub fn external(lease_lanes: Lanes, clients: LanesConfig) -> LaneUsers {
        LaneUsers(
            Arc::new(Keeper::External {
                lease_lanes,
                clients: Box::new(clients),
            }),
            ScopeLogins::default(),
        )
    }

    /// Cuts the users to the policy now active in `admission`: on an embedded Redis they are set
    /// again (and a restarted server gets these rules); on an external one, each lane user that is
    /// too narrow or too wide for the policy is logged as a warning, naming the commands. Neither
    /// stops the daemon: the policy still decides every command, and what would let a client
    /// reach the reserved keyspace was refused at start-up.
    pub async fn follow(&self, admission: &Admission) {
        let generation = admission.current();
        let grants = grants(&generation.admissible());
        self.follow_scopes(&generation).await;
        match &*self.0 {
            Keeper::Embedded {
                users,
                endpoint,
                script_limit,
            } => {
                users.regrant(&grants);
                users.keep_busy_threshold(embedded::busy_threshold(
                    *script_limit,
                    generation.quotas(),
                ));
                match users.apply(endpoint).await {
                    Ok(()) => tracing::info!("lane users cut to the policy"),
                    Err(error) => tracing::warn!(
                        %error,
                        "cannot set the lane users for the policy now; a restarted server gets them"
                    ),
                }
            }
            Keeper::External {
                lease_lanes,
                clients,
            } => check(lease_lanes, clients, &grants).await,
        }
    }
}

impl LaneUsers {
    /// On an embedded Redis, keeps its `busy-reply-threshold` at the shortest script time limit
    /// of the config and `generation`'s quotas, and sets it now when a quota lowers it below the
    /// one the server was started with. At start; a reload's [`LaneUsers::follow`] sets it too.
    pub async fn follow_script_limits(&self, generation: &Generation) {
        let Keeper::Embedded {
            users,
            endpoint,
            script_limit,
        } = &*self.0
        else {
            return;
        };
        let threshold = embedded::busy_threshold(*script_limit, generation.quotas());
        users.keep_busy_threshold(threshold);
        if threshold != *script_limit {
            match users.apply(endpoint).await {
                Ok(()) => tracing::info!(
                    ?threshold,
                    "busy-reply-threshold lowered to a quota's script_time_limit"
                ),
                Err(error) => tracing::warn!(
                    %error,
                    "cannot lower busy-reply-threshold to a quota's script_time_limit: that \
                     principal's scripts are stopped only from the server's threshold on"
                ),
            }
        }
    }

    /// Makes the scopes' users those of `generation`: on an embedded Redis, set (and the logins
    /// of their pools kept); on an external one, those the operator made, once checked.
    pub async fn follow_scopes(&self, generation: &Generation) {
        let provisioning = match &*self.0 {
            Keeper::Embedded {
                users, endpoint, ..
            } => Provisioning::Embedded(users, endpoint),
            Keeper::External {
                lease_lanes,
                clients,
            } => Provisioning::External {
                leases: lease_lanes,
                clients,
            },
        };
        self.1.follow(generation, provisioning).await;
    }

    /// The login of the scope user `user`, if it is ready for use.
    pub fn scope_login(&self, user: &str) -> Option<ScopeLogin> {
        self.1.of(user)
    }
}

/// Logs each lane user of an external Redis that does not match `grants`.
pub async fn check(lease_lanes: &Lanes, clients: &LanesConfig, grants: &LaneGrants) {
    match tollgate_lanes::check_grants(lease_lanes, clients, grants).await {
        Ok(mismatches) if mismatches.is_empty() => {
            tracing::info!("every lane user matches the policy");
        }
        Ok(mismatches) => {
            for mismatch in mismatches {
                tracing::warn!(
                    lane = %mismatch.lane,
                    user = %mismatch.user,
                    too_narrow = ?mismatch.too_narrow,
                    too_wide = ?mismatch.too_wide,
                    "{mismatch}"
                );
            }
        }
        Err(error) => tracing::warn!(%error, "cannot check the lane users against the policy"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use tollgate_policy::{AdmissibleCommand, PrincipalReach};

    use super::*;

    fn command(name: &str, runs_code: bool) -> AdmissibleCommand {
        AdmissibleCommand {
            name: name.into(),
            arity: -1,
            runs_code,
        }
    }

    /// Commands GET, KEYS, EVAL, SUBSCRIBE, PUBLISH, CONFIG|GET, INFO, BLPOP, MULTI.
    fn admissible(principals: &[(&str, &[(Lane, usize)])]) -> Admissible {
        Admissible {
            commands: vec![
                command("GET", false),
                command("KEYS", false),
                command("EVAL", true),
                command("SUBSCRIBE", false),
                command("PUBLISH", false),
                command("CONFIG|GET", false),
                command("INFO", false),
                command("BLPOP", false),
                command("MULTI", false),
            ],
            principals: principals
                .iter()
                .map(|(name, commands)| PrincipalReach {
                    principal: Some((*name).into()),
                    commands: commands.iter().copied().collect::<BTreeSet<_>>(),
                })
                .collect(),
        }
    }

    fn granted(grants: &LaneGrants, lane: Lane) -> Vec<&str> {
        grants.granted(lane).collect()
    }

    #[test]
    fn each_command_goes_to_the_lane_it_is_sent_on_and_everything_to_transaction() {
        let grants = grants(&admissible(&[(
            "app",
            &[
                (Lane::Regular, 0),
                (Lane::Pubsub, 3),
                (Lane::Regular, 4),
                (Lane::Admin, 5),
                (Lane::Admin, 6),
                (Lane::Blocking, 7),
                (Lane::Transaction, 8),
            ],
        )]));
        assert_eq!(granted(&grants, Lane::Regular), ["get", "publish"]);
        assert_eq!(granted(&grants, Lane::Pubsub), ["subscribe"]);
        assert_eq!(granted(&grants, Lane::Blocking), ["blpop"]);
        // CONFIG GET is sent for Redis's values (the daemon removes the secrets).
        assert_eq!(granted(&grants, Lane::Admin), ["config|get", "info"]);
        assert_eq!(
            granted(&grants, Lane::Transaction),
            ["blpop", "config|get", "get", "info", "multi", "publish"]
        );
        // No principal runs scripts: the SCRIPT user runs nothing.
        assert_eq!(granted(&grants, Lane::Script), Vec::<&str>::new());
        assert!(grants.known().any(|(name, _)| name == "config|get"));
    }

    #[test]
    fn scripts_may_call_what_their_principals_may_run() {
        let grants = grants(&admissible(&[
            (
                "scripter",
                &[(Lane::Regular, 0), (Lane::Script, 2), (Lane::Pubsub, 3)],
            ),
            ("keys", &[(Lane::Regular, 1)]),
        ]));
        assert_eq!(granted(&grants, Lane::Script), ["eval", "get"]);
        // KEYS is run by a principal who cannot run scripts: scripts do not get it.
        assert!(!grants.is_granted(Lane::Script, "keys"));
        // KEYS is served with SCAN: Redis never runs a raw KEYS for a client.
        assert!(!grants.is_granted(Lane::Regular, "keys"));
        assert!(grants.is_granted(Lane::Regular, "scan"));
        assert!(grants.is_granted(Lane::Transaction, "eval"));
    }
}
