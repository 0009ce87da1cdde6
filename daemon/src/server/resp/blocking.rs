//! How long a blocking command may hold its BLOCKING connection: its own timeout plus a grace, or no
//! limit for a timeout of zero ("block forever", as Redis means it).
//!
//! The timeout is the client's: any spelling (huge, negative, NaN, `inf`) is read without panicking.
//! One that is no timeout Redis would accept is sent all the same, so that Redis answers it with
//! its own error.

use std::time::Duration;

/// Extra time past the command's own timeout before the daemon gives up on the reply.
pub const GRACE: Duration = Duration::from_secs(2);

/// The deadline for `argv`'s reply; `None` when the command may block forever.
pub fn deadline(argv: &[&[u8]]) -> Option<Duration> {
    let name = argv.first()?.to_ascii_uppercase();
    let timeout = match name.as_slice() {
        // Timeout in seconds, last argument.
        b"BLPOP" | b"BRPOP" | b"BRPOPLPUSH" | b"BLMOVE" | b"BZPOPMIN" | b"BZPOPMAX" => {
            seconds(argv.last()?)
        }
        // Timeout in seconds, first argument.
        b"BLMPOP" | b"BZMPOP" => seconds(argv.get(1)?),
        // Timeout in milliseconds, last argument.
        b"WAIT" | b"WAITAOF" => millis(argv.last()?),
        // `BLOCK <ms>` option; without it the command does not block.
        b"XREAD" | b"XREADGROUP" => match block_option(argv) {
            Some(ms) => millis(ms),
            None => Some(Duration::ZERO),
        },
        _ => Some(Duration::ZERO),
    };
    // A timeout we cannot read is left to Redis to reject; give it the grace period to answer.
    match timeout {
        Some(timeout) if timeout.is_zero() && blocks_forever(&name, argv) => None,
        // Saturating: no client-given timeout may overflow the addition.
        Some(timeout) => Some(timeout.saturating_add(GRACE)),
        None => Some(GRACE),
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

    #[test]
    fn blocking_family_uses_its_own_timeout_plus_grace() {
        assert_eq!(
            deadline(&argv("BLPOP a b 1.5")),
            Some(Duration::from_millis(1500) + GRACE)
        );
        assert_eq!(
            deadline(&argv("blmpop 3 2 a b LEFT")),
            Some(Duration::from_secs(3) + GRACE)
        );
        assert_eq!(
            deadline(&argv("XREAD BLOCK 250 STREAMS s 0")),
            Some(Duration::from_millis(250) + GRACE)
        );
        assert_eq!(
            deadline(&argv("WAIT 1 100")),
            Some(Duration::from_millis(100) + GRACE)
        );
    }

    #[test]
    fn zero_means_forever_only_where_redis_says_so() {
        assert_eq!(deadline(&argv("BRPOP q 0")), None);
        assert_eq!(deadline(&argv("XREAD BLOCK 0 STREAMS s $")), None);
        assert_eq!(deadline(&argv("XREAD STREAMS s 0")), Some(GRACE));
    }

    #[test]
    fn unreadable_timeouts_get_the_grace_period() {
        assert_eq!(deadline(&argv("BLPOP q soon")), Some(GRACE));
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
            ] {
                let limit = deadline(&argv(&command));
                assert!(
                    limit.is_none_or(|limit| limit >= GRACE),
                    "{command}: {limit:?}"
                );
            }
        }
        // Redis reads `-0` as zero: forever.
        assert_eq!(deadline(&argv("BLPOP q -0")), None);
        assert!(deadline(&argv("BLPOP q 1.8e19")).is_some_and(|limit| limit > GRACE));
        assert_eq!(
            deadline(&argv("WAIT 1 18446744073709551615")),
            Some(Duration::from_millis(u64::MAX) + GRACE)
        );
        assert_eq!(deadline(&argv("XREAD BLOCK -5 STREAMS s 0")), Some(GRACE));
    }
}
