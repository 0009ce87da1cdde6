//! How a caller and commands cross into the sandbox: arguments packed into the WIT `argv` record
//! (all bytes in one buffer; where each ends, how long it was and whether it is a key in one list
//! of numbers), so a call lowers two lists however many arguments and keys there are; a guard's
//! batch packs several commands the same way, one after another. Keys and channels cross in full
//! (guards match them); every other argument as a bounded prefix. The buffers are reused per thread.

use std::cell::RefCell;

use tollgate_model::Caller;
use tollgate_policy_rules::channels;

use super::bindings::{
    self, Access, Argv, Batch, Batched, Categories, Command, CommandFlags, Descriptor, Lane,
};

/// How many leading bytes of a non-key argument cross into the sandbox.
pub const ARG_PREFIX: usize = 64;

thread_local! {
    static SCRATCH: RefCell<Lowered> = RefCell::new(Lowered::new());
}

/// A decision's caller and commands in their WIT form. One per thread, refilled in place: after a
/// thread's first decisions, lowering allocates nothing on the host (the buffers keep their size).
pub struct Lowered {
    /// One command's arguments, all bounded, for a catalog.
    described: Argv,
    caller: bindings::Caller,
    /// One command for a guard's `admit`.
    command: Command,
    /// Several commands for a guard's `admit-batch`.
    batch: Batch,
    /// Per argument of the command being added: its key's access bits, 0 when it is no key.
    uses: Vec<u32>,
}

impl Lowered {
    fn new() -> Lowered {
        let argv = || Argv {
            bytes: Vec::new(),
            spans: Vec::new(),
        };
        Lowered {
            described: argv(),
            caller: bindings::Caller {
                principal: String::new(),
                uid: 0,
                gid: 0,
                pid: 0,
            },
            command: Command {
                lane: Lane::Regular,
                categories: Categories::empty(),
                traits: CommandFlags::empty(),
                argv: argv(),
            },
            batch: Batch {
                argv: argv(),
                commands: Vec::new(),
            },
            uses: Vec::new(),
        }
    }

    /// Runs `f` with this thread's buffers. Not re-entrant: `f` must not call `with` again.
    pub fn with<R>(f: impl FnOnce(&mut Lowered) -> R) -> R {
        SCRATCH.with_borrow_mut(f)
    }

    /// `argv` for a catalog: every argument bounded, the name as the client sent it.
    pub fn bounded<A: AsRef<[u8]>>(&mut self, argv: &[A]) -> &Argv {
        let described = &mut self.described;
        clear(described);
        for arg in argv {
            push_arg(described, arg.as_ref(), NOT_A_KEY);
        }
        described
    }

    /// `argv` for a guard's `admit`, as `descriptor` describes it: named canonically, its keys
    /// whole and marked.
    pub fn for_guard<A: AsRef<[u8]>>(
        &mut self,
        caller: &Caller,
        descriptor: &Descriptor,
        argv: &[A],
    ) -> (&bindings::Caller, &Command) {
        self.set_caller(caller);
        let command = &mut self.command;
        command.lane = descriptor.lane;
        command.categories = descriptor.categories;
        command.traits = descriptor.traits;
        clear(&mut command.argv);
        pack_command(&mut command.argv, &mut self.uses, descriptor, argv);
        (&self.caller, &self.command)
    }

    /// Starts an empty batch for a guard's `admit-batch`.
    pub fn start(&mut self, caller: &Caller) {
        self.set_caller(caller);
        clear(&mut self.batch.argv);
        self.batch.commands.clear();
    }

    /// Adds `argv` to the batch as [`Lowered::for_guard`] lowers one command.
    pub fn push<A: AsRef<[u8]>>(&mut self, descriptor: &Descriptor, argv: &[A]) {
        let args = pack_command(&mut self.batch.argv, &mut self.uses, descriptor, argv);
        self.batch.commands.push(Batched {
            lane: descriptor.lane,
            categories: descriptor.categories,
            traits: descriptor.traits,
            args,
        });
    }

    /// The caller and the batch, as [`Lowered::start`] and [`Lowered::push`] left them.
    pub fn batch(&self) -> (&bindings::Caller, &Batch) {
        (&self.caller, &self.batch)
    }

