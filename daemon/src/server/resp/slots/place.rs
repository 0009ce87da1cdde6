//! Where a command's keys put it in a cluster: nowhere in particular (keyless), in one slot, split
//! per slot (the multi-key commands whose keys are independent, where splitting is allowed), or
//! across slots and refused before anything is sent; and the check of a command queued in a
//! transaction against the transaction's slot.

use tollgate_lanes::{Slot, Splitting};
use tollgate_policy::KeyAccess;

use super::cross::{CrossSlot, KeyInSlot};
use super::split::{Family, Located, Split};

/// What a command becomes in a cluster, from its keys.
#[derive(Debug, PartialEq)]
pub enum Placement {
    /// No keys: it goes to any master, or to every one ([`super::spread`]).
    Keyless,
    /// Every key in one slot: sent whole to that slot's node.
    Slot(Slot),
    /// One command per slot, their replies merged back.
    Split(Split),
    /// Keys in two slots and no split: refused with [`CrossSlot::message`], nothing sent.
    Cross(CrossSlot),
}

/// What the command `name` (the catalog's: `MGET`, `SCRIPT|LOAD`) with words `argv` becomes, its
/// keys at the catalog's `keys` positions.
pub fn place<A: AsRef<[u8]>>(
    name: &str,
    argv: &[A],
    keys: &[KeyAccess],
    splitting: Splitting,
) -> Placement {
    // Every command pays for this: the keys are walked once, and nothing is allocated unless
    // they turn out to span slots.
    let mut walk = located(argv, keys);
    let Some(first) = walk.next() else {
        return Placement::Keyless;
    };
    let Some(other) = walk.find(|key| key.slot != first.slot) else {
        return Placement::Slot(first.slot);
    };
    let split = match (splitting, Family::of(name)) {
        (Splitting::Split, Some(family)) => {
            Split::of(family, argv, &located(argv, keys).collect::<Vec<_>>())
        }
        _ => None,
    };
    match split {
        Some(split) => Placement::Split(split),
        None => Placement::Cross(CrossSlot::between(first.named(), other.named())),
    }
}

/// The slot a transaction runs in: that of the first key it named (in `WATCH` or in the first
/// queued command with keys). Its TRANSACTION connection is on that slot's node, so every later
/// key must be in that slot too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionSlot(KeyInSlot);

impl TransactionSlot {
    pub fn of(key: &[u8]) -> TransactionSlot {
        TransactionSlot(KeyInSlot::new(key, Slot::of(key)))
    }

    pub fn slot(&self) -> Slot {
        self.0.slot()
    }
}

/// Whether a command queued in a transaction pinned to `pinned` keeps to its slot: if not, the
/// refusal names the key that pinned it and the first key that does not. Nothing inside a
/// transaction is split: its commands run on one connection, on one node.
pub fn same_slot<A: AsRef<[u8]>>(
    pinned: &TransactionSlot,
    argv: &[A],
    keys: &[KeyAccess],
) -> Result<(), CrossSlot> {
    match located(argv, keys).find(|key| key.slot != pinned.slot()) {
        Some(other) => Err(CrossSlot::between(pinned.0.clone(), other.named())),
        None => Ok(()),
    }
}

