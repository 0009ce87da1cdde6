//! One policy generation: the catalogs (built-in, then the operator's), the guard chain (a YAML
//! guard per policy file, then the operator's modules), the principals, and what it was built
//! from. Built completely — compiled, instantiated, self-tested — before it can become active;
//! immutable afterwards.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tollgate_model::Caller;
use tollgate_policy_rules::{Action, CompiledPolicy, LEASE_COMMAND};

use crate::admissible::{self, Admissible};
use crate::classes::atoms::Atoms;
use crate::compile::{self, CatalogCommand, CatalogIndex, CompiledFile, Expected, Principal};
use crate::config::PolicyConfig;
use crate::decision::{Decision, Denial, DenyCause, Descriptor};
use crate::described::{self, Described, DescribedCache};
use crate::error::PolicyError;
use crate::heard::Heard;
use crate::invariants::Checked;
use crate::quota::Quota;
use crate::reserved;
use crate::sandbox::bindings::{self, Access, Argv, Categories, CommandFlags, KeyAccess};
use crate::sandbox::{
    fits_arity, Allocator, Catalog, Fault, Guard, Lowered, Sandbox, Scaling, Shared,
};
use crate::scope::{self, ScopeInput, Scopes};
use crate::verdict_memo::{Recall, VerdictMemo};

const BUILTIN_CATALOG: &[u8] =
    include_bytes!(concat!(env!("TOLLGATE_COMPONENTS"), "/catalog.wasm"));
const YAML_GUARD: &[u8] = include_bytes!(concat!(env!("TOLLGATE_COMPONENTS"), "/yaml-guard.wasm"));
/// The policy used when the config names no files.
pub const DEFAULT_POLICY: &str = include_str!("../../../policies/default.yaml");
const DEFAULT_POLICY_NAME: &str = "<built-in>/default.yaml";
/// The module name on denials the host itself decides.
const HOST: &str = "tollgate";

/// What a generation was built from, as `GET /v1/policy` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct GenerationInfo {
    pub number: u64,
    pub allocator: Allocator,
    pub files: Vec<FileInfo>,
    pub modules: Vec<ModuleInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileInfo {
    pub path: PathBuf,
    pub sha256: String,
    pub rules: usize,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModuleInfo {
    pub name: String,
    pub role: &'static str,
    pub sha256: String,
}

/// One module's answer, as `explain` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub module: String,
    pub verdict: String,
    pub rule: Option<String>,
    pub reason: Option<String>,
}

pub struct Generation {
    /// The built-in catalog first, then the operator's; the first that knows a command describes it.
    catalogs: Vec<Catalog>,
    guards: Vec<Guard>,
    principals: Vec<Principal>,
    files: Vec<CompiledFile>,
    descriptors: Vec<bindings::Descriptor>,
    described: DescribedCache,
    /// Every invariant of its files, as checked when it was built: each holds, unless it was
    /// built with [`Invariants::Report`].
    pub(crate) invariants: Vec<Checked>,
    /// Its key globs' partition of keys, when its decisions are logged with key classes.
    pub(crate) key_regions: Option<Arc<Atoms>>,
    /// The Redis users key-constrained principals' scripts run as.
    scopes: Scopes,
    pub info: GenerationInfo,
}

