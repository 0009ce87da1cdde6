//! One guard asked directly, as `tollgate module test` and `module bench` ask it: the command
//! described by the generation's catalogs, packed and called in the daemon's own sandbox under the
//! guard's own limits, with the guard's verdict (not the chain's decision), the fuel it spent and
//! the memory its instance holds. A fault keeps its detail, which a decision does not show.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_model::Caller;

use crate::decision::{Decision, DenyCause};
use crate::described::Described;
use crate::generation::Generation;
use crate::sandbox::bindings::Verdict;
use crate::sandbox::{Called, Fault, Lowered};

/// What one guard answered for one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardAnswer {
    Allow {
        rule: String,
    },
    Deny {
        rule: String,
        reason: String,
    },
    Abstain,
    /// The guard trapped, ran out of its budget or memory, or answered malformed.
    Fault {
        cause: DenyCause,
        detail: String,
    },
    /// The host refused the command before any guard saw it (unknown command, wrong arity).
    NotJudged(String),
}

impl GuardAnswer {
    /// `admit`, `deny`, `abstain`, `fault` or `not-judged`: the words expectations use.
    pub fn word(&self) -> &'static str {
        match self {
            GuardAnswer::Allow { .. } => "admit",
            GuardAnswer::Deny { .. } => "deny",
            GuardAnswer::Abstain => "abstain",
            GuardAnswer::Fault { .. } => "fault",
            GuardAnswer::NotJudged(_) => "not-judged",
        }
    }

    /// The deciding rule of an allow or a deny.
    pub fn rule(&self) -> Option<&str> {
        match self {
            GuardAnswer::Allow { rule } | GuardAnswer::Deny { rule, .. } => Some(rule),
            _ => None,
        }
    }

    fn of(answer: Result<Verdict, Fault>) -> GuardAnswer {
        match answer {
            Ok(Verdict::Allow(rule)) => GuardAnswer::Allow { rule },
            Ok(Verdict::Deny(denial)) => GuardAnswer::Deny {
                rule: denial.rule,
                reason: denial.reason,
            },
            Ok(Verdict::Abstain) => GuardAnswer::Abstain,
            Err(fault) => GuardAnswer::Fault {
                cause: fault.cause,
                detail: fault.detail,
            },
        }
    }
}

impl fmt::Display for GuardAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuardAnswer::Allow { rule } => write!(f, "admit (rule {rule})"),
            GuardAnswer::Deny { rule, reason } => write!(f, "deny (rule {rule}: {reason})"),
            GuardAnswer::Abstain => f.write_str("abstain"),
            GuardAnswer::Fault { cause, detail } => {
                write!(f, "a fault ({}): {detail}", cause.as_str())
            }
            GuardAnswer::NotJudged(why) => write!(f, "nothing: the host refused it first: {why}"),
        }
    }
}

/// What one call into a guard cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallCost {
    pub fuel: u64,
    /// Wall time of the call, packing included.
    pub elapsed: Duration,
    /// The linear memory of the instance that answered.
    pub memory: usize,
}

/// One guard of a generation, asked directly.
pub struct GuardProbe {
    generation: Arc<Generation>,
    guard: String,
}

impl GuardProbe {
    /// The guard called `guard` in `generation` (`None` when it has none by that name).
    pub fn new(generation: Arc<Generation>, guard: &str) -> Option<GuardProbe> {
        generation.guard_named(guard)?;
        Some(GuardProbe {
            generation,
            guard: guard.to_owned(),
        })
    }

    pub fn name(&self) -> &str {
        &self.guard
    }

    /// The guard's answer to `argv` from `caller` through `admit`, and what the call cost.
    pub fn admit<A: AsRef<[u8]>>(&self, caller: &Caller, argv: &[A]) -> (GuardAnswer, CallCost) {
        let guard = self.guard();
        let described = match self.generation.catalogued(argv, None) {
            Ok(described) => described,
            Err(refused) => return (not_judged(refused), CallCost::default()),
        };
        let started = Instant::now();
        let called = Lowered::with(|lowered| {
            let (who, command) = lowered.for_guard(caller, &described.wit, argv);
            guard.admit_within(who, command, guard.budget_of(&command.argv))
        });
        let cost = cost(&called, started);
        (GuardAnswer::of(called.answer), cost)
    }

    /// The guard's answers to several commands of `caller` through one `admit-batch` call (a
    /// command the host refuses first is left out of the call and answered `NotJudged`), and
    /// what the call cost.
    pub fn admit_batch<A: AsRef<[u8]>>(
        &self,
        caller: &Caller,
        argvs: &[&[A]],
    ) -> (Vec<GuardAnswer>, CallCost) {
        let guard = self.guard();
        let catalogued: Vec<Result<Arc<Described>, Decision>> = argvs
            .iter()
            .map(|argv| self.generation.catalogued(argv, None))
            .collect();
        let started = Instant::now();
        let called = Lowered::with(|lowered| {
            lowered.start(caller);
            for (described, argv) in catalogued.iter().zip(argvs) {
                if let Ok(described) = described {
                    lowered.push(&described.wit, argv);
                }
            }
            let (who, batch) = lowered.batch();
            guard.admit_batch_within(who, batch, guard.budget_of(&batch.argv))
        });
        let cost = cost(&called, started);
        let mut verdicts = match called.answer {
            Ok(verdicts) => verdicts.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(fault) => catalogued.iter().map(|_| Err(fault.clone())).collect(),
        }
        .into_iter();
        let answers = catalogued
            .into_iter()
            .map(|described| match described {
                Ok(_) => GuardAnswer::of(verdicts.next().expect("one verdict per judged command")),
                Err(refused) => not_judged(refused),
            })
            .collect();
        (answers, cost)
    }

    fn guard(&self) -> &crate::sandbox::Guard {
        self.generation
            .guard_named(&self.guard)
            .expect("checked in GuardProbe::new")
    }
}

impl Default for CallCost {
    fn default() -> CallCost {
        CallCost {
            fuel: 0,
            elapsed: Duration::ZERO,
            memory: 0,
        }
    }
}

fn cost<R>(called: &Called<R>, started: Instant) -> CallCost {
    CallCost {
        fuel: called.fuel,
        elapsed: started.elapsed(),
        memory: called.memory,
    }
}

fn not_judged(refused: Decision) -> GuardAnswer {
    match refused {
        Decision::Denied(denial) => GuardAnswer::NotJudged(denial.to_string()),
        Decision::Admitted { .. } => GuardAnswer::NotJudged("admitted by the host".into()),
    }
}
