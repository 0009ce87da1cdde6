//! Redis's replies that the daemon corrects, because its shared connections stand between clients
//! and Redis: subscriber counts (Redis counts the daemon's one subscribed connection, not the
//! clients behind it), `CONFIG GET` (secrets removed; one database, as the daemon serves) and
//! `INFO` (a cluster behind the daemon is shown as the one standalone server clients see; the
//! keyspace shows database 0 alone, and its counts and the per-command statistics only to a
//! caller whose keys the policy does not constrain).

use bytes::Bytes;
use tollgate_lanes::cache::Cause;
use tollgate_lanes::{Cache, PubSub, SubscriptionKind};
use tollgate_policy::glob;
use tollgate_resp::{Frame, Limits};

use super::replies;
use super::script_refusal::ScriptNote;

/// Parameters `CONFIG GET` never shows through the daemon: passwords Redis would print in clear.
const SECRET: [&str; 4] = [
    "requirepass",
    "masterauth",
    "tls-key-file-pass",
    "tls-client-key-file-pass",
];

/// How one command's reply is corrected.
#[derive(Debug, PartialEq)]
pub enum Amend {
    /// `PUBLISH` (channels and patterns) or `SPUBLISH` (shard channels): the receivers Redis
    /// counted, with the daemon's subscriptions replaced by the clients subscribed through them.
    Publish(SubscriptionKind, Bytes),
    /// `PUBSUB NUMSUB` / `SHARDNUMSUB`: each count with the daemon's connection replaced by its
    /// local subscribers.
    NumSub(SubscriptionKind),
    /// `CONFIG GET`: Redis's answer without secrets and with `databases` 1; `fallback` (the
    /// daemon's own short answer) when the lane's user may not read the configuration.
    ConfigGet { fallback: Bytes },
    /// `INFO`: a cluster node's `redis_mode:cluster` and `cluster_enabled:1` read as standalone, so
    /// that a client library that picks its mode from INFO stays cluster-unaware. The `Keyspace`
    /// section keeps database 0 only (the others, the lease database among them, are no client's);
    /// unless the caller `sees_every_key` (see `Generation::sees_every_key`), its `db0` line and
    /// the server-wide counts per command (`Commandstats`, `Errorstats`, `Latencystats`) are left
    /// out too: they count every tenant's keys and commands.
    Info {
        sees_every_key: bool,
        /// The sessions the caller sees, for `connected_clients` (Redis counts the daemon's
        /// lane connections there); `None` leaves Redis's count.
        clients: Option<usize>,
        /// The daemon's `CLIENT TRACKING` counts, for `tracking_clients` and
        /// `tracking_total_keys|items|prefixes` (Redis's count its invalidation connection).
        /// Boxed: `Amend` stays the size it was.
        tracking: Option<Box<crate::tracking::Stats>>,
    },
    /// A script (`EVAL`, `FCALL` …): a call its lane's user was refused is told the policy's rule
    /// behind it (see [`ScriptNote`]).
    Script(Box<ScriptNote>),
    /// A command that wrote (or read past the cache) keys the near cache may hold: they are
    /// dropped before the reply goes on (then any amendment of its own applies), so that no later
    /// hit shows a value older than this reply's. Boxed: only with the cache on, and `Amend`
    /// stays the size it was without it.
    Passed(Box<Passed>),
}

/// See [`Amend::Passed`].
#[derive(Debug, PartialEq)]
pub struct Passed {
    pub cache: Cache,
    pub keys: Vec<Bytes>,
    pub cause: Cause,
    pub then: Option<Amend>,
}

/// `INFO` sections of server-wide counts per command, which a constrained caller does not see.
const PER_COMMAND_SECTIONS: [&[u8]; 3] = [b"commandstats", b"errorstats", b"latencystats"];

/// What `INFO` says of a cluster node, and what the daemon's clients read instead.
const CLUSTER_LINES: [(&[u8], &[u8]); 2] = [
    (b"redis_mode:cluster", b"redis_mode:standalone"),
    (b"cluster_enabled:1", b"cluster_enabled:0"),
];