impl Generation {
    /// Compiles every policy file and module of `config`, then runs the policies' own tests.
    /// Not yet ready to decide: `proven::build` proves its invariants and gives it what its
    /// decision log needs.
    pub(crate) fn build(
        sandbox: &Arc<Sandbox>,
        config: &PolicyConfig,
        number: u64,
    ) -> Result<Generation, PolicyError> {
        let limits = &config.limits;
        let mut catalogs = vec![Catalog::load(
            sandbox.clone(),
            "catalog",
            BUILTIN_CATALOG,
            limits.clone(),
            Scaling::WithArguments,
        )
        .map_err(module_error("catalog"))?];
        let mut modules = vec![module_info("catalog", "catalog", BUILTIN_CATALOG)];
        for path in &config.catalogs {
            let bytes = read_module(path)?;
            let name = module_name(path);
            catalogs.push(
                Catalog::load(
                    sandbox.clone(),
                    &name,
                    &bytes,
                    limits.clone(),
                    Scaling::Fixed,
                )
                .map_err(module_error(&name))?,
            );
            modules.push(module_info(&name, "catalog", &bytes));
        }
        let mut descriptors: Vec<bindings::Descriptor> = Vec::new();
        for catalog in &catalogs {
            let all = catalog.all().map_err(|fault| PolicyError::Module {
                name: catalog.name().to_owned(),
                detail: fault.detail,
            })?;
            // An earlier catalog's answer wins, as it does in `describe`.
            for descriptor in all {
                if !descriptors
                    .iter()
                    .any(|known| known.name == descriptor.name)
                {
                    descriptors.push(descriptor);
                }
            }
        }
        let index = CatalogIndex {
            commands: descriptors
                .iter()
                .map(|d| {
                    let described = Descriptor::from(d);
                    let command = CatalogCommand {
                        categories: described.categories,
                        scripting: described.traits.scripting,
                        keyed: !described.keys.is_empty(),
                    };
                    (d.name.clone(), command)
                })
                .collect(),
        };
        let sources = read_sources(config)?;
        let mut files = Vec::new();
        let mut errors = Vec::new();
        let deadline = Instant::now() + config.compile_deadline;
        for (path, text) in &sources {
            match compile::compile(path, text, &index, deadline) {
                Ok(file) => files.push(file),
                Err(diagnostics) => errors.extend(diagnostics),
            }
        }
        errors.extend(quota_ids_shared(&files));
        if !errors.is_empty() {
            return Err(PolicyError::Compile(errors));
        }
        let mut guards = Vec::new();
        for file in &files {
            let name = format!("yaml-guard:{}", file_name(&file.path));
            let bytes: Arc<[u8]> = file.policy.to_bytes().into();
            guards.push(
                Guard::load(
                    sandbox.clone(),
                    &name,
                    YAML_GUARD,
                    bytes,
                    limits.clone(),
                    Scaling::WithArguments,
                )
                .map_err(module_error(&name))?
                .remembering(VerdictMemo::new(file.policy.clone())),
            );
            modules.push(module_info(&name, "guard", YAML_GUARD));
        }
        for module in &config.modules {
            let path = module.path();
            let bytes = read_module(path)?;
            let name = module_name(path);
            guards.push(
                Guard::load(
                    sandbox.clone(),
                    &name,
                    &bytes,
                    module.config().into(),
                    module.limits(limits),
                    Scaling::Fixed,
                )
                .map_err(module_error(&name))?,
            );
            modules.push(module_info(&name, "guard", &bytes));
        }
        let info = GenerationInfo {
            number,
            allocator: sandbox.allocator,
            files: files
                .iter()
                .zip(&sources)
                .map(|(file, (_, text))| FileInfo {
                    path: file.path.clone(),
                    sha256: hex::encode(Sha256::digest(text.as_bytes())),
                    rules: file.policy.rules.len(),
                    warnings: file.warnings.iter().map(ToString::to_string).collect(),
                })
                .collect(),
            modules,
        };
        let principals = files
            .iter()
            .flat_map(|f| f.principals.iter().cloned())
            .collect();
        let generation = Generation {
            catalogs,
            guards,
            principals,
            files,
            descriptors,
            described: DescribedCache::default(),
            invariants: Vec::new(),
            key_regions: None,
            scopes: Scopes::default(),
            info,
        };
        let mut generation = generation;
        generation.scopes = generation.derive_scopes().map_err(PolicyError::Compile)?;
        generation.self_test()?;
        Ok(generation)
    }

    /// Instantiates every module once (a module that cannot start or answer fails the build
    /// rather than the first command), then runs every file's `tests:`.
    fn self_test(&self) -> Result<(), PolicyError> {
        let probe = [Bytes::from_static(b"PING")];
        let who = caller("tollgate-self-test");
        let mut failures: Vec<String> = self
            .guards
            .iter()
            .enumerate()
            .filter_map(|(index, guard)| {
                match self.decide(&self.guards[index..=index], &who, &probe, None) {
                    Decision::Denied(denial) if denial.cause.is_fault() => Some(format!(
                        "module {}: probe PING failed: {denial}",
                        guard.name()
                    )),
                    _ => None,
                }
            })
            .collect();
        failures.extend(self.test_failures());
        if failures.is_empty() {
            Ok(())
        } else {
            Err(PolicyError::SelfTest(failures))
        }
    }

