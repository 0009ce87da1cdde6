//! Which arguments of a command are pub/sub channels, and whether a rule's channel globs grant
//! them. The one list of channel positions: the host's reserved-keyspace check, the packing of
//! arguments for guards (channels cross whole, as keys do) and the `yaml-guard`'s evaluation all
//! read [`positions`].
//!
//! Three kinds of names: plain channels (`PUBLISH`, `SUBSCRIBE`, `PUBSUB NUMSUB`), shard channels
//! (`SPUBLISH`, `SSUBSCRIBE`: the catalog also lists them as keys, so a rule's `keys:` vouches for
//! them as before) and patterns (`PSUBSCRIBE`, and the pattern of `PUBSUB CHANNELS`). A pattern is
//! granted only when every channel it can match is (containment of globs, [`crate::relation`]),
//! and only when it is *plain*: written so that this crate's reading of a glob and Redis's
//! `stringmatchlen` cannot differ (they do on `[]]`, `[a-]`, escapes inside classes and ranges
//! past `\x7f`), so what the containment proves is what Redis will match.
//!
//! The unsubscribe commands name no channel they could reach (they only leave subscriptions the
//! connection holds), so they are not here: a rule without `channels:` grants them.

use std::ops::Range;

use crate::glob::{self, Piece};
use crate::relation::relate_union;

/// How a command names its channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Channels, matched literally (`PUBLISH`, `SUBSCRIBE`, `PUBSUB NUMSUB`).
    Plain,
    /// Shard channels, which are also the command's keys (`SPUBLISH`, `SSUBSCRIBE`).
    Shard,
    /// Patterns, each standing for every channel it matches (`PSUBSCRIBE`, `PUBSUB CHANNELS`).
    Pattern,
}

/// The channels of `name` (canonical: `PUBLISH`, `PUBSUB|NUMSUB`) called with `argc` arguments
/// (the name counted): how it names them and where they are. `None`: it names no channel.
pub fn positions(name: &str, argc: usize) -> Option<(Kind, Range<usize>)> {
    let (kind, start, end) = match name {
        "PUBLISH" => (Kind::Plain, 1, 2),
        "SUBSCRIBE" => (Kind::Plain, 1, argc),
        "PSUBSCRIBE" => (Kind::Pattern, 1, argc),
        "SPUBLISH" => (Kind::Shard, 1, 2),
        "SSUBSCRIBE" => (Kind::Shard, 1, argc),
        "PUBSUB|NUMSUB" | "PUBSUB|SHARDNUMSUB" => (Kind::Plain, 2, argc),
        "PUBSUB|CHANNELS" | "PUBSUB|SHARDCHANNELS" => (Kind::Pattern, 2, 3),
        _ => return None,
    };
    let end = end.min(argc);
    (start < end).then_some((kind, start..end))
}

/// The channels `argv` (the name first) names, if any.
pub fn of<'a, A>(name: &str, argv: &'a [A]) -> Option<(Kind, &'a [A])> {
    positions(name, argv.len()).map(|(kind, at)| (kind, &argv[at]))
}

/// Whether every channel a command names is one `globs` grant: a plain or shard channel when a
/// glob matches it, a pattern when it is plain and every channel it matches is matched by some
/// glob. Nothing named: nothing granted.
pub fn granted<A: AsRef<[u8]>>(globs: &[String], kind: Kind, names: &[A]) -> bool {
    !names.is_empty()
        && names.iter().all(|name| match kind {
            Kind::Plain | Kind::Shard => any_matches(globs, name.as_ref()),
            Kind::Pattern => {
                is_plain(name.as_ref()) && relation(globs, name.as_ref()).is_some_and(|r| r.within)
            }
        })
}

/// Whether some channel a command names may be one `globs` protect: a plain or shard channel
/// when a glob matches it, a pattern when some channel matches both it and a glob, or when
/// that cannot be told (a pattern that is not plain, or too costly to compare).
pub fn hit<A: AsRef<[u8]>>(globs: &[String], kind: Kind, names: &[A]) -> bool {
    names.iter().any(|name| match kind {
        Kind::Plain | Kind::Shard => any_matches(globs, name.as_ref()),
        Kind::Pattern => {
            !is_plain(name.as_ref()) || relation(globs, name.as_ref()).is_none_or(|r| r.overlap)
        }
    })
}