impl Amend {
    /// The correction `name` (a catalog name, `PUBSUB|NUMSUB`) needs, if any.
    pub fn of(name: &str, first: Option<&[u8]>) -> Option<Amend> {
        let channel = || first.map(Bytes::copy_from_slice);
        match name {
            "PUBLISH" => Some(Amend::Publish(SubscriptionKind::Channel, channel()?)),
            "SPUBLISH" => Some(Amend::Publish(SubscriptionKind::Shard, channel()?)),
            "PUBSUB|NUMSUB" => Some(Amend::NumSub(SubscriptionKind::Channel)),
            "PUBSUB|SHARDNUMSUB" => Some(Amend::NumSub(SubscriptionKind::Shard)),
            // Told whether the caller sees every key once the caller is known (state.rs).
            "INFO" => Some(Amend::Info {
                sees_every_key: false,
                clients: None,
                tracking: None,
            }),
            _ => None,
        }
    }

    /// Redis's `reply`, corrected. A reply of another shape (an error, say) is left as it is.
    pub fn apply(self, reply: Bytes, pubsub: &PubSub) -> Bytes {
        match self {
            Amend::Publish(kind, channel) => publish(reply, pubsub, kind, &channel),
            Amend::NumSub(kind) => edit(reply, |frame| numsub(frame, pubsub, kind)),
            Amend::ConfigGet { fallback } if reply.starts_with(b"-") => fallback,
            Amend::ConfigGet { .. } => edit(reply, config_get),
            Amend::Script(note) => note.apply(reply),
            Amend::Passed(passed) => {
                let Passed {
                    cache,
                    keys,
                    cause,
                    then,
                } = *passed;
                for key in &keys {
                    cache.passed(key, cause);
                }
                match then {
                    Some(amend) => amend.apply(reply, pubsub),
                    None => reply,
                }
            }
            Amend::Info {
                sees_every_key,
                clients,
                tracking,
            } => edit(reply, |frame| {
                standalone_info(frame, sees_every_key, clients, tracking.as_deref())
            }),
        }
    }
}

fn publish(reply: Bytes, pubsub: &PubSub, kind: SubscriptionKind, channel: &Bytes) -> Bytes {
    let Some(counted) = integer(&reply) else {
        return reply;
    };
    let (mut ours, mut clients) = (0, 0);
    if let Some(local) = pubsub.local_subscribers(kind, channel.clone()) {
        ours += 1;
        clients += local;
    }
    if kind == SubscriptionKind::Channel {
        for (pattern, local) in pubsub.patterns() {
            if glob::matches(&pattern, channel) {
                ours += 1;
                clients += local;
            }
        }
    }
    if ours == 0 {
        return reply;
    }
    let receivers = counted.saturating_sub(ours) + clients as i64;
    replies::encode(&Frame::Integer(receivers))
}

fn numsub(frame: &mut Frame, pubsub: &PubSub, kind: SubscriptionKind) {
    let correct = |name: &Frame, count: &mut Frame| {
        let (Some(name), Frame::Integer(n)) = (name.as_bytes(), count) else {
            return;
        };
        if let Some(local) = pubsub.local_subscribers(kind, name.clone()) {
            *n = n.saturating_sub(1) + local as i64;
        }
    };
    match frame {
        Frame::Array(items) => {
            for pair in items.chunks_exact_mut(2) {
                let (name, count) = pair.split_at_mut(1);
                correct(&name[0], &mut count[0]);
            }
        }
        Frame::Map(pairs) => {
            for (name, count) in pairs {
                correct(name, count);
            }
        }
        _ => {}
    }
}

