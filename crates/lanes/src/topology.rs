//! Where Redis is: the `redis:` section of the config and the endpoints it names.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Deserialize;

/// The `redis:` section: either `address:` (one server) or `sentinel: { master, addresses }`.
/// Absent from the config means the daemon runs an embedded `redis-server`.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    topology: Topology,
    /// `trusted_users`: ACL users other than the daemon's own that may reach the reserved keyspace
    /// (an operator's password-protected admin user, say), accepted at start with a warning.
    trusted_users: Vec<String>,
}

impl RedisConfig {
    /// One server at a fixed address.
    pub fn standalone(address: Endpoint) -> Self {
        Self::of(Topology::Standalone(address))
    }

    fn of(topology: Topology) -> Self {
        Self {
            topology,
            trusted_users: Vec::new(),
        }
    }

    /// This config with `users` accepted although they could reach the reserved keyspace.
    pub fn trusting(mut self, users: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.trusted_users = users.into_iter().map(Into::into).collect();
        self
    }

    /// The users named in `trusted_users`.
    pub fn trusted_users(&self) -> &[String] {
        &self.trusted_users
    }

    /// A Redis Cluster, learnt from `seeds`, whose commands wait for a busy cluster up to
    /// [`RETRY_FOR`].
    pub fn cluster(seeds: Vec<Endpoint>, split: Splitting) -> Self {
        Self::cluster_retrying(seeds, split, RETRY_FOR)
    }

    /// [`RedisConfig::cluster`], waiting up to `retry_for`.
    pub fn cluster_retrying(
        seeds: Vec<Endpoint>,
        split: Splitting,
        retry_for: std::time::Duration,
    ) -> Self {
        Self::of(Topology::Cluster {
            seeds,
            split,
            retry_for,
        })
    }

    /// The master named `master`, found through `sentinels` and followed across failovers.
    pub fn sentinel(master: impl Into<String>, sentinels: Vec<Endpoint>) -> Self {
        Self::sentinel_as(master, sentinels, SentinelAuth::default())
    }

    /// [`RedisConfig::sentinel`], authenticating to the sentinels as `auth` says.
    pub fn sentinel_as(
        master: impl Into<String>,
        sentinels: Vec<Endpoint>,
        auth: SentinelAuth,
    ) -> Self {
        Self::of(Topology::Sentinel {
            master: master.into(),
            sentinels,
            auth,
        })
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }
}

/// The section as written, before "exactly one of `address`, `sentinel` and `cluster`" is checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RedisSection {
    /// `unix:/path/to/redis.sock` or `host:port`.
    address: Option<Endpoint>,
    sentinel: Option<SentinelSection>,
    cluster: Option<ClusterSection>,
    /// ACL users other than the daemon's own that may reach the reserved keyspace.
    #[serde(default)]
    trusted_users: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterSection {
    /// Seed nodes: any of the cluster's nodes; the slot map names the rest.
    addresses: Vec<Endpoint>,
    /// Whether MGET, MSET, DEL, UNLINK, EXISTS and TOUCH across slots are split per slot (not
    /// atomic) rather than refused with CROSSSLOT.
    #[serde(default = "split_by_default")]
    split_multi_key: bool,
    /// How long a command may wait, in all, for a busy cluster (`TRYAGAIN`, `CLUSTERDOWN`, a
    /// master that cannot be reached during a failover) before the client gets an error.
    #[serde(default = "retry_for_by_default", with = "humantime_serde")]
    retry_for: std::time::Duration,
}

/// Long enough for a failover with a short `cluster-node-timeout`; a client that would rather see
/// the error sooner sets less.
pub const RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(5);

fn retry_for_by_default() -> std::time::Duration {
    RETRY_FOR
}

fn split_by_default() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SentinelSection {
    /// The name the sentinels monitor the group under (`sentinel monitor <master> ...`).
    master: String,
    /// The sentinels to ask; each is tried in turn.
    addresses: Vec<Endpoint>,
    /// The sentinels' ACL user (`default` when only `password_file` is set: `requirepass`).
    user: Option<String>,
    /// File holding that user's password (first line); never the password itself in the config.
    password_file: Option<PathBuf>,
}

/// How the daemon authenticates to the sentinels: as `user` (or `default`) with the password in
/// `password_file`; neither, for sentinels open to every local user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SentinelAuth {
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
}

