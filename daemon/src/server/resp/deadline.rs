//! How long Redis may take to answer a command before the daemon gives up on its reply and closes
//! the connection it was sent on: the configured `resp.command_timeout`; for commands that say how
//! long they take (the blocking family, `WAIT`, `WAITAOF`, `DEBUG SLEEP`, `MIGRATE`) their own
//! timeout plus a grace; for commands known to run long without saying so (`SAVE`, `FLUSHALL`, …)
//! a per-command deadline (`resp.command_deadlines`, over the built-in ones); no limit for a
//! timeout of zero ("block forever", as Redis means it).
//!
//! The timeout is the client's: any spelling (huge, negative, NaN, `inf`) is read without panicking.
//! One that is no timeout Redis would accept is sent all the same, so that Redis answers it with
//! its own error.

use std::collections::BTreeMap;
use std::time::Duration;

use tollgate_resp::Command;

/// Extra time past the command's own timeout before the daemon gives up on the reply.
pub const GRACE: Duration = Duration::from_secs(2);

/// Commands that run long without saying how long, and the deadline each gets unless
/// `resp.command_deadlines` says otherwise: a synchronous save or flush of a large dataset takes
/// minutes, and a cut while it runs would only leave the client guessing.
pub const BUILT_IN: [(&str, Duration); 4] = [
    ("SAVE", Duration::from_secs(300)),
    ("FLUSHALL", Duration::from_secs(120)),
    ("FLUSHDB", Duration::from_secs(120)),
    ("DEBUG RELOAD", Duration::from_secs(300)),
];

/// The deadlines of the commands a session sends.
#[derive(Debug, Clone)]
pub struct Deadlines {
    command_timeout: Duration,
    /// Per command: `NAME` or `NAME SUBCOMMAND`, upper-case.
    per_command: BTreeMap<Vec<u8>, Duration>,
    /// The names `per_command` has entries for (their first words): asked of every command that
    /// `known` does not rule out, and for almost every one the answer is no, which this says
    /// without building a key.
    names: Vec<Vec<u8>>,
    /// Every name above or in [`LONG`], by first letter and length: most commands sent are ruled
    /// out by one load and a bit test, before any name is compared.
    known: Shapes,
}

/// A set of command names' shapes (first letter, ASCII case ignored, and length): a name whose
/// shape is not in the set is none of the names it was made of.
#[derive(Debug, Clone, Default)]
struct Shapes([u32; 27]);

impl Shapes {
    fn add(&mut self, name: &[u8]) {
        let (row, bit) = Shapes::place(name);
        self.0[row] |= bit;
    }

    /// Whether `name` may be one of the names added (`false`: it is none of them).
    fn may_hold(&self, name: &[u8]) -> bool {
        let (row, bit) = Shapes::place(name);
        self.0[row] & bit != 0
    }

    /// A row per letter (and one for the rest), a bit per length (the last for 31 and longer).
    fn place(name: &[u8]) -> (usize, u32) {
        let row = match name.first().map(u8::to_ascii_uppercase) {
            Some(letter @ b'A'..=b'Z') => usize::from(letter - b'A'),
            _ => 26,
        };
        (row, 1 << name.len().min(31))
    }
}

impl Deadlines {
    /// `configured` (names in any case) over [`BUILT_IN`].
    pub fn new(command_timeout: Duration, configured: &BTreeMap<String, Duration>) -> Self {
        let built_in = BUILT_IN.iter().map(|(name, deadline)| (*name, *deadline));
        let configured = configured
            .iter()
            .map(|(name, deadline)| (name.as_str(), *deadline));
        let per_command: BTreeMap<Vec<u8>, Duration> = built_in
            .chain(configured)
            .map(|(name, deadline)| (normalise(name), deadline))
            .collect();
        let mut names: Vec<Vec<u8>> = per_command
            .keys()
            .map(|key| {
                key.split(|&byte| byte == b' ')
                    .next()
                    .unwrap_or_default()
                    .to_vec()
            })
            .collect();
        names.dedup();
        let mut known = Shapes::default();
        for name in names.iter().map(Vec::as_slice).chain(LONG) {
            known.add(name);
        }
        Deadlines {
            command_timeout,
            per_command,
            names,
            known,
        }
    }

    /// The deadline for `argv`'s reply; `None` when the command may block forever.
    pub fn of(&self, argv: &[&[u8]]) -> Option<Duration> {
        let name = argv.first().copied().unwrap_or_default();
        match own_timeout(argv, self.command_timeout) {
            Some(own) => own,
            None => Some(self.per_command(name, argv.get(1).copied())),
        }
    }

