//! Reuse of catalog answers as each answer's `reuse` allows: for later calls with the same name,
//! subcommand and argc, and equal arguments at the positions it names (EVAL's numkeys), so a
//! `GET` or an `EVAL` does not ask the catalog module again for every call. Per generation, and
//! bounded: past [`CAPACITY`] answers new ones are simply not kept.
//!
//! Names are compared exactly (but for ASCII case): `SET\0` or `SET ` is not `SET`, whatever is
//! kept, so a name the catalog does not know is always described afresh, and refused.

use std::sync::Arc;

use parking_lot::RwLock;
use rustc_hash::FxHashMap;

use crate::decision::Descriptor;
use crate::sandbox::bindings;

const CAPACITY: usize = 4096;
/// Answers naming more keys are not kept: each is kept twice (WIT and native), per argc, and an
/// MSET of a million keys would hold megabytes for one call. Commands that large are rare, and
/// their catalog call is small beside the command.
const MAX_KEYS_KEPT: usize = 256;
/// Longest name or subcommand cached; longer ones are always described afresh.
const WORD: usize = 24;
/// Room for the values an answer depends on, each with a length byte (numkeys values are short;
/// calls with longer ones are described afresh).
const VALUES: usize = 16;

/// A catalog answer in both forms: for the guards (WIT) and for the caller (native).
pub struct Described {
    pub wit: bindings::Descriptor,
    pub native: Arc<Descriptor>,
    /// Which catalog answered (an index into the generation's catalogs; 0 is the built-in one).
    pub catalog: usize,
}

impl Described {
    /// A descriptor the host made or the built-in catalog gave.
    pub fn new(wit: bindings::Descriptor) -> Described {
        Described::by(0, wit)
    }

    pub fn by(catalog: usize, wit: bindings::Descriptor) -> Described {
        let native = Arc::new(Descriptor::from(&wit));
        Described {
            wit,
            native,
            catalog,
        }
    }
}

/// A name or subcommand, upper case, with its length: padding alone cannot tell `SET` from `SET\0`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Word {
    len: u8,
    bytes: [u8; WORD],
}

/// Which command and argc: name and subcommand, and how many arguments (a catalog may name other
/// positions for another argc, as SET's options).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct CommandKey {
    name: Word,
    sub: Option<Word>,
    argc: u32,
}

/// Which call of a command and argc: the values at the command's reuse positions.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct CallKey {
    values: [u8; VALUES],
}

/// The answers kept for one command and argc, and the positions its calls are told apart by.
struct Known {
    positions: Vec<u32>,
    answers: FxHashMap<CallKey, Arc<Described>>,
}

#[derive(Default)]
pub struct DescribedCache {
    inner: RwLock<Inner>,
}

#[derive(Default)]
struct Inner {
    commands: FxHashMap<CommandKey, Known>,
    answers: usize,
}

impl DescribedCache {
    /// A kept answer for `argv`: first as a plain command, then as `PARENT|SUB`.
    pub fn get<A: AsRef<[u8]>>(&self, argv: &[A]) -> Option<Arc<Described>> {
        let inner = self.inner.read();
        let known = match inner.commands.get(&command_key(argv, false)?) {
            Some(known) => known,
            None => inner.commands.get(&command_key(argv, true)?)?,
        };
        known
            .answers
            .get(&call_key(argv, &known.positions)?)
            .cloned()
    }

    pub fn offer<A: AsRef<[u8]>>(&self, argv: &[A], described: &Arc<Described>) {
        let Some(positions) = &described.wit.reuse else {
            return;
        };
        if described.wit.keys.len() > MAX_KEYS_KEPT {
            return;
        }
        let with_sub = described.wit.name.contains('|');
        let (Some(command), Some(call)) = (command_key(argv, with_sub), call_key(argv, positions))
        else {
            return;
        };
        let mut inner = self.inner.write();
        if inner.answers >= CAPACITY {
            return;
        }
        let known = inner.commands.entry(command).or_insert_with(|| Known {
            positions: positions.clone(),
            answers: FxHashMap::default(),
        });
        // A catalog names the same positions for every call of a command with this argc; if one
        // did not, the first answer's positions stay and this answer is not kept.
        if known.positions != *positions {
            return;
        }
        if known.answers.insert(call, described.clone()).is_none() {
            inner.answers += 1;
        }
    }
}