    /// The failed expectations of every file, each as `file:line: what happened`. A file's
    /// expectations describe that file, so they are judged by its own YAML guard alone.
    pub fn test_failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for (file, guard) in self.files.iter().zip(self.guards.chunks(1)) {
            for test in &file.tests {
                let who = caller(&test.principal);
                let decision = match test.argv.as_slice() {
                    [lease, resource] if lease.eq_ignore_ascii_case("LEASE") => {
                        let (described, argv) = lease_command(resource);
                        self.judge_argv(guard, &who, &described, &argv, None)
                    }
                    argv => {
                        let argv: Vec<Bytes> =
                            argv.iter().map(|a| Bytes::from(a.clone())).collect();
                        self.decide(guard, &who, &argv, None)
                    }
                };
                let (got, rule) = match &decision {
                    Decision::Admitted { .. } => (Expected::Allow, None),
                    Decision::Denied(denial) => (Expected::Deny, Some(denial.rule.as_str())),
                };
                let rule_ok =
                    test.rule.is_none() || got == Expected::Deny && test.rule.as_deref() == rule;
                if got != test.expect || !rule_ok {
                    let said = match &decision {
                        Decision::Admitted { .. } => "admitted".to_owned(),
                        Decision::Denied(denial) => format!("denied: {denial}"),
                    };
                    failures.push(format!(
                        "{}:{}: `{}` as {}: expected {:?}{}, but {said}",
                        file.path.display(),
                        test.line,
                        test.argv.join(" "),
                        test.principal,
                        test.expect,
                        test.rule
                            .as_ref()
                            .map(|r| format!(" by rule {r}"))
                            .unwrap_or_default(),
                    ));
                }
            }
        }
        failures
    }

    /// Its key globs' partition of keys (the reserved keyspace's too), when the decision log
    /// writes key classes: the log names each key's region by a witness of it.
    pub fn key_regions(&self) -> Option<Arc<Atoms>> {
        self.key_regions.clone()
    }

    /// Every invariant of its files, as checked when it was built.
    pub fn invariants(&self) -> &[Checked] {
        &self.invariants
    }

    pub fn files(&self) -> &[CompiledFile] {
        &self.files
    }

    /// Every file's quotas (their ids are unique across the files).
    pub fn quotas(&self) -> impl Iterator<Item = &Quota> {
        self.files.iter().flat_map(|file| file.quotas.iter())
    }

    pub fn principals(&self) -> &[Principal] {
        &self.principals
    }

    /// What each principal could be admitted to run, from the rules (see [`admissible`]).
    pub fn admissible(&self) -> Admissible {
        let policies: Vec<&CompiledPolicy> = self.files.iter().map(|file| &file.policy).collect();
        let mut principals: Vec<&str> = self.principals.iter().map(|p| p.name.as_str()).collect();
        principals.sort_unstable();
        principals.dedup();
        let descriptors: Vec<Descriptor> = self.catalog().collect();
        let modules = !self.judges_by_rules_alone();
        admissible::derive(&policies, modules, &principals, &descriptors)
    }

    /// The scopes of this generation's key-constrained principals ([`crate::scope`]).
    pub fn scopes(&self) -> &Scopes {
        &self.scopes
    }

    fn derive_scopes(&self) -> Result<Scopes, Vec<compile::Diagnostic>> {
        let admissible = self.admissible();
        let descriptors: Vec<Descriptor> = self.catalog().collect();
        let runnable: Vec<Descriptor> = descriptors
            .iter()
            .filter(|d| admissible::runs_bare(d) || !admissible::is_parent(&d.name, &descriptors))
            .cloned()
            .collect();
        let scripts = admissible
            .principals
            .iter()
            .map(|reach| {
                // Everything the principal may send on SCRIPT: its scope's connections carry it.
                let runs: std::collections::BTreeSet<String> = admissible
                    .of(reach)
                    .filter(|(lane, _)| *lane == tollgate_model::Lane::Script)
                    .map(|(_, command)| command.name.clone())
                    .collect();
                (reach.principal.clone(), runs)
            })
            .collect();
        scope::derive(&ScopeInput {
            files: &self.files,
            descriptors: &runnable,
            scripts,
        })
    }

    /// Every command the catalog knows, in catalog order.
    pub fn catalog(&self) -> impl Iterator<Item = Descriptor> + '_ {
        self.descriptors.iter().map(Descriptor::from)
    }

    /// The principal for peer credentials: a uid match first, then a gid match, then `any`.
    pub fn principal_for(&self, uid: u32, gid: u32) -> Option<String> {
        let by = |pick: &dyn Fn(&Principal) -> bool| self.principals.iter().find(|p| pick(p));
        by(&|p| p.uids.contains(&uid))
            .or_else(|| by(&|p| p.gids.contains(&gid)))
            .or_else(|| by(&|p| p.any))
            .map(|p| p.name.clone())
    }

    pub fn admit<A: AsRef<[u8]>>(&self, caller: &Caller, argv: &[A]) -> Decision {
        self.decide(&self.guards, caller, argv, None)
    }

    /// Decides several commands of one caller, as [`Generation::admit`] decides each, with one
    /// call into each guard for all of them.
    pub fn admit_all<A: AsRef<[u8]>>(&self, caller: &Caller, argvs: &[&[A]]) -> Vec<Decision> {
        // A command the same call as the one before it in the batch (a pipeline is mostly runs
        // of one command) has the same answer: taken from its predecessor, not the cache.
        let mut catalogued: Vec<Result<Arc<Described>, Decision>> = Vec::with_capacity(argvs.len());
        for (at, argv) in argvs.iter().enumerate() {
            let inherited = at.checked_sub(1).and_then(|before| {
                let described = catalogued[before].as_ref().ok()?;
                let same = fits_arity(described.wit.arity, argv.len())
                    && described::same_call(described, argvs[before], argv);
                same.then(|| described.clone())
            });
            catalogued.push(match inherited {
                Some(described) => Ok(described),
                None => self.catalogued(argv, None),
            });
        }
        // The commands the catalogs know go to the guards; the others are refused already.
        // Sized for the whole batch: a filtered collect would grow it (a reallocation or two
        // per pipelined batch).
        let mut known: Vec<(&Described, &[A])> = Vec::with_capacity(argvs.len());
        known.extend(
            catalogued
                .iter()
                .zip(argvs)
                .filter_map(|(described, argv)| Some((&**described.as_ref().ok()?, *argv))),
        );
        let mut judged = self.judge_all(&self.guards, caller, &known).into_iter();
        catalogued
            .into_iter()
            .zip(argvs)
            .map(|(described, argv)| match described {
                Ok(_) => {
                    outside_reserved(judged.next().expect("one decision per known command"), argv)
                }
                Err(refused) => refused,
            })
            .collect()
    }

    /// A lease request, judged as the pseudo-command `TOLLGATE|LEASE <resource>`.
    pub fn admit_lease(&self, caller: &Caller, resource: &str) -> Decision {
        let (described, argv) = lease_command(resource);
        self.judge_argv(&self.guards, caller, &described, &argv, None)
    }

    /// Every module's answer for one command, and the decision.
    pub fn explain<A: AsRef<[u8]>>(&self, caller: &Caller, argv: &[A]) -> (Decision, Vec<Step>) {
        let mut steps = Vec::new();
        let decision = self.decide(&self.guards, caller, argv, Some(&mut steps));
        (decision, steps)
    }

    /// Judges a catalog descriptor with the given keys (the host's reserved keyspace included),
    /// as review does for a witness no argv form holds.
    pub fn judge_sample(
        &self,
        caller: &Caller,
        descriptor: &bindings::Descriptor,
        keys: Vec<Vec<u8>>,
    ) -> Decision {
        let argv: Vec<Bytes> = std::iter::once(Bytes::from(descriptor.name.clone()))
            .chain(keys.into_iter().map(Bytes::from))
            .collect();
        // The sample keys stand where the descriptor's keys are, in order, with their access.
        let marks: Vec<KeyAccess> = (1..argv.len())
            .map(|position| KeyAccess {
                position: position as u32,
                access: descriptor
                    .keys
                    .get(position - 1)
                    .map_or(Access::READ | Access::WRITE, |key| key.access),
            })
            .collect();
        let described = Described::new(bindings::Descriptor {
            keys: marks,
            ..descriptor.clone()
        });
        outside_reserved(
            self.judge_argv(&self.guards, caller, &described, &argv, None),
            &argv,
        )
    }

    /// Whether every guard is a YAML guard, whose answer follows from the caller and the command
    /// alone (no operator's module, which may answer otherwise from one call to the next). Every
    /// file has a YAML guard; any guard beyond those is an operator's module.
    pub fn judges_by_rules_alone(&self) -> bool {
        self.guards.len() == self.files.len()
    }

    /// Whether an allow rule confines `principal` to keys (a tenant): its part of Redis's one
    /// namespace of scripts and libraries is then its own (the daemon's `namespace.rs`), whether
    /// or not its scripts run in a scope.
    pub fn confined_to_keys(&self, principal: &str) -> bool {
        self.files.iter().any(|file| {
            file.policy.rules.iter().any(|rule| {
                rule.action == Action::Allow
                    && rule.matches_keys()
                    && rule
                        .principals
                        .as_ref()
                        .is_none_or(|names| names.iter().any(|name| name == principal))
            })
        })
    }

    /// Whether the policy lets `principal` reach every key alike: no rule that applies to it
    /// matches on keys, and no operator module (which may judge by keys) is in the chain. Only
    /// then are server-wide counts of keys and commands (`INFO keyspace`, `INFO commandstats`) its
    /// to see; a tenant's keys are constrained, and those counts would show the other tenants'.
    pub fn sees_every_key(&self, principal: &str) -> bool {
        self.judges_by_rules_alone()
            && self.files.iter().all(|file| {
                file.policy.rules.iter().all(|rule| {
                    let applies = rule
                        .principals
                        .as_ref()
                        .is_none_or(|names| names.iter().any(|name| name == principal));
                    !applies || !rule.matches_keys()
                })
            })
    }

    /// The operator's guard modules (every guard after the YAML guards), by name.
    pub fn operator_guards(&self) -> Vec<String> {
        self.guards
            .iter()
            .skip(self.files.len())
            .map(|guard| guard.name().to_owned())
            .collect()
    }

    /// What the catalogs say `argv` is, as admission would ask them; `None` when none knows it.
    pub fn describe_argv<A: AsRef<[u8]>>(&self, argv: &[A]) -> Option<bindings::Descriptor> {
        self.catalogued(argv, None)
            .ok()
            .map(|described| described.wit.clone())
    }

    /// The catalogs' description of `argv` whatever its length: of a command of subcommands named
    /// alone (`ACL`), which the host refuses for its arity before any guard sees it, too.
    pub fn describe_any_arity<A: AsRef<[u8]>>(&self, argv: &[A]) -> Option<bindings::Descriptor> {
        Lowered::with(|lowered| self.describe(lowered.bounded(argv)))
            .ok()
            .flatten()
            .map(|described| described.wit)
    }

    /// The guard called `name` (a YAML guard is `yaml-guard:FILE`, a module its file's stem).
    pub(crate) fn guard_named(&self, name: &str) -> Option<&Guard> {
        self.guards.iter().find(|guard| guard.name() == name)
    }

    pub fn descriptors(&self) -> &[bindings::Descriptor] {
        &self.descriptors
    }

    fn decide<A: AsRef<[u8]>>(
        &self,
        guards: &[Guard],
        caller: &Caller,
        argv: &[A],
        mut steps: Option<&mut Vec<Step>>,
    ) -> Decision {
        match self.catalogued(argv, steps.as_deref_mut()) {
            Ok(described) => outside_reserved(
                self.judge_argv(guards, caller, &described, argv, steps),
                argv,
            ),
            Err(refused) => refused,
        }
    }

    /// What the catalogs say `argv` is (a cached answer when one applies), or the decision that
    /// refuses it: empty, unknown to every catalog, or a catalog fault.
    pub(crate) fn catalogued<A: AsRef<[u8]>>(
        &self,
        argv: &[A],
        steps: Option<&mut Vec<Step>>,
    ) -> Result<Arc<Described>, Decision> {
        let Some(name) = argv.first() else {
            return Err(denied(
                HOST,
                "argv",
                "an empty command",
                DenyCause::Malformed,
                String::new(),
            ));
        };
        let described = match self.described.get(argv) {
            Some(cached) => cached,
            None => match Lowered::with(|lowered| self.describe(lowered.bounded(argv))) {
                Ok(Some(described)) => {
                    let described = Arc::new(described);
                    if fits_arity(described.wit.arity, argv.len()) {
                        self.described.offer(argv, &described);
                    }
                    described
                }
                Ok(None) => {
                    let command = String::from_utf8_lossy(name.as_ref()).to_ascii_uppercase();
                    let reason = "no catalog knows this command";
                    return Err(denied(
                        self.catalogs[0].name(),
                        "catalog",
                        reason,
                        DenyCause::UnknownCommand,
                        command,
                    ));
                }
                Err((catalog, fault)) => {
                    return Err(faulted(
                        catalog,
                        fault,
                        String::from_utf8_lossy(name.as_ref()).to_ascii_uppercase(),
                    ))
                }
            },
        };
        // Checked by the host, as Redis checks it before anything else: a catalog's key positions
        // for too few arguments are meaningless, and the client gets Redis's own error.
        if !fits_arity(described.wit.arity, argv.len()) {
            let reason = format!(
                "wrong number of arguments for '{}' command",
                described.wit.name.to_ascii_lowercase()
            );
            return Err(denied(
                HOST,
                "arity",
                &reason,
                DenyCause::WrongArity,
                String::from_utf8_lossy(name.as_ref()).to_ascii_uppercase(),
            ));
        }
        if let Some(steps) = steps {
            steps.push(Step {
                module: self.catalogs[described.catalog].name().to_owned(),
                verdict: "describe".into(),
                rule: Some(described.wit.name.clone()),
                reason: None,
            });
        }
        Ok(described)
    }

    /// The first catalog's answer that knows the command; a faulting catalog ends the search.
    fn describe(&self, argv: &Argv) -> Result<Option<Described>, (&str, Fault)> {
        for (index, catalog) in self.catalogs.iter().enumerate() {
            match catalog.describe(argv) {
                Ok(Some(descriptor)) => return Ok(Some(Described::by(index, descriptor))),
                Ok(None) => continue,
                Err(fault) => return Err((catalog.name(), fault)),
            }
        }
        Ok(None)
    }

    /// The guard chain on one described command: the first deny wins, and it is admitted only if
    /// some guard allows.
    fn judge_argv<A: AsRef<[u8]>>(
        &self,
        guards: &[Guard],
        caller: &Caller,
        described: &Described,
        argv: &[A],
        mut steps: Option<&mut Vec<Step>>,
    ) -> Decision {
        let mut chain = Chain::default();
        for guard in guards {
            let verdict = judge_alone(guard, caller, described, argv);
            if let Some(steps) = steps.as_deref_mut() {
                steps.push(step(guard.name(), &verdict));
            }
            chain.hear(guard.name(), verdict, &described.wit.name);
            // Explaining shows every module's answer; deciding stops at the first refusal.
            if chain.denial.is_some() && steps.is_none() {
                break;
            }
        }
        chain.decision(described)
    }

    /// The guard chain on several described commands, each decided as [`Generation::judge_argv`]
    /// decides it alone; each guard sees the commands still open in one call.
    fn judge_all<A: AsRef<[u8]>>(
        &self,
        guards: &[Guard],
        caller: &Caller,
        commands: &[(&Described, &[A])],
    ) -> Vec<Decision> {
        if let [(described, argv)] = commands {
            return vec![self.judge_argv(guards, caller, described, argv, None)];
        }
        // A run of commands of one description (a pipeline's run of one command) whose every
        // guard's verdict is kept (no argument can change it) is decided once for the run.
        let mut kept: Vec<Option<Decision>> = Vec::with_capacity(commands.len());
        let mut last: Option<(&Described, Option<Decision>)> = None;
        for &(described, _) in commands {
            match &last {
                Some((seen, decision)) if std::ptr::eq(*seen, described) => {
                    kept.push(decision.clone())
                }
                _ => {
                    let decision = kept_decision(guards, caller, described);
                    kept.push(decision.clone());
                    last = Some((described, decision));
                }
            }
        }
        // The others through the chain, each guard asked of those still open in one call.
        let mut chains: Vec<Chain> = commands.iter().map(|_| Chain::default()).collect();
        let mut open: Vec<usize> = Vec::with_capacity(commands.len());
        for guard in guards {
            open.clear();
            open.extend(
                (0..commands.len()).filter(|&at| kept[at].is_none() && chains[at].denial.is_none()),
            );
            if open.is_empty() {
                break;
            }
            for (at, verdict) in open.iter().zip(judge_batch(guard, caller, commands, &open)) {
                chains[*at].hear(guard.name(), verdict, &commands[*at].0.wit.name);
            }
        }
        (kept.into_iter().zip(chains).zip(commands))
            .map(|((kept, chain), (described, _))| match kept {
                Some(decision) => decision,
                None => chain.decision(described),
            })
            .collect()
    }
}