/// Why a `redis:` section names no usable server.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidRedisConfig {
    #[error(
        "set exactly one of `address` (one server), `sentinel` (master and addresses) and \
         `cluster` (addresses), not several"
    )]
    Several,
    #[error(
        "set one of `address` (one server), `sentinel` (master and addresses) or `cluster` \
         (addresses)"
    )]
    Neither,
    #[error("`sentinel.master` must name the monitored master")]
    EmptyMaster,
    #[error("`sentinel.addresses` must list at least one sentinel")]
    NoSentinels,
    #[error("`cluster.addresses` must list at least one node")]
    NoSeeds,
    #[error("`sentinel.user` needs `sentinel.password_file`: the password it logs in with")]
    UserWithoutPassword,
}

impl<'de> Deserialize<'de> for RedisConfig {
    /// Checks the section while its map is still open, so that a YAML error points at the section
    /// itself rather than at the start of the file.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SectionVisitor;

        impl<'de> serde::de::Visitor<'de> for SectionVisitor {
            type Value = RedisConfig;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map with `address` or `sentinel`")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RedisConfig, A::Error> {
                let section =
                    RedisSection::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                RedisConfig::try_from(section).map_err(serde::de::Error::custom)
            }
        }

        deserializer.deserialize_map(SectionVisitor)
    }
}

impl TryFrom<RedisSection> for RedisConfig {
    type Error = InvalidRedisConfig;

    fn try_from(section: RedisSection) -> Result<Self, Self::Error> {
        let trusted = section.trusted_users;
        let config = match (section.address, section.sentinel, section.cluster) {
            (None, None, None) => Err(InvalidRedisConfig::Neither),
            (Some(address), None, None) => Ok(RedisConfig::standalone(address)),
            (None, Some(sentinel), None) if sentinel.master.trim().is_empty() => {
                Err(InvalidRedisConfig::EmptyMaster)
            }
            (None, Some(sentinel), None) if sentinel.addresses.is_empty() => {
                Err(InvalidRedisConfig::NoSentinels)
            }
            (None, Some(sentinel), None)
                if sentinel.user.is_some() && sentinel.password_file.is_none() =>
            {
                Err(InvalidRedisConfig::UserWithoutPassword)
            }
            (None, Some(sentinel), None) => Ok(RedisConfig::sentinel_as(
                sentinel.master,
                sentinel.addresses,
                SentinelAuth {
                    user: sentinel.user,
                    password_file: sentinel.password_file,
                },
            )),
            (None, None, Some(cluster)) if cluster.addresses.is_empty() => {
                Err(InvalidRedisConfig::NoSeeds)
            }
            (None, None, Some(cluster)) => {
                let split = match cluster.split_multi_key {
                    true => Splitting::Split,
                    false => Splitting::Refuse,
                };
                Ok(RedisConfig::cluster_retrying(
                    cluster.addresses,
                    split,
                    cluster.retry_for,
                ))
            }
            _ => Err(InvalidRedisConfig::Several),
        }?;
        Ok(config.trusting(trusted))
    }
}

/// How the lanes find the server to talk to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server at a fixed address.
    Standalone(Endpoint),
    /// The master of a Sentinel-monitored group, found through the sentinels and followed across
    /// failovers (`+switch-master`).
    Sentinel {
        master: String,
        sentinels: Vec<Endpoint>,
        auth: SentinelAuth,
    },
    /// A Redis Cluster: the slot map is learnt from the seeds (and then from every node it names),
    /// and each master gets lanes of its own.
    Cluster {
        seeds: Vec<Endpoint>,
        split: Splitting,
        retry_for: std::time::Duration,
    },
}

/// What a multi-key command whose keys span slots becomes in a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Splitting {
    /// MGET, MSET, DEL, UNLINK, EXISTS and TOUCH are split per slot and their replies merged (a
    /// split MSET or DEL is not atomic).
    Split,
    /// Refused with CROSSSLOT, as Redis refuses them.
    Refuse,
}

impl From<&RedisConfig> for Topology {
    fn from(config: &RedisConfig) -> Self {
        config.topology.clone()
    }
}

/// One Redis server address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

#[derive(Debug, thiserror::Error)]
#[error("invalid Redis address `{0}`: expected `unix:/path/to/redis.sock` or `host:port`")]
pub struct InvalidEndpoint(String);