    fn set_caller(&mut self, caller: &Caller) {
        let who = &mut self.caller;
        if who.principal != caller.principal {
            who.principal.clone_from(&caller.principal);
        }
        (who.uid, who.gid, who.pid) = (caller.uid, caller.gid, caller.pid);
    }
}

/// Appends one command to `out` for a guard: its canonical name, its keys whole and marked with
/// their access (`uses` is scratch), the rest bounded. Returns how many arguments it took.
fn pack_command<A: AsRef<[u8]>>(
    out: &mut Argv,
    uses: &mut Vec<u32>,
    descriptor: &Descriptor,
    argv: &[A],
) -> u32 {
    // Marked in one pass over the keys: MSET with a thousand keys stays linear.
    uses.clear();
    uses.resize(argv.len(), NOT_A_KEY);
    for key in &descriptor.keys {
        if let Some(using) = uses.get_mut(key.position as usize) {
            *using |= access_bits(key.access);
        }
    }
    // Channels are no keys (their access stays 0) but guards match them as they do keys.
    if let Some((_, at)) = channels::positions(&descriptor.name, argv.len()) {
        for using in &mut uses[at] {
            *using |= WHOLE;
        }
    }
    out.spans.reserve(argv.len().max(1) * SPAN);
    push_arg(out, descriptor.name.as_bytes(), NOT_A_KEY);
    for (arg, &using) in argv.iter().zip(uses.iter()).skip(1) {
        push_arg(out, arg.as_ref(), using);
    }
    wire_len(argv.len().max(1))
}

/// How many arguments `argv` holds.
pub fn argc(argv: &Argv) -> usize {
    argv.spans.len() / SPAN
}

/// Numbers per argument in `argv.spans`: where it ends, its full length, its key's access.
const SPAN: usize = 3;
/// The access of an argument that is not a key.
const NOT_A_KEY: u32 = 0;
/// In `uses` only, never on the wire: the argument crosses whole (a channel).
const WHOLE: u32 = 1 << 31;

/// `access` as `argv.spans` carries it: the flags' bits in WIT order (1 read, 2 write).
fn access_bits(access: Access) -> u32 {
    u32::from(access.contains(Access::READ)) | (u32::from(access.contains(Access::WRITE)) << 1)
}

fn clear(argv: &mut Argv) {
    argv.bytes.clear();
    argv.spans.clear();
}

/// Appends `arg` to `out`: whole if it is a key (`using` is its access), else cut to its prefix.
fn push_arg(out: &mut Argv, arg: &[u8], using: u32) {
    let crossing = if using == NOT_A_KEY {
        arg.len().min(ARG_PREFIX)
    } else {
        arg.len()
    };
    out.bytes.extend_from_slice(&arg[..crossing]);
    out.spans.extend_from_slice(&[
        wire_len(out.bytes.len()),
        wire_len(arg.len()),
        using & !WHOLE,
    ]);
}

