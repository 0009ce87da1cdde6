//! The entry point every command and lease takes: the active generation behind an `ArcSwap`, so a
//! decision is a lock-free load plus the generation's module calls, and a reload swaps atomically.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use bytes::Bytes;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tollgate_model::Caller;

use crate::config::PolicyConfig;
use crate::decision::{Decision, Descriptor};
use crate::decision_log::{DecisionLog, Entry, MAX_KEYS};
use crate::error::PolicyError;
use crate::generation::{Generation, GenerationInfo, Step};
use crate::lease_memo::LeaseMemo;
use crate::metrics::PolicyMetrics;
use crate::proven;
use crate::sandbox::Sandbox;

/// Admission for the whole daemon; cheap to clone.
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

struct Inner {
    config: PolicyConfig,
    sandbox: Arc<Sandbox>,
    current: ArcSwap<Generation>,
    metrics: PolicyMetrics,
    log: Option<DecisionLog>,
    /// Serialises reloads so generation numbers stay in order.
    reloading: Mutex<()>,
}

impl Admission {
    /// Builds generation 1 from `config`; any error is a start error.
    pub fn load(config: &PolicyConfig, registry: &mut Registry) -> Result<Admission, PolicyError> {
        let sandbox =
            Arc::new(
                Sandbox::new(config.all_limits()).map_err(|error| PolicyError::Module {
                    name: "engine".into(),
                    detail: format!("{error:#}"),
                })?,
            );
        let generation = proven::build(&sandbox, config, 1)?;
        let metrics = PolicyMetrics::register(registry);
        metrics.reloaded(Some(1));
        let log = match &config.decision_log {
            Some(log) => Some(DecisionLog::open(log, metrics.log_dropped.clone()).map_err(
                |source| PolicyError::DecisionLog {
                    path: log.path.clone(),
                    source,
                },
            )?),
            None => None,
        };
        Ok(Admission {
            inner: Arc::new(Inner {
                config: config.clone(),
                sandbox,
                current: ArcSwap::from_pointee(generation),
                metrics,
                log,
                reloading: Mutex::new(()),
            }),
        })
    }

    /// Decides one command (`argv[0]` is its name).
    pub fn admit<A: AsRef<[u8]>>(&self, caller: &Caller, argv: &[A]) -> Decision {
        let Some(log) = &self.inner.log else {
            let decision = self.inner.current.load().admit(caller, argv);
            self.inner.metrics.decided(&decision);
            return decision;
        };
        let started = Instant::now();
        let generation = self.inner.current.load();
        let decision = generation.admit(caller, argv);
        self.record(log, caller, argv, &decision, &generation, started.elapsed());
        decision
    }

    /// Decides several commands of one caller (a pipeline), each as [`Admission::admit`] would,
    /// entering each guard once for all of them. Each is counted and logged on its own; a logged
    /// latency is the batch's, shared out evenly.
    pub fn admit_all<A: AsRef<[u8]>>(&self, caller: &Caller, argvs: &[&[A]]) -> Vec<Decision> {
        let started = Instant::now();
        let generation = self.inner.current.load();
        let decisions = generation.admit_all(caller, argvs);
        let Some(log) = &self.inner.log else {
            decisions.iter().for_each(|d| self.inner.metrics.decided(d));
            return decisions;
        };
        let share = started.elapsed() / argvs.len().max(1) as u32;
        for (argv, decision) in argvs.iter().zip(&decisions) {
            self.record(log, caller, argv, decision, &generation, share);
        }
        decisions
    }

    /// The `keys` the caller may `access` (a command such as `EXISTS` or `UNLINK` applied to each
    /// alone) under the current policy, in their order. Not counted or logged as admissions: this
    /// is the daemon asking on the caller's behalf, for a whole-keyspace command already admitted.
    pub fn touchable<K: AsRef<[u8]>>(&self, caller: &Caller, access: &str, keys: Vec<K>) -> Vec<K> {
        let argvs: Vec<[&[u8]; 2]> = keys
            .iter()
            .map(|key| [access.as_bytes(), key.as_ref()])
            .collect();
        let argvs: Vec<&[&[u8]]> = argvs.iter().map(|argv| &argv[..]).collect();
        let decisions = self.inner.current.load().admit_all(caller, &argvs);
        keys.into_iter()
            .zip(decisions)
            .filter(|(_, decision)| matches!(decision, Decision::Admitted { .. }))
            .map(|(key, _)| key)
            .collect()
    }