/// The decision on every command `described` describes, when each guard's verdict on it is one
/// its memo kept (the same for all such commands of the caller): heard in the chain's order, as
/// the guards would answer, without asking any. `None` when a guard must be asked.
fn kept_decision(guards: &[Guard], caller: &Caller, described: &Described) -> Option<Decision> {
    let mut chain = Chain::default();
    for guard in guards {
        if chain.denial.is_some() {
            break;
        }
        match guard.memo()?.recall(&caller.principal, described) {
            Recall::Kept(verdict) => chain.hear(guard.name(), Ok(verdict), &described.wit.name),
            Recall::Ask | Recall::Unknown => return None,
        }
    }
    Some(chain.decision(described))
}

/// One command's way through the guard chain so far.
#[derive(Default)]
struct Chain {
    allowed: Option<Arc<str>>,
    denial: Option<Decision>,
}

impl Chain {
    fn hear(&mut self, guard: &str, verdict: Result<Heard, Fault>, command: &str) {
        let refusal = match verdict {
            Ok(Heard::Allow(rule)) => {
                self.allowed.get_or_insert(rule);
                return;
            }
            Ok(Heard::Abstain) => return,
            Ok(Heard::Deny(d)) => denied(
                guard,
                &d.rule,
                &d.reason,
                DenyCause::Rule,
                command.to_owned(),
            ),
            Err(fault) => faulted(guard, fault, command.to_owned()),
        };
        self.denial.get_or_insert(refusal);
    }

