//! How long a command may hold the BLOCKING or ADMIN connection it borrowed before the daemon
//! gives up on its reply and closes the connection: the configured `resp.command_timeout`, or for
//! commands known to take long (the blocking family, `WAIT`, `DEBUG SLEEP`) their own timeout
//! plus a grace, or no limit for a timeout of zero ("block forever", as Redis means it).
//!
//! The timeout is the client's: any spelling (huge, negative, NaN, `inf`) is read without panicking.
//! One that is no timeout Redis would accept is sent all the same, so that Redis answers it with
//! its own error.

use std::time::Duration;

/// Extra time past the command's own timeout before the daemon gives up on the reply.
pub const GRACE: Duration = Duration::from_secs(2);

/// The deadline for `argv`'s reply; `None` when the command may block forever.
pub fn of(argv: &[&[u8]], command_timeout: Duration) -> Option<Duration> {
    let Some(name) = argv.first().map(|name| name.to_ascii_uppercase()) else {
        return Some(command_timeout);
    };
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
        // `BLOCK <ms>` option; without it the command does not block.
        b"XREAD" | b"XREADGROUP" => match block_option(argv) {
            Some(ms) => millis(ms),
            None => return Some(command_timeout),
        },
        // Sleeps as long as it is told: seconds, a float.
        b"DEBUG" if arg(1).is_some_and(|sub| sub.eq_ignore_ascii_case(b"SLEEP")) => {
            arg(2).and_then(seconds)
        }
        _ => return Some(command_timeout),
    };
    match own {
        Some(timeout) if timeout.is_zero() && blocks_forever(&name, argv) => None,
        // Saturating: no client-given timeout may overflow the addition.
        Some(timeout) => Some(timeout.saturating_add(GRACE)),
        // A timeout the daemon cannot read is refused by Redis at once, or is one Redis reads in a
        // spelling Rust does not (`0x10`): the ordinary deadline bounds both.
        None => Some(command_timeout),
    }
}

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
    use crate::server::resp::argv;

    const ORDINARY: Duration = Duration::from_secs(10);

    fn deadline(words: &str) -> Option<Duration> {
        of(&argv(words), ORDINARY)
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
            "SAVE",
            "XREAD STREAMS s 0",
            "DEBUG OBJECT k",
            "BLPOP",
            "DEBUG SLEEP",
        ] {
            assert_eq!(deadline(command), Some(ORDINARY), "{command}");
        }
        assert_eq!(of(&[], ORDINARY), Some(ORDINARY));
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