fn config_get(frame: &mut Frame) {
    let secret = |name: &Frame| {
        name.as_bytes()
            .is_some_and(|n| SECRET.iter().any(|s| n.eq_ignore_ascii_case(s.as_bytes())))
    };
    let one_database = |name: &Frame, value: &mut Frame| {
        if name
            .as_bytes()
            .is_some_and(|n| n.eq_ignore_ascii_case(b"databases"))
        {
            *value = Frame::Bulk(Bytes::from_static(b"1"));
        }
    };
    match frame {
        Frame::Array(items) => {
            let pairs: Vec<Frame> = std::mem::take(items);
            let mut pairs = pairs.into_iter();
            while let (Some(name), Some(mut value)) = (pairs.next(), pairs.next()) {
                if !secret(&name) {
                    one_database(&name, &mut value);
                    items.extend([name, value]);
                }
            }
        }
        Frame::Map(pairs) => {
            pairs.retain(|(name, _)| !secret(name));
            for (name, value) in pairs {
                one_database(name, value);
            }
        }
        _ => {}
    }
}

/// `reply` decoded, changed by `change`, encoded again; as it was if it does not decode.
fn edit(reply: Bytes, change: impl FnOnce(&mut Frame)) -> Bytes {
    let limits = Limits {
        max_frame_bytes: reply.len(),
        max_elements: usize::MAX,
        ..Limits::default()
    };
    let mut buffer = bytes::BytesMut::from(&reply[..]);
    match tollgate_resp::parse(&mut buffer, &limits) {
        Ok(Some(mut frame)) if buffer.is_empty() => {
            change(&mut frame);
            replies::encode(&frame)
        }
        _ => reply,
    }
}

fn standalone_info(
    frame: &mut Frame,
    sees_every_key: bool,
    clients: Option<usize>,
    tracking: Option<&crate::tracking::Stats>,
) {
    let text = match frame {
        Frame::Bulk(text) | Frame::Verbatim { text, .. } => text,
        _ => return,
    };
    let mut edited = Vec::with_capacity(text.len());
    let mut section: &[u8] = b"";
    for line in text.split_inclusive(|&b| b == b'\n') {
        let bare = line.strip_suffix(b"\r\n").unwrap_or(line);
        if let Some(name) = bare.strip_prefix(b"# ") {
            section = name;
            edited.extend_from_slice(line);
            continue;
        }
        if !bare.is_empty() && !shown(section, bare, sees_every_key) {
            continue;
        }
        // The clients are the daemon's sessions (as CLIENT LIST shows them), not its lanes.
        // blocked_clients stays Redis's: what Redis holds (a paused write, a blocking pop).
        if let Some(clients) = clients.filter(|_| section.eq_ignore_ascii_case(b"clients")) {
            if bare.starts_with(b"connected_clients:") {
                edited.extend_from_slice(format!("connected_clients:{clients}\r\n").as_bytes());
                continue;
            }
        }
        if let Some(stats) = tracking {
            let counts = [
                ("tracking_clients:", stats.clients),
                ("tracking_total_keys:", stats.keys),
                ("tracking_total_items:", stats.items),
                ("tracking_total_prefixes:", stats.prefixes),
            ];
            if let Some((name, count)) = counts
                .iter()
                .find(|(name, _)| bare.starts_with(name.as_bytes()))
            {
                edited.extend_from_slice(format!("{name}{count}\r\n").as_bytes());
                continue;
            }
        }
        match CLUSTER_LINES.iter().find(|(cluster, _)| bare == *cluster) {
            Some((cluster, standalone)) => {
                edited.extend_from_slice(standalone);
                edited.extend_from_slice(&line[cluster.len()..]);
            }
            None => edited.extend_from_slice(line),
        }
    }
    *text = Bytes::from(edited);
}

/// Whether a line of `section` reaches the caller.
fn shown(section: &[u8], line: &[u8], sees_every_key: bool) -> bool {
    if section.eq_ignore_ascii_case(b"keyspace") {
        return sees_every_key && line.starts_with(b"db0:");
    }
    sees_every_key
        || !PER_COMMAND_SECTIONS
            .iter()
            .any(|name| section.eq_ignore_ascii_case(name))
}