    /// [`Deadlines::of`] `command`, whose words are only gathered for the few commands that say
    /// how long they take: this is asked of every command sent.
    pub fn of_command(&self, command: &Command) -> Option<Duration> {
        let name = command.name();
        if !self.known.may_hold(name) {
            return Some(self.command_timeout);
        }
        if says_how_long(name) {
            self.of(&command.argv())
        } else {
            Some(self.per_command(name, command.word(1)))
        }
    }

    /// The configured deadline of `name sub`, else of `name`, else the command timeout.
    fn per_command(&self, name: &[u8], sub: Option<&[u8]>) -> Duration {
        self.configured(name, sub).unwrap_or(self.command_timeout)
    }

    fn configured(&self, name: &[u8], sub: Option<&[u8]>) -> Option<Duration> {
        if !self
            .names
            .iter()
            .any(|known| known.eq_ignore_ascii_case(name))
        {
            return None;
        }
        // Upper-cased on the stack: no allocation for a lookup.
        let mut buffer = [0u8; 64];
        let mut key = |words: &[&[u8]]| -> Option<Duration> {
            let mut len = 0;
            for (at, word) in words.iter().enumerate() {
                let end = len + usize::from(at > 0) + word.len();
                let slot = buffer.get_mut(len..end)?;
                let (space, rest) = slot.split_at_mut(usize::from(at > 0));
                space.fill(b' ');
                rest.copy_from_slice(word);
                rest.make_ascii_uppercase();
                len = end;
            }
            self.per_command.get(&buffer[..len]).copied()
        };
        match sub {
            Some(sub) => key(&[name, sub]).or_else(|| key(&[name])),
            None => key(&[name]),
        }
    }
}

/// `DEBUG reload` and `debug  RELOAD` as the one key `DEBUG RELOAD`.
fn normalise(name: &str) -> Vec<u8> {
    name.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_uppercase()
        .into_bytes()
}

/// The deadline of a command that says how long it may take (`Some(None)`: forever); `None` for
/// every other command.
fn own_timeout(argv: &[&[u8]], command_timeout: Duration) -> Option<Option<Duration>> {
    let first = argv.first()?;
    // Only the few names below are upper-cased (and allocated); every other command is done here.
    if !says_how_long(first) {
        return None;
    }
    let name = first.to_ascii_uppercase();
    let arg = |at: usize| argv.get(at).copied();
    let own = match name.as_slice() {
        // Timeout in seconds, last argument.
        b"BLPOP" | b"BRPOP" | b"BRPOPLPUSH" | b"BLMOVE" | b"BZPOPMIN" | b"BZPOPMAX" => {
            argv.last().and_then(|last| seconds(last))
        }
        // Timeout in seconds, first argument.
        b"BLMPOP" | b"BZMPOP" => arg(1).and_then(seconds),
        // Timeout in milliseconds, last argument.
        b"WAIT" | b"WAITAOF" => argv.last().and_then(|last| millis(last)),
        // `MIGRATE host port key db timeout …`: milliseconds, the fifth argument, per I/O step;
        // Redis waits that long at most for the target to take the keys.
        b"MIGRATE" => arg(5).and_then(millis),
        // `BLOCK <ms>` option; without it the command does not block.
        b"XREAD" | b"XREADGROUP" => match block_option(argv) {
            Some(ms) => millis(ms),
            None => return Some(Some(command_timeout)),
        },
        // Sleeps as long as it is told: seconds, a float.
        b"DEBUG" if arg(1).is_some_and(|sub| sub.eq_ignore_ascii_case(b"SLEEP")) => {
            arg(2).and_then(seconds)
        }
        // `DEBUG` without `SLEEP` goes by its subcommand (`resp.command_deadlines`).
        _ => return None,
    };
    Some(match own {
        Some(timeout) if timeout.is_zero() && blocks_forever(&name, argv) => None,
        // Saturating: no client-given timeout may overflow the addition.
        Some(timeout) => Some(timeout.saturating_add(GRACE)),
        // A timeout the daemon cannot read is refused by Redis at once, or is one Redis reads in a
        // spelling Rust does not (`0x10`): the ordinary deadline bounds both.
        None => Some(command_timeout),
    })
}

/// Whether a command of this name may take as long as it says (a blocking command, `WAIT`,
/// `MIGRATE`, `DEBUG SLEEP`) rather than answering at once.
pub fn may_block(name: &[u8]) -> bool {
    says_how_long(name)
}

fn says_how_long(name: &[u8]) -> bool {
    LONG.iter().any(|long| name.eq_ignore_ascii_case(long))
}

/// The commands [`own_timeout`] reads a timeout from.
const LONG: [&[u8]; 14] = [
    b"BLPOP",
    b"BRPOP",
    b"BRPOPLPUSH",
    b"BLMOVE",
    b"BZPOPMIN",
    b"BZPOPMAX",
    b"BLMPOP",
    b"BZMPOP",
    b"WAIT",
    b"WAITAOF",
    b"MIGRATE",
    b"XREAD",
    b"XREADGROUP",
    b"DEBUG",
];

