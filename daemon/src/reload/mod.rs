//! The one policy reload, whoever asks for it: SIGHUP (`cli/serve.rs`), `systemctl reload` (its
//! `ExecReload=` sends SIGHUP) and `POST /v1/policy/reload` all call [`Reloader::reload`]. One
//! throttle spaces reloads out (`admin.reload_interval`), one lock keeps them one at a time, and
//! every reload takes the same steps in the same order:
//!
//! 1. claim the throttle (refused at once, with when to try again, if a reload ran moments ago);
//! 2. take the lock; tell systemd `RELOADING=1`;
//! 3. compile, instantiate and self-test the policy and check its invariants, then swap it in
//!    (`Admission::reload`, off the async workers: it costs a compile of every module);
//! 4. cut the lanes' and scopes' Redis ACL users to the new generation (`LaneUsers::follow`);
//! 5. tell systemd `READY=1`, log one line and count it in `policy_reload_requests`.
//!
//! A rejected policy keeps the running generation and the users cut to it.

mod throttle;

use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tollgate_policy::{Admission, GenerationInfo, PolicyError};

pub use self::throttle::{Claim, Throttle, Throttled};
use crate::config::AdminConfig;
use crate::lane_acl::LaneUsers;
use crate::quotas::Quotas;
use crate::systemd::Notifier;

/// Who asked for a reload: named in its log line and metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP, from a shell or from systemd's `ExecReload=`.
    Signal,
    /// `POST /v1/policy/reload`.
    Http,
}

impl Trigger {
    fn name(self) -> &'static str {
        match self {
            Trigger::Signal => "signal",
            Trigger::Http => "http",
        }
    }
}

/// Why a reload did not swap in a new generation.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(
        "the policy was reloaded moments ago; reloads are at least {} apart (admin.reload_interval)",
        humantime::format_duration(*.interval)
    )]
    Throttled {
        throttled: Throttled,
        interval: std::time::Duration,
    },
    /// The new policy did not compile, self-test or keep its invariants; the running one stays.
    #[error("policy rejected; the running generation stays: {0}")]
    Rejected(PolicyError),
    #[error("reload task failed: {0}")]
    Failed(String),
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    trigger: &'static str,
    /// `reloaded`, `rejected`, `throttled` or `failed`.
    outcome: &'static str,
}

/// The daemon's one way to reload the policy; lent to every listener through `Services`.
pub struct Reloader {
    admission: Admission,
    lane_users: LaneUsers,
    quotas: Arc<Quotas>,
    throttle: Throttle,
    /// Held from the compile to the lane users' update, so two reloads never interleave their
    /// steps (the throttle alone would let one start as soon as the last ended).
    lock: tokio::sync::Mutex<()>,
    notifier: Notifier,
    /// When the active generation was swapped in.
    loaded_at: Mutex<SystemTime>,
    requests: Family<ReloadLabels, Counter>,
}

impl Reloader {
    /// Registers `policy_reload_requests` in `registry`.
    pub fn new(
        admission: Admission,
        lane_users: LaneUsers,
        quotas: Arc<Quotas>,
        admin: &AdminConfig,
        notifier: Notifier,
        registry: &mut Registry,
    ) -> Reloader {
        let requests = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "policy_reload_requests",
            "Policy reloads asked for, by trigger (signal, http) and outcome (reloaded, rejected, throttled, failed)",
            requests.clone(),
        );
        Reloader {
            admission,
            lane_users,
            quotas,
            throttle: Throttle::new(admin.reload_interval),
            lock: tokio::sync::Mutex::new(()),
            notifier,
            loaded_at: Mutex::new(SystemTime::now()),
            requests,
        }
    }

    /// When the active generation was loaded.
    pub fn loaded_at(&self) -> SystemTime {
        *self.loaded_at.lock()
    }

    /// The least time between two reloads.
    pub fn interval(&self) -> std::time::Duration {
        self.throttle.interval()
    }

    /// Reloads the policy, in the steps of the module's header.
    pub async fn reload(&self, trigger: Trigger) -> Result<GenerationInfo, ReloadError> {
        let outcome = self.steps().await;
        let name = match &outcome {
            Ok(generation) => {
                tracing::info!(
                    trigger = trigger.name(),
                    generation = generation.number,
                    "policy reload: reloaded"
                );
                "reloaded"
            }
            Err(error) => {
                tracing::warn!(trigger = trigger.name(), %error, "policy reload: not reloaded");
                match error {
                    ReloadError::Throttled { .. } => "throttled",
                    ReloadError::Rejected(_) => "rejected",
                    ReloadError::Failed(_) => "failed",
                }
            }
        };
        self.requests
            .get_or_create(&ReloadLabels {
                trigger: trigger.name(),
                outcome: name,
            })
            .inc();
        outcome
    }

    async fn steps(&self) -> Result<GenerationInfo, ReloadError> {
        let _claim = self
            .throttle
            .claim()
            .map_err(|throttled| ReloadError::Throttled {
                throttled,
                interval: self.throttle.interval(),
            })?;
        let _one_at_a_time = self.lock.lock().await;
        self.notifier.reloading();
        let admission = self.admission.clone();
        let compiled = tokio::task::spawn_blocking(move || admission.reload()).await;
        let outcome = match compiled {
            Ok(Ok(generation)) => {
                *self.loaded_at.lock() = SystemTime::now();
                // Answered once Redis backs the new policy, so a client that saw the reload sees it.
                self.lane_users.follow(&self.admission).await;
                self.quotas.follow(&self.admission);
                Ok(generation)
            }
            Ok(Err(error)) => Err(ReloadError::Rejected(error)),
            Err(error) => Err(ReloadError::Failed(error.to_string())),
        };
        // The daemon serves on, with the new generation or the old one.
        self.notifier.ready();
        outcome
    }
}