/// The keys of `argv` at `keys`' positions, in the catalog's order; a position past argv (which
/// admission does not let through) names no key, as in [`tollgate_policy::Descriptor::keys`].
fn located<'a, A: AsRef<[u8]>>(
    argv: &'a [A],
    keys: &'a [KeyAccess],
) -> impl Iterator<Item = Located<'a>> + 'a {
    keys.iter().filter_map(|access| {
        let key = argv.get(access.position)?.as_ref();
        Some(Located {
            position: access.position,
            key,
            slot: Slot::of(key),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{argv, every_other_word, every_word, keys_at};
    use super::super::split::Part;
    use super::*;

    fn placed(name: &str, words: &str, keys: &[KeyAccess], splitting: Splitting) -> Placement {
        place(name, &argv(words), keys, splitting)
    }

    fn cross_reply(placement: Placement) -> String {
        match placement {
            Placement::Cross(cross) => format!("-{}\r\n", cross.message()),
            other => panic!("not cross-slot: {other:?}"),
        }
    }

    #[test]
    fn a_command_without_keys_is_keyless() {
        for (name, words) in [("PING", "PING"), ("SCRIPT|LOAD", "SCRIPT LOAD return")] {
            assert_eq!(
                placed(name, words, &[], Splitting::Split),
                Placement::Keyless
            );
        }
        // A key position past argv names no key.
        assert_eq!(
            placed("GET", "GET", &keys_at([1]), Splitting::Split),
            Placement::Keyless
        );
    }

    #[test]
    fn keys_in_one_slot_place_the_command_there_hash_tags_included() {
        let tagged = Slot::of(b"u");
        for (name, words, keys) in [
            ("GET", "GET {u}a", keys_at([1])),
            ("MSET", "MSET {u}a 1 {u}b 2", every_other_word(5)),
            ("MGET", "MGET {u}a {u}b x{u}", every_word(4)),
            ("SUNIONSTORE", "SUNIONSTORE {u}d {u}a {u}b", every_word(4)),
            ("EVAL", "EVAL return 2 {u}a {u}b", keys_at([3, 4])),
        ] {
            assert_eq!(
                placed(name, words, &keys, Splitting::Refuse),
                Placement::Slot(tagged),
                "{words}"
            );
        }
        // Without the tag the same keys are apart.
        assert_ne!(Slot::of(b"a"), Slot::of(b"b"));
    }

    #[test]
    fn the_six_multi_key_commands_across_slots_are_split() {
        for (name, words, keys) in [
            ("MGET", "MGET foo bar", every_word(3)),
            ("MSET", "MSET foo 1 bar 2", every_other_word(5)),
            ("DEL", "DEL foo bar", every_word(3)),
            ("UNLINK", "UNLINK foo bar", every_word(3)),
            ("EXISTS", "EXISTS foo bar", every_word(3)),
            ("TOUCH", "TOUCH foo bar", every_word(3)),
        ] {
            match placed(name, words, &keys, Splitting::Split) {
                Placement::Split(split) => {
                    let slots: Vec<_> = split.parts().iter().map(Part::slot).collect();
                    assert_eq!(slots, [Slot::of(b"foo"), Slot::of(b"bar")], "{words}");
                }
                other => panic!("{words} not split: {other:?}"),
            }
        }
    }

    #[test]
    fn other_commands_across_slots_are_refused_naming_the_first_two_keys_apart() {
        let expected = "-CROSSSLOT tollgate: keys \"foo\" (slot 12182) and \"bar\" (slot 5061) \
                        are in different slots\r\n";
        for (name, words, keys) in [
            ("SUNIONSTORE", "SUNIONSTORE foo {foo}x bar", every_word(4)),
            ("RENAME", "RENAME foo bar", every_word(3)),
            ("EVAL", "EVAL return 2 foo bar", keys_at([3, 4])),
            ("FCALL", "FCALL f 3 foo {foo}b bar", keys_at([3, 4, 5])),
            // All or nothing is MSETNX's point: never split.
            ("MSETNX", "MSETNX foo 1 bar 2", every_other_word(5)),
        ] {
            assert_eq!(
                cross_reply(placed(name, words, &keys, Splitting::Split)),
                expected,
                "{words}"
            );
        }
    }

    #[test]
    fn a_split_refused_by_config_is_a_cross_slot_refusal() {
        let placement = placed("MGET", "MGET foo bar", &every_word(3), Splitting::Refuse);
        match &placement {
            Placement::Cross(cross) => {
                assert_eq!(cross.slots(), (Slot::of(b"foo"), Slot::of(b"bar")))
            }
            other => panic!("not refused: {other:?}"),
        }
        assert!(cross_reply(placement).starts_with("-CROSSSLOT tollgate: keys \"foo\""));
    }

    #[test]
    fn a_split_command_with_words_the_split_cannot_place_is_refused() {
        // An MSET missing its last value (admission refuses it first) and a key list the catalog
        // gave with a gap: splitting either would lose a word from every part.
        for (name, words, keys) in [
            ("MSET", "MSET foo 1 bar", every_other_word(4)),
            ("DEL", "DEL foo extra bar", keys_at([1, 3])),
        ] {
            assert!(
                matches!(
                    placed(name, words, &keys, Splitting::Split),
                    Placement::Cross(_)
                ),
                "{words}"
            );
        }
    }

    #[test]
    fn a_hostile_key_stays_on_one_line_escaped_and_cut_short() {
        let hostile = format!("evil\r\n+OK\r\n{}", "x".repeat(1000));
        let argv: Vec<&[u8]> = vec![b"RENAME", hostile.as_bytes(), b"bar"];
        let reply = cross_reply(place("RENAME", &argv, &every_word(3), Splitting::Split));
        assert_eq!(reply.matches("\r\n").count(), 1, "{reply:?}");
        assert!(reply.ends_with("\r\n"));
        assert!(reply.starts_with(r#"-CROSSSLOT tollgate: keys "evil\r\n+OK\r\nxxx"#));
        assert!(reply.contains(r#"xxx"... (slot "#), "{reply:?}");
        assert!(reply.len() < 200, "{} bytes", reply.len());
    }

    #[test]
    fn a_queued_command_must_keep_to_the_transactions_slot() {
        let pinned = TransactionSlot::of(b"foo");
        assert_eq!(pinned.slot(), Slot::of(b"foo"));
        let keys = every_word(3);
        assert_eq!(
            same_slot(&pinned, &argv("MGET {foo}a x{foo}y"), &keys),
            Ok(())
        );
        assert_eq!(same_slot(&pinned, &argv("PING"), &[]), Ok(()));
        let refused = same_slot(&pinned, &argv("MGET {foo}a bar"), &keys).unwrap_err();
        assert_eq!(
            refused.message(),
            "CROSSSLOT tollgate: keys \"foo\" (slot 12182) and \"bar\" (slot 5061) \
              are in different slots"
        );
    }
}