/// Whether `described`, the answer for `earlier`, is the answer [`DescribedCache::get`] would
/// give for `argv` once kept: the same name (and subcommand), argc and values at the answer's
/// reuse positions. A pipeline is mostly runs of one command; its batch asks this of each
/// command's predecessor instead of the cache (no lock, no hashing). As with
/// [`DescribedCache::offer`], the caller keeps answers that do not fit their argc's arity out.
pub fn same_call<A: AsRef<[u8]>>(described: &Described, earlier: &[A], argv: &[A]) -> bool {
    let Some(positions) = &described.wit.reuse else {
        return false;
    };
    if earlier.len() != argv.len() || described.wit.keys.len() > MAX_KEYS_KEPT {
        return false;
    }
    // What equal keys mean, compared in place: a name (and subcommand) short enough to be a
    // key, equal but for ASCII case; the values at the positions equal byte for byte, all of
    // them fitting a key (length-prefixed packing is equal exactly when each value is).
    let word = |a: &A, b: &A| {
        let (a, b) = (a.as_ref(), b.as_ref());
        a.len() <= WORD && a.eq_ignore_ascii_case(b)
    };
    let with_sub = described.wit.name.contains('|');
    let named = match (earlier, argv) {
        ([name_a, sub_a, ..], [name_b, sub_b, ..]) if with_sub => {
            word(name_a, name_b) && word(sub_a, sub_b)
        }
        ([name_a, ..], [name_b, ..]) if !with_sub => word(name_a, name_b),
        _ => false,
    };
    let mut packed = 0;
    named
        && u32::try_from(argv.len()).is_ok()
        && positions.iter().all(|&position| {
            let at = position as usize;
            match (earlier.get(at), argv.get(at)) {
                (Some(a), Some(b)) => {
                    packed += 1 + b.as_ref().len();
                    packed <= VALUES && a.as_ref() == b.as_ref()
                }
                _ => false,
            }
        })
}

fn command_key<A: AsRef<[u8]>>(argv: &[A], with_sub: bool) -> Option<CommandKey> {
    let word = |bytes: &[u8]| -> Option<Word> {
        let mut out = [0u8; WORD];
        let word = out.get_mut(..bytes.len())?;
        word.copy_from_slice(bytes);
        word.make_ascii_uppercase();
        Some(Word {
            len: bytes.len() as u8,
            bytes: out,
        })
    };
    let sub = match (with_sub, argv.get(1)) {
        (true, Some(sub)) => Some(word(sub.as_ref())?),
        (true, None) => return None,
        (false, _) => None,
    };
    Some(CommandKey {
        name: word(argv.first()?.as_ref())?,
        sub,
        argc: u32::try_from(argv.len()).ok()?,
    })
}

