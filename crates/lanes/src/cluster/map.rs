//! The slot map: which master serves each of the 16384 slots and which replicas stand behind each
//! master, read from one node's `CLUSTER SHARDS` reply (Redis 7; RESP2 flat pairs or RESP3 maps) or,
//! from a server without it, its `CLUSTER SLOTS` reply. Reading is total: a malformed or hostile
//! reply is a typed [`MapError`], never a panic. Nodes whose health is `fail(ed)`, and nodes without
//! an address we can dial (a TLS-only port), are left out, so their slots read as unserved; a
//! replica still `loading` is not counted as a replica yet (as `CLUSTER SLOTS` does).

use std::collections::{HashMap, HashSet};
use std::fmt;

use tollgate_resp::Frame;

use super::{Slot, SLOT_COUNT};
use crate::Endpoint;

/// The owner index of a slot no reachable master serves.
const UNSERVED: u16 = u16::MAX;

/// One node's view of who serves what, ready for an O(1) lookup per slot.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SlotMap {
    /// The masters serving at least one slot, ordered by address so that two maps of the same
    /// cluster list them alike.
    shards: Vec<Shard>,
    /// Per slot, its master's index in `shards`, or [`UNSERVED`].
    owner: Box<[u16; SLOT_COUNT as usize]>,
    covered: usize,
    /// Every node named and not failed (masters first, in `shards` order, then the others): whom a
    /// refresh may ask.
    nodes: Vec<Endpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Shard {
    master: Endpoint,
    /// Ordered by address, like the masters.
    replicas: Vec<Endpoint>,
}

/// Why a reply could not be read as a slot map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MapError {
    /// The node answered with an error (`CLUSTER SHARDS` unknown before Redis 7, or not in
    /// cluster mode).
    #[error("the node refused: {0}")]
    Refused(String),
    #[error("{what}: expected {expected}, found {found}")]
    Unexpected {
        what: &'static str,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{what}: a list of pairs with an odd number of elements")]
    OddLength { what: &'static str },
    #[error("{what} has no `{field}`")]
    MissingField {
        what: &'static str,
        field: &'static str,
    },
    #[error("slot range {start}-{end} is not within 0-{}", SLOT_COUNT - 1)]
    SlotRange { start: i64, end: i64 },
    #[error("port {0} is not a TCP port")]
    Port(i64),
    #[error("slot {slot} is claimed twice (by {first} and by {second})")]
    SlotClaimedTwice {
        slot: u16,
        first: Endpoint,
        second: Endpoint,
    },
}

/// One shard or slot range as read, before the map is assembled.
#[derive(Default)]
struct Entry {
    /// Inclusive slot ranges.
    ranges: Vec<(u16, u16)>,
    /// `None` when the entry's master failed or cannot be dialled: its slots are unserved.
    master: Option<Endpoint>,
    replicas: Vec<Endpoint>,
    /// Nodes named but neither the master nor a replica to route to (a second master, a replica
    /// still loading).
    others: Vec<Endpoint>,
}

impl SlotMap {
    /// Reads a `CLUSTER SHARDS` reply from the node at `answered` (which stands in for a node that
    /// reports no address of its own).
    pub(crate) fn from_shards(reply: &Frame, answered: &Endpoint) -> Result<SlotMap, MapError> {
        let shards = list(reply, "the CLUSTER SHARDS reply")?;
        let entries = shards
            .iter()
            .map(|shard| shard_entry(shard, answered))
            .collect::<Result<Vec<_>, _>>()?;
        assemble(entries)
    }

    /// Reads a `CLUSTER SLOTS` reply: per range `[start, end, master, replicas…]`, each node
    /// `[host, port, id, …]`. Failed replicas are already left out by the server.
    pub(crate) fn from_slots(reply: &Frame, answered: &Endpoint) -> Result<SlotMap, MapError> {
        let ranges = list(reply, "the CLUSTER SLOTS reply")?;
        let entries = ranges
            .iter()
            .map(|range| slots_entry(range, answered))
            .collect::<Result<Vec<_>, _>>()?;
        assemble(entries)
    }

    /// The master serving `slot`, if a reachable one does.
    pub(crate) fn master_of(&self, slot: Slot) -> Option<&Endpoint> {
        let index = self.owner[usize::from(slot.number())];
        self.shards
            .get(usize::from(index))
            .map(|shard| &shard.master)
    }

    /// The distinct masters serving at least one slot, ordered by address.
    pub(crate) fn masters(&self) -> impl ExactSizeIterator<Item = &Endpoint> {
        self.shards.iter().map(|shard| &shard.master)
    }

    /// Every node the map names and that is not failed: masters and replicas, and masters without
    /// slots (a node being added).
    pub(crate) fn nodes(&self) -> &[Endpoint] {
        &self.nodes
    }

    /// The replicas of `master` (none when it is not a master serving slots). The hub routes to
    /// masters only; the tests read what the map learnt of the replicas.
    #[cfg(test)]
    pub(crate) fn replicas_of(&self, master: &Endpoint) -> &[Endpoint] {
        self.shards
            .iter()
            .find(|shard| &shard.master == master)
            .map_or(&[], |shard| &shard.replicas)
    }

    /// How many of the 16384 slots a reachable master serves.
    pub(crate) fn covered(&self) -> usize {
        self.covered
    }
}

impl fmt::Debug for SlotMap {
    /// The slot ranges per master rather than 16384 owner indexes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ranges: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.shards.len()];
        for (slot, &owner) in self.owner.iter().enumerate() {
            if let Some(list) = ranges.get_mut(usize::from(owner)) {
                match list.last_mut() {
                    Some((_, end)) if *end + 1 == slot => *end = slot,
                    _ => list.push((slot, slot)),
                }
            }
        }
        let shards: Vec<_> = self
            .shards
            .iter()
            .zip(&ranges)
            .map(|(shard, ranges)| (&shard.master, ranges, &shard.replicas))
            .collect();
        f.debug_struct("SlotMap")
            .field("shards", &shards)
            .field("covered", &self.covered)
            .field("nodes", &self.nodes)
            .finish()
    }
}