/// Lengths cross as u32. Frames are far smaller (the front door bounds them), so saturating
/// only guards against a caller that skipped those limits.
fn wire_len(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::sandbox::bindings::KeyAccess;

    fn argv(parts: &[&[u8]]) -> Vec<Bytes> {
        parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
    }

    /// Argument by argument, what crossed.
    fn crossed(packed: &Argv) -> Vec<&[u8]> {
        let ends: Vec<u32> = packed.spans.iter().step_by(SPAN).copied().collect();
        let starts = std::iter::once(0).chain(ends.iter().copied());
        starts
            .zip(&ends)
            .map(|(start, &end)| &packed.bytes[start as usize..end as usize])
            .collect()
    }

    /// Argument by argument, its full length and its key's access.
    fn lens_and_uses(packed: &Argv) -> Vec<(u32, u32)> {
        packed
            .spans
            .chunks(SPAN)
            .map(|span| (span[1], span[2]))
            .collect()
    }

    #[test]
    fn bounded_cuts_every_argument_to_its_prefix_and_keeps_its_length() {
        let long = vec![b'v'; 1000];
        Lowered::with(|lowered| {
            let packed = lowered.bounded(&argv(&[b"set", &long, b"x"]));
            assert_eq!(crossed(packed), [&b"set"[..], &long[..ARG_PREFIX], b"x"]);
            assert_eq!(lens_and_uses(packed), [(3, 0), (1000, 0), (1, 0)]);
            assert_eq!(packed.bytes.len(), 3 + ARG_PREFIX + 1);
        });
    }

    #[test]
    fn channels_cross_whole_and_unmarked_as_keys_do() {
        let channel = vec![b'c'; 100];
        let message = vec![b'm'; 100];
        let descriptor = Descriptor {
            name: "PUBLISH".into(),
            lane: Lane::Regular,
            categories: Categories::PUBSUB,
            traits: CommandFlags::PUBSUB,
            arity: 3,
            keys: Vec::new(),
            reuse: Some(Vec::new()),
        };
        let caller = Caller {
            principal: "app".into(),
            uid: 7,
            gid: 8,
            pid: 9,
        };
        Lowered::with(|lowered| {
            let (_, command) = lowered.for_guard(
                &caller,
                &descriptor,
                &argv(&[b"publish", &channel, &message]),
            );
            assert_eq!(
                crossed(&command.argv),
                [&b"PUBLISH"[..], &channel[..], &message[..ARG_PREFIX]]
            );
            // No access bits: a channel is no key, and the marker stays on the host.
            assert_eq!(lens_and_uses(&command.argv), [(7, 0), (100, 0), (100, 0)]);
        });
    }

    #[test]
    fn guards_see_canonical_names_and_whole_keys_alone_and_in_batches() {
        let key = vec![b'k'; 100];
        let value = vec![b'v'; 100];
        let descriptor = Descriptor {
            name: "SET".into(),
            lane: Lane::Regular,
            categories: Categories::WRITE,
            traits: CommandFlags::WRITE,
            arity: -3,
            keys: vec![KeyAccess {
                position: 1,
                access: Access::WRITE,
            }],
            reuse: Some(Vec::new()),
        };
        let caller = Caller {
            principal: "app".into(),
            uid: 7,
            gid: 8,
            pid: 9,
        };
        Lowered::with(|lowered| {
            // A previous, longer command must leave nothing behind.
            lowered.for_guard(&caller, &descriptor, &argv(&[b"set", b"a", b"1", b"2"]));
            let (who, command) =
                lowered.for_guard(&caller, &descriptor, &argv(&[b"set", &key, &value]));
            assert_eq!((who.principal.as_str(), who.uid, who.pid), ("app", 7, 9));
            assert_eq!(command.categories, Categories::WRITE);
            assert_eq!(
                crossed(&command.argv),
                [&b"SET"[..], &key[..], &value[..ARG_PREFIX]]
            );
            let write = access_bits(Access::WRITE);
            assert_eq!(
                lens_and_uses(&command.argv),
                [(3, 0), (100, write), (100, 0)]
            );
            // A batch packs each command the same way, one after another.
            // A previous, longer batch must leave nothing behind.
            lowered.start(&caller);
            lowered.push(&descriptor, &argv(&[b"set", b"a", b"1", b"2"]));
            lowered.start(&caller);
            lowered.push(&descriptor, &argv(&[b"set", &key, &value]));
            lowered.push(&descriptor, &argv(&[b"set", b"k2", b"v2"]));
            let (who, batch) = lowered.batch();
            assert_eq!((who.principal.as_str(), who.uid, who.pid), ("app", 7, 9));
            assert_eq!(batch.commands.len(), 2);
            assert_eq!(batch.commands[0].categories, Categories::WRITE);
            assert_eq!(batch.commands[0].args, 3);
            assert_eq!(
                crossed(&batch.argv),
                [
                    &b"SET"[..],
                    &key[..],
                    &value[..ARG_PREFIX],
                    b"SET",
                    b"k2",
                    b"v2"
                ]
            );
            assert_eq!(
                lens_and_uses(&batch.argv),
                [(3, 0), (100, write), (100, 0), (3, 0), (2, write), (2, 0)]
            );
        });
    }
}
