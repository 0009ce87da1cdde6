//! Reuse of catalog answers the catalog marks `fixed` (they depend only on the name, subcommand
//! and argc), so a `GET` does not ask the catalog module again for every key. Per generation, and
//! bounded: past [`CAPACITY`] entries new answers are simply not kept.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;

use crate::decision::Descriptor;
use crate::sandbox::bindings;

const CAPACITY: usize = 4096;
/// Longest name or subcommand cached; longer ones are always described afresh.
const WORD: usize = 24;

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

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    name: [u8; WORD],
    sub: [u8; WORD],
    argc: u32,
}

#[derive(Default)]
pub struct DescribedCache {
    entries: RwLock<HashMap<Key, Arc<Described>>>,
}

impl DescribedCache {
    /// A cached answer for `argv`: first as a plain command, then as `PARENT|SUB`.
    pub fn get(&self, argv: &[Bytes]) -> Option<Arc<Described>> {
        let entries = self.entries.read();
        let plain = key(argv, false)?;
        if let Some(found) = entries.get(&plain) {
            return Some(found.clone());
        }
        entries.get(&key(argv, true)?).cloned()
    }

    pub fn offer(&self, argv: &[Bytes], described: &Arc<Described>) {
        if !described.wit.fixed {
            return;
        }
        let Some(key) = key(argv, described.wit.name.contains('|')) else {
            return;
        };
        let mut entries = self.entries.write();
        if entries.len() < CAPACITY {
            entries.insert(key, described.clone());
        }
    }
}

fn key(argv: &[Bytes], with_sub: bool) -> Option<Key> {
    let word = |bytes: &[u8]| -> Option<[u8; WORD]> {
        let mut out = [0u8; WORD];
        out.get_mut(..bytes.len())?.copy_from_slice(bytes);
        out.make_ascii_uppercase();
        Some(out)
    };
    let sub = match (with_sub, argv.get(1)) {
        (true, Some(sub)) => word(sub)?,
        (true, None) => return None,
        (false, _) => [0u8; WORD],
    };
    Some(Key {
        name: word(argv.first()?)?,
        sub,
        argc: u32::try_from(argv.len()).ok()?,
    })
}
