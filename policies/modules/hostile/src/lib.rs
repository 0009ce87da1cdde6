//! A hostile guard for the sandbox tests. Its config picks the misbehaviour: `spin` loops forever,
//! `bomb` allocates until memory runs out, `trap` panics (an `unreachable` trap), `huge` answers
//! with a 4 MiB rule name, `echo` denies with a reason that reports what crossed into the sandbox
//! (so a test can check that a large value arrives as a bounded prefix), `short` answers a batch
//! with one verdict too few. Any other config behaves: it allows, so a test can see the next
//! command served normally by a fresh instance.

wit_bindgen::generate!({ world: "guard-module", path: "../../../wit" });

use std::hint::black_box;

use exports::tollgate::policy::guard::Guest;
use guest_kit::Args;
use tollgate::policy::config;
use tollgate::policy::types::{Batch, Caller, Command, Denial, Verdict};

struct Hostile;

impl Guest for Hostile {
    fn admit(_who: Caller, cmd: Command) -> Verdict {
        judge(Args::new(&cmd.argv.bytes, &cmd.argv.spans))
    }

    fn admit_batch(_who: Caller, batch: Batch) -> Vec<Verdict> {
        let all = Args::new(&batch.argv.bytes, &batch.argv.spans);
        let mut verdicts: Vec<Verdict> = all
            .split(batch.commands.iter().map(|cmd| cmd.args))
            .map(judge)
            .collect();
        if config::get() == b"short" {
            verdicts.pop();
        }
        verdicts
    }
}

fn judge(args: Args) -> Verdict {
    if config::get() == b"echo" {
        // Arguments after the name that are not keys: what crossed of each, and its length.
        let others: Vec<String> = (1..args.count())
            .filter(|&i| args.key_use(i).is_none())
            .map(|i| {
                let crossed = args.get(i).unwrap_or_default().len();
                format!("{crossed}/{}", args.len(i).unwrap_or_default())
            })
            .collect();
        let crossed: usize = (0..args.count())
            .map(|i| args.get(i).unwrap_or_default().len())
            .sum();
        return Verdict::Deny(Denial {
            rule: "echo".into(),
            reason: format!(
                "keys={} args={} bytes={crossed}",
                args.keys().count(),
                others.join(","),
            ),
        });
    }
    // Misbehave only for the key `hostile`, so the same instance pool also serves clean calls.
    let first_key = args.keys().next().map(|(_, key, _)| key);
    if first_key != Some(b"hostile") {
        return Verdict::Allow("hostile-behaves".into());
    }
    match config::get().as_slice() {
        b"spin" => {
            let mut n: u64 = 0;
            loop {
                n = black_box(n.wrapping_add(1));
            }
        }
        b"bomb" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(black_box(vec![1u8; 1 << 20]));
            }
        }
        b"trap" => panic!("hostile guard traps"),
        b"huge" => Verdict::Allow("x".repeat(4 << 20)),
        _ => Verdict::Allow("hostile-behaves".into()),
    }
}

export!(Hostile);