fn integer(reply: &[u8]) -> Option<i64> {
    let digits = reply.strip_prefix(b":")?.strip_suffix(b"\r\n")?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(reply: &str) -> String {
        let mut out = Vec::new();
        let amended = edit(Bytes::from(reply.to_owned()), config_get);
        out.extend_from_slice(&amended);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn config_get_hides_passwords_and_shows_one_database() {
        assert_eq!(
            config("*6\r\n$11\r\nrequirepass\r\n$6\r\nsecret\r\n$9\r\ndatabases\r\n$2\r\n16\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n"),
            "*4\r\n$9\r\ndatabases\r\n$1\r\n1\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n"
        );
        assert_eq!(
            config("%2\r\n$10\r\nmasterauth\r\n$1\r\nx\r\n$7\r\ntimeout\r\n$1\r\n0\r\n"),
            "%1\r\n$7\r\ntimeout\r\n$1\r\n0\r\n"
        );
    }

    #[test]
    fn a_reply_that_is_not_the_expected_shape_is_left_alone() {
        assert_eq!(config("-NOPERM no\r\n"), "-NOPERM no\r\n");
        assert_eq!(integer(b":12\r\n"), Some(12));
        assert_eq!(integer(b"-ERR\r\n"), None);
    }

    #[test]
    fn only_pubsub_counts_and_config_get_are_amended() {
        let first = Some(&b"news"[..]);
        assert!(matches!(
            Amend::of("PUBLISH", first),
            Some(Amend::Publish(SubscriptionKind::Channel, _))
        ));
        assert!(Amend::of("PUBLISH", None).is_none());
        assert!(Amend::of("PUBSUB|CHANNELS", first).is_none());
        assert!(Amend::of("GET", first).is_none());
    }

    fn info(text: &str, sees_every_key: bool) -> String {
        let mut frame = Frame::Bulk(Bytes::from(text.to_owned()));
        standalone_info(&mut frame, sees_every_key, None, None);
        String::from_utf8(frame.as_bytes().unwrap().to_vec()).unwrap()
    }

    const INFO: &str = "# Server\r\nredis_mode:cluster\r\n\r\n# Commandstats\r\n\
        cmdstat_get:calls=9,usec=1\r\n\r\n# Errorstats\r\nerrorstat_ERR:count=1\r\n\r\n\
        # Cluster\r\ncluster_enabled:1\r\n\r\n# Keyspace\r\ndb0:keys=3,expires=0\r\n\
        db1:keys=2,expires=2\r\n";

    #[test]
    fn info_shows_database_zero_alone_and_server_wide_counts_to_whom_sees_every_key() {
        assert_eq!(
            info(INFO, true),
            "# Server\r\nredis_mode:standalone\r\n\r\n# Commandstats\r\n\
             cmdstat_get:calls=9,usec=1\r\n\r\n# Errorstats\r\nerrorstat_ERR:count=1\r\n\r\n\
             # Cluster\r\ncluster_enabled:0\r\n\r\n# Keyspace\r\ndb0:keys=3,expires=0\r\n"
        );
        assert_eq!(
            info(INFO, false),
            "# Server\r\nredis_mode:standalone\r\n\r\n# Commandstats\r\n\r\n\
             # Errorstats\r\n\r\n# Cluster\r\ncluster_enabled:0\r\n\r\n# Keyspace\r\n"
        );
    }

    #[test]
    fn connected_clients_counts_the_sessions_the_caller_sees() {
        let text = "# Clients\r\nconnected_clients:10\r\nblocked_clients:1\r\n\r\n\
            # Stats\r\nconnected_clients:10\r\n";
        let mut frame = Frame::Bulk(Bytes::from(text));
        standalone_info(&mut frame, true, Some(3), None);
        assert_eq!(
            frame.as_bytes().unwrap(),
            &b"# Clients\r\nconnected_clients:3\r\nblocked_clients:1\r\n\r\n\
            # Stats\r\nconnected_clients:10\r\n"[..]
        );
    }
}
