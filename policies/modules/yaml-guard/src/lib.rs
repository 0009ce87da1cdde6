//! The YAML guard: reads the compiled policy once per instance (the host's bytes never change for
//! an instance) and judges each command with the same evaluator the host uses natively.

wit_bindgen::generate!({ world: "guard-module", path: "../../../wit" });

use std::sync::OnceLock;

use exports::tollgate::policy::guard::Guest;
use tollgate::policy::config;
use tollgate::policy::types::{Caller, Command, Denial, Descriptor, Lane, Verdict};
use tollgate_policy_rules::{
    CategorySet, CompiledPolicy, Outcome, Request, Subject, LEASE_COMMAND,
};

struct YamlGuard;

static POLICY: OnceLock<Result<CompiledPolicy, String>> = OnceLock::new();

impl Guest for YamlGuard {
    fn admit(who: Caller, cmd: Command, desc: Descriptor) -> Verdict {
        let policy = POLICY.get_or_init(|| {
            CompiledPolicy::from_bytes(&config::get()).map_err(|error| error.to_string())
        });
        let policy = match policy {
            Ok(policy) => policy,
            Err(error) => {
                return Verdict::Deny(Denial {
                    rule: "yaml-guard".into(),
                    reason: format!("the compiled policy is unreadable: {error}"),
                })
            }
        };
        let subject = if desc.name == LEASE_COMMAND {
            Subject::Lease {
                resource: cmd.keys.first().map_or(&[][..], Vec::as_slice),
            }
        } else {
            Subject::Command {
                name: &desc.name,
                categories: CategorySet(desc.categories.bits()),
                lane: lane_index(desc.lane),
                keys: &cmd.keys,
            }
        };
        let request = Request {
            principal: &who.principal,
            subject,
        };
        match policy.evaluate(&request) {
            Outcome::Allow(rule) => Verdict::Allow(rule.id.clone()),
            Outcome::AuditDeny(rule) => Verdict::Allow(format!("audit:{}", rule.id)),
            Outcome::Deny(rule) => Verdict::Deny(Denial {
                rule: rule.id.clone(),
                reason: rule.reason.clone(),
            }),
            Outcome::NoMatch => Verdict::Abstain,
        }
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