fn shard_entry(shard: &Frame, answered: &Endpoint) -> Result<Entry, MapError> {
    const WHAT: &str = "a shard";
    let shard = fields(shard, WHAT)?;
    let slots = list(field(&shard, "slots", WHAT)?, "a shard's slots")?;
    if slots.len() % 2 != 0 {
        return Err(MapError::OddLength {
            what: "a shard's slots",
        });
    }
    let mut entry = Entry {
        ranges: slots
            .chunks_exact(2)
            .map(|pair| range(&pair[0], &pair[1]))
            .collect::<Result<_, _>>()?,
        ..Entry::default()
    };
    for node in list(field(&shard, "nodes", WHAT)?, "a shard's nodes")? {
        let node = fields(node, "a node")?;
        let role = text(field(&node, "role", "a node")?, "a node's role")?;
        let health = match lookup(&node, "health") {
            Some(health) => text(health, "a node's health")?,
            None => b"online",
        };
        // Redis 7.0 says `fail`; the documentation (and later servers) `failed`.
        if health == b"fail" || health == b"failed" {
            continue;
        }
        let preferred = lookup(&node, "endpoint")
            .map(|e| host(e, "a node's endpoint"))
            .transpose()?
            .flatten();
        let ip = lookup(&node, "ip")
            .map(|ip| host(ip, "a node's ip"))
            .transpose()?
            .flatten();
        // No plain `port` (a TLS-only node): not one we can dial.
        let Some(port) = lookup(&node, "port").map(port).transpose()? else {
            continue;
        };
        let Some(endpoint) = address(preferred.or(ip), port, answered) else {
            continue;
        };
        match role {
            b"master" if entry.master.is_none() => entry.master = Some(endpoint),
            // A replica that has not synced yet (offset 0) serves nothing; CLUSTER SLOTS leaves
            // it out too. It can still be asked for the map.
            b"master" => entry.others.push(endpoint),
            _ if health == b"loading" => entry.others.push(endpoint),
            _ => entry.replicas.push(endpoint),
        }
    }
    Ok(entry)
}