    fn record<A: AsRef<[u8]>>(
        &self,
        log: &DecisionLog,
        caller: &Caller,
        argv: &[A],
        decision: &Decision,
        generation: &Generation,
        latency: Duration,
    ) {
        self.inner.metrics.decided(decision);
        // A denied command's keys and lane, as the catalog describes it (cached for the argv
        // shapes admission already asked about); none for a command no catalog knows.
        let described;
        let (descriptor, lane) = match decision {
            Decision::Admitted {
                descriptor, lane, ..
            } => (Some(&**descriptor), Some(*lane)),
            Decision::Denied(_) => {
                described = generation.describe_argv(argv).map(|d| Descriptor::from(&d));
                (described.as_ref(), described.as_ref().map(|d| d.lane))
            }
        };
        // Keys, or a pub/sub command's channels: what its request classes split.
        let named = descriptor.map(|d| d.named(argv)).unwrap_or_default();
        let all = named.len();
        let keys = named
            .into_iter()
            .take(MAX_KEYS)
            .map(|key| Bytes::copy_from_slice(key.as_ref()))
            .collect();
        log.record(Entry {
            principal: caller.principal.clone(),
            uid: caller.uid,
            gid: caller.gid,
            pid: caller.pid,
            lane,
            keys,
            cut: all > MAX_KEYS,
            regions: generation.key_regions(),
            at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            decision: decision.clone(),
            generation: generation.info.number,
            latency,
        });
    }

    /// Decides a lease request on `resource` (the policy's `leases:` rules).
    pub fn admit_lease(&self, caller: &Caller, resource: &str) -> Decision {
        let decision = self.inner.current.load().admit_lease(caller, resource);
        self.inner.metrics.decided(&decision);
        decision
    }

    /// [`Admission::admit_lease`] for a client that keeps a [`LeaseMemo`]: an admission the same
    /// generation gave this caller for this resource is recalled rather than judged again, where
    /// the generation's guards allow it (see `lease_memo.rs`). Counted as every decision is.
    pub fn admit_lease_remembered(
        &self,
        caller: &Caller,
        resource: &str,
        memo: &mut LeaseMemo,
    ) -> Decision {
        let generation = self.inner.current.load();
        if !generation.judges_by_rules_alone() {
            return self.admit_lease(caller, resource);
        }
        let decision = match memo.recall(generation.info.number, caller, resource) {
            Some(recalled) => recalled,
            None => {
                let decision = generation.admit_lease(caller, resource);
                memo.remember(resource, &decision);
                decision
            }
        };
        self.inner.metrics.decided(&decision);
        decision
    }

    /// Every module's answer for one command, and the decision (not counted in metrics).
    pub fn explain<A: AsRef<[u8]>>(&self, caller: &Caller, argv: &[A]) -> (Decision, Vec<Step>) {
        self.inner.current.load().explain(caller, argv)
    }

    /// The principal the active policy gives these peer credentials, if any.
    pub fn principal_for(&self, uid: u32, gid: u32) -> Option<String> {
        self.inner.current.load().principal_for(uid, gid)
    }

    /// Re-reads the policy files and modules, builds and self-tests a new generation, and swaps it
    /// in. On error the running generation stays and the error says why.
    pub fn reload(&self) -> Result<GenerationInfo, PolicyError> {
        let _serial = self.inner.reloading.lock();
        let number = self.inner.current.load().info.number + 1;
        match proven::build(&self.inner.sandbox, &self.inner.config, number) {
            Ok(generation) => {
                let info = generation.info.clone();
                self.inner.current.store(Arc::new(generation));
                self.inner.metrics.reloaded(Some(number));
                tracing::info!(generation = number, "policy reloaded");
                Ok(info)
            }
            Err(error) => {
                self.inner.metrics.reloaded(None);
                tracing::warn!(%error, "policy reload failed; the running generation stays");
                Err(error)
            }
        }
    }

    pub fn generation(&self) -> GenerationInfo {
        self.inner.current.load().info.clone()
    }

    /// The active generation, for review and tests.
    pub fn current(&self) -> Arc<Generation> {
        self.inner.current.load_full()
    }
}
