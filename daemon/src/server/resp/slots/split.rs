//! The multi-key commands whose keys are independent of each other — `MGET`, `MSET`, `DEL`,
//! `UNLINK`, `EXISTS`, `TOUCH` — cut into one command per slot, and the parts' replies merged into
//! the reply one Redis would have given.
//!
//! A split command is not atomic: its parts run on different nodes at different moments. Another
//! client may see a split `MSET` or `DEL` half done, and when one part fails (the client gets the
//! first error) the other parts may already have applied.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use tollgate_lanes::Slot;
use tollgate_resp::Frame;

use super::combine::{finish, without_errors, Combine, Failure, Misshapen};
use super::cross::KeyInSlot;

/// How a splittable command's words and replies are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    /// `MGET key…`: one value per key, put back at the key's place.
    Values,
    /// `MSET key value…`: `+OK` from every part.
    Pairs,
    /// `DEL`, `UNLINK`, `EXISTS`, `TOUCH`: the parts' integers summed. A repeated key stays in its
    /// slot's part as often as it was named, so `EXISTS k k` still counts it twice, as Redis does.
    Counts,
}

impl Family {
    /// The family of the catalog's `name`, if it splits. `MSETNX` does not: all or nothing is its
    /// point, and no split keeps it.
    pub(super) fn of(name: &str) -> Option<Family> {
        match name {
            "MGET" => Some(Family::Values),
            "MSET" => Some(Family::Pairs),
            "DEL" | "UNLINK" | "EXISTS" | "TOUCH" => Some(Family::Counts),
            _ => None,
        }
    }

    /// The words each key brings: itself, and `MSET`'s value after it.
    fn stride(self) -> usize {
        match self {
            Family::Pairs => 2,
            Family::Values | Family::Counts => 1,
        }
    }
}

/// One key of a command: where it is in argv, its bytes and its slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Located<'a> {
    pub position: usize,
    pub key: &'a [u8],
    pub slot: Slot,
}

impl Located<'_> {
    pub(super) fn named(&self) -> KeyInSlot {
        KeyInSlot::new(self.key, self.slot)
    }
}

/// A command cut into one command per slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    parts: Vec<Part>,
    merge: Merge,
}

/// One slot's share of a split command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    slot: Slot,
    command: Bytes,
}

impl Part {
    pub fn slot(&self) -> Slot {
        self.slot
    }