fn slots_entry(range_reply: &Frame, answered: &Endpoint) -> Result<Entry, MapError> {
    const WHAT: &str = "a CLUSTER SLOTS range";
    let items = list(range_reply, WHAT)?;
    let [start, end, master, replicas @ ..] = items else {
        return Err(MapError::MissingField {
            what: WHAT,
            field: "start, end and master",
        });
    };
    let node = |node: &Frame| -> Result<Option<Endpoint>, MapError> {
        let parts = list(node, "a CLUSTER SLOTS node")?;
        let [host_reply, port_reply, ..] = parts else {
            return Err(MapError::MissingField {
                what: "a CLUSTER SLOTS node",
                field: "host and port",
            });
        };
        let host = host(host_reply, "a node's host")?;
        Ok(address(host, port(port_reply)?, answered))
    };
    Ok(Entry {
        ranges: vec![range(start, end)?],
        master: node(master)?,
        replicas: replicas
            .iter()
            .map(node)
            .filter_map(Result::transpose)
            .collect::<Result<_, _>>()?,
        others: Vec::new(),
    })
}

/// Builds the map from what was read: the ranges of entries with the same master merge, a slot
/// claimed twice is an error.
fn assemble(entries: Vec<Entry>) -> Result<SlotMap, MapError> {
    let mut by_master: HashMap<Endpoint, Entry> = HashMap::new();
    let mut unserving = Vec::new();
    for mut entry in entries {
        match entry.master.take() {
            Some(master) => {
                let merged = by_master.entry(master).or_default();
                merged.ranges.append(&mut entry.ranges);
                merged.replicas.append(&mut entry.replicas);
                merged.others.append(&mut entry.others);
            }
            None => unserving.push(entry),
        }
    }
    let (mut serving, idle): (Vec<_>, Vec<_>) = by_master
        .into_iter()
        .partition(|(_, entry)| !entry.ranges.is_empty());
    serving.sort_by_key(|(master, _)| order(master));

    let mut owner = Box::new([UNSERVED; SLOT_COUNT as usize]);
    let mut covered = 0;
    for (index, (master, entry)) in serving.iter().enumerate() {
        for &(start, end) in &entry.ranges {
            for slot in start..=end {
                let claimed = &mut owner[usize::from(slot)];
                if let Some((first, _)) = serving.get(usize::from(*claimed)) {
                    return Err(MapError::SlotClaimedTwice {
                        slot,
                        first: first.clone(),
                        second: master.clone(),
                    });
                }
                // Each slot is claimed once at most, so no more than 16384 masters get here and
                // the index always fits below UNSERVED.
                *claimed = u16::try_from(index).unwrap_or(UNSERVED);
                covered += 1;
            }
        }
    }

    let shards: Vec<Shard> = serving
        .iter()
        .map(|(master, entry)| {
            let mut replicas = entry.replicas.clone();
            replicas.sort_by_key(order);
            replicas.dedup();
            Shard {
                master: master.clone(),
                replicas,
            }
        })
        .collect();
    let mut seen = HashSet::new();
    let nodes = shards
        .iter()
        .map(|shard| &shard.master)
        .chain(shards.iter().flat_map(|shard| &shard.replicas))
        .chain(idle.iter().map(|(master, _)| master))
        .chain(
            serving
                .iter()
                .chain(&idle)
                .flat_map(|(_, entry)| &entry.others),
        )
        .chain(
            unserving
                .iter()
                .flat_map(|entry| entry.replicas.iter().chain(&entry.others)),
        )
        .chain(idle.iter().flat_map(|(_, entry)| &entry.replicas))
        .filter(|endpoint| seen.insert(*endpoint))
        .cloned()
        .collect();
    Ok(SlotMap {
        shards,
        owner,
        covered,
        nodes,
    })
}

/// How endpoints are ordered in a map: by host, then port.
fn order(endpoint: &Endpoint) -> (String, u16) {
    match endpoint {
        Endpoint::Tcp { host, port } => (host.clone(), *port),
        Endpoint::Unix(path) => (path.display().to_string(), 0),
    }
}

