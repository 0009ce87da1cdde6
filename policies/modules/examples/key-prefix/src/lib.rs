//! An example operator guard: every key of every command must start with the caller's principal
//! name followed by a separator (`:` unless the module's config says otherwise). It never allows
//! on its own: it abstains and leaves the grant to the YAML policy, or denies.

wit_bindgen::generate!({ world: "guard-module", path: "../../../../wit" });

use std::sync::OnceLock;

use exports::tollgate::policy::guard::Guest;
use guest_kit::Args;
use tollgate::policy::config;
use tollgate::policy::types::{Batch, Caller, Command, Denial, Verdict};

struct KeyPrefix;

static SEPARATOR: OnceLock<Vec<u8>> = OnceLock::new();

impl Guest for KeyPrefix {
    fn admit(who: Caller, cmd: Command) -> Verdict {
        judge(&prefix(who), Args::new(&cmd.argv.bytes, &cmd.argv.spans))
    }

    fn admit_batch(who: Caller, batch: Batch) -> Vec<Verdict> {
        let prefix = prefix(who);
        let all = Args::new(&batch.argv.bytes, &batch.argv.spans);
        all.split(batch.commands.iter().map(|cmd| cmd.args))
            .map(|args| judge(&prefix, args))
            .collect()
    }
}

/// The caller's principal followed by the separator (`:` unless the config says otherwise).
fn prefix(who: Caller) -> Vec<u8> {
    let separator = SEPARATOR.get_or_init(|| {
        let configured = config::get();
        if configured.is_empty() {
            b":".to_vec()
        } else {
            configured
        }
    });
    let mut prefix = who.principal.into_bytes();
    prefix.extend_from_slice(separator);
    prefix
}

fn judge(prefix: &[u8], args: Args) -> Verdict {
    match args.keys().find(|(_, key, _)| !key.starts_with(prefix)) {
        None => Verdict::Abstain,
        Some((_, key, _)) => Verdict::Deny(Denial {
            rule: "key-prefix".into(),
            reason: format!(
                "key `{}` is outside `{}*`",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(prefix)
            ),
        }),
    }
}

export!(KeyPrefix);
