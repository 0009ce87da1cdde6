//! The shape of the generated command table, command lookup, and key-position resolution that
//! follows Redis's key specs (`begin_search` + `find_keys`, as `COMMAND INFO` reports them) and,
//! where those cannot say, the option parsing of Redis's own key procedures (db.c).
//!
//! Arguments are compared as Redis compares them: keywords with `strcasecmp`, which stops at the
//! first NUL (`STORE\0x` is STORE to Redis), counts as `COMMAND GETKEYS` reads them. Command and
//! subcommand names are looked up whole, as Redis's command table does.

use std::cmp::Ordering;

pub use crate::tollgate::policy::types::Lane;
use guest_kit::Args;

use crate::tollgate::policy::types::{
    Access, Argv, Categories, CommandFlags, Descriptor, KeyAccess,
};

pub struct Entry {
    pub name: &'static str,
    pub arity: i32,
    pub lane: Lane,
    /// Flagged blocking, but blocks only when this keyword is among the arguments (XREAD BLOCK).
    pub blocks_only_with: Option<&'static str>,
    /// Bit `i`: the `i`-th flag of `categories` in the WIT.
    pub categories: u32,
    /// Bit `i`: the `i`-th flag of `command-flags` in the WIT.
    pub traits: u8,
    pub keys: &'static [KeySpec],
    pub subcommands: &'static [Entry],
}

pub struct KeySpec {
    pub read: bool,
    pub write: bool,
    pub begin: Begin,
    pub find: Find,
}

/// Where the search for keys starts.
pub enum Begin {
    /// At this argv index.
    Index(i32),
    /// After this keyword, searched from `startfrom` (negative: from the end, backwards).
    Keyword(&'static str, i32),
    /// After every occurrence at or after this index of any of these keywords: where Redis's key
    /// spec cannot say (SORT's BY and GET patterns), or says less than the command does
    /// (GEORADIUS stores to its last STORE or STOREDIST, its key spec names the first).
    AfterEach(&'static [&'static str], i32),
    /// Where the command's own option parsing puts its first key (none: no key from this spec).
    Parsed(Parse),
}

/// Option parsing that Redis does for a command's keys or their flags in a key procedure of its
/// own (db.c), because the command's key specs are incomplete or its flags vary.
#[derive(Clone, Copy)]
pub enum Parse {
    /// MIGRATE's argv[3], unless a KEYS option follows (`migrateGetKeys`).
    MigrateKey,
    /// After MIGRATE's KEYS option, when argv[3] is empty (AUTH takes one argument, AUTH2 two).
    MigrateKeys,
    /// After XREAD's and XREADGROUP's STREAMS option, found as the command finds it (BLOCK and
    /// COUNT take one argument, GROUP two). The key spec's search starts at a fixed index, so a
    /// group named STREAMS after another option misleads it; both are kept.
    Streams,
    /// SET's key, when the GET option makes it read as well as written (`setGetKeys`).
    SetGet,
    /// BITFIELD's key, unless every operation is a GET or OVERFLOW (`bitfieldGetKeys`).
    BitfieldWrite,
}

/// Which arguments from the start are keys.
pub enum Find {
    /// `last` relative to the start (negative: from the end; with `limit`, a fraction of the rest).
    Range { last: i32, step: i32, limit: i32 },
    /// The argument at `index` (relative to the start) holds the number of keys; they begin at
    /// `first` (relative to the start).
    Keynum { index: i32, first: i32, step: i32 },
}

pub fn describe(table: &'static [Entry], argv: &Argv) -> Option<Descriptor> {
    let args = Args::new(&argv.bytes, &argv.spans);
    // What crossed of each argument. Of one cut to a prefix, that prefix: no name is that long,
    // a keyword is one if the prefix holds a NUL early enough, and Redis refuses such a count.
    let arg = |i: usize| (i < args.count()).then(|| args.get(i).unwrap_or_default());
    let entry = lookup(table, args.count(), arg)?;
    Some(descriptor(entry, args.count(), arg))
}

pub fn all(table: &'static [Entry]) -> Vec<Descriptor> {
    let mut out = Vec::new();
    for entry in table {
        for entry in std::iter::once(entry).chain(entry.subcommands) {
            let argv = sample(entry);
            out.push(descriptor(entry, argv.len(), |i| {
                argv.get(i).map(Vec::as_slice)
            }));
        }
    }
    out
}

/// A short argv that reaches every key spec: the arity's worth of placeholders, key counts of 1,
/// and each search keyword followed by one key (and its partner argument, as XREAD's ID).
fn sample(entry: &Entry) -> Vec<Vec<u8>> {
    let mut argv = vec![b"x".to_vec(); (entry.arity.unsigned_abs() as usize).max(1)];
    let grow = |argv: &mut Vec<Vec<u8>>, len: usize| {
        if argv.len() < len {
            argv.resize(len, b"x".to_vec());
        }
    };
    for spec in entry.keys {
        match (&spec.begin, &spec.find) {
            (Begin::Index(at), Find::Keynum { index, first, .. }) => {
                let (count, key) = ((at + index) as usize, (at + first) as usize);
                grow(&mut argv, count.max(key) + 1);
                argv[count] = b"1".to_vec();
            }
            (Begin::Index(at), Find::Range { .. }) => grow(&mut argv, *at as usize + 1),
            (Begin::Keyword(keyword, _), _) | (Begin::AfterEach([keyword, ..], _), _) => {
                argv.extend([keyword.as_bytes().to_vec(), b"x".to_vec(), b"x".to_vec()]);
            }
            (Begin::AfterEach([], _), _) | (Begin::Parsed(_), _) => {}
        }
    }
    argv
}

