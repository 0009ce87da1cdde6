//! A real local Redis Cluster: `redis-server` nodes with `cluster-enabled yes`, each on a free
//! loopback port (and a Unix socket in its temporary directory for direct checks), formed by hand
//! (`CLUSTER MEET`, `ADDSLOTSRANGE`, `REPLICATE`) so that the layout is known: nodes
//! `0..masters` are the masters, in slot order, and each master's replicas follow the masters.
//! `start` returns once every node says `cluster_state:ok`, agrees on the slots, and every replica
//! is in sync and seen as serving; dropping the cluster kills every node (their logs are printed when a test panics).
//!
//! Like every testkit server, each node has Redis's `default` user off; testkit and the tests log
//! in as [`ADMIN_USER`](crate::ADMIN_USER), and replicas replicate as it (`masteruser`).
//!
//! The methods block (std sockets and sleeps, like [`RedisServer`]); from an async test call them
//! on a multi-threaded runtime or in `spawn_blocking`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tollgate_resp::Frame;

use crate::{loopback_port, RedisServer};

/// How long forming the cluster, a failover or a migration may take before the test gives up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a settling cluster is looked at.
const POLL: Duration = Duration::from_millis(50);
/// How long a node waits for a failed peer before marking it failed (so failovers are quick).
const NODE_TIMEOUT_MS: u32 = 1000;
/// How many slots there are.
const SLOTS: u16 = 16384;

/// One node of a [`RedisCluster`].
pub struct ClusterNode {
    server: RedisServer,
    port: u16,
    /// The cluster bus port, which the nodes gossip on.
    bus: u16,
    id: String,
}

impl ClusterNode {
    /// The port clients use (the cluster bus has its own).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`, as the nodes name each other.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The node's Unix socket, for checks that should not go through the cluster's addresses.
    pub fn socket(&self) -> &Path {
        self.server.socket()
    }

    /// The node's cluster id (`CLUSTER MYID`).
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn is_running(&self) -> bool {
        self.server.is_running()
    }

    /// A file holding testkit's admin password (see [`RedisServer::admin_password_file`]).
    pub fn admin_password_file(&self) -> std::path::PathBuf {
        self.server.admin_password_file()
    }
}

/// How often one command was called on a node (`INFO commandstats`): `calls` ran, `rejected` were
/// refused before running (a redirect, an ACL denial); both reached the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calls {
    pub calls: u64,
    pub rejected: u64,
}

/// A running cluster. Nodes are named by their index in [`RedisCluster::nodes`].
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
}

