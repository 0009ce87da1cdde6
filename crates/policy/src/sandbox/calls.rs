//! Typed calls into catalog and guard modules, with the answers checked: an answer that is too
//! large or names impossible key positions is a [`Fault`] with cause `Malformed`, never trusted.

use std::sync::Arc;

use super::bindings::{Argv, Batch, Caller, Command, Descriptor, Verdict};
use super::engine::{Budget, Sandbox, Scaling};
use super::module::{Called, CatalogKind, Fault, GuardKind, Module};
use super::packing::argc;
use crate::config::SandboxLimits;
use crate::verdict_memo::VerdictMemo;

/// Longest command name, rule id or reason a module may answer with.
const MAX_TEXT: usize = 1024;
/// Most argument positions an answer's reuse may depend on (key counts: one per key spec).
const MAX_REUSE: usize = 4;

pub struct Catalog {
    module: Module<CatalogKind>,
}

impl Catalog {
    pub fn load(
        sandbox: Arc<Sandbox>,
        name: &str,
        bytes: &[u8],
        limits: SandboxLimits,
        scaling: Scaling,
    ) -> wasmtime::Result<Catalog> {
        let module = Module::compile(sandbox, name, bytes, Arc::from(&[][..]), limits, scaling)?;
        Ok(Catalog { module })
    }

    pub fn name(&self) -> &str {
        &self.module.name
    }

    /// The descriptor of `argv` (bounded arguments, the name first); `None` for an unknown command.
    pub fn describe(&self, argv: &Argv) -> Result<Option<Descriptor>, Fault> {
        let budget = self.module.budget_for(argc(argv), argv.bytes.len());
        let mut answer = self
            .module
            .call_within(budget, |catalog, store| {
                catalog.tollgate_policy_catalog().call_describe(store, argv)
            })
            .answer?;
        if let Some(descriptor) = &mut answer {
            if fits_arity(descriptor.arity, argc(argv)) {
                check_descriptor(descriptor, Some(argc(argv)))?;
            } else {
                // Refused for its arity before anything reads them; positions a catalog computes
                // for too few arguments say nothing.
                descriptor.keys.clear();
                descriptor.reuse = None;
            }
        }
        Ok(answer)
    }

    pub fn all(&self) -> Result<Vec<Descriptor>, Fault> {
        let all = self
            .module
            .call(|catalog, store| catalog.tollgate_policy_catalog().call_all(store))?;
        all.iter().try_for_each(|d| check_descriptor(d, None))?;
        Ok(all)
    }
}

/// Whether `argc` words (the name included) fit a Redis arity: exactly `arity`, or at least
/// `-arity` when negative.
pub fn fits_arity(arity: i32, argc: usize) -> bool {
    let argc = i64::try_from(argc).unwrap_or(i64::MAX);
    match i64::from(arity) {
        exact if exact >= 0 => argc == exact,
        at_least => argc >= -at_least,
    }
}

fn check_descriptor(descriptor: &Descriptor, argc: Option<usize>) -> Result<(), Fault> {
    if descriptor.name.is_empty() || descriptor.name.len() > MAX_TEXT {
        return Err(Fault::malformed(format!(
            "descriptor name of {} bytes",
            descriptor.name.len()
        )));
    }
    let argc = argc.unwrap_or(usize::MAX);
    let reuse = descriptor.reuse.as_deref().unwrap_or_default();
    if reuse.len() > MAX_REUSE || reuse.iter().any(|&at| at == 0 || at as usize >= argc) {
        return Err(Fault::malformed(format!(
            "reuse positions {reuse:?} outside argv of {argc} (at most {MAX_REUSE})"
        )));
    }
    if let Some(key) = descriptor
        .keys
        .iter()
        .find(|key| key.position == 0 || key.position as usize >= argc)
    {
        return Err(Fault::malformed(format!(
            "key position {} outside argv of {argc}",
            key.position
        )));
    }
    Ok(())
}