impl FromStr for Endpoint {
    type Err = InvalidEndpoint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidEndpoint(s.to_owned());
        if let Some(path) = s
            .strip_prefix("unix://")
            .or_else(|| s.strip_prefix("unix:"))
        {
            if path.is_empty() {
                return Err(invalid());
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let rest = s.strip_prefix("redis://").unwrap_or(s);
        let (host, port) = rest.rsplit_once(':').ok_or_else(invalid)?;
        let port = port.parse().map_err(|_| invalid())?;
        if host.is_empty() {
            return Err(invalid());
        }
        Ok(Endpoint::Tcp {
            host: host.trim_matches(['[', ']']).to_owned(),
            port,
        })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
            Endpoint::Tcp { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl<'de> Deserialize<'de> for Endpoint {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_and_tcp_addresses() {
        assert_eq!(
            "unix:/run/redis.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/run/redis.sock".into())
        );
        assert_eq!(
            "redis://127.0.0.1:6380".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 6380
            }
        );
        assert!("localhost".parse::<Endpoint>().is_err());
        assert!("unix:".parse::<Endpoint>().is_err());
    }

    fn redis(yaml: &str) -> Result<RedisConfig, String> {
        serde_yaml::from_str(yaml).map_err(|error| error.to_string())
    }

    #[test]
    fn redis_section_is_either_an_address_or_a_sentinel_group() {
        assert_eq!(
            redis("address: unix:/run/redis.sock").unwrap(),
            RedisConfig::standalone(Endpoint::Unix("/run/redis.sock".into()))
        );
        assert_eq!(
            redis(
                "sentinel: { master: mymaster, addresses: ['10.0.0.1:26379', '10.0.0.2:26379'] }"
            )
            .unwrap()
            .topology(),
            &Topology::Sentinel {
                master: "mymaster".into(),
                sentinels: vec![
                    "10.0.0.1:26379".parse().unwrap(),
                    "10.0.0.2:26379".parse().unwrap()
                ],
                auth: SentinelAuth::default(),
            }
        );
    }

    #[test]
    fn a_cluster_section_names_seed_nodes_and_splits_by_default() {
        let seeds = vec![
            "127.0.0.1:7000".parse().unwrap(),
            "unix:/run/n2.sock".parse().unwrap(),
        ];
        assert_eq!(
            redis("cluster: { addresses: ['127.0.0.1:7000', 'unix:/run/n2.sock'] }").unwrap(),
            RedisConfig::cluster(seeds.clone(), Splitting::Split)
        );
        assert_eq!(
            redis("cluster: { addresses: ['127.0.0.1:7000', 'unix:/run/n2.sock'], split_multi_key: false }")
                .unwrap(),
            RedisConfig::cluster(seeds, Splitting::Refuse)
        );
    }

    #[test]
    fn trusted_users_and_the_sentinels_login_are_read() {
        let config = redis(
            "sentinel: { master: m, addresses: ['h:1'], user: s, password_file: /etc/s.pw }\n\
             trusted_users: [tollgate-root, default]",
        )
        .unwrap();
        assert_eq!(config.trusted_users(), ["tollgate-root", "default"]);
        let Topology::Sentinel { auth, .. } = config.topology() else {
            panic!("not a sentinel group");
        };
        assert_eq!(
            auth,
            &SentinelAuth {
                user: Some("s".into()),
                password_file: Some("/etc/s.pw".into()),
            }
        );
        assert!(redis("address: h:1").unwrap().trusted_users().is_empty());
        assert!(
            redis("sentinel: { master: m, addresses: ['h:1'], user: s }")
                .unwrap_err()
                .contains("password_file")
        );
        assert!(
            redis("sentinel: { master: m, addresses: ['h:1'], password: x }")
                .unwrap_err()
                .contains("unknown field `password`")
        );
    }

    #[test]
    fn redis_section_rejects_both_neither_and_empty_sentinel_groups() {
        let both = "address: localhost:6379\nsentinel: { master: m, addresses: ['h:1'] }";
        assert!(redis(both).unwrap_err().contains("not several"));
        assert!(redis("{}").unwrap_err().contains("set one of `address`"));
        let sentinel_and_cluster =
            "sentinel: { master: m, addresses: ['h:1'] }\ncluster: { addresses: ['h:2'] }";
        assert!(redis(sentinel_and_cluster)
            .unwrap_err()
            .contains("not several"));
        assert!(redis("cluster: { addresses: [] }")
            .unwrap_err()
            .contains("at least one node"));
        assert!(redis("sentinel: { master: '', addresses: ['h:1'] }")
            .unwrap_err()
            .contains("sentinel.master"));
        assert!(redis("sentinel: { master: m, addresses: [] }")
            .unwrap_err()
            .contains("at least one sentinel"));
        assert!(
            redis("sentinel: { master: m, addresses: ['h:1'], quorum: 2 }")
                .unwrap_err()
                .contains("unknown field `quorum`")
        );
    }
}