    fn decision(self, described: &Described) -> Decision {
        match (self.denial, self.allowed) {
            (Some(denial), _) => denial,
            (None, Some(rule)) => Decision::Admitted {
                descriptor: described.native.clone(),
                lane: described.native.lane,
                rule,
            },
            (None, None) => denied(
                HOST,
                compile::DEFAULT_DENY,
                "no rule allows it (policies are default-deny)",
                DenyCause::NoRule,
                described.wit.name.clone(),
            ),
        }
    }
}

/// One guard's verdict on one command, through its `admit`.
fn judge_alone<A: AsRef<[u8]>>(
    guard: &Guard,
    caller: &Caller,
    described: &Described,
    argv: &[A],
) -> Result<Heard, Fault> {
    let memo = guard.memo();
    let recalled = memo.map(|memo| memo.recall(&caller.principal, described));
    if let Some(Recall::Kept(verdict)) = recalled {
        return Ok(verdict);
    }
    let verdict = Lowered::with(|lowered| {
        let (who, command) = lowered.for_guard(caller, &described.wit, argv);
        guard.admit(who, command).map(Heard::from)
    });
    if let (Some(memo), Some(Recall::Unknown), Ok(verdict)) = (memo, recalled, &verdict) {
        memo.remember(&caller.principal, described, verdict);
    }
    verdict
}