pub struct Guard {
    module: Module<GuardKind>,
    /// A YAML guard's verdicts that no argument can change ([`VerdictMemo`]); `None` for an
    /// operator's module.
    memo: Option<VerdictMemo>,
}

impl Guard {
    pub fn load(
        sandbox: Arc<Sandbox>,
        name: &str,
        bytes: &[u8],
        config: Arc<[u8]>,
        limits: SandboxLimits,
        scaling: Scaling,
    ) -> wasmtime::Result<Guard> {
        let module = Module::compile(sandbox, name, bytes, config, limits, scaling)?;
        Ok(Guard { module, memo: None })
    }

    /// This guard, keeping its verdicts in `memo` where they cannot depend on the arguments.
    pub fn remembering(self, memo: VerdictMemo) -> Guard {
        Guard {
            memo: Some(memo),
            ..self
        }
    }

    pub fn memo(&self) -> Option<&VerdictMemo> {
        self.memo.as_ref()
    }

    pub fn name(&self) -> &str {
        &self.module.name
    }

    /// The budget of one call of this guard on `args` arguments of `bytes` bytes.
    pub fn budget_for(&self, args: usize, bytes: usize) -> Budget {
        self.module.budget_for(args, bytes)
    }

    /// The budget of one call of this guard on the arguments `argv` (a command's or a batch's).
    pub fn budget_of(&self, argv: &Argv) -> Budget {
        self.budget_for(argc(argv), argv.bytes.len())
    }

    pub fn admit(&self, who: &Caller, command: &Command) -> Result<Verdict, Fault> {
        let budget = self.budget_of(&command.argv);
        self.admit_within(who, command, budget).answer
    }

    /// [`Guard::admit`] under `budget` rather than the guard's own.
    pub fn admit_within(&self, who: &Caller, command: &Command, budget: Budget) -> Called<Verdict> {
        let called = self.module.call_within(budget, |guard, store| {
            guard
                .tollgate_policy_guard()
                .call_admit(store, who, command)
        });
        Called {
            answer: called.answer.and_then(|verdict| {
                check_verdict(&verdict)?;
                Ok(verdict)
            }),
            fuel: called.fuel,
            memory: called.memory,
        }
    }

    /// One verdict per command of `batch`, in order.
    pub fn admit_batch(&self, who: &Caller, batch: &Batch) -> Result<Vec<Verdict>, Fault> {
        self.admit_batch_within(who, batch, self.budget_of(&batch.argv))
            .answer
    }

    /// [`Guard::admit_batch`] under `budget`, with what the call spent.
    pub fn admit_batch_within(
        &self,
        who: &Caller,
        batch: &Batch,
        budget: Budget,
    ) -> Called<Vec<Verdict>> {
        let called = self.module.call_within(budget, |guard, store| {
            guard
                .tollgate_policy_guard()
                .call_admit_batch(store, who, batch)
        });
        Called {
            answer: called.answer.and_then(|verdicts| checked(verdicts, batch)),
            fuel: called.fuel,
            memory: called.memory,
        }
    }
}

/// A batch's verdicts, when there is one per command and each is well-formed.
fn checked(verdicts: Vec<Verdict>, batch: &Batch) -> Result<Vec<Verdict>, Fault> {
    if verdicts.len() != batch.commands.len() {
        return Err(Fault::malformed(format!(
            "{} verdicts for {} commands",
            verdicts.len(),
            batch.commands.len()
        )));
    }
    verdicts.iter().try_for_each(check_verdict)?;
    Ok(verdicts)
}

/// Rule ids and reasons end up in replies and logs: a guard may not make them arbitrarily long.
fn check_verdict(verdict: &Verdict) -> Result<(), Fault> {
    let longest = match verdict {
        Verdict::Allow(rule) => rule.len(),
        Verdict::Deny(denial) => denial.rule.len().max(denial.reason.len()),
        Verdict::Abstain => 0,
    };
    if longest > MAX_TEXT {
        return Err(Fault::malformed(format!(
            "answer of {longest} bytes (at most {MAX_TEXT})"
        )));
    }
    Ok(())
}