fn lookup<'a>(
    table: &'static [Entry],
    argc: usize,
    arg: impl Fn(usize) -> Option<&'a [u8]>,
) -> Option<&'static Entry> {
    let name = arg(0)?;
    let index = table
        .binary_search_by(|entry| cmp_ignore_case(entry.name.as_bytes(), name))
        .ok()?;
    let entry = &table[index];
    if entry.subcommands.is_empty() || argc < 2 {
        return Some(entry);
    }
    let sub = arg(1)?;
    entry.subcommands.iter().find(|candidate| {
        let (_, sub_name) = candidate
            .name
            .split_once('|')
            .unwrap_or(("", candidate.name));
        sub_name.as_bytes().eq_ignore_ascii_case(sub)
    })
}

fn cmp_ignore_case(a: &[u8], b: &[u8]) -> Ordering {
    a.iter()
        .map(u8::to_ascii_lowercase)
        .cmp(b.iter().map(u8::to_ascii_lowercase))
}

fn descriptor<'a>(
    entry: &Entry,
    argc: usize,
    arg: impl Fn(usize) -> Option<&'a [u8]>,
) -> Descriptor {
    let mut keys: Vec<KeyAccess> = Vec::new();
    for spec in entry.keys {
        let mut access = Access::empty();
        access.set(Access::READ, spec.read);
        access.set(Access::WRITE, spec.write);
        keys.extend(
            positions(spec, argc, &arg)
                .into_iter()
                .map(|position| KeyAccess { position, access }),
        );
    }
    // A position several specs name is one key with their accesses together. Sorted and merged
    // rather than searched per position: an MSET of a million keys stays linear (but for the
    // sort), where a search per key was quadratic and ran out of fuel past a few thousand.
    keys.sort_unstable_by_key(|k| k.position);
    keys.dedup_by(|later, kept| {
        let same = later.position == kept.position;
        if same {
            kept.access |= later.access;
        }
        same
    });
    let lane = match entry.blocks_only_with {
        Some(keyword) if !(1..argc as i64).any(|i| is_keyword(&arg, i, keyword)) => Lane::Regular,
        _ => entry.lane,
    };
    Descriptor {
        name: entry.name.to_owned(),
        lane,
        categories: Categories::from_bits_retain(entry.categories),
        traits: CommandFlags::from_bits_retain(entry.traits),
        arity: entry.arity,
        keys,
        reuse: reuse(entry, argc),
    }
}

/// What besides argc decides key positions, their flags and the lane: the positions of key counts
/// (EVAL's numkeys) and of SET's options (GET among them makes its key read); `None` when a
/// keyword does (XREAD's STREAMS, XREAD's BLOCK for the lane).
fn reuse(entry: &Entry, argc: usize) -> Option<Vec<u32>> {
    if entry.blocks_only_with.is_some() {
        return None;
    }
    let mut depends = Vec::new();
    for spec in entry.keys {
        match (&spec.begin, &spec.find) {
            (Begin::Index(_), Find::Range { .. }) => {}
            (Begin::Index(at), Find::Keynum { index, .. }) => {
                depends.push(u32::try_from(at + index).ok()?);
            }
            (Begin::Parsed(Parse::SetGet), _) => {
                depends.extend(SET_OPTIONS as u32..u32::try_from(argc).ok()?);
            }
            _ => return None,
        }
    }
    (depends.len() <= MAX_REUSE).then_some(depends)
}