/// The address to dial: the node's own host when it reports one, else the host of the node that
/// answered (Redis 7's unknown endpoint: "same host, this port").
fn address(host: Option<String>, port: u16, answered: &Endpoint) -> Option<Endpoint> {
    let host = match (host, answered) {
        (Some(host), _) => host,
        (None, Endpoint::Tcp { host, .. }) => host.clone(),
        (None, Endpoint::Unix(_)) => return None,
    };
    Some(Endpoint::Tcp { host, port })
}

/// A host field: `None` for an unknown endpoint (null, empty, or `?` for an unset hostname).
fn host(frame: &Frame, what: &'static str) -> Result<Option<String>, MapError> {
    if matches!(frame, Frame::Null | Frame::Null3) {
        return Ok(None);
    }
    let bytes = text(frame, what)?;
    if bytes.is_empty() || bytes == b"?" {
        return Ok(None);
    }
    let host = std::str::from_utf8(bytes).map_err(|_| MapError::Unexpected {
        what,
        expected: "a host name",
        found: "bytes that are not UTF-8",
    })?;
    Ok(Some(host.to_owned()))
}

fn port(frame: &Frame) -> Result<u16, MapError> {
    let value = integer(frame, "a node's port")?;
    match u16::try_from(value) {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(MapError::Port(value)),
    }
}

fn range(start: &Frame, end: &Frame) -> Result<(u16, u16), MapError> {
    let start = integer(start, "a slot number")?;
    let end = integer(end, "a slot number")?;
    let slot = |n: i64| {
        u16::try_from(n)
            .ok()
            .filter(|&n| n < SLOT_COUNT)
            .ok_or(MapError::SlotRange { start, end })
    };
    let (first, last) = (slot(start)?, slot(end)?);
    if first > last {
        return Err(MapError::SlotRange { start, end });
    }
    Ok((first, last))
}

/// The elements of an array (or set).
fn list<'a>(frame: &'a Frame, what: &'static str) -> Result<&'a [Frame], MapError> {
    match frame {
        Frame::Array(items) | Frame::Set(items) => Ok(items),
        Frame::Error(message) | Frame::BulkError(message) => Err(MapError::Refused(
            String::from_utf8_lossy(message).into_owned(),
        )),
        other => Err(MapError::Unexpected {
            what,
            expected: "an array",
            found: kind(other),
        }),
    }
}

/// A record's fields: a RESP3 map, or RESP2's flat `[name, value, name, value, …]`. Fields whose
/// name is not a string are skipped (none that we read).
fn fields<'a>(
    frame: &'a Frame,
    what: &'static str,
) -> Result<Vec<(&'a [u8], &'a Frame)>, MapError> {
    let pairs: Vec<(&Frame, &Frame)> = match frame {
        Frame::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
        Frame::Array(items) if items.len() % 2 == 0 => {
            items.chunks_exact(2).map(|p| (&p[0], &p[1])).collect()
        }
        Frame::Array(_) => return Err(MapError::OddLength { what }),
        other => {
            return Err(MapError::Unexpected {
                what,
                expected: "a map",
                found: kind(other),
            })
        }
    };
    Ok(pairs
        .into_iter()
        .filter_map(|(name, value)| Some((name.as_bytes()?.as_ref(), value)))
        .collect())
}

fn lookup<'a>(fields: &[(&[u8], &'a Frame)], name: &str) -> Option<&'a Frame> {
    fields
        .iter()
        .find(|(field, _)| field.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, value)| *value)
}

fn field<'a>(
    fields: &[(&[u8], &'a Frame)],
    name: &'static str,
    what: &'static str,
) -> Result<&'a Frame, MapError> {
    lookup(fields, name).ok_or(MapError::MissingField { what, field: name })
}

fn text<'a>(frame: &'a Frame, what: &'static str) -> Result<&'a [u8], MapError> {
    match frame {
        Frame::Simple(b) | Frame::Bulk(b) | Frame::Verbatim { text: b, .. } => Ok(b),
        other => Err(MapError::Unexpected {
            what,
            expected: "a string",
            found: kind(other),
        }),
    }
}

fn integer(frame: &Frame, what: &'static str) -> Result<i64, MapError> {
    match frame {
        Frame::Integer(n) => Ok(*n),
        other => Err(MapError::Unexpected {
            what,
            expected: "an integer",
            found: kind(other),
        }),
    }
}

