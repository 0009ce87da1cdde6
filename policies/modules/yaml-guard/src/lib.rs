//! The YAML guard: reads the compiled policy once per instance (the host's bytes never change for
//! an instance) and judges each command with the same evaluator the host uses natively.

wit_bindgen::generate!({ world: "guard-module", path: "../../../wit" });

#[global_allocator]
static ALLOCATOR: guest_kit::SizeClasses = guest_kit::SizeClasses::new();

use std::sync::OnceLock;

use exports::tollgate::policy::guard::Guest;
use guest_kit::Args;
use tollgate::policy::config;
use tollgate::policy::types::{Batch, Caller, Categories, Command, Denial, Lane, Verdict};
use tollgate_policy_rules::{
    channels, CategorySet, Channels, CompiledPolicy, Outcome, Request, Subject, LEASE_COMMAND,
};

struct YamlGuard;

/// The compiled policy, and whether any of its command rules matches on keys.
struct Loaded {
    policy: CompiledPolicy,
    matches_keys: bool,
}

static POLICY: OnceLock<Result<Loaded, String>> = OnceLock::new();

impl Guest for YamlGuard {
    fn admit(who: Caller, cmd: Command) -> Verdict {
        let args = Args::new(&cmd.argv.bytes, &cmd.argv.spans);
        judge(&who, cmd.lane, cmd.categories, args)
    }

    fn admit_batch(who: Caller, batch: Batch) -> Vec<Verdict> {
        let all = Args::new(&batch.argv.bytes, &batch.argv.spans);
        all.split(batch.commands.iter().map(|cmd| cmd.args))
            .zip(&batch.commands)
            .map(|(args, cmd)| judge(&who, cmd.lane, cmd.categories, args))
            .collect()
    }
}

/// The compiled policy, read from the host's bytes on the instance's first call.
fn policy() -> &'static Result<Loaded, String> {
    POLICY.get_or_init(|| {
        let policy =
            CompiledPolicy::from_bytes(&config::get()).map_err(|error| error.to_string())?;
        let matches_keys = policy.matches_keys();
        Ok(Loaded {
            policy,
            matches_keys,
        })
    })
}

fn judge(who: &Caller, lane: Lane, categories: Categories, args: Args) -> Verdict {
    let policy = match policy() {
        Ok(policy) => policy,
        Err(error) => {
            return Verdict::Deny(Denial {
                rule: "yaml-guard".into(),
                reason: format!("the compiled policy is unreadable: {error}"),
            })
        }
    };
    let name = args
        .get(0)
        .and_then(|name| std::str::from_utf8(name).ok())
        .unwrap_or_default();
    let lease = name == LEASE_COMMAND;
    // Gathered only when they can matter: a lease's resource is its key.
    let keys: Vec<&[u8]> = if lease || policy.matches_keys {
        args.keys().map(|(_, key, _)| key).collect()
    } else {
        Vec::new()
    };
    // The host packs channels whole, as it does keys; one that was cut cannot be judged.
    let named: Vec<&[u8]> = match channels::positions(name, args.count()) {
        Some((_, at)) => {
            let whole: Option<Vec<&[u8]>> = at.map(|i| args.whole(i)).collect();
            match whole {
                Some(whole) => whole,
                None => {
                    return Verdict::Deny(Denial {
                        rule: "yaml-guard".into(),
                        reason: "a channel did not cross into the sandbox whole".into(),
                    })
                }
            }
        }
        None => Vec::new(),
    };
    let subject = if lease {
        Subject::Lease {
            resource: keys.first().copied().unwrap_or_default(),
        }
    } else {
        Subject::Command {
            name,
            categories: CategorySet(categories.bits()),
            lane: lane_index(lane),
            keys: &keys,
            channels: match channels::positions(name, args.count()) {
                Some((kind, _)) => Channels {
                    kind,
                    names: &named,
                },
                None => Channels::none(),
            },
        }
    };
    let request = Request {
        principal: &who.principal,
        subject,
    };
    match policy.policy.evaluate(&request) {
        Outcome::Allow(rule) => Verdict::Allow(rule.id.clone()),
        Outcome::AuditDeny(rule) => Verdict::Allow(format!("audit:{}", rule.id)),
        Outcome::Deny(rule) => Verdict::Deny(Denial {
            rule: rule.id.clone(),
            reason: rule.reason.clone(),
        }),
        Outcome::NoMatch => Verdict::Abstain,
    }
}

fn lane_index(lane: Lane) -> u8 {
    match lane {
        Lane::Regular => 0,
        Lane::Blocking => 1,
        Lane::Transaction => 2,
        Lane::Script => 3,
        Lane::Pubsub => 4,
        Lane::Admin => 5,
    }
}

export!(YamlGuard);
