//! The words of `CLIENT TRACKING` and `CLIENT CACHING`, read as Redis 7.0's `clientCommand` reads
//! them (`src/networking.c`), and every error either can answer, in Redis's words: clients and
//! Redis's own test suite match on them. Options are read left to right and the first bad one is
//! the error (so `REDIRECT` to a client that does not exist is refused even with `OFF`); the rules
//! that need the client's state are [`super::client`]'s.

use std::fmt;

use bytes::Bytes;

use super::ClientId;

/// `CLIENT TRACKING ON` or `OFF`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    On,
    Off,
}

/// The options of `CLIENT TRACKING`, as given (not yet checked against each other).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `REDIRECT id`: a client that existed when the command was read.
    pub redirect: Option<ClientId>,
    pub bcast: bool,
    pub optin: bool,
    pub optout: bool,
    pub noloop: bool,
    /// `PREFIX p`, in the order given.
    pub prefixes: Vec<Bytes>,
}

/// A `CLIENT TRACKING` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub switch: Switch,
    pub options: Options,
}

/// Why `CLIENT TRACKING` or `CLIENT CACHING` is refused: the error line Redis 7.0 answers, less
/// its `-`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrackingError {
    /// The command table's arity check (`client|tracking`, `client|caching` …).
    #[error("ERR wrong number of arguments for '{0}' command")]
    Arity(&'static str),
    #[error("ERR syntax error")]
    Syntax,
    /// `REDIRECT` not followed by an integer (`getLongLongFromObjectOrReply`).
    #[error("ERR value is not an integer or out of range")]
    NotAnInteger,
    #[error("ERR A client can only redirect to a single other client")]
    SecondRedirect,
    #[error("ERR The client ID you want redirect to does not exist")]
    NoSuchClient,
    #[error("ERR PREFIX option requires BCAST mode to be enabled")]
    PrefixWithoutBcast,
    #[error(
        "ERR You can't switch BCAST mode on/off before disabling tracking for this client, and \
         then re-enabling it with a different mode."
    )]
    BcastSwitch,
    #[error("ERR OPTIN and OPTOUT are not compatible with BCAST")]
    OptWithBcast,
    #[error("ERR You can't specify both OPTIN mode and OPTOUT mode")]
    OptInAndOptOut,
    #[error(
        "ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and \
         then re-enabling it with a different mode."
    )]
    OptSwitch,
    #[error(
        "ERR Prefix '{}' overlaps with an existing prefix '{}'. Prefixes for a single client must \
         not overlap.",
        Shown(.prefix),
        Shown(.existing)
    )]
    OverlapsExisting { prefix: Bytes, existing: Bytes },
    #[error(
        "ERR Prefix '{}' overlaps with another provided prefix '{}'. Prefixes for a single client \
         must not overlap.",
        Shown(.prefix),
        Shown(.other)
    )]
    OverlapsGiven { prefix: Bytes, other: Bytes },
    #[error(
        "ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or \
         OPTOUT mode enabled"
    )]
    CachingNotTracking,
    #[error("ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.")]
    CachingYesWithoutOptIn,
    #[error("ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.")]
    CachingNoWithoutOptOut,
}

/// A prefix in an error line as Redis's `%s` shows it: up to its first NUL, with CR and LF made
/// spaces (`addReplyErrorFormat`), so that the line stays one line.
struct Shown<'a>(&'a Bytes);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0.split(|&byte| byte == 0).next().unwrap_or_default();
        let text = String::from_utf8_lossy(text).replace(['\r', '\n'], " ");
        f.write_str(&text)
    }
}