/// A node's view, from `CLUSTER NODES`.
#[derive(Debug, PartialEq, Eq)]
struct Listed {
    id: String,
    flags: Vec<String>,
    /// The master's id, for a replica.
    master: Option<String>,
    /// Inclusive slot ranges served.
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas_per_master` replicas each and waits until the
    /// cluster serves every slot. The slots are split evenly, in order, over the masters.
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        assert!(
            (1..=usize::from(SLOTS)).contains(&masters),
            "a cluster needs 1 to {SLOTS} masters"
        );
        let count = masters * (1 + replicas_per_master);
        let nodes: Vec<ClusterNode> = (0..count).map(|_| start_node()).collect();
        let cluster = RedisCluster { nodes };
        for (index, node) in cluster.nodes.iter().enumerate() {
            // What `redis-cli --cluster create` does: distinct config epochs from the start, so
            // that no epoch collision has to be resolved while the cluster forms.
            cluster.expect_ok(
                index,
                &["CLUSTER", "SET-CONFIG-EPOCH", &(index + 1).to_string()],
            );
            if index < masters {
                let (first, last) = share(index, masters);
                cluster.expect_ok(
                    index,
                    &[
                        "CLUSTER",
                        "ADDSLOTSRANGE",
                        &first.to_string(),
                        &last.to_string(),
                    ],
                );
            }
            if index > 0 {
                let (port, bus) = (node.port.to_string(), node.bus.to_string());
                cluster.expect_ok(0, &["CLUSTER", "MEET", "127.0.0.1", &port, &bus]);
            }
        }
        cluster.wait_until("every node knows every other", |cluster| {
            cluster.live().all(|index| {
                let listed = cluster.listed(index);
                listed.len() == count
                    && listed
                        .iter()
                        .all(|node| !node.flags.iter().any(|f| f == "handshake" || f == "noaddr"))
            })
        });
        for index in masters..count {
            let master = (index - masters) / replicas_per_master;
            let id = cluster.nodes[master].id.clone();
            cluster.expect_ok(index, &["CLUSTER", "REPLICATE", &id]);
        }
        cluster.wait_agreed();
        cluster
    }

    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    pub fn node(&self, index: usize) -> &ClusterNode {
        &self.nodes[index]
    }

    /// Every node's `127.0.0.1:<port>`, killed ones included.
    pub fn addresses(&self) -> Vec<String> {
        self.nodes.iter().map(ClusterNode::address).collect()
    }

    /// The masters serving slots now, as a running node sees them, in slot order.
    pub fn masters(&self) -> Vec<usize> {
        let mut serving: Vec<(u16, usize)> = self
            .listed(self.any_live())
            .iter()
            .filter_map(|node| Some((node.slots.first()?.0, self.index_of(&node.id))))
            .collect();
        serving.sort();
        serving.into_iter().map(|(_, index)| index).collect()
    }

    /// The nodes replicating `master`, as a running node sees them.
    pub fn replicas_of(&self, master: usize) -> Vec<usize> {
        let id = &self.nodes[master].id;
        self.listed(self.any_live())
            .iter()
            .filter(|node| node.master.as_ref() == Some(id))
            .map(|node| self.index_of(&node.id))
            .collect()
    }

    /// The master serving `slot`, as a running node sees it.
    pub fn master_of(&self, slot: u16) -> usize {
        let listed = self.listed(self.any_live());
        let owner = listed
            .iter()
            .find(|node| node.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .unwrap_or_else(|| panic!("no node serves slot {slot}"));
        self.index_of(&owner.id)
    }

    /// Sends one inline command to `node` over its Unix socket; the raw reply.
    pub fn inline(&self, node: usize, command: &str) -> String {
        self.nodes[node].server.inline(command)
    }

    /// Sends `argv` to `node` over its Unix socket (RESP2) and reads the whole reply.
    pub fn call(&self, node: usize, argv: &[&str]) -> Frame {
        let mut stream = self.nodes[node].server.connect();
        let mut out = BytesMut::new();
        tollgate_resp::encode_command(argv, &mut out);
        stream.write_all(&out).expect("write to a cluster node");
        let mut read = BytesMut::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(frame) = tollgate_resp::parse(&mut read, &tollgate_resp::Limits::default())
                .expect("a cluster node's reply is RESP")
            {
                return frame;
            }
            let n = stream.read(&mut buf).expect("read from a cluster node");
            assert!(n > 0, "cluster node {node} hung up");
            read.extend_from_slice(&buf[..n]);
        }
    }

    /// Kills `node` (SIGKILL, as a crash would).
    pub fn kill(&mut self, node: usize) {
        self.nodes[node].server.kill();
    }

    /// Promotes `replica`: `CLUSTER FAILOVER` while its master runs, `CLUSTER FAILOVER FORCE` once
    /// it was killed. Returns when the replica serves its master's slots and every running node
    /// agrees.
    pub fn failover(&self, replica: usize) {
        let me = self.listed_self(replica);
        let master = me
            .master
            .as_ref()
            .map(|id| self.index_of(id))
            .unwrap_or_else(|| panic!("node {replica} is not a replica"));
        let argv: &[&str] = match self.nodes[master].is_running() {
            true => &["CLUSTER", "FAILOVER"],
            false => &["CLUSTER", "FAILOVER", "FORCE"],
        };
        self.expect_ok(replica, argv);
        self.wait_until("the replica is promoted", |cluster| {
            let me = cluster.listed_self(replica);
            me.flags.iter().any(|f| f == "master") && !me.slots.is_empty()
        });
        self.wait_agreed();
    }

    /// `INFO commandstats` of `node`: per command (`get`, `cluster|shards`), its calls.
    pub fn commandstats(&self, node: usize) -> BTreeMap<String, Calls> {
        let info = self.call(node, &["INFO", "commandstats"]);
        let text = bulk_text(&info);
        text.lines()
            .filter_map(|line| {
                let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |wanted: &str| {
                    fields
                        .split(',')
                        .find_map(|f| f.strip_prefix(wanted)?.strip_prefix('='))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0)
                };
                Some((
                    name.to_owned(),
                    Calls {
                        calls: field("calls"),
                        rejected: field("rejected_calls"),
                    },
                ))
            })
            .collect()
    }

    /// The first step of moving `slot`: `to` imports it, `from` migrates it. Keys not yet moved
    /// are still served by `from`; the others are answered with `-ASK`.
    pub fn begin_migration(&self, slot: u16, from: usize, to: usize) {
        let slot = slot.to_string();
        let from_id = self.nodes[from].id.clone();
        let to_id = self.nodes[to].id.clone();
        self.expect_ok(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        self.expect_ok(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
    }

    /// Moves every key of `slot` from `from` to `to` (`GETKEYSINSLOT` + `MIGRATE … KEYS`);
    /// returns how many moved.
    pub fn migrate_keys(&self, slot: u16, from: usize, to: usize) -> usize {
        let slot = slot.to_string();
        let port = self.nodes[to].port.to_string();
        let mut moved = 0;
        loop {
            let keys = match self.call(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]) {
                Frame::Array(keys) => keys,
                other => panic!("GETKEYSINSLOT {slot} on node {from}: {other:?}"),
            };
            if keys.is_empty() {
                return moved;
            }
            let keys: Vec<String> = keys.iter().map(bulk_text).collect();
            // The target's `default` user is off: MIGRATE logs in as testkit's admin.
            let (admin, password) = (crate::ADMIN_USER, crate::admin_password());
            let mut argv = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000"];
            argv.extend(["AUTH2", admin, password, "KEYS"]);
            argv.extend(keys.iter().map(String::as_str));
            self.expect_ok(from, &argv);
            moved += keys.len();
        }
    }

    /// The last step: `slot` belongs to `to`, told to `to` first and then to every other running
    /// master; returns when every running node agrees.
    pub fn finish_migration(&self, slot: u16, to: usize) {
        let slot_text = slot.to_string();
        let to_id = self.nodes[to].id.clone();
        let setslot = ["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id];
        self.expect_ok(to, &setslot);
        for master in self.masters() {
            if master != to {
                self.expect_ok(master, &setslot);
            }
        }
        self.wait_agreed();
    }

    /// Waits until every running node says `cluster_state:ok`, they all assign every slot alike,
    /// every running replica of a running master is in sync, and no node sees a replica as still
    /// `loading`.
    pub fn wait_agreed(&self) {
        self.wait_until("the nodes agree on the slots", |cluster| {
            let views: Vec<Vec<(u16, u16, String)>> = cluster
                .live()
                .map(|index| {
                    let mut slots: Vec<(u16, u16, String)> = cluster
                        .listed(index)
                        .into_iter()
                        .flat_map(|node| {
                            let id = node.id;
                            node.slots.into_iter().map(move |(a, b)| (a, b, id.clone()))
                        })
                        .collect();
                    slots.sort();
                    slots
                })
                .collect();
            let covered = |view: &Vec<(u16, u16, String)>| {
                view.iter()
                    .map(|(a, b, _)| usize::from(b - a) + 1)
                    .sum::<usize>()
            };
            views.windows(2).all(|pair| pair[0] == pair[1])
                && views.iter().all(|view| covered(view) == usize::from(SLOTS))
                && cluster.live().all(|index| {
                    cluster.state_ok(index) && cluster.in_sync(index) && cluster.none_loading(index)
                })
        });
    }

    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&index| self.nodes[index].is_running())
    }

    fn any_live(&self) -> usize {
        self.live().next().expect("a running cluster node")
    }

    fn index_of(&self, id: &str) -> usize {
        self.nodes
            .iter()
            .position(|node| node.id == id)
            .unwrap_or_else(|| panic!("no node has id {id}"))
    }

    fn state_ok(&self, node: usize) -> bool {
        bulk_text(&self.call(node, &["CLUSTER", "INFO"]))
            .lines()
            .any(|line| line.trim_end() == "cluster_state:ok")
    }

    /// A master, or a replica whose master is down (nothing to sync with), or a replica in sync.
    fn in_sync(&self, node: usize) -> bool {
        let me = self.listed_self(node);
        let Some(master) = me.master else {
            return true;
        };
        if !self.nodes.iter().any(|n| n.id == master && n.is_running()) {
            return true;
        }
        bulk_text(&self.call(node, &["INFO", "replication"]))
            .lines()
            .any(|line| line.trim_end() == "master_link_status:up")
    }

    /// Whether `node` sees every replica as serving: none is `loading` (still at offset 0) in
    /// its `CLUSTER SHARDS`.
    fn none_loading(&self, node: usize) -> bool {
        fn loading(frame: &Frame) -> bool {
            match frame {
                Frame::Array(items) => {
                    items.windows(2).any(|pair| {
                        pair[0].as_bytes().is_some_and(|b| b.as_ref() == b"health")
                            && pair[1].as_bytes().is_some_and(|b| b.as_ref() == b"loading")
                    }) || items.iter().any(loading)
                }
                _ => false,
            }
        }
        !loading(&self.call(node, &["CLUSTER", "SHARDS"]))
    }

    fn listed(&self, node: usize) -> Vec<Listed> {
        bulk_text(&self.call(node, &["CLUSTER", "NODES"]))
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(parse_listed)
            .collect()
    }

    fn listed_self(&self, node: usize) -> Listed {
        self.listed(node)
            .into_iter()
            .find(|listed| listed.flags.iter().any(|f| f == "myself"))
            .expect("CLUSTER NODES names the node itself")
    }

    fn expect_ok(&self, node: usize, argv: &[&str]) {
        match self.call(node, argv) {
            Frame::Simple(ok) if ok.as_ref() == b"OK" => {}
            other => panic!("{argv:?} on node {node}: {other:?}"),
        }
    }

    fn wait_until(&self, what: &str, done: impl Fn(&RedisCluster) -> bool) {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "the cluster did not settle within {SETTLE_TIMEOUT:?}: waiting until {what}"
            );
            std::thread::sleep(POLL);
        }
    }
}

/// Master `index`'s share of the slots: an even split, the remainder to the first masters.
fn share(index: usize, masters: usize) -> (u16, u16) {
    let slots = usize::from(SLOTS);
    let first = index * slots / masters;
    let last = (index + 1) * slots / masters - 1;
    // Both are below 16384 by construction.
    (first as u16, last as u16)
}

fn start_node() -> ClusterNode {
    let port = loopback_port();
    let bus = loopback_port();
    // `--port` after RedisServer's own `--port 0`: the last one given wins.
    let server = RedisServer::builder()
        .arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--cluster-enabled")
        .arg("yes")
        .arg("--cluster-port")
        .arg(bus.to_string())
        .arg("--cluster-node-timeout")
        .arg(NODE_TIMEOUT_MS.to_string())
        .arg("--cluster-config-file")
        .arg("nodes.conf")
        // A master's offset moves only when it writes to its replicas; a replica still at offset
        // 0 counts as `loading`, not serving. Pinging them every second moves it.
        .arg("--repl-ping-replica-period")
        .arg("1")
        // A master streams its data to a new replica at once instead of waiting 5 s (Redis 7's
        // default) for more replicas to share the transfer: every cluster with replicas waited
        // those 5 s before `wait_agreed` saw its replicas in sync.
        .arg("--repl-diskless-sync-delay")
        .arg("0")
        .start();
    let mut node = ClusterNode {
        server,
        port,
        bus,
        id: String::new(),
    };
    let id = node.server.inline("CLUSTER MYID");
    node.id = id
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("CLUSTER MYID: {id}"))
        .to_owned();
    node
}

fn bulk_text(frame: &Frame) -> String {
    match frame.as_bytes() {
        Some(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        None => panic!("expected text, got {frame:?}"),
    }
}

/// One line of `CLUSTER NODES`: `<id> <ip:port@bus> <flags> <master|-> <ping> <pong> <epoch>
/// <link> <slots…>`, where a slot is `n`, `a-b`, or `[n->-id]`/`[n-<-id]` (a migration, skipped).
fn parse_listed(line: &str) -> Listed {
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert!(fields.len() >= 8, "unreadable CLUSTER NODES line: {line}");
    let slots = fields[8..]
        .iter()
        .filter(|slot| !slot.starts_with('['))
        .map(|slot| {
            let (a, b) = slot.split_once('-').unwrap_or((slot, slot));
            let parse = |n: &str| {
                n.parse()
                    .unwrap_or_else(|_| panic!("slot `{slot}` in CLUSTER NODES: {line}"))
            };
            (parse(a), parse(b))
        })
        .collect();
    Listed {
        id: fields[0].to_owned(),
        flags: fields[2].split(',').map(str::to_owned).collect(),
        master: (fields[3] != "-").then(|| fields[3].to_owned()),
        slots,
    }
}