/// Length-prefixed, so `["1", "23"]` and `["12", "3"]` differ.
fn call_key<A: AsRef<[u8]>>(argv: &[A], positions: &[u32]) -> Option<CallKey> {
    let mut values = [0u8; VALUES];
    let mut at = 0;
    for &position in positions {
        let value = argv.get(position as usize)?.as_ref();
        let end = at + 1 + value.len();
        values.get_mut(at + 1..end)?.copy_from_slice(value);
        values[at] = value.len() as u8;
        at = end;
    }
    Some(CallKey { values })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::sandbox::bindings::{Categories, CommandFlags, Lane};

    fn argv(parts: &[&str]) -> Vec<Bytes> {
        parts
            .iter()
            .map(|p| Bytes::copy_from_slice(p.as_bytes()))
            .collect()
    }

    fn answer(name: &str, reuse: Option<Vec<u32>>) -> Arc<Described> {
        Arc::new(Described::new(bindings::Descriptor {
            name: name.into(),
            lane: Lane::Regular,
            categories: Categories::empty(),
            traits: CommandFlags::empty(),
            arity: -1,
            keys: Vec::new(),
            reuse,
        }))
    }

    #[test]
    fn an_answer_is_reused_for_calls_equal_at_its_positions_only() {
        let cache = DescribedCache::default();
        let eval = answer("EVAL", Some(vec![2]));
        cache.offer(&argv(&["EVAL", "return 1", "2", "a", "b"]), &eval);
        let hit = cache.get(&argv(&["eval", "return 2", "2", "c", "d"]));
        assert!(hit.is_some_and(|hit| Arc::ptr_eq(&hit, &eval)));
        // Another numkeys, or another argc, is another call.
        assert!(cache
            .get(&argv(&["EVAL", "return 1", "1", "a", "b"]))
            .is_none());
        assert!(cache.get(&argv(&["EVAL", "return 1", "2", "a"])).is_none());
    }

    #[test]
    fn a_batch_reuses_its_predecessor_s_answer_exactly_where_the_cache_would() {
        // `same_call` stands in for the cache inside a batch: for every pair, it must say yes
        // exactly when the cache, given the first call's answer, would give it for the second.
        let answers = [
            answer("SET", Some(vec![])),
            answer("EVAL", Some(vec![2])),
            answer("CLIENT|LIST", Some(vec![])),
            answer("XREAD", None),
            answer("ABCDEFGHIJKLMNOPQRSTUVWXYZ", Some(vec![])),
        ];
        let calls = [
            argv(&["SET", "k", "v"]),
            argv(&["set", "other", "value"]),
            argv(&["SET\0", "k", "v"]),
            argv(&["SET", "k", "v", "GET"]),
            argv(&["EVAL", "return 1", "2", "a", "b"]),
            argv(&["eval", "return 2", "2", "c", "d"]),
            argv(&["EVAL", "return 1", "1", "a", "b"]),
            argv(&["CLIENT", "LIST"]),
            argv(&["client", "list"]),
            argv(&["CLIENT", "INFO"]),
            argv(&["XREAD", "STREAMS", "s", "0"]),
            // Too long to be kept: a name past a word, values past a key's room.
            argv(&["ABCDEFGHIJKLMNOPQRSTUVWXYZ"]),
            argv(&["EVAL", "s", "123456789012345678", "a"]),
            argv(&["EVAL", "s", "12345678901234", "a"]),
        ];
        for described in &answers {
            for earlier in &calls {
                for call in &calls {
                    let cache = DescribedCache::default();
                    cache.offer(earlier, described);
                    let kept = cache
                        .get(call)
                        .is_some_and(|hit| Arc::ptr_eq(&hit, described));
                    assert_eq!(
                        same_call(described, earlier, call),
                        kept,
                        "{} answering {earlier:?}, then {call:?}",
                        described.wit.name
                    );
                }
            }
        }
    }

    #[test]
    fn an_answer_without_reuse_is_not_kept() {
        let cache = DescribedCache::default();
        let xread = argv(&["XREAD", "STREAMS", "s", "0"]);
        cache.offer(&xread, &answer("XREAD", None));
        assert!(cache.get(&xread).is_none());
    }

    #[test]
    fn a_name_with_a_nul_or_other_bytes_is_not_a_kept_name() {
        let cache = DescribedCache::default();
        cache.offer(&argv(&["SET", "k", "v"]), &answer("SET", Some(vec![])));
        assert!(cache.get(&argv(&["set", "k", "v"])).is_some());
        for name in ["SET\0", "SET\0\0", "\0SET", "SET ", "SETX", "SE"] {
            assert!(
                cache.get(&argv(&[name, "k", "v"])).is_none(),
                "{name:?} was answered as SET"
            );
        }
        cache.offer(
            &argv(&["CLIENT", "LIST"]),
            &answer("CLIENT|LIST", Some(vec![])),
        );
        assert!(cache.get(&argv(&["CLIENT", "LIST\0"])).is_none());
        assert!(cache.get(&argv(&["CLIENT\0", "LIST"])).is_none());
    }

    #[test]
    fn positions_may_differ_with_argc() {
        // SET's answer depends on its options (GET makes its key read): none for three arguments,
        // every option for more. Both are kept, each for its own argc.
        let cache = DescribedCache::default();
        let plain = answer("SET", Some(vec![]));
        let with_options = answer("SET", Some(vec![3]));
        cache.offer(&argv(&["SET", "k", "v"]), &plain);
        cache.offer(&argv(&["SET", "k", "v", "GET"]), &with_options);
        let hit = cache.get(&argv(&["SET", "a", "b", "GET"]));
        assert!(hit.is_some_and(|hit| Arc::ptr_eq(&hit, &with_options)));
        // Values compare byte for byte: another option, or another spelling, is another call.
        assert!(cache.get(&argv(&["SET", "a", "b", "NX"])).is_none());
        assert!(cache.get(&argv(&["SET", "a", "b", "get"])).is_none());
        let hit = cache.get(&argv(&["SET", "a", "b"]));
        assert!(hit.is_some_and(|hit| Arc::ptr_eq(&hit, &plain)));
    }

    #[test]
    fn an_answer_naming_many_keys_is_not_kept() {
        let mget = |keys: usize| {
            let argv: Vec<String> = std::iter::once("MGET".to_owned())
                .chain((0..keys).map(|i| format!("k{i}")))
                .collect();
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            let mut wit = answer("MGET", Some(vec![])).wit.clone();
            wit.keys = (1..=keys as u32)
                .map(|position| bindings::KeyAccess {
                    position,
                    access: bindings::Access::READ,
                })
                .collect();
            (self::argv(&argv), Arc::new(Described::new(wit)))
        };
        let cache = DescribedCache::default();
        let (few, described) = mget(MAX_KEYS_KEPT);
        cache.offer(&few, &described);
        assert!(cache.get(&few).is_some());
        let (many, described) = mget(MAX_KEYS_KEPT + 1);
        cache.offer(&many, &described);
        assert!(cache.get(&many).is_none());
    }

    #[test]
    fn subcommands_are_told_apart() {
        let cache = DescribedCache::default();
        cache.offer(
            &argv(&["CLIENT", "LIST"]),
            &answer("CLIENT|LIST", Some(vec![])),
        );
        assert!(cache.get(&argv(&["client", "list"])).is_some());
        assert!(cache.get(&argv(&["CLIENT", "KILL"])).is_none());
    }
}