impl Request {
    /// The words after `CLIENT TRACKING`; `exists` tells whether a client id is connected now
    /// (Redis checks `REDIRECT` as it reads it, `lookupClientByID`).
    pub fn parse(args: &[&[u8]], exists: impl Fn(ClientId) -> bool) -> Result<Self, TrackingError> {
        let Some((switch, options)) = args.split_first() else {
            return Err(TrackingError::Arity("client|tracking"));
        };
        let mut parsed = Options::default();
        let mut words = options.iter();
        while let Some(word) = words.next() {
            // An option that takes a value and has none left falls through to a syntax error.
            let more = !words.as_slice().is_empty();
            if word.eq_ignore_ascii_case(b"redirect") && more {
                let id = words.next().copied().unwrap_or_default();
                if parsed.redirect.is_some() {
                    return Err(TrackingError::SecondRedirect);
                }
                let id = parse_integer(id).ok_or(TrackingError::NotAnInteger)?;
                // Ids start at 1: 0 and negative ids name no client.
                match u64::try_from(id) {
                    Ok(id) if id > 0 && exists(id) => parsed.redirect = Some(id),
                    _ => return Err(TrackingError::NoSuchClient),
                }
            } else if word.eq_ignore_ascii_case(b"bcast") {
                parsed.bcast = true;
            } else if word.eq_ignore_ascii_case(b"optin") {
                parsed.optin = true;
            } else if word.eq_ignore_ascii_case(b"optout") {
                parsed.optout = true;
            } else if word.eq_ignore_ascii_case(b"noloop") {
                parsed.noloop = true;
            } else if word.eq_ignore_ascii_case(b"prefix") && more {
                let prefix = words.next().copied().unwrap_or_default();
                parsed.prefixes.push(Bytes::copy_from_slice(prefix));
            } else {
                return Err(TrackingError::Syntax);
            }
        }
        let switch = if switch.eq_ignore_ascii_case(b"on") {
            Switch::On
        } else if switch.eq_ignore_ascii_case(b"off") {
            Switch::Off
        } else {
            return Err(TrackingError::Syntax);
        };
        Ok(Request {
            switch,
            options: parsed,
        })
    }
}

/// `CLIENT CACHING YES` or `NO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caching {
    Yes,
    No,
}

impl Caching {
    /// The words after `CLIENT CACHING`, or `Ok(None)` for a word that is neither `yes` nor `no`:
    /// Redis says so (a syntax error) only after it checked that the client tracks.
    pub fn parse(args: &[&[u8]]) -> Result<Option<Self>, TrackingError> {
        let [word] = args else {
            return Err(TrackingError::Arity("client|caching"));
        };
        Ok(if word.eq_ignore_ascii_case(b"yes") {
            Some(Caching::Yes)
        } else if word.eq_ignore_ascii_case(b"no") {
            Some(Caching::No)
        } else {
            None
        })
    }
}