/// Key positions of one spec for this argv; positions past the end are dropped (Redis itself
/// would reject such a call for its arity).
fn positions<'a>(
    spec: &KeySpec,
    argc: usize,
    arg: &impl Fn(usize) -> Option<&'a [u8]>,
) -> Vec<u32> {
    let argc = argc as i64;
    let starts: Vec<i64> = match spec.begin {
        Begin::Index(index) => vec![index as i64],
        Begin::Keyword(keyword, from) => {
            // As Redis searches: never the last argument (forwards) nor the first (backwards),
            // which could not be followed by a key anyway.
            let found = if from >= 0 {
                (from as i64..argc - 1).find(|&i| is_keyword(arg, i, keyword))
            } else {
                (2..=argc + from as i64)
                    .rev()
                    .find(|&i| is_keyword(arg, i, keyword))
            };
            found.map(|i| i + 1).into_iter().collect()
        }
        Begin::AfterEach(keywords, from) => (from.max(1) as i64..argc - 1)
            .filter(|&i| keywords.iter().any(|k| is_keyword(arg, i, k)))
            .map(|i| i + 1)
            .collect(),
        Begin::Parsed(parse) => parsed(parse, argc, arg).into_iter().collect(),
    };
    let mut out = Vec::new();
    for first in starts {
        let (first, last, step) = match spec.find {
            Find::Range { last, step, limit } => {
                let last = match (last, limit) {
                    (last, _) if last >= 0 => first + last as i64,
                    (last, limit) if limit <= 1 => argc + last as i64,
                    (last, limit) => first + (argc - first) / limit as i64 + last as i64,
                };
                (first, last, step)
            }
            Find::Keynum {
                index,
                first: offset,
                step,
            } => {
                let start = first + offset as i64;
                let count = arg((first + index as i64) as usize).map_or(0, key_count);
                let last = start + (count as i64 - 1) * step.max(1) as i64;
                // No keys at all when the count is not positive or runs past argv, as Redis's
                // `genericGetKeys` decides (and the command itself refuses the call).
                if count < 1 || last >= argc {
                    continue;
                }
                (start, last, step)
            }
        };
        let step = step.max(1) as usize;
        out.extend(
            (first..=last.min(argc - 1))
                .step_by(step)
                .filter(|&i| i >= 1)
                .map(|i| i as u32),
        );
    }
    out
}

/// Where SET's options start (after `SET key value`).
const SET_OPTIONS: usize = 3;
/// Most positions an answer's `reuse` may name: the host refuses an answer with more as malformed
/// (crates/policy/src/sandbox/calls.rs), so a SET with more options is described afresh each time.
const MAX_REUSE: usize = 4;

/// The first key position of a [`Parse`] for this argv, as Redis's key procedure finds it.
fn parsed<'a>(parse: Parse, argc: i64, arg: &impl Fn(usize) -> Option<&'a [u8]>) -> Option<i64> {
    let is = |i: i64, keyword: &str| is_keyword(arg, i, keyword);
    match parse {
        Parse::MigrateKey => migrate_keys_option(argc, arg).is_none().then_some(3),
        Parse::MigrateKeys => {
            let keys = migrate_keys_option(argc, arg)?;
            arg(3).is_some_and(<[u8]>::is_empty).then_some(keys + 1)
        }
        Parse::Streams => {
            let mut i = 1;
            while i < argc {
                if is(i, "BLOCK") || is(i, "COUNT") {
                    i += 1;
                } else if is(i, "GROUP") {
                    i += 2;
                } else if is(i, "STREAMS") {
                    return Some(i + 1);
                } else if !is(i, "NOACK") {
                    return None;
                }
                i += 1;
            }
            None
        }
        Parse::SetGet => (SET_OPTIONS as i64..argc)
            .any(|i| is(i, "GET"))
            .then_some(1),
        Parse::BitfieldWrite => {
            let mut i = 2;
            while i < argc {
                let more = argc - i - 1;
                if is(i, "GET") && more >= 2 {
                    i += 3;
                } else if is(i, "OVERFLOW") && more >= 1 {
                    i += 2;
                } else {
                    // SET, INCRBY, or a malformed operation (Redis assumes the safer: written).
                    return Some(1);
                }
            }
            None
        }
    }
}

/// The index of MIGRATE's KEYS option, searched from argv[6] past COPY, REPLACE, AUTH's password
/// and AUTH2's user and password.
fn migrate_keys_option<'a>(argc: i64, arg: &impl Fn(usize) -> Option<&'a [u8]>) -> Option<i64> {
    let mut i = 6;
    while i < argc {
        if is_keyword(arg, i, "KEYS") {
            return Some(i);
        }
        if is_keyword(arg, i, "AUTH") {
            i += 1;
        } else if is_keyword(arg, i, "AUTH2") {
            i += 2;
        }
        i += 1;
    }
    None
}

/// A key count as `COMMAND GETKEYS` reads it: C's `strtol` (leading blanks, a sign, digits up to
/// the first other byte, saturating), then cut to a C `int`. Redis itself refuses every count that
/// is not a plain number, so only plain numbers reach it.
fn key_count(bytes: &[u8]) -> i32 {
    let text = bytes
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'))
        .map_or(&[][..], |start| &bytes[start..]);
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        rest => (false, rest),
    };
    let mut value: i64 = 0;
    for digit in digits.iter().take_while(|b| b.is_ascii_digit()) {
        let digit = i64::from(digit - b'0');
        value = if negative {
            value.saturating_mul(10).saturating_sub(digit)
        } else {
            value.saturating_mul(10).saturating_add(digit)
        };
    }
    value as i32
}

/// Whether argument `index` is `keyword` as Redis's `strcasecmp` sees it: up to its first NUL.
fn is_keyword<'a>(arg: &impl Fn(usize) -> Option<&'a [u8]>, index: i64, keyword: &str) -> bool {
    index >= 0
        && arg(index as usize).is_some_and(|a| {
            let c_string = a.split(|&b| b == 0).next().unwrap_or_default();
            c_string.eq_ignore_ascii_case(keyword.as_bytes())
        })
}
