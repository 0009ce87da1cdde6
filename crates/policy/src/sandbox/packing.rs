//! How a caller and commands cross into the sandbox: arguments packed into the WIT `argv` record
//! (all bytes in one buffer, where each ends and how long it was in two more lists), so a call
//! lowers three lists however many arguments there are; a guard's batch packs several commands
//! the same way, one after another. Keys cross in full (guards match them); every other argument
//! as a bounded prefix. The buffers are reused per thread.

use std::cell::RefCell;

use tollgate_model::Caller;

use super::bindings::{
    self, Argv, Batch, Batched, Categories, Command, CommandFlags, Descriptor, Lane,
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
    /// Per argument of the command being added: whether it is a key (and so crosses whole).
    whole: Vec<bool>,
}

impl Lowered {
    fn new() -> Lowered {
        let argv = || Argv {
            bytes: Vec::new(),
            ends: Vec::new(),
            lens: Vec::new(),
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
                keys: Vec::new(),
            },
            whole: Vec::new(),
        }
    }

    /// Runs `f` with this thread's buffers. Not re-entrant: `f` must not call `with` again.
    pub fn with<R>(f: impl FnOnce(&mut Lowered) -> R) -> R {
        SCRATCH.with_borrow_mut(f)
    }

    /// `argv` for a catalog: every argument bounded, the name as the client sent it.
    pub fn bounded<A: AsRef<[u8]>>(&mut self, argv: &[A]) -> &Argv {
        clear(&mut self.described);
        pack(
            &mut self.described,
            argv.iter().map(|arg| (arg.as_ref(), false)),
        );
        &self.described
    }

    /// `argv` for a guard's `admit`, as `descriptor` describes it: named canonically, its keys
    /// whole.
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
        pack_command(&mut command.argv, &mut self.whole, descriptor, argv);
        (&self.caller, &self.command)
    }

    /// Starts an empty batch for a guard's `admit-batch`.
    pub fn start(&mut self, caller: &Caller) {
        self.set_caller(caller);
        clear(&mut self.batch.argv);
        self.batch.commands.clear();
        self.batch.keys.clear();
    }

    /// Adds `argv` to the batch as [`Lowered::for_guard`] lowers one command.
    pub fn push<A: AsRef<[u8]>>(&mut self, descriptor: &Descriptor, argv: &[A]) {
        let args = pack_command(&mut self.batch.argv, &mut self.whole, descriptor, argv);
        self.batch.commands.push(Batched {
            lane: descriptor.lane,
            categories: descriptor.categories,
            traits: descriptor.traits,
            args,
            keys: wire_len(descriptor.keys.len()),
        });
        self.batch.keys.extend_from_slice(&descriptor.keys);
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

/// Appends one command to `out` for a guard: its canonical name, its keys whole (`whole` is
/// scratch), the rest bounded. Returns how many arguments it took.
fn pack_command<A: AsRef<[u8]>>(
    out: &mut Argv,
    whole: &mut Vec<bool>,
    descriptor: &Descriptor,
    argv: &[A],
) -> u32 {
    // Marked in one pass over the keys: MSET with a thousand keys stays linear.
    whole.clear();
    whole.resize(argv.len(), false);
    for key in &descriptor.keys {
        if let Some(whole) = whole.get_mut(key.position as usize) {
            *whole = true;
        }
    }
    let rest = argv
        .iter()
        .zip(whole.iter())
        .skip(1)
        .map(|(arg, &whole)| (arg.as_ref(), whole));
    let name = std::iter::once((descriptor.name.as_bytes(), true));
    let before = out.ends.len();
    pack(out, name.chain(rest));
    wire_len(out.ends.len() - before)
}

fn clear(argv: &mut Argv) {
    argv.bytes.clear();
    argv.ends.clear();
    argv.lens.clear();
}

/// Appends `args` to `out`, each whole or cut to its prefix.
fn pack<'a>(out: &mut Argv, args: impl Iterator<Item = (&'a [u8], bool)>) {
    for (arg, whole) in args {
        let crossing = if whole {
            arg.len()
        } else {
            arg.len().min(ARG_PREFIX)
        };
        out.bytes.extend_from_slice(&arg[..crossing]);
        out.ends.push(wire_len(out.bytes.len()));
        out.lens.push(wire_len(arg.len()));
    }
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
    use crate::sandbox::bindings::{Access, Categories, CommandFlags, KeyAccess, Lane};

    fn argv(parts: &[&[u8]]) -> Vec<Bytes> {
        parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
    }

    /// Argument by argument, what crossed.
    fn crossed(packed: &Argv) -> Vec<&[u8]> {
        let starts = std::iter::once(0).chain(packed.ends.iter().copied());
        starts
            .zip(&packed.ends)
            .map(|(start, &end)| &packed.bytes[start as usize..end as usize])
            .collect()
    }

    #[test]
    fn bounded_cuts_every_argument_to_its_prefix_and_keeps_its_length() {
        let long = vec![b'v'; 1000];
        Lowered::with(|lowered| {
            let packed = lowered.bounded(&argv(&[b"set", &long, b"x"]));
            assert_eq!(crossed(packed), [&b"set"[..], &long[..ARG_PREFIX], b"x"]);
            assert_eq!(packed.lens, [3, 1000, 1]);
            assert_eq!(packed.bytes.len(), 3 + ARG_PREFIX + 1);
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
            assert_eq!(command.argv.lens, [3, 100, 100]);
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
            assert_eq!((batch.commands[0].args, batch.commands[0].keys), (3, 1));
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
            assert_eq!(batch.argv.lens, [3, 100, 100, 3, 2, 2]);
            let keys: Vec<u32> = batch.keys.iter().map(|key| key.position).collect();
            assert_eq!(keys, [1, 1]);
        });
    }
}