fn any_matches(globs: &[String], channel: &[u8]) -> bool {
    globs
        .iter()
        .any(|pattern| glob::matches(pattern.as_bytes(), channel))
}

fn relation(globs: &[String], pattern: &[u8]) -> Option<crate::relation::Relation> {
    let globs: Vec<Vec<Piece>> = globs.iter().map(|g| glob::pieces(g.as_bytes())).collect();
    let union: Vec<&[Piece]> = globs.iter().map(Vec::as_slice).collect();
    relate_union(&glob::pieces(pattern), &union)
}

/// Whether `pattern` reads the same to [`glob::matches`] and to Redis's `stringmatchlen`: outside
/// classes any byte, `*`, `?` or `\` with the byte it escapes; each class `[`, an optional `^`,
/// then one or more items, each a printable ASCII byte or two joined by `-` (never `\`, `[`,
/// `]`, `-` or `^` as an item), then `]`.
pub fn is_plain(pattern: &[u8]) -> bool {
    let item =
        |byte: u8| byte.is_ascii_graphic() && !matches!(byte, b'\\' | b'[' | b']' | b'-' | b'^');
    let mut i = 0;
    while i < pattern.len() {
        match pattern[i] {
            b'\\' if i + 1 < pattern.len() => i += 2,
            b'\\' => return false,
            b'[' => {
                i += 1;
                if pattern.get(i) == Some(&b'^') {
                    i += 1;
                }
                let mut items = 0;
                loop {
                    match pattern.get(i) {
                        Some(b']') if items > 0 => break,
                        Some(&low) if item(low) => {
                            if pattern.get(i + 1) == Some(&b'-') {
                                match pattern.get(i + 2) {
                                    Some(&high) if item(high) => i += 3,
                                    _ => return false,
                                }
                            } else {
                                i += 1;
                            }
                            items += 1;
                        }
                        _ => return false,
                    }
                }
                i += 1;
            }
            b']' => return false,
            _ => i += 1,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn globs(list: &[&str]) -> Vec<String> {
        list.iter().map(|g| (*g).to_owned()).collect()
    }

    #[test]
    fn positions_name_the_channels_of_each_pubsub_command() {
        let argv = ["PUBLISH", "acme:chan", "hello"];
        assert_eq!(of("PUBLISH", &argv), Some((Kind::Plain, &argv[1..2])));
        let argv = ["SUBSCRIBE", "a", "b", "c"];
        assert_eq!(of("SUBSCRIBE", &argv), Some((Kind::Plain, &argv[1..])));
        assert_eq!(of("PSUBSCRIBE", &argv).map(|(k, _)| k), Some(Kind::Pattern));
        assert_eq!(of("SSUBSCRIBE", &argv).map(|(k, _)| k), Some(Kind::Shard));
        let argv = ["PUBSUB", "CHANNELS", "acme:*"];
        assert_eq!(
            of("PUBSUB|CHANNELS", &argv),
            Some((Kind::Pattern, &argv[2..]))
        );
        // Without a pattern PUBSUB CHANNELS names no channel: it lists every one.
        assert_eq!(of("PUBSUB|CHANNELS", &argv[..2]), None);
        let argv = ["PUBSUB", "NUMSUB", "a", "b"];
        assert_eq!(of("PUBSUB|NUMSUB", &argv), Some((Kind::Plain, &argv[2..])));
        assert_eq!(of("PUBSUB|NUMPAT", &argv[..2]), None);
        assert_eq!(of("UNSUBSCRIBE", &["UNSUBSCRIBE", "x"]), None);
        assert_eq!(of("GET", &["GET", "x"]), None);
    }

    #[test]
    fn a_channel_is_granted_when_a_glob_matches_it_and_every_one_must_be() {
        let acme = globs(&["acme:*"]);
        assert!(granted(&acme, Kind::Plain, &["acme:chan"]));
        assert!(!granted(&acme, Kind::Plain, &["globex:chan"]));
        assert!(!granted(&acme, Kind::Plain, &["acme:a", "globex:b"]));
        let none: [&str; 0] = [];
        assert!(!granted(&acme, Kind::Plain, &none));
        assert!(hit(&acme, Kind::Plain, &["globex:b", "acme:a"]));
        assert!(!hit(&acme, Kind::Plain, &["globex:b"]));
    }

    /// The tricky patterns: a pattern is granted only when every channel it can match is.
    #[test]
    fn a_pattern_is_granted_only_when_every_channel_it_matches_is() {
        let acme = globs(&["acme:*"]);
        let cases: &[(&str, bool)] = &[
            ("acme:*", true),
            ("acme:[ab]*", true),
            ("acme:?", true),
            ("acme:news", true),
            ("acme:\\*", true),
            ("acme:[^x]*", true),
            ("*", false),
            // `acme*` matches `acmex`, which acme:* does not grant.
            ("acme*", false),
            ("acme?*", false),
            ("acm[e]:*", true),
            ("acm[de]:*", false),
            ("?cme:*", false),
            ("a\\cme:*", true),
            // Escaped: `acme\:*` is `acme:*` to both matchers.
            ("acme\\:*", true),
            ("globex:*", false),
            ("[a]cme:*", true),
        ];
        for &(pattern, expected) in cases {
            assert_eq!(
                granted(&acme, Kind::Pattern, &[pattern]),
                expected,
                "PSUBSCRIBE {pattern} under acme:*"
            );
        }
        // Within the union of two globs, though within neither alone.
        let split = globs(&["acme:a*", "acme:b*"]);
        assert!(granted(&split, Kind::Pattern, &["acme:[ab]*"]));
        assert!(!granted(&split, Kind::Pattern, &["acme:[abc]*"]));
        // `?` is one byte, whatever the byte.
        assert!(granted(&globs(&["x?"]), Kind::Pattern, &["x[a-z]"]));
        assert!(!granted(&globs(&["x[a-z]"]), Kind::Pattern, &["x?"]));
        // Every pattern of a PSUBSCRIBE must be granted.
        assert!(!granted(&acme, Kind::Pattern, &["acme:*", "*"]));
        // `*` is granted by `*` alone.
        assert!(granted(&globs(&["*"]), Kind::Pattern, &["*"]));
    }

    #[test]
    fn a_pattern_the_matchers_read_differently_is_never_granted() {
        let every = globs(&["*"]);
        for pattern in [
            "acme:[]]",
            "acme:[a-]",
            "acme:[\\a-z]",
            "acme:\\",
            "acme:[ab",
            "x]",
            "[\u{80}-\u{ff}]",
        ] {
            assert!(!is_plain(pattern.as_bytes()), "{pattern}");
            assert!(!granted(&every, Kind::Pattern, &[pattern]), "{pattern}");
            // A deny rule cannot tell what it matches: it takes it as protected.
            assert!(hit(&globs(&["nothing-like-it"]), Kind::Pattern, &[pattern]));
        }
        for pattern in ["acme:[a-z0-9]*", "[^t]*", "\\[x\\]", "a?b*c", ""] {
            assert!(is_plain(pattern.as_bytes()), "{pattern}");
        }
    }

    #[test]
    fn a_deny_rule_hits_a_pattern_that_can_match_one_of_its_channels() {
        let secret = globs(&["acme:secret:*"]);
        assert!(hit(&secret, Kind::Pattern, &["acme:*"]));
        assert!(hit(&secret, Kind::Pattern, &["*"]));
        assert!(hit(&secret, Kind::Pattern, &["acme:s?cret:x"]));
        assert!(!hit(&secret, Kind::Pattern, &["acme:public:*"]));
        assert!(!hit(&secret, Kind::Pattern, &["globex:*"]));
    }
}