    /// The part as RESP command bytes, the client's spelling of the name first.
    pub fn command(&self) -> &Bytes {
        &self.command
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Merge {
    /// The values of part `i` go back to the client's key places `places[i]`, of `keys` in all.
    Values {
        keys: usize,
        places: Vec<Vec<usize>>,
    },
    Combined(Combine),
}

/// One part while it is being built: its words, and which of the client's keys they are.
struct Building<'a> {
    slot: Slot,
    words: Vec<&'a [u8]>,
    places: Vec<usize>,
}

impl Split {
    /// `argv` (of `family`, its keys `located`) cut per slot, parts in the order their slots first
    /// appear. `None` unless argv is exactly the name and the keys (and MSET's values): a word the
    /// split did not know where to put would be lost from every part.
    pub(super) fn of<A: AsRef<[u8]>>(
        family: Family,
        argv: &[A],
        located: &[Located<'_>],
    ) -> Option<Split> {
        let stride = family.stride();
        let exact = argv.len() == 1 + located.len() * stride
            && located
                .iter()
                .enumerate()
                .all(|(place, key)| key.position == 1 + place * stride);
        if !exact {
            return None;
        }
        let name = argv.first()?.as_ref();
        let mut index: HashMap<Slot, usize> = HashMap::new();
        let mut building: Vec<Building<'_>> = Vec::new();
        for (place, key) in located.iter().enumerate() {
            let at = *index.entry(key.slot).or_insert_with(|| {
                building.push(Building {
                    slot: key.slot,
                    words: vec![name],
                    places: Vec::new(),
                });
                building.len() - 1
            });
            let words = argv.get(key.position..key.position + stride)?;
            let part = building.get_mut(at)?;
            part.words.extend(words.iter().map(AsRef::as_ref));
            part.places.push(place);
        }
        let (parts, places): (Vec<Part>, Vec<Vec<usize>>) = building
            .into_iter()
            .map(|part| {
                let mut command = BytesMut::new();
                tollgate_resp::encode_command(&part.words, &mut command);
                let command = command.freeze();
                (
                    Part {
                        slot: part.slot,
                        command,
                    },
                    part.places,
                )
            })
            .unzip();
        let merge = match family {
            Family::Values => Merge::Values {
                keys: located.len(),
                places,
            },
            Family::Pairs => Merge::Combined(Combine::AllOk),
            Family::Counts => Merge::Combined(Combine::Sum),
        };
        Some(Split { parts, merge })
    }

    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The client's reply from the parts' `replies`, in part order. A part that could not be sent,
    /// or whose reply was lost, is passed as its error reply; the first error is the answer.
    pub fn merge(&self, replies: Vec<Frame>) -> Bytes {
        if replies.len() != self.parts.len() {
            return finish(Err(Misshapen::Count {
                parts: self.parts.len(),
                got: replies.len(),
            }
            .into()));
        }
        finish(match &self.merge {
            Merge::Values { keys, places } => put_back(*keys, places, replies),
            Merge::Combined(combine) => combine.frame(replies),
        })
    }
}

/// MGET's values from every part, each at the place of its key among the client's.
fn put_back(keys: usize, places: &[Vec<usize>], replies: Vec<Frame>) -> Result<Frame, Failure> {
    let replies = without_errors(replies)?;
    let mut values = vec![Frame::Null; keys];
    for (reply, places) in replies.into_iter().zip(places) {
        let items = match reply {
            Frame::Array(items) => items,
            other => return Err(Misshapen::shape("an array", &other).into()),
        };
        if items.len() != places.len() {
            return Err(Misshapen::Length {
                expected: places.len(),
                got: items.len(),
            }
            .into());
        }
        for (item, &place) in items.into_iter().zip(places) {
            if let Some(value) = values.get_mut(place) {
                *value = item;
            }
        }
    }
    Ok(Frame::Array(values))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tollgate_policy::KeyAccess;

    use super::super::fixtures::{
        argv, bulk, encoded, error, every_other_word, every_word, ok, words_of, Keyspace,
    };
    use super::super::place::{place, Placement};
    use super::*;
    use tollgate_lanes::Splitting;

    fn split(name: &str, argv: &[&[u8]], keys: &[KeyAccess]) -> Split {
        match place(name, argv, keys, Splitting::Split) {
            Placement::Split(split) => split,
            other => panic!("{name} not split: {other:?}"),
        }
    }

    fn keyspace(pairs: &[(&str, &str)]) -> Keyspace {
        Keyspace(
            pairs
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
        )
    }

    /// Runs `words` whole on one copy of `keyspace` and split on another: the client's reply and
    /// the data afterwards must be the same both ways.
    fn round_trip(name: &str, argv: &[&[u8]], keys: &[KeyAccess], keyspace: &Keyspace) -> Split {
        let words = String::from_utf8_lossy(&argv.join(&b' ')).into_owned();
        let split = split(name, argv, keys);
        let mut whole = keyspace.clone();
        let mut whole_command = BytesMut::new();
        tollgate_resp::encode_command(argv, &mut whole_command);
        let expected = encoded(&whole.run(&whole_command));
        let mut parted = keyspace.clone();
        let replies = split
            .parts()
            .iter()
            .map(|part| parted.run(part.command()))
            .collect();
        assert_eq!(split.merge(replies), expected, "{words}");
        assert_eq!(parted, whole, "{words}: the data afterwards");
        for part in split.parts() {
            let words = words_of(part.command());
            let part_keys = words[1..].iter().step_by(keys_stride(name));
            assert!(
                part_keys.clone().all(|key| Slot::of(key) == part.slot()),
                "{words:?} keeps to slot {}",
                part.slot()
            );
        }
        split
    }

    fn keys_stride(name: &str) -> usize {
        Family::of(name).map_or(1, Family::stride)
    }

    fn commands(split: &Split) -> Vec<Vec<Bytes>> {
        split
            .parts()
            .iter()
            .map(|part| words_of(part.command()))
            .collect()
    }

    fn texts(words: &[&str]) -> Vec<Bytes> {
        words
            .iter()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect()
    }

    #[test]
    fn mget_across_three_slots_interleaved_comes_back_in_the_clients_order() {
        // foo and {foo}x share a slot; bar and {bar}y another; baz is a third.
        let data = keyspace(&[("foo", "1"), ("bar", "2"), ("{foo}x", "3"), ("baz", "5")]);
        let words = "mget foo bar {foo}x baz {bar}y foo";
        let split = round_trip("MGET", &argv(words), &every_word(7), &data);
        // Parts in the order their slots first appear, the client's spelling of the name kept.
        assert_eq!(
            commands(&split),
            [
                texts(&["mget", "foo", "{foo}x", "foo"]),
                texts(&["mget", "bar", "{bar}y"]),
                texts(&["mget", "baz"]),
            ]
        );
    }

    #[test]
    fn mset_and_del_across_slots_apply_as_the_whole_command_would() {
        let data = keyspace(&[("bar", "old"), ("baz", "old")]);
        let split = round_trip(
            "MSET",
            &argv("MSET foo 1 bar 2 {foo}x 3 baz 4 foo 5"),
            &every_other_word(11),
            &data,
        );
        assert_eq!(
            commands(&split)[0],
            texts(&["MSET", "foo", "1", "{foo}x", "3", "foo", "5"]),
            "pairs stay together, in order, so the last value of a repeated key wins"
        );
        let split = round_trip(
            "DEL",
            &argv("DEL foo bar baz {bar}y bar"),
            &every_word(6),
            &data,
        );
        assert_eq!(split.parts().len(), 3);
        round_trip(
            "UNLINK",
            &argv("UNLINK baz nothing bar"),
            &every_word(4),
            &data,
        );
    }

    #[test]
    fn exists_counts_a_repeated_key_each_time_it_is_named() {
        let data = keyspace(&[("foo", "1"), ("bar", "2")]);
        let split = round_trip(
            "EXISTS",
            &argv("EXISTS foo bar foo gone"),
            &every_word(5),
            &data,
        );
        assert_eq!(
            split.merge(vec![
                Frame::Integer(2),
                Frame::Integer(1),
                Frame::Integer(0)
            ])[..],
            b":3\r\n"[..]
        );
        round_trip("TOUCH", &argv("TOUCH foo bar foo"), &every_word(4), &data);
    }

    #[test]
    fn resp3_nulls_are_put_back_as_they_came() {
        let split = split("MGET", &argv("MGET foo bar"), &every_word(3));
        let merged = split.merge(vec![
            Frame::Array(vec![Frame::Null3]),
            Frame::Array(vec![bulk("b")]),
        ]);
        assert_eq!(&merged[..], b"*2\r\n_\r\n$1\r\nb\r\n");
    }

    #[test]
    fn the_first_error_in_part_order_is_the_reply() {
        let mget = split("MGET", &argv("MGET foo bar baz"), &every_word(4));
        let merged = mget.merge(vec![
            Frame::Array(vec![bulk("a")]),
            error("MOVED 5061 127.0.0.1:7001"),
            Frame::BulkError(Bytes::from_static(b"ERR later")),
        ]);
        assert_eq!(&merged[..], b"-MOVED 5061 127.0.0.1:7001\r\n");
        // A split MSET whose second part failed: the first may have applied; the client is told
        // the error all the same.
        let mset = split("MSET", &argv("MSET foo 1 bar 2"), &every_other_word(5));
        let merged = mset.merge(vec![ok(), error("OOM command not allowed")]);
        assert_eq!(&merged[..], b"-OOM command not allowed\r\n");
        let del = split("DEL", &argv("DEL foo bar"), &every_word(3));
        let lost = error("IOERR tollgate: the connection was lost");
        assert_eq!(
            &del.merge(vec![lost, Frame::Integer(1)])[..],
            b"-IOERR tollgate: the connection was lost\r\n"
        );
    }

    fn misshapen(merged: Bytes) -> String {
        let text = String::from_utf8(merged.to_vec()).unwrap();
        assert!(text.starts_with("-ERR tollgate: "), "{text:?}");
        assert_eq!(text.matches("\r\n").count(), 1, "{text:?}");
        text
    }

    #[test]
    fn a_part_reply_of_the_wrong_shape_is_an_error_never_a_guess() {
        let mget = split("MGET", &argv("MGET foo {foo}x bar"), &every_word(4));
        let short = mget.merge(vec![
            Frame::Array(vec![bulk("a")]),
            Frame::Array(vec![bulk("b")]),
        ]);
        assert_eq!(
            misshapen(short),
            "-ERR tollgate: a node answered an array of 1 where an array of 2 was expected\r\n"
        );
        let not_an_array = mget.merge(vec![Frame::Integer(3), Frame::Array(vec![bulk("b")])]);
        assert_eq!(
            misshapen(not_an_array),
            "-ERR tollgate: a node answered the integer 3 where an array was expected\r\n"
        );
        let too_few = mget.merge(vec![Frame::Array(vec![bulk("a"), bulk("c")])]);
        assert_eq!(
            misshapen(too_few),
            "-ERR tollgate: 1 replies for 2 parts\r\n"
        );
        let del = split("DEL", &argv("DEL foo bar"), &every_word(3));
        misshapen(del.merge(vec![Frame::Integer(1), bulk("1")]));
        let overflow = del.merge(vec![Frame::Integer(i64::MAX), Frame::Integer(1)]);
        assert!(misshapen(overflow).contains("overflows"));
        let mset = split("MSET", &argv("MSET foo 1 bar 2"), &every_other_word(5));
        let queued = Frame::Simple(Bytes::from_static(b"QUEUED\r\n+OK"));
        assert_eq!(
            misshapen(mset.merge(vec![ok(), queued])),
            "-ERR tollgate: a node answered a simple string \"QUEUED\\r\\n+OK\" where +OK was expected\r\n"
        );
    }

    /// Keys from a small alphabet, so that slots repeat, keys repeat and hash tags join them.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-e]",
            "\\{[a-c]\\}[a-e]",
            "[a-e]\\{[a-c]\\}",
            "[a-z{}]{0,6}",
        ]
    }