fn kind(frame: &Frame) -> &'static str {
    match frame {
        Frame::Simple(_) | Frame::Bulk(_) | Frame::Verbatim { .. } => "a string",
        Frame::Error(_) | Frame::BulkError(_) => "an error",
        Frame::Integer(_) => "an integer",
        Frame::Null | Frame::Null3 | Frame::NullArray => "a null",
        Frame::Array(_) | Frame::Set(_) | Frame::Push(_) => "an array",
        Frame::Map(_) => "a map",
        Frame::Double(_) | Frame::BigNumber(_) => "a number",
        Frame::Boolean(_) => "a boolean",
        Frame::Attribute { .. } => "an attribute",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn tcp(host: &str, port: u16) -> Endpoint {
        Endpoint::Tcp {
            host: host.into(),
            port,
        }
    }

    fn bulk(text: &str) -> Frame {
        Frame::Bulk(text.to_owned().into())
    }

    fn slot(n: u16) -> Slot {
        Slot::new(n).unwrap()
    }

    /// A node of a `CLUSTER SHARDS` reply, RESP2 style (flat pairs).
    pub(crate) fn node(port: u16, role: &str, health: &str) -> Frame {
        Frame::Array(vec![
            bulk("id"),
            bulk(&format!("{port:040}")),
            bulk("port"),
            Frame::Integer(port.into()),
            bulk("ip"),
            bulk("127.0.0.1"),
            bulk("endpoint"),
            bulk("127.0.0.1"),
            bulk("role"),
            bulk(role),
            bulk("replication-offset"),
            Frame::Integer(72156),
            bulk("health"),
            bulk(health),
        ])
    }

    pub(crate) fn shard(ranges: &[(u16, u16)], nodes: Vec<Frame>) -> Frame {
        let slots = ranges
            .iter()
            .flat_map(|&(a, b)| [Frame::Integer(a.into()), Frame::Integer(b.into())])
            .collect();
        Frame::Array(vec![
            bulk("slots"),
            Frame::Array(slots),
            bulk("nodes"),
            Frame::Array(nodes),
        ])
    }

    /// Three masters (7000-7002) with one replica each (7003-7005), the way Redis lists them.
    pub(crate) fn three_shards() -> Frame {
        Frame::Array(vec![
            shard(
                &[(10923, 16383)],
                vec![
                    node(7002, "master", "online"),
                    node(7005, "replica", "online"),
                ],
            ),
            shard(
                &[(0, 5460)],
                vec![
                    node(7000, "master", "online"),
                    node(7003, "replica", "online"),
                ],
            ),
            shard(
                &[(5461, 10922)],
                vec![
                    node(7004, "replica", "online"),
                    node(7001, "master", "online"),
                ],
            ),
        ])
    }

    /// RESP2 flat pairs turned into RESP3 maps, recursively where a shard or node is a record.
    fn as_resp3(frame: &Frame) -> Frame {
        let record = |items: &[Frame]| {
            Frame::Map(
                items
                    .chunks_exact(2)
                    .map(|pair| {
                        let value = match (&pair[0], &pair[1]) {
                            (Frame::Bulk(name), Frame::Array(nodes))
                                if name.as_ref() == b"nodes" =>
                            {
                                Frame::Array(nodes.iter().map(as_resp3).collect())
                            }
                            (_, value) => value.clone(),
                        };
                        (pair[0].clone(), value)
                    })
                    .collect(),
            )
        };
        match frame {
            Frame::Array(items) if matches!(items.first(), Some(Frame::Bulk(_))) => record(items),
            Frame::Array(items) => Frame::Array(items.iter().map(as_resp3).collect()),
            other => other.clone(),
        }
    }

    fn answered() -> Endpoint {
        tcp("10.0.0.9", 7000)
    }

    #[test]
    fn reads_cluster_shards_in_resp2_and_resp3_alike() {
        let map = SlotMap::from_shards(&three_shards(), &answered()).unwrap();
        assert_eq!(map.covered(), 16384);
        assert_eq!(map.master_of(slot(0)), Some(&tcp("127.0.0.1", 7000)));
        assert_eq!(map.master_of(slot(5461)), Some(&tcp("127.0.0.1", 7001)));
        assert_eq!(map.master_of(slot(16383)), Some(&tcp("127.0.0.1", 7002)));
        assert_eq!(
            map.masters().cloned().collect::<Vec<_>>(),
            [7000, 7001, 7002].map(|p| tcp("127.0.0.1", p))
        );
        assert_eq!(
            map.replicas_of(&tcp("127.0.0.1", 7001)),
            [tcp("127.0.0.1", 7004)]
        );
        assert_eq!(map.replicas_of(&tcp("127.0.0.1", 7004)), []);
        assert_eq!(
            map.nodes(),
            [7000, 7001, 7002, 7003, 7004, 7005].map(|p| tcp("127.0.0.1", p))
        );
        let resp3 = as_resp3(&three_shards());
        assert!(matches!(&resp3, Frame::Array(s) if matches!(s[0], Frame::Map(_))));
        assert_eq!(SlotMap::from_shards(&resp3, &answered()).unwrap(), map);
    }

    #[test]
    fn reads_cluster_slots_as_the_same_map() {
        let node = |port: i64| {
            Frame::Array(vec![
                bulk("127.0.0.1"),
                Frame::Integer(port),
                bulk("id"),
                Frame::Map(vec![]),
            ])
        };
        let range = |a: i64, b: i64, nodes: Vec<Frame>| {
            let mut items = vec![Frame::Integer(a), Frame::Integer(b)];
            items.extend(nodes);
            Frame::Array(items)
        };
        let slots = Frame::Array(vec![
            range(0, 5460, vec![node(7000), node(7003)]),
            range(5461, 10922, vec![node(7001), node(7004)]),
            range(10923, 16383, vec![node(7002), node(7005)]),
        ]);
        assert_eq!(
            SlotMap::from_slots(&slots, &answered()).unwrap(),
            SlotMap::from_shards(&three_shards(), &answered()).unwrap()
        );
        // A null host is Redis 7's unknown endpoint: the answering node's host.
        let unknown = Frame::Array(vec![range(
            0,
            16383,
            vec![Frame::Array(vec![Frame::Null, Frame::Integer(7010)])],
        )]);
        let map = SlotMap::from_slots(&unknown, &answered()).unwrap();
        assert_eq!(map.master_of(slot(9)), Some(&tcp("10.0.0.9", 7010)));
    }

    #[test]
    fn failed_nodes_are_left_out_and_their_slots_unserved() {
        let shards = Frame::Array(vec![
            shard(
                &[(0, 8191)],
                vec![
                    node(7000, "master", "fail"),
                    node(7003, "replica", "online"),
                ],
            ),
            shard(
                &[(8192, 16383)],
                vec![
                    node(7001, "master", "online"),
                    node(7004, "replica", "failed"),
                    node(7005, "replica", "loading"),
                ],
            ),
        ]);
        let map = SlotMap::from_shards(&shards, &answered()).unwrap();
        assert_eq!(map.covered(), 8192);
        assert_eq!(map.master_of(slot(0)), None);
        assert_eq!(map.master_of(slot(8192)), Some(&tcp("127.0.0.1", 7001)));
        // Failed, or not synced yet: no replica of 7001 serves.
        assert_eq!(map.replicas_of(&tcp("127.0.0.1", 7001)), []);
        // The orphaned and the loading replicas can still be asked during a refresh; the failed
        // nodes cannot.
        assert_eq!(
            map.nodes(),
            [7001, 7005, 7003].map(|port| tcp("127.0.0.1", port))
        );
    }

    #[test]
    fn a_node_without_its_own_address_is_found_at_the_answering_host() {
        let node = |endpoint: Frame, ip: Option<&str>| {
            let mut items = vec![
                bulk("port"),
                Frame::Integer(7000),
                bulk("endpoint"),
                endpoint,
            ];
            if let Some(ip) = ip {
                items.extend([bulk("ip"), bulk(ip)]);
            }
            items.extend([bulk("role"), bulk("master")]);
            Frame::Array(items)
        };
        for (endpoint, ip, expected) in [
            (
                bulk("redis-1.internal"),
                Some("10.1.1.1"),
                "redis-1.internal",
            ),
            (bulk("?"), Some("10.1.1.1"), "10.1.1.1"),
            (bulk(""), Some("10.1.1.1"), "10.1.1.1"),
            (Frame::Null, None, "10.0.0.9"),
            (bulk("?"), Some(""), "10.0.0.9"),
        ] {
            let reply = Frame::Array(vec![shard(&[(0, 16383)], vec![node(endpoint, ip)])]);
            let map = SlotMap::from_shards(&reply, &answered()).unwrap();
            assert_eq!(map.master_of(slot(1)), Some(&tcp(expected, 7000)));
        }
        // Asked over a Unix socket, an unknown endpoint has no host to fall back on.
        let reply = Frame::Array(vec![shard(&[(0, 16383)], vec![node(Frame::Null, None)])]);
        let unix = Endpoint::Unix("/run/redis.sock".into());
        assert_eq!(SlotMap::from_shards(&reply, &unix).unwrap().covered(), 0);
    }

    #[test]
    fn a_tls_only_node_and_a_slotless_master_serve_nothing() {
        let tls_only = Frame::Array(vec![
            bulk("tls-port"),
            Frame::Integer(7443),
            bulk("ip"),
            bulk("127.0.0.1"),
            bulk("role"),
            bulk("master"),
        ]);
        let reply = Frame::Array(vec![
            shard(&[(0, 16383)], vec![tls_only]),
            shard(&[], vec![node(7009, "master", "online")]),
        ]);
        let map = SlotMap::from_shards(&reply, &answered()).unwrap();
        assert_eq!(map.covered(), 0);
        assert_eq!(map.masters().len(), 0);
        // The new master is still someone to ask.
        assert_eq!(map.nodes(), [tcp("127.0.0.1", 7009)]);
    }

    #[test]
    fn hostile_replies_are_typed_errors() {
        let refused = Frame::Error("ERR unknown subcommand 'SHARDS'".into());
        assert!(matches!(
            SlotMap::from_shards(&refused, &answered()),
            Err(MapError::Refused(message)) if message.contains("SHARDS")
        ));
        type Expected = fn(&MapError) -> bool;
        let cases: Vec<(Frame, Expected)> = vec![
            (Frame::Integer(1), |e| {
                matches!(e, MapError::Unexpected { .. })
            }),
            (Frame::Array(vec![Frame::Null]), |e| {
                matches!(e, MapError::Unexpected { .. })
            }),
            (Frame::Array(vec![Frame::Array(vec![bulk("slots")])]), |e| {
                matches!(e, MapError::OddLength { .. })
            }),
            (
                Frame::Array(vec![Frame::Array(vec![
                    bulk("nodes"),
                    Frame::Array(vec![]),
                ])]),
                |e| matches!(e, MapError::MissingField { field: "slots", .. }),
            ),
            (Frame::Array(vec![shard(&[(0, 16384)], vec![])]), |e| {
                matches!(e, MapError::SlotRange { .. })
            }),
            (Frame::Array(vec![shard(&[(9, 3)], vec![])]), |e| {
                matches!(e, MapError::SlotRange { .. })
            }),
            (
                Frame::Array(vec![Frame::Array(vec![
                    bulk("slots"),
                    Frame::Array(vec![Frame::Integer(-1), Frame::Integer(3)]),
                    bulk("nodes"),
                    Frame::Array(vec![]),
                ])]),
                |e| matches!(e, MapError::SlotRange { .. }),
            ),
            (
                Frame::Array(vec![Frame::Array(vec![
                    bulk("slots"),
                    Frame::Array(vec![Frame::Integer(1)]),
                    bulk("nodes"),
                    Frame::Array(vec![]),
                ])]),
                |e| matches!(e, MapError::OddLength { .. }),
            ),
            (
                Frame::Array(vec![Frame::Array(vec![
                    bulk("slots"),
                    Frame::Array(vec![bulk("0"), bulk("9")]),
                    bulk("nodes"),
                    Frame::Array(vec![]),
                ])]),
                |e| matches!(e, MapError::Unexpected { .. }),
            ),
            (
                Frame::Array(vec![shard(
                    &[(0, 1)],
                    vec![Frame::Array(vec![
                        bulk("port"),
                        Frame::Integer(70000),
                        bulk("role"),
                        bulk("master"),
                    ])],
                )]),
                |e| matches!(e, MapError::Port(70000)),
            ),
            (
                Frame::Array(vec![shard(
                    &[(0, 1)],
                    vec![Frame::Array(vec![
                        bulk("port"),
                        Frame::Integer(0),
                        bulk("role"),
                        bulk("master"),
                    ])],
                )]),
                |e| matches!(e, MapError::Port(0)),
            ),
            (
                Frame::Array(vec![shard(
                    &[(0, 1)],
                    vec![Frame::Array(vec![bulk("port"), Frame::Integer(1)])],
                )]),
                |e| matches!(e, MapError::MissingField { field: "role", .. }),
            ),
            (
                Frame::Array(vec![shard(
                    &[(0, 1)],
                    vec![Frame::Array(vec![bulk("role"), Frame::Integer(1)])],
                )]),
                |e| matches!(e, MapError::Unexpected { .. }),
            ),
            (
                Frame::Array(vec![shard(
                    &[(0, 1)],
                    vec![Frame::Array(vec![
                        bulk("port"),
                        Frame::Integer(1),
                        bulk("ip"),
                        Frame::Bulk(vec![0xff, 0xfe].into()),
                        bulk("role"),
                        bulk("master"),
                    ])],
                )]),
                |e| matches!(e, MapError::Unexpected { .. }),
            ),
            (
                Frame::Array(vec![
                    shard(&[(0, 100)], vec![node(7000, "master", "online")]),
                    shard(&[(100, 200)], vec![node(7001, "master", "online")]),
                ]),
                |e| matches!(e, MapError::SlotClaimedTwice { slot: 100, .. }),
            ),
            (
                // The same master listed twice with the same slots is not let through either.
                Frame::Array(vec![
                    shard(&[(0, 100)], vec![node(7000, "master", "online")]),
                    shard(&[(0, 100)], vec![node(7000, "master", "online")]),
                ]),
                |e| matches!(e, MapError::SlotClaimedTwice { slot: 0, .. }),
            ),
        ];
        for (reply, expected) in cases {
            match SlotMap::from_shards(&reply, &answered()) {
                Err(error) if expected(&error) => {}
                other => panic!("{reply:?} read as {other:?}"),
            }
        }
    }

    #[test]
    fn hostile_cluster_slots_replies_are_typed_errors() {
        for reply in [
            Frame::Map(vec![]),
            Frame::Array(vec![Frame::Array(vec![
                Frame::Integer(0),
                Frame::Integer(1),
            ])]),
            Frame::Array(vec![Frame::Array(vec![
                Frame::Integer(0),
                Frame::Integer(1),
                Frame::Array(vec![bulk("127.0.0.1")]),
            ])]),
            Frame::Array(vec![Frame::Array(vec![
                Frame::Integer(0),
                Frame::Integer(99999),
                Frame::Array(vec![bulk("127.0.0.1"), Frame::Integer(7000)]),
            ])]),
            Frame::Array(vec![Frame::Array(vec![
                Frame::Integer(0),
                Frame::Integer(1),
                Frame::Array(vec![bulk("127.0.0.1"), bulk("7000")]),
            ])]),
        ] {
            assert!(
                SlotMap::from_slots(&reply, &answered()).is_err(),
                "{reply:?}"
            );
        }
    }

    #[test]
    fn many_claims_of_every_slot_stop_at_the_first_collision() {
        // A reply as large as a hostile node likes: it costs a scan of the slots once, not once
        // per claim.
        let claims = (0..5000u16)
            .map(|i| shard(&[(0, 16383)], vec![node(7000 + i, "master", "online")]))
            .collect();
        assert!(matches!(
            SlotMap::from_shards(&Frame::Array(claims), &answered()),
            Err(MapError::SlotClaimedTwice { slot: 0, .. })
        ));
    }
}