/// An integer as Redis's `string2ll` reads one: optional `-`, no `+`, no spaces, no leading zeros,
/// within 64 bits.
fn parse_integer(word: &[u8]) -> Option<i64> {
    let digits = word.strip_prefix(b"-").unwrap_or(word);
    let canonical = match digits {
        [b'0'] => word.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !canonical {
        return None;
    }
    std::str::from_utf8(word).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<&[u8]> {
        line.split_whitespace().map(str::as_bytes).collect()
    }

    fn parse(line: &str) -> Result<Request, TrackingError> {
        Request::parse(&words(line), |id| id == 7)
    }

    #[test]
    fn options_are_read_case_insensitively_in_any_order() {
        let request = parse("on Redirect 7 bcast PREFIX a: prefix b: NoLoop").unwrap();
        assert_eq!(request.switch, Switch::On);
        assert_eq!(
            request.options,
            Options {
                redirect: Some(7),
                bcast: true,
                noloop: true,
                prefixes: vec![Bytes::from_static(b"a:"), Bytes::from_static(b"b:")],
                ..Options::default()
            }
        );
        assert_eq!(parse("OFF").unwrap().switch, Switch::Off);
    }

    /// networking.c, `clientCommand`, "tracking": the option loop runs before ON/OFF is looked
    /// at, each error as it is met.
    #[test]
    fn the_first_bad_option_is_the_error() {
        assert_eq!(parse("maybe"), Err(TrackingError::Syntax));
        assert_eq!(parse("on frobnicate"), Err(TrackingError::Syntax));
        // REDIRECT and PREFIX without their value are unknown words.
        assert_eq!(parse("on redirect"), Err(TrackingError::Syntax));
        assert_eq!(parse("on bcast prefix"), Err(TrackingError::Syntax));
        assert_eq!(parse("on redirect x"), Err(TrackingError::NotAnInteger));
        assert_eq!(parse("on redirect 07"), Err(TrackingError::NotAnInteger));
        assert_eq!(parse("on redirect +7"), Err(TrackingError::NotAnInteger));
        assert_eq!(parse("on redirect 8"), Err(TrackingError::NoSuchClient));
        assert_eq!(parse("on redirect 0"), Err(TrackingError::NoSuchClient));
        assert_eq!(parse("on redirect -7"), Err(TrackingError::NoSuchClient));
        // Even when turning tracking off: `lookupClientByID` runs in the option loop.
        assert_eq!(parse("off redirect 8"), Err(TrackingError::NoSuchClient));
        // The second REDIRECT is refused before its value is read.
        assert_eq!(
            parse("on redirect 7 redirect x"),
            Err(TrackingError::SecondRedirect)
        );
        // Left to right: the redirect is checked before the unknown word after it.
        assert_eq!(
            parse("on redirect 8 junk"),
            Err(TrackingError::NoSuchClient)
        );
        assert_eq!(parse("on junk redirect 8"), Err(TrackingError::Syntax));
        // The switch is read last.
        assert_eq!(parse("maybe redirect 8"), Err(TrackingError::NoSuchClient));
        assert_eq!(
            Request::parse(&[], |_| true),
            Err(TrackingError::Arity("client|tracking"))
        );
    }

    #[test]
    fn errors_read_as_redis_writes_them() {
        assert_eq!(
            TrackingError::OverlapsExisting {
                prefix: Bytes::from_static(b"FO"),
                existing: Bytes::from_static(b"FOO"),
            }
            .to_string(),
            "ERR Prefix 'FO' overlaps with an existing prefix 'FOO'. Prefixes for a single \
             client must not overlap."
        );
        assert_eq!(
            TrackingError::BcastSwitch.to_string(),
            "ERR You can't switch BCAST mode on/off before disabling tracking for this client, \
             and then re-enabling it with a different mode."
        );
        assert_eq!(
            TrackingError::Arity("client|caching").to_string(),
            "ERR wrong number of arguments for 'client|caching' command"
        );
        // A prefix keeps the error on one line, and stops at a NUL as `%s` does.
        assert_eq!(
            TrackingError::OverlapsGiven {
                prefix: Bytes::from_static(b"a\r\nb"),
                other: Bytes::from_static(b"a\0zzz"),
            }
            .to_string(),
            "ERR Prefix 'a  b' overlaps with another provided prefix 'a'. Prefixes for a single \
             client must not overlap."
        );
    }

    #[test]
    fn caching_takes_one_word() {
        assert_eq!(Caching::parse(&words("YES")), Ok(Some(Caching::Yes)));
        assert_eq!(Caching::parse(&words("no")), Ok(Some(Caching::No)));
        assert_eq!(Caching::parse(&words("maybe")), Ok(None));
        assert_eq!(
            Caching::parse(&words("yes please")),
            Err(TrackingError::Arity("client|caching"))
        );
    }

    #[test]
    fn integers_are_read_as_string2ll_reads_them() {
        assert_eq!(parse_integer(b"0"), Some(0));
        assert_eq!(parse_integer(b"-12"), Some(-12));
        assert_eq!(parse_integer(b"9223372036854775807"), Some(i64::MAX));
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"00",
            b" 1",
            b"1 ",
            b"+1",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_integer(bad), None, "{bad:?}");
        }
    }
}