/// A zero timeout means "forever" for the blocking family, but "do not block" for the rest.
fn blocks_forever(name: &[u8], argv: &[&[u8]]) -> bool {
    match name {
        b"XREAD" | b"XREADGROUP" => block_option(argv).is_some(),
        b"BLPOP" | b"BRPOP" | b"BRPOPLPUSH" | b"BLMOVE" | b"BZPOPMIN" | b"BZPOPMAX" | b"BLMPOP"
        | b"BZMPOP" | b"WAIT" | b"WAITAOF" => true,
        _ => false,
    }
}

fn block_option<'a>(argv: &[&'a [u8]]) -> Option<&'a [u8]> {
    let position = argv
        .iter()
        .position(|arg| arg.eq_ignore_ascii_case(b"BLOCK"))?;
    argv.get(position + 1).copied()
}

/// Seconds as Redis reads them (a float); `None` for what no `Duration` holds: negative, NaN,
/// infinite or too large, which Redis refuses too (`timeout is negative` / `out of range`).
fn seconds(arg: &[u8]) -> Option<Duration> {
    let value: f64 = std::str::from_utf8(arg).ok()?.parse().ok()?;
    Duration::try_from_secs_f64(value).ok()
}

fn millis(arg: &[u8]) -> Option<Duration> {
    let value: u64 = std::str::from_utf8(arg).ok()?.parse().ok()?;
    Some(Duration::from_millis(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::resp::words::argv;

    const ORDINARY: Duration = Duration::from_secs(10);

    fn deadline(words: &str) -> Option<Duration> {
        Deadlines::new(ORDINARY, &BTreeMap::new()).of(&argv(words))
    }

    #[test]
    fn a_command_sent_has_the_deadline_its_words_give_whatever_its_shape() {
        let configured = BTreeMap::from([
            ("cluster setslot".to_owned(), Duration::from_secs(7)),
            ("Keys".to_owned(), Duration::from_secs(30)),
            (
                "a-very-long-command-name-of-over-thirty-one-bytes".to_owned(),
                Duration::from_secs(9),
            ),
        ]);
        let deadlines = Deadlines::new(ORDINARY, &configured);
        for words in [
            "GET a",
            "get a",
            "SET a b",
            "INCR a",
            "LPUSH l a",
            "MSET a 1 b 2",
            "LRANGE l 0 9",
            "BLPOP a 1.5",
            "blpop a 0",
            "brpoplpush a b 3",
            "XREAD BLOCK 250 STREAMS s 0",
            "xreadgroup GROUP g c STREAMS s >",
            "WAIT 1 100",
            "waitaof 0 1 50",
            "DEBUG SLEEP 2",
            "debug reload",
            "SAVE",
            "save",
            "FLUSHALL",
            "flushdb async",
            "CLUSTER SETSLOT 1 STABLE",
            "cluster info",
            "KEYS *",
            "keys *",
            "KEY",
            "SAVES",
            "a-very-long-command-name-of-over-thirty-one-bytes",
            "a-very-long-command-name-of-over-thirty-one-bytes-and-more",
            "MIGRATE h 1 k 0 5000",
            "1",
            "@",
            "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
        ] {
            let command = crate::server::resp::words::command(words);
            assert_eq!(
                deadlines.of_command(&command),
                deadlines.of(&argv(words)),
                "{words:?}"
            );
        }
    }

    #[test]
    fn shapes_rule_out_only_names_they_were_not_given() {
        let mut shapes = Shapes::default();
        for name in [&b"BLPOP"[..], b"save", b"x", b"", b"0DAY"] {
            shapes.add(name);
        }
        for name in [
            &b"blpop"[..],
            b"BRPOP",
            b"SAVE",
            b"sane",
            b"X",
            b"",
            b"0day",
            b"9DAY",
        ] {
            assert!(shapes.may_hold(name), "{name:?}");
        }
        for name in [&b"GET"[..], b"BLPOPS", b"SAV", b"xy", b"A", b"save!"] {
            assert!(!shapes.may_hold(name), "{name:?}");
        }
    }

    #[test]
    fn commands_that_take_long_use_their_own_timeout_plus_grace() {
        assert_eq!(
            deadline("BLPOP a b 1.5"),
            Some(Duration::from_millis(1500) + GRACE)
        );
        assert_eq!(
            deadline("blmpop 3 2 a b LEFT"),
            Some(Duration::from_secs(3) + GRACE)
        );
        assert_eq!(
            deadline("XREAD BLOCK 250 STREAMS s 0"),
            Some(Duration::from_millis(250) + GRACE)
        );
        assert_eq!(
            deadline("WAIT 1 100"),
            Some(Duration::from_millis(100) + GRACE)
        );
        assert_eq!(
            deadline("debug sleep 30"),
            Some(Duration::from_secs(30) + GRACE)
        );
        assert_eq!(deadline("DEBUG SLEEP 0"), Some(GRACE));
    }

    #[test]
    fn every_other_command_gets_the_command_timeout() {
        for command in [
            "INFO",
            "SAVEX",
            "XREAD STREAMS s 0",
            "DEBUG OBJECT k",
            "BLPOP",
            "DEBUG SLEEP",
        ] {
            assert_eq!(deadline(command), Some(ORDINARY), "{command}");
        }
        let deadlines = Deadlines::new(ORDINARY, &BTreeMap::new());
        assert_eq!(deadlines.of(&[]), Some(ORDINARY));
    }

    #[test]
    fn commands_known_to_run_long_get_their_own_deadline_which_the_config_can_change() {
        assert_eq!(deadline("save"), Some(Duration::from_secs(300)));
        assert_eq!(deadline("FLUSHALL SYNC"), Some(Duration::from_secs(120)));
        assert_eq!(deadline("debug Reload"), Some(Duration::from_secs(300)));
        assert_eq!(
            deadline("MIGRATE host 6379 k 0 5000"),
            Some(Duration::from_secs(5) + GRACE)
        );
        let configured = BTreeMap::from([
            ("eval".to_owned(), Duration::from_secs(60)),
            ("SAVE".to_owned(), Duration::from_secs(30)),
            ("script  flush".to_owned(), Duration::from_secs(20)),
        ]);
        let deadlines = Deadlines::new(ORDINARY, &configured);
        let of = |words: &str| deadlines.of(&argv(words));
        assert_eq!(of("EVAL return 0"), Some(Duration::from_secs(60)));
        assert_eq!(of("SAVE"), Some(Duration::from_secs(30)));
        assert_eq!(of("SCRIPT FLUSH"), Some(Duration::from_secs(20)));
        assert_eq!(of("SCRIPT EXISTS x"), Some(ORDINARY));
        // Longer than any key the map holds: the ordinary deadline, no panic.
        let long = format!("GET {}", "k".repeat(100));
        assert_eq!(of(&long), Some(ORDINARY));
        assert_eq!(of(&"K".repeat(100)), Some(ORDINARY));
        // A command that says how long it takes goes by that, whatever the map says.
        let configured = BTreeMap::from([("BLPOP".to_owned(), Duration::from_secs(1))]);
        let deadlines = Deadlines::new(ORDINARY, &configured);
        assert_eq!(deadlines.of(&argv("BLPOP q 0")), None);
    }

    #[test]
    fn zero_means_forever_only_where_redis_says_so() {
        assert_eq!(deadline("BRPOP q 0"), None);
        assert_eq!(deadline("XREAD BLOCK 0 STREAMS s $"), None);
        assert_eq!(deadline("XREAD STREAMS s 0"), Some(ORDINARY));
    }

    #[test]
    fn unreadable_timeouts_get_the_command_timeout() {
        assert_eq!(deadline("BLPOP q soon"), Some(ORDINARY));
        // Redis reads hex floats; the daemon does not, and must not cut it short at the grace.
        assert_eq!(deadline("BLPOP q 0x10"), Some(ORDINARY));
    }

    #[test]
    fn any_timeout_a_client_sends_is_read_without_panicking() {
        for timeout in [
            "1e308", "1e300", "-1", "-1e308", "nan", "NaN", "inf", "-inf", "1e400", "-0",
        ] {
            for command in [
                format!("BLPOP q {timeout}"),
                format!("BZPOPMIN z {timeout}"),
                format!("BLMPOP {timeout} 1 q LEFT"),
                format!("BRPOPLPUSH a b {timeout}"),
                format!("BLMOVE a b LEFT RIGHT {timeout}"),
                format!("DEBUG SLEEP {timeout}"),
            ] {
                let limit = deadline(&command);
                assert!(
                    limit.is_none_or(|limit| limit >= GRACE),
                    "{command}: {limit:?}"
                );
            }
        }
        // Redis reads `-0` as zero: forever.
        assert_eq!(deadline("BLPOP q -0"), None);
        assert!(deadline("BLPOP q 1.8e19").is_some_and(|limit| limit > GRACE));
        assert_eq!(
            deadline("WAIT 1 18446744073709551615"),
            Some(Duration::from_millis(u64::MAX) + GRACE)
        );
        assert_eq!(deadline("XREAD BLOCK -5 STREAMS s 0"), Some(ORDINARY));
    }
}
