//! What a command is, from its first words alone: connection-scoped (the daemon answers it), a
//! subscription, the lease service's, or Redis's. Found once per command, as it is read; every
//! later step (read-ahead, `CLIENT REPLY`, the plan, the lane users' ACLs) reads this answer.

use tollgate_lanes::SubscriptionKind;
use tollgate_resp::Command;

use super::local::Local;

/// What a command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Connection-scoped: the daemon answers it (some once the policy admits them, see
    /// [`Local::needs_admission`]).
    Local(Local),
    /// `SUBSCRIBE` and the like: served from the shared PUBSUB lane.
    Subscription(SubscriptionKind, Subscribing),
    /// `LEASE …` or `COMMAND DOCS LEASE`: the lease service's (see `lease.rs`).
    Lease(LeaseCommand),
    /// Everything else: sent to Redis on the lane the policy names.
    Redis,
}

/// Which way a subscription command goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subscribing {
    Subscribe,
    Unsubscribe,
}

/// A command of the lease service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseCommand {
    /// `LEASE ACQUIRE|RENEW|RELEASE|INSPECT …`.
    Call,
    /// `LEASE WATCH|UNWATCH …`: changes the connection's watches (`lease_watch.rs`); allowed in
    /// RESP2 watch mode and while subscribed, as `SUBSCRIBE` is.
    Watch,
    /// `COMMAND DOCS LEASE`, exactly: Redis knows no LEASE, so the daemon describes it.
    Docs,
}

impl Kind {
    pub fn of(command: &Command) -> Kind {
        Kind::of_words(
            command.name(),
            command.word(1),
            command.word(2),
            command.len(),
        )
    }

    /// The kind of the commands a catalog name (`GET`, `CLIENT|SETNAME`) stands for.
    pub fn of_catalog(name: &str) -> Kind {
        match name.split_once('|') {
            Some((command, sub)) => {
                Kind::of_words(command.as_bytes(), Some(sub.as_bytes()), None, 2)
            }
            None => Kind::of_words(name.as_bytes(), None, None, 1),
        }
    }

    /// Asked of every command: compared in place rather than upper-cased into a new buffer.
    fn of_words(name: &[u8], first: Option<&[u8]>, second: Option<&[u8]>, len: usize) -> Kind {
        let is = |word: &[u8], expected: &[u8]| word.eq_ignore_ascii_case(expected);
        if is(name, b"LEASE") {
            let watch = first.is_some_and(|w| is(w, b"WATCH") || is(w, b"UNWATCH"));
            return Kind::Lease(match watch {
                true => LeaseCommand::Watch,
                false => LeaseCommand::Call,
            });
        }
        if len == 3
            && is(name, b"COMMAND")
            && first.is_some_and(|w| is(w, b"DOCS"))
            && second.is_some_and(|w| is(w, b"LEASE"))
        {
            return Kind::Lease(LeaseCommand::Docs);
        }
        if let Some(local) = Local::of(name, first) {
            return Kind::Local(local);
        }
        match SUBSCRIPTIONS.iter().find(|(word, ..)| is(name, word)) {
            Some(&(_, kind, way)) => Kind::Subscription(kind, way),
            None => Kind::Redis,
        }
    }

    /// Whether its reply reaches the client whatever `CLIENT REPLY` says: `CLIENT REPLY` itself
    /// (only `ON` answers, as in Redis) and subscription confirmations, which are out-of-band in
    /// Redis 7.
    pub fn always_heard(self) -> bool {
        matches!(
            self,
            Kind::Local(Local::ClientReply) | Kind::Subscription(..)
        )
    }
}

const SUBSCRIPTIONS: [(&[u8], SubscriptionKind, Subscribing); 6] = [
    (
        b"SUBSCRIBE",
        SubscriptionKind::Channel,
        Subscribing::Subscribe,
    ),
    (
        b"PSUBSCRIBE",
        SubscriptionKind::Pattern,
        Subscribing::Subscribe,
    ),
    (
        b"SSUBSCRIBE",
        SubscriptionKind::Shard,
        Subscribing::Subscribe,
    ),
    (
        b"UNSUBSCRIBE",
        SubscriptionKind::Channel,
        Subscribing::Unsubscribe,
    ),
    (
        b"PUNSUBSCRIBE",
        SubscriptionKind::Pattern,
        Subscribing::Unsubscribe,
    ),
    (
        b"SUNSUBSCRIBE",
        SubscriptionKind::Shard,
        Subscribing::Unsubscribe,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::resp::words::command;

    fn kind(words: &str) -> Kind {
        Kind::of(&command(words))
    }

    #[test]
    fn a_get_is_redis_s() {
        assert_eq!(kind("GET k"), Kind::Redis);
        assert_eq!(Kind::of_catalog("GET"), Kind::Redis);
    }

    #[test]
    fn connection_scoped_commands_are_local_in_any_case() {
        assert_eq!(kind("ping"), Kind::Local(Local::Ping));
        assert_eq!(
            kind("Client SetName app"),
            Kind::Local(Local::ClientSetName)
        );
        assert_eq!(
            Kind::of_catalog("CLIENT|LIST"),
            Kind::Local(Local::ClientList)
        );
        assert_eq!(kind("CLIENT PAUSE 10"), Kind::Redis);
    }

    #[test]
    fn subscription_commands_say_their_kind_and_way() {
        assert_eq!(
            kind("psubscribe news.*"),
            Kind::Subscription(SubscriptionKind::Pattern, Subscribing::Subscribe)
        );
        assert_eq!(
            kind("SUNSUBSCRIBE"),
            Kind::Subscription(SubscriptionKind::Shard, Subscribing::Unsubscribe)
        );
        assert_eq!(kind("PUBLISH ch hello"), Kind::Redis);
    }

    #[test]
    fn lease_commands_are_the_lease_service_s_and_only_command_docs_lease_exactly() {
        assert_eq!(kind("lease acquire r"), Kind::Lease(LeaseCommand::Call));
        assert_eq!(kind("COMMAND docs lease"), Kind::Lease(LeaseCommand::Docs));
        assert_eq!(kind("LEASE watch r"), Kind::Lease(LeaseCommand::Watch));
        assert_eq!(kind("lease UNWATCH"), Kind::Lease(LeaseCommand::Watch));
        assert_eq!(kind("LEASE WATCHDOG r"), Kind::Lease(LeaseCommand::Call));
        assert_eq!(kind("LEASE"), Kind::Lease(LeaseCommand::Call));
        assert_eq!(kind("COMMAND DOCS LEASE GET"), Kind::Redis);
        assert_eq!(kind("COMMAND DOCS"), Kind::Redis);
        assert_eq!(Kind::of_catalog("COMMAND|DOCS"), Kind::Redis);
    }

    #[test]
    fn only_client_reply_and_subscriptions_are_heard_whatever_client_reply_says() {
        assert!(kind("CLIENT REPLY ON").always_heard());
        assert!(kind("UNSUBSCRIBE").always_heard());
        assert!(!kind("PING").always_heard());
        assert!(!kind("GET k").always_heard());
    }
}
