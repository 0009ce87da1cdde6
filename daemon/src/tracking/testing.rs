//! A [`Directory`] for the tests: clients by id with their protocol and whether they subscribed,
//! and the prefixes of keys each may not read.

use std::collections::BTreeMap;

use bytes::Bytes;
use tollgate_model::Protocol;

use super::{ClientId, Delivery, Directory, Invalidation, Message, Peer};

#[derive(Debug, Default)]
pub struct Clients {
    peers: BTreeMap<ClientId, Peer>,
    refused: Vec<(ClientId, Bytes)>,
}

impl Clients {
    /// A client connects speaking `protocol`, not subscribed.
    pub fn connect(&mut self, id: ClientId, protocol: Protocol) {
        let subscribed = false;
        self.peers.insert(
            id,
            Peer {
                protocol,
                subscribed,
            },
        );
    }

    /// `HELLO 2` or `HELLO 3`.
    pub fn hello(&mut self, id: ClientId, protocol: Protocol) {
        self.peers.get_mut(&id).expect("connected").protocol = protocol;
    }

    /// `SUBSCRIBE …` (or, `false`, its last `UNSUBSCRIBE`).
    pub fn subscribed(&mut self, id: ClientId, subscribed: bool) {
        self.peers.get_mut(&id).expect("connected").subscribed = subscribed;
    }

    pub fn leave(&mut self, id: ClientId) {
        self.peers.remove(&id);
    }

    /// `id`'s principal may not read keys starting with `prefix`.
    pub fn refuse(&mut self, id: ClientId, prefix: &'static str) {
        self.refused
            .push((id, Bytes::from_static(prefix.as_bytes())));
    }
}

impl Directory for Clients {
    fn peer(&self, id: ClientId) -> Option<Peer> {
        self.peers.get(&id).copied()
    }

    fn may_read(&self, client: ClientId, key: &[u8]) -> bool {
        !self
            .refused
            .iter()
            .any(|(id, prefix)| *id == client && key.starts_with(prefix))
    }
}

pub fn key(name: &str) -> Bytes {
    Bytes::copy_from_slice(name.as_bytes())
}

pub fn keys(names: &[&str]) -> Vec<Bytes> {
    names.iter().map(|name| key(name)).collect()
}

pub fn words(line: &str) -> Vec<&[u8]> {
    line.split_whitespace().map(str::as_bytes).collect()
}

/// `tracking`'s invalidation of `names`, pushed to `to`.
pub fn push(tracking: ClientId, to: ClientId, names: &[&str]) -> Delivery {
    Delivery {
        tracking,
        to,
        message: Message::Push(Invalidation::Keys(keys(names))),
    }
}

/// `tracking`'s invalidation of `names`, a message on `__redis__:invalidate` to `to`.
pub fn message(tracking: ClientId, to: ClientId, names: &[&str]) -> Delivery {
    Delivery {
        tracking,
        to,
        message: Message::PubSub(Invalidation::Keys(keys(names))),
    }
}