/// One guard's verdicts on the commands at `open`, in one `admit-batch` call. After a fault, one
/// call per command, so that only a command that makes the guard trap or run out of fuel, time or
/// memory is refused for it; those calls share one more budget of the guard between them (see
/// [`Shared`]), so a guard that spins on every command of a pipeline costs the worker two budgets,
/// not one per command, while the commands it answers quickly are still answered.
fn judge_batch<A: AsRef<[u8]>>(
    guard: &Guard,
    caller: &Caller,
    commands: &[(&Described, &[A])],
    open: &[usize],
) -> Vec<Result<Heard, Fault>> {
    let Some(memo) = guard.memo() else {
        return ask_batch(guard, caller, commands, open);
    };
    // Verdicts the guard gave already and no argument can change; the guard hears the rest, and
    // what it says of a command not seen yet is remembered.
    let mut verdicts: Vec<Option<Result<Heard, Fault>>> = Vec::with_capacity(open.len());
    let mut ask = Vec::new();
    let mut learn = Vec::new();
    // Commands of one description in a row (a pipeline's run of one command, which the batch
    // gave one `Described`) are recalled once: the memo's key is the caller and the description.
    let mut last: Option<(&Described, Recall)> = None;
    for &at in open {
        let described = commands[at].0;
        let recall = match &last {
            Some((seen, recall)) if std::ptr::eq(*seen, described) => recall.clone(),
            _ => {
                let recall = memo.recall(&caller.principal, described);
                last = Some((described, recall.clone()));
                recall
            }
        };
        match recall {
            Recall::Kept(verdict) => verdicts.push(Some(Ok(verdict))),
            recall => {
                verdicts.push(None);
                ask.push(at);
                learn.push(matches!(recall, Recall::Unknown));
            }
        }
    }
    if !ask.is_empty() {
        let answers = ask_batch(guard, caller, commands, &ask);
        for ((&at, answer), &new) in ask.iter().zip(&answers).zip(&learn) {
            if let (true, Ok(verdict)) = (new, answer) {
                memo.remember(&caller.principal, commands[at].0, verdict);
            }
        }
        let mut answers = answers.into_iter();
        for slot in verdicts.iter_mut().filter(|slot| slot.is_none()) {
            *slot = answers.next();
        }
    }
    verdicts
        .into_iter()
        .map(|verdict| verdict.expect("one answer per command asked"))
        .collect()
}

