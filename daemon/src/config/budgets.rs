//! `resp.budgets`: the bytes the daemon may hold for RESP clients (replies not yet read, input not
//! yet parsed), per client and in total, in the spirit of Redis's `client-output-buffer-limit` and
//! `client-query-buffer-limit`. Sizes are bytes, or a string with a unit (`32MiB`).

use std::time::Duration;

use serde::Deserialize;
pub use tollgate_model::ByteSize;

/// `resp.budgets`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetsConfig {
    /// All clients' held bytes together (replies and input). A reply that would take the total past
    /// it is dropped and its client disconnected; clients holding more than a little input stop
    /// being read until there is room.
    pub total: ByteSize,
    /// What the clients of one tenant (a principal and one OS user of it) may hold together, out
    /// of `total`: past it, that tenant's clients stop being read and its replies are refused,
    /// while other users still find the rest of the total. Unset: a quarter of `total`. Zero: no
    /// share (the total alone, first come first served).
    pub per_uid: Option<ByteSize>,
    /// Clients with no subscriptions.
    pub normal: ClassBudgets,
    /// Clients subscribed to at least one channel, pattern or shard channel.
    pub pubsub: ClassBudgets,
}

impl Default for BudgetsConfig {
    fn default() -> Self {
        Self {
            total: ByteSize::mib(512),
            per_uid: None,
            normal: ClassBudgets {
                output: Limit::new(ByteSize::mib(128), ByteSize::mib(32)),
                input: Limit::new(ByteSize::mib(64), ByteSize::mib(16)),
            },
            pubsub: ClassBudgets {
                output: Limit::new(ByteSize::mib(32), ByteSize::mib(8)),
                input: Limit::new(ByteSize::mib(1), ByteSize(0)),
            },
        }
    }
}

impl BudgetsConfig {
    /// `per_uid` as written, or a quarter of `total`.
    pub fn per_uid(&self) -> ByteSize {
        self.per_uid.unwrap_or(ByteSize(self.total.0 / 4))
    }
}

/// The limits of one class of client; a class written in the file gives both.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClassBudgets {
    /// Replies held for the client: arrived from Redis and not yet written to its socket.
    pub output: Limit,
    /// What the client sent that does not yet make a whole command.
    pub input: Limit,
}

/// A hard limit, and a soft one that may be exceeded for `soft_for` at most (default 60 s). Past
/// either the client is disconnected. Zero disables a limit.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, try_from = "WrittenLimit")]
pub struct Limit {
    pub hard: ByteSize,
    pub soft: ByteSize,
    pub soft_for: Duration,
}

impl Limit {
    const fn new(hard: ByteSize, soft: ByteSize) -> Self {
        Limit {
            hard,
            soft,
            soft_for: Duration::from_secs(60),
        }
    }
}

/// [`Limit`] as written, checked as it is read so that an error points at the file, line and
/// column like a type error does.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WrittenLimit {
    hard: ByteSize,
    #[serde(default)]
    soft: ByteSize,
    #[serde(default = "sixty_seconds", with = "humantime_serde")]
    soft_for: Duration,
}

fn sixty_seconds() -> Duration {
    Duration::from_secs(60)
}

impl TryFrom<WrittenLimit> for Limit {
    type Error = String;

    fn try_from(written: WrittenLimit) -> Result<Self, Self::Error> {
        if written.hard.0 > 0 && written.soft > written.hard {
            return Err(format!(
                "soft ({}) is over hard ({}): the soft limit would never apply",
                written.soft, written.hard
            ));
        }
        if written.soft.0 > 0 && written.soft_for.is_zero() {
            return Err("soft_for must be longer than zero (or drop `soft`)".to_owned());
        }
        Ok(Limit {
            hard: written.hard,
            soft: written.soft,
            soft_for: written.soft_for,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_bytes_or_a_number_with_a_unit() {
        for (text, bytes) in [
            ("0", 0),
            ("4096", 4096),
            ("512KiB", 512 << 10),
            ("32MiB", 32 << 20),
            ("32mb", 32 << 20),
            ("1 GiB", 1 << 30),
        ] {
            assert_eq!(ByteSize::parse(text), Some(ByteSize(bytes)), "{text}");
        }
        for text in [
            "",
            "MiB",
            "1.5MiB",
            "-1",
            "3 parsecs",
            "99999999999999999999GiB",
        ] {
            assert_eq!(ByteSize::parse(text), None, "{text}");
        }
    }
}
