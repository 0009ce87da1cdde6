//! How a caller and a command cross into the sandbox: the arguments packed into the WIT `argv`
//! record (all bytes in one buffer, where each ends and how long it was in two more lists), so a
//! call lowers three lists however many arguments there are. Keys cross in full (guards match
//! them); every other argument as a bounded prefix. The buffers are reused per thread.

use std::cell::RefCell;

use bytes::Bytes;
use tollgate_model::Caller;

use super::bindings::{self, Argv, Categories, Command, CommandFlags, Descriptor, Lane};

/// How many leading bytes of a non-key argument cross into the sandbox.
pub const ARG_PREFIX: usize = 64;

thread_local! {
    static SCRATCH: RefCell<Lowered> = RefCell::new(Lowered::new());
}

/// A decision's caller and command in their WIT form. One per thread, refilled in place: after a
/// thread's first decision, lowering allocates nothing on the host (the buffers keep their size).
pub struct Lowered {
    caller: bindings::Caller,
    command: Command,
    /// Per argument of the last command: whether it is a key (and so crosses whole).
    whole: Vec<bool>,
}

impl Lowered {
    fn new() -> Lowered {
        Lowered {
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
                argv: Argv {
                    bytes: Vec::new(),
                    ends: Vec::new(),
                    lens: Vec::new(),
                },
            },
            whole: Vec::new(),
        }
    }

    /// Runs `f` with this thread's buffers. Not re-entrant: `f` must not call `with` again.
    pub fn with<R>(f: impl FnOnce(&mut Lowered) -> R) -> R {
        SCRATCH.with_borrow_mut(f)
    }

    /// `argv` as a catalog sees it: every argument bounded.
    pub fn bounded(&mut self, argv: &[Bytes]) -> &Argv {
        pack(
            &mut self.command.argv,
            argv.iter().map(|arg| (&arg[..], false)),
        );
        &self.command.argv
    }

    /// `caller` and `argv` as a guard sees them under `descriptor`: the canonical name in place of
    /// argument 0, the arguments at the descriptor's key positions in full, every other one
    /// bounded.
    pub fn for_guard(
        &mut self,
        caller: &Caller,
        descriptor: &Descriptor,
        argv: &[Bytes],
    ) -> (&bindings::Caller, &Command) {
        let who = &mut self.caller;
        if who.principal != caller.principal {
            who.principal.clone_from(&caller.principal);
        }
        (who.uid, who.gid, who.pid) = (caller.uid, caller.gid, caller.pid);
        let command = &mut self.command;
        command.lane = descriptor.lane;
        command.categories = descriptor.categories;
        command.traits = descriptor.traits;
        // Marked in one pass over the keys: MSET with a thousand keys stays linear.
        self.whole.clear();
        self.whole.resize(argv.len(), false);
        for key in &descriptor.keys {
            if let Some(whole) = self.whole.get_mut(key.position as usize) {
                *whole = true;
            }
        }
        let rest = argv
            .iter()
            .zip(&self.whole)
            .skip(1)
            .map(|(arg, &whole)| (&arg[..], whole));
        let name = std::iter::once((descriptor.name.as_bytes(), true));
        pack(&mut command.argv, name.chain(rest));
        (&self.caller, &self.command)
    }
}

/// Packs `(argument, whole)` pairs into `out`: a `whole` argument crosses in full, any other
/// bounded.
fn pack<'a>(out: &mut Argv, args: impl Iterator<Item = (&'a [u8], bool)>) {
    out.bytes.clear();
    out.ends.clear();
    out.lens.clear();
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
    use super::*;
    use crate::sandbox::bindings::{Access, KeyAccess};

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
    fn for_guard_names_the_command_canonically_and_sends_keys_whole() {
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
            lowered.bounded(&argv(&[b"mset", b"a", b"1", b"b", b"2"]));
            let (who, command) =
                lowered.for_guard(&caller, &descriptor, &argv(&[b"set", &key, &value]));
            assert_eq!((who.principal.as_str(), who.uid, who.pid), ("app", 7, 9));
            assert_eq!(command.categories, Categories::WRITE);
            assert_eq!(
                crossed(&command.argv),
                [&b"SET"[..], &key[..], &value[..ARG_PREFIX]]
            );
            assert_eq!(command.argv.lens, [3, 100, 100]);
        });
    }
}
