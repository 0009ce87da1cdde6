//! Where Redis is: the `redis:` section of the config and the endpoints it names.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Deserialize;

/// The `redis:` section. Absent from the config means the daemon runs an embedded `redis-server`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `unix:/path/to/redis.sock` or `host:port`.
    pub address: Endpoint,
}

/// How the lanes find the server to talk to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One server at a fixed address.
    Standalone(Endpoint),
    /// The master of a Sentinel-monitored group, found through the sentinels and followed across
    /// failovers (`+switch-master`).
    Sentinel {
        master: String,
        sentinels: Vec<Endpoint>,
    },
}

impl From<&RedisConfig> for Topology {
    fn from(config: &RedisConfig) -> Self {
        Topology::Standalone(config.address.clone())
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
}
