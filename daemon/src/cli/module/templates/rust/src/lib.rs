//! A guard module: every key of every command must start with the caller's principal name and a
//! separator (`config.get()`, `:` when empty). It never allows on its own: it abstains and leaves
//! the grant to the YAML policy, or denies.

wit_bindgen::generate!({ world: "guard-module", path: "wit" });

use std::sync::OnceLock;

use exports::tollgate::policy::guard::Guest;
use tollgate::policy::config;
use tollgate::policy::types::{Batch, Caller, Command, Denial, Verdict};

/// Numbers per argument in `argv.spans`: where it ends in `bytes`, its full length, its access
/// as a key (0: not a key). See wit/policy.wit.
const SPAN: usize = 3;

static SEPARATOR: OnceLock<Vec<u8>> = OnceLock::new();

struct Module;

impl Guest for Module {
    fn admit(who: Caller, cmd: Command) -> Verdict {
        let count = cmd.argv.spans.len() / SPAN;
        judge(&prefix(who), &cmd.argv.bytes, &cmd.argv.spans, 0, count)
    }

    fn admit_batch(who: Caller, batch: Batch) -> Vec<Verdict> {
        let prefix = prefix(who);
        let mut first = 0;
        let mut verdicts = Vec::with_capacity(batch.commands.len());
        for command in &batch.commands {
            let count = command.args as usize;
            verdicts.push(judge(&prefix, &batch.argv.bytes, &batch.argv.spans, first, count));
            first += count;
        }
        verdicts
    }
}

/// The caller's principal followed by the separator. Config bytes never change during an
/// instance's life, so they are read once.
fn prefix(who: Caller) -> Vec<u8> {
    let separator = SEPARATOR.get_or_init(|| match config::get() {
        configured if configured.is_empty() => b":".to_vec(),
        configured => configured,
    });
    let mut prefix = who.principal.into_bytes();
    prefix.extend_from_slice(separator);
    prefix
}

/// Judges arguments `first .. first + count` of a packed argv.
fn judge(prefix: &[u8], bytes: &[u8], spans: &[u32], first: usize, count: usize) -> Verdict {
    for i in first..first + count {
        let (Some(&end), Some(&access)) = (spans.get(SPAN * i), spans.get(SPAN * i + 2)) else {
            break;
        };
        if access == 0 {
            continue;
        }
        let start = if i == 0 { 0 } else { spans[SPAN * (i - 1)] as usize };
        let key = bytes.get(start..end as usize).unwrap_or_default();
        if !key.starts_with(prefix) {
            return Verdict::Deny(Denial {
                rule: "key-prefix".into(),
                reason: format!(
                    "key `{}` is outside `{}*`",
                    String::from_utf8_lossy(key),
                    String::from_utf8_lossy(prefix)
                ),
            });
        }
    }
    Verdict::Abstain
}

export!(Module);