    proptest! {
        #[test]
        fn a_split_mget_gives_the_values_in_the_clients_order(
            keys in proptest::collection::vec(key(), 1..40),
            stored in proptest::collection::btree_map(key(), "[a-z]{0,3}", 0..20),
        ) {
            let mut argv: Vec<&[u8]> = vec![b"MGET"];
            argv.extend(keys.iter().map(String::as_bytes));
            let expected = Frame::Array(
                keys.iter()
                    .map(|key| match stored.get(key) {
                        Some(value) => bulk(value),
                        None => Frame::Null,
                    })
                    .collect(),
            );
            let data = Keyspace(
                stored
                    .iter()
                    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                    .collect(),
            );
            match place("MGET", &argv, &every_word(argv.len()), Splitting::Split) {
                Placement::Split(split) => {
                    let mut nodes = data.clone();
                    let replies = split.parts().iter().map(|part| nodes.run(part.command())).collect();
                    prop_assert_eq!(split.merge(replies), encoded(&expected));
                }
                Placement::Slot(slot) => {
                    prop_assert!(keys.iter().all(|key| Slot::of(key.as_bytes()) == slot));
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }

        #[test]
        fn a_split_write_or_count_does_what_the_whole_command_does(
            name in prop_oneof!["MSET", "DEL", "UNLINK", "EXISTS", "TOUCH"],
            keys in proptest::collection::vec(key(), 1..30),
            stored in proptest::collection::btree_map(key(), "[a-z]{1,3}", 0..20),
        ) {
            let data = Keyspace(
                stored
                    .iter()
                    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                    .collect(),
            );
            let values: Vec<String> = (0..keys.len()).map(|at| format!("v{at}")).collect();
            let mut argv: Vec<&[u8]> = vec![name.as_bytes()];
            for (key, value) in keys.iter().zip(&values) {
                argv.push(key.as_bytes());
                if name == "MSET" {
                    argv.push(value.as_bytes());
                }
            }
            let positions = match name.as_str() {
                "MSET" => every_other_word(argv.len()),
                _ => every_word(argv.len()),
            };
            let spans = keys
                .iter()
                .map(|key| Slot::of(key.as_bytes()))
                .collect::<std::collections::HashSet<_>>()
                .len();
            if spans > 1 {
                // Asserts the same reply and the same data both ways.
                round_trip(&name, &argv, &positions, &data);
            }
        }
    }
}
