//! An example operator catalog for commands the built-in catalog cannot know: a Redis module's.
//! It describes three RedisJSON commands (key at position 1) and nothing else, so the built-in
//! catalog keeps answering for every core command.

wit_bindgen::generate!({ world: "catalog-module", path: "../../../../wit" });

use exports::tollgate::policy::catalog::Guest;
use guest_kit::Args;
use tollgate::policy::types::{
    Access, Argv, Categories, CommandFlags, Descriptor, KeyAccess, Lane,
};

struct JsonCatalog;

/// Name, arity, categories, whether it writes.
const COMMANDS: &[(&str, i32, Categories, bool)] = &[
    (
        "JSON.DEL",
        -2,
        Categories::KEYSPACE.union(Categories::WRITE),
        true,
    ),
    ("JSON.GET", -2, Categories::READ, false),
    ("JSON.SET", -4, Categories::WRITE, true),
];

fn descriptor(&(name, arity, categories, writes): &(&str, i32, Categories, bool)) -> Descriptor {
    Descriptor {
        name: name.to_owned(),
        lane: Lane::Regular,
        categories,
        traits: if writes {
            CommandFlags::WRITE
        } else {
            CommandFlags::READONLY
        },
        arity,
        keys: vec![KeyAccess {
            position: 1,
            access: if writes { Access::WRITE } else { Access::READ },
        }],
        reuse: Some(Vec::new()),
    }
}

impl Guest for JsonCatalog {
    fn describe(argv: Argv) -> Option<Descriptor> {
        let args = Args::new(&argv.bytes, &argv.spans);
        let name = args.whole(0)?;
        let command = COMMANDS
            .iter()
            .find(|(known, ..)| known.as_bytes().eq_ignore_ascii_case(name))?;
        // Without its key the call is malformed; let Redis say so, but name no impossible key.
        let mut described = descriptor(command);
        described
            .keys
            .retain(|key| (key.position as usize) < args.count());
        Some(described)
    }

    fn all() -> Vec<Descriptor> {
        COMMANDS.iter().map(descriptor).collect()
    }
}

export!(JsonCatalog);