/// One guard's verdicts on the commands at `open`, all asked of the guard ([`judge_batch`]).
fn ask_batch<A: AsRef<[u8]>>(
    guard: &Guard,
    caller: &Caller,
    commands: &[(&Described, &[A])],
    open: &[usize],
) -> Vec<Result<Heard, Fault>> {
    let batched = Lowered::with(|lowered| {
        lowered.start(caller);
        for &at in open {
            let (described, argv) = commands[at];
            lowered.push(&described.wit, argv);
        }
        let (who, batch) = lowered.batch();
        guard.admit_batch(who, batch)
    });
    match batched {
        Ok(verdicts) => verdicts.into_iter().map(|v| Ok(Heard::from(v))).collect(),
        Err(fault) => {
            tracing::warn!(
                module = guard.name(),
                cause = fault.cause.as_str(),
                detail = %fault.detail,
                commands = open.len(),
                "policy module fault on a batch; judging its commands one at a time"
            );
            let (args, bytes) = open.iter().fold((0, 0), |(args, bytes), &at| {
                let argv = commands[at].1;
                let len: usize = argv.iter().map(|arg| arg.as_ref().len()).sum();
                (args + argv.len(), bytes + len)
            });
            let mut shared = Shared::new(guard.budget_for(args, bytes), open.len());
            open.iter()
                .map(|&at| {
                    let Some(budget) = shared.next() else {
                        return Err(Fault {
                            cause: DenyCause::Deadline,
                            detail: "the pipeline's shared budget was spent before its turn".into(),
                        });
                    };
                    let (described, argv) = commands[at];
                    let called = Lowered::with(|lowered| {
                        let (who, command) = lowered.for_guard(caller, &described.wit, argv);
                        guard.admit_within(who, command, budget)
                    });
                    shared.spent(called.fuel);
                    called.answer.map(Heard::from)
                })
                .collect()
        }
    }
}

fn read_sources(config: &PolicyConfig) -> Result<Vec<(PathBuf, String)>, PolicyError> {
    if config.files.is_empty() {
        return Ok(vec![(
            PathBuf::from(DEFAULT_POLICY_NAME),
            DEFAULT_POLICY.to_owned(),
        )]);
    }
    config
        .files
        .iter()
        .map(|path| read_policy(path, config.max_file_bytes).map(|text| (path.clone(), text)))
        .collect()
}

/// A policy file's text, refused unread when it is larger than `max` bytes (reading stops there
/// too, should the file grow meanwhile).
fn read_policy(path: &Path, max: u64) -> Result<String, PolicyError> {
    let read_error = |source| PolicyError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut text = String::new();
    file.take(max.saturating_add(1))
        .read_to_string(&mut text)
        .map_err(read_error)?;
    let size = text.len() as u64;
    if size > max {
        let size = std::fs::metadata(path).map_or(size, |m| m.len().max(size));
        return Err(PolicyError::TooLarge {
            path: path.to_owned(),
            size,
            max,
        });
    }
    Ok(text)
}

