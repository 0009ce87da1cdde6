//! The vocabulary every Tollgate crate shares, kept tiny so that the policy engine and the Redis lanes
//! can agree on it without depending on each other: which lane a command travels on, who sent it,
//! which protocol its replies are in, and which names the daemon keeps for itself.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub mod reserved;
pub mod size;

pub use size::ByteSize;

/// A pool of Redis connections that carries one kind of traffic (see docs/design.md, "Lanes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    Regular,
    Blocking,
    Transaction,
    Script,
    Pubsub,
    Admin,
}

impl Lane {
    pub const ALL: [Lane; 6] = [
        Lane::Regular,
        Lane::Blocking,
        Lane::Transaction,
        Lane::Script,
        Lane::Pubsub,
        Lane::Admin,
    ];

    /// The lowercase name used in configuration, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Regular => "regular",
            Lane::Blocking => "blocking",
            Lane::Transaction => "transaction",
            Lane::Script => "script",
            Lane::Pubsub => "pubsub",
            Lane::Admin => "admin",
        }
    }

    /// The uppercase name used in error replies (`-BUSY tollgate: lane BLOCKING saturated`).
    pub fn shout(self) -> &'static str {
        match self {
            Lane::Regular => "REGULAR",
            Lane::Blocking => "BLOCKING",
            Lane::Transaction => "TRANSACTION",
            Lane::Script => "SCRIPT",
            Lane::Pubsub => "PUBSUB",
            Lane::Admin => "ADMIN",
        }
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lane whose connections carry many clients' commands at once, pipelined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Multiplexed {
    Regular,
    Script,
}

/// A lane whose connections are lent to one borrower at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exclusive {
    Blocking,
    Transaction,
    Admin,
}

impl From<Multiplexed> for Lane {
    fn from(lane: Multiplexed) -> Lane {
        match lane {
            Multiplexed::Regular => Lane::Regular,
            Multiplexed::Script => Lane::Script,
        }
    }
}

impl From<Exclusive> for Lane {
    fn from(lane: Exclusive) -> Lane {
        match lane {
            Exclusive::Blocking => Lane::Blocking,
            Exclusive::Transaction => Lane::Transaction,
            Exclusive::Admin => Lane::Admin,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown lane `{0}` (expected regular, blocking, transaction, script, pubsub or admin)")]
pub struct UnknownLane(pub String);

impl FromStr for Lane {
    type Err = UnknownLane;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Lane::ALL
            .into_iter()
            .find(|lane| lane.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownLane(s.to_owned()))
    }
}

/// The Redis protocol a client speaks (`HELLO 2` or `HELLO 3`), and so the one the lane connection
/// carrying its commands must speak: RESP3 gives maps, sets and doubles where RESP2 gives arrays and
/// strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Resp2,
    Resp3,
}

impl Protocol {
    pub const ALL: [Protocol; 2] = [Protocol::Resp2, Protocol::Resp3];

    /// The version `HELLO` takes.
    pub fn version(self) -> &'static str {
        match self {
            Protocol::Resp2 => "2",
            Protocol::Resp3 => "3",
        }
    }

    /// 0 for RESP2, 1 for RESP3: a place in per-protocol arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Who sent a command: the peer credentials of the Unix socket and the principal they map to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Caller {
    pub principal: String,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// How the principal of a peer the policy maps to no principal begins: `uid:<n>`. Policies may
/// not name a principal so, or its rules would apply to whoever has that uid.
pub const UNMAPPED_PREFIX: &str = "uid:";

impl Caller {
    /// The principal of a peer that no principal of the policy maps: its uid, never a name the
    /// peer's user could choose.
    pub fn unmapped_principal(uid: u32) -> String {
        format!("{UNMAPPED_PREFIX}{uid}")
    }

    /// Whose share of a pooled resource this caller's use counts against.
    pub fn tenant(&self) -> Tenant {
        Tenant {
            principal: self.principal.clone(),
            uid: self.uid,
        }
    }
}

/// Who a pooled resource (an exclusive lane's connections, watchdogs, …) is shared by: a
/// principal and one OS user of it. Not the principal alone, because one principal may cover
/// every local user (the default policy's `local`), and then a per-principal share would let one
/// user take what every other user needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant {
    pub principal: String,
    pub uid: u32,
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (uid {})", self.principal, self.uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_names_round_trip_case_insensitively() {
        for lane in Lane::ALL {
            assert_eq!(lane.as_str().parse::<Lane>().unwrap(), lane);
            assert_eq!(lane.shout().parse::<Lane>().unwrap(), lane);
        }
        assert!("express".parse::<Lane>().is_err());
    }
}
