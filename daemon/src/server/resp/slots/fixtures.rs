//! For unit tests: keys at the catalog's positions, frames, and a toy keyspace that answers the
//! split commands as Redis does, so that a command and its split parts can be run and compared.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use tollgate_policy::KeyAccess;
use tollgate_resp::{Frame, Limits};

pub use super::super::words::argv;

/// Keys at these argv positions, as the catalog resolves them.
pub fn keys_at(positions: impl IntoIterator<Item = usize>) -> Vec<KeyAccess> {
    positions
        .into_iter()
        .map(|position| KeyAccess {
            position,
            read: true,
            write: false,
        })
        .collect()
}

/// The keys of `MGET`, `DEL`, `EXISTS` … with `argc` words: every word after the name.
pub fn every_word(argc: usize) -> Vec<KeyAccess> {
    keys_at(1..argc)
}

/// The keys of `MSET` with `argc` words: every other word after the name.
pub fn every_other_word(argc: usize) -> Vec<KeyAccess> {
    keys_at((1..argc).step_by(2))
}

pub fn bulk(text: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(text.as_bytes()))
}

pub fn ok() -> Frame {
    Frame::Simple(Bytes::from_static(b"OK"))
}

pub fn error(text: &str) -> Frame {
    Frame::Error(Bytes::copy_from_slice(text.as_bytes()))
}

pub fn encoded(frame: &Frame) -> Bytes {
    let mut out = BytesMut::new();
    tollgate_resp::encode(frame, &mut out);
    out.freeze()
}

/// The words of a RESP command.
pub fn words_of(command: &[u8]) -> Vec<Bytes> {
    let mut wire = BytesMut::from(command);
    let parsed = tollgate_resp::parse_command(&mut wire, &Limits::default())
        .expect("well formed")
        .expect("complete");
    assert!(wire.is_empty(), "one command");
    parsed.shared_argv()
}

/// A keyspace answering `MGET`, `MSET`, `DEL`, `UNLINK`, `EXISTS` and `TOUCH` as Redis does.
/// One map stands for every node: a cluster's slots are disjoint, so their union is one keyspace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Keyspace(pub BTreeMap<Vec<u8>, Vec<u8>>);

impl Keyspace {
    pub fn run(&mut self, command: &[u8]) -> Frame {
        let words = words_of(command);
        let (name, args) = words.split_first().expect("a name");
        let present = |map: &BTreeMap<Vec<u8>, Vec<u8>>, key: &Bytes| map.contains_key(&key[..]);
        match &name.to_ascii_uppercase()[..] {
            b"MGET" => Frame::Array(
                args.iter()
                    .map(|key| match self.0.get(&key[..]) {
                        Some(value) => Frame::Bulk(Bytes::copy_from_slice(value)),
                        None => Frame::Null,
                    })
                    .collect(),
            ),
            b"MSET" => {
                for pair in args.chunks(2) {
                    self.0.insert(pair[0].to_vec(), pair[1].to_vec());
                }
                ok()
            }
            // A key named twice is deleted once.
            b"DEL" | b"UNLINK" => Frame::Integer(
                args.iter()
                    .filter(|key| self.0.remove(&key[..]).is_some())
                    .count() as i64,
            ),
            // A key named twice is counted twice.
            b"EXISTS" | b"TOUCH" => {
                Frame::Integer(args.iter().filter(|key| present(&self.0, key)).count() as i64)
            }
            other => panic!("the toy keyspace does not run {other:?}"),
        }
    }
}