fn module_error(name: &str) -> impl FnOnce(wasmtime::Error) -> PolicyError + '_ {
    move |error| PolicyError::Module {
        name: name.to_owned(),
        detail: format!("{error:#}"),
    }
}

fn read_module(path: &Path) -> Result<Vec<u8>, PolicyError> {
    std::fs::read(path).map_err(|source| PolicyError::Read {
        path: path.to_owned(),
        source,
    })
}

/// A module's name: its file name without `.wasm`.
fn module_name(path: &Path) -> String {
    file_name(path).trim_end_matches(".wasm").to_owned()
}

fn module_info(name: &str, role: &'static str, bytes: &[u8]) -> ModuleInfo {
    ModuleInfo {
        name: name.to_owned(),
        role,
        sha256: hex::encode(Sha256::digest(bytes)),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn caller(principal: &str) -> Caller {
    Caller {
        principal: principal.to_owned(),
        uid: 0,
        gid: 0,
        pid: 0,
    }
}

/// A lease request as the guards see it: `TOLLGATE|LEASE <resource>`, the resource its key.
fn lease_command(resource: &str) -> (Described, [Bytes; 2]) {
    let key = KeyAccess {
        position: 1,
        access: Access::READ | Access::WRITE,
    };
    let described = Described::new(bindings::Descriptor {
        name: LEASE_COMMAND.to_owned(),
        lane: bindings::Lane::Script,
        categories: Categories::empty(),
        traits: CommandFlags::WRITE | CommandFlags::SCRIPTING,
        arity: 2,
        keys: vec![key],
        reuse: None,
    });
    let argv = [
        Bytes::from_static(LEASE_COMMAND.as_bytes()),
        Bytes::copy_from_slice(resource.as_bytes()),
    ];
    (described, argv)
}

/// `decision`, unless it admits a command that names the reserved keyspace: whatever the guards
/// said, that is refused (a policy's own denial stands, so its rule is the one named).
fn outside_reserved<A: AsRef<[u8]>>(decision: Decision, argv: &[A]) -> Decision {
    let Decision::Admitted { descriptor, .. } = &decision else {
        return decision;
    };
    match reserved::refusal(descriptor, argv) {
        Some(reason) => denied(
            HOST,
            reserved::RULE,
            &reason,
            DenyCause::Reserved,
            descriptor.name.clone(),
        ),
        None => decision,
    }
}

fn denied(module: &str, rule: &str, reason: &str, cause: DenyCause, command: String) -> Decision {
    Decision::Denied(Box::new(Denial {
        rule: rule.to_owned(),
        module: module.to_owned(),
        reason: reason.to_owned(),
        cause,
        command,
    }))
}

/// A module that gave no usable answer: the client learns the cause, the log gets the detail
/// (a trap's wasm backtrace does not belong in a Redis error reply).
fn faulted(module: &str, fault: Fault, command: String) -> Decision {
    tracing::warn!(module, cause = fault.cause.as_str(), detail = %fault.detail, "policy module fault; denied");
    let what = match fault.cause {
        DenyCause::Deadline => "ran out of its budget (fuel or deadline)",
        DenyCause::OutOfMemory => "ran out of memory",
        DenyCause::Malformed => "answered malformed",
        _ => "trapped",
    };
    denied(
        module,
        "sandbox",
        &format!("module {module} {what}"),
        fault.cause,
        command,
    )
}

fn step(module: &str, verdict: &Result<Heard, Fault>) -> Step {
    let (verdict, rule, reason) = match verdict {
        Ok(Heard::Allow(rule)) => ("allow", Some(rule.to_string()), None),
        Ok(Heard::Deny(d)) => ("deny", Some(d.rule.clone()), Some(d.reason.clone())),
        Ok(Heard::Abstain) => ("abstain", None, None),
        Err(fault) => (
            "fault",
            None,
            Some(format!("{}: {}", fault.cause.as_str(), fault.detail)),
        ),
    };
    Step {
        module: module.to_owned(),
        verdict: verdict.to_owned(),
        rule,
        reason,
    }
}

/// A quota id used by two files: the daemon keeps one set of buckets per id, and metrics and
/// refusals name quotas by id, so an id names one quota across the whole policy.
fn quota_ids_shared(files: &[CompiledFile]) -> Vec<compile::Diagnostic> {
    let mut seen: std::collections::HashMap<&str, &Path> = std::collections::HashMap::new();
    let mut errors = Vec::new();
    for file in files {
        for quota in &file.quotas {
            if let Some(first) = seen.insert(&quota.id, &file.path) {
                errors.push(compile::Diagnostic {
                    file: file.path.clone(),
                    line: quota.line,
                    column: 1,
                    severity: compile::Severity::Error,
                    message: format!(
                        "quota id `{}` is also used in {}: quota ids name one quota across the policy",
                        quota.id,
                        first.display()
                    ),
                });
            }
        }
    }
    errors
}
