//! One client's tracking state, as Redis keeps it in its client flags (`CLIENT_TRACKING`,
//! `_BCAST`, `_OPTIN`, `_OPTOUT`, `_CACHING`, `_NOLOOP`, `_BROKEN_REDIR`), its redirection and its
//! prefixes; the rules `CLIENT TRACKING ON` checks against it (`clientCommand`), what turning
//! tracking on and off changes (`enableTracking`, `disableTracking`), whether a read is remembered
//! (`trackingRememberKeys`), and what `CLIENT GETREDIR` and `CLIENT TRACKINGINFO` answer. The keys
//! the client read are here too, so that a client that leaves takes them out of the table at once.

use std::collections::{BTreeSet, HashSet};

use bytes::Bytes;

use super::command::{Caching, Options, TrackingError};
use super::prefixes;
use super::ClientId;

/// How a tracking client is told of changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Of the keys it read.
    Default,
    /// Of the keys read by a command right after `CLIENT CACHING YES`.
    OptIn,
    /// Of the keys it read, but for a command right after `CLIENT CACHING NO`.
    OptOut,
    /// Of every key under its prefixes, read or not.
    Bcast,
}

/// A client with tracking on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct On {
    pub mode: Mode,
    pub noloop: bool,
    /// `REDIRECT`: who gets the invalidations instead.
    pub redirect: Option<ClientId>,
    /// `CLIENT CACHING` was given for the next command (`CLIENT_TRACKING_CACHING`).
    pub caching: bool,
    /// An invalidation found the redirect target gone (`CLIENT_TRACKING_BROKEN_REDIR`).
    pub broken: bool,
    /// BCAST prefixes (sorted, as Redis's radix tree lists them).
    pub prefixes: BTreeSet<Bytes>,
}

/// What the tracker knows of one client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Client {
    /// `None`: tracking is off.
    pub on: Option<On>,
    /// The keys the table holds for this client. They stay while tracking is off, as in Redis
    /// (which removes a client's ids from the table lazily): turned on again in default mode, the
    /// client is told of keys it read before.
    pub keys: HashSet<Bytes>,
    /// BCAST, without `NOLOOP`: keys it wrote through the daemon and was told of at once
    /// (`Tracker::wrote`), whose invalidation from Redis — the same write's, on its way — is
    /// not passed on. A key leaves when that comes, or when the client reads it again (then the
    /// next invalidation is news). One left behind by a write that changed nothing, and so never
    /// comes from Redis, hides the next change of a key the client has not read since it was
    /// told: it holds no value of it to drop.
    pub echoes: HashSet<Bytes>,
}

impl Client {
    /// `CLIENT TRACKING ON` with `options`, checked against this client as `clientCommand` checks
    /// them, in its order, then applied as `enableTracking` applies them: mode, `NOLOOP` and
    /// `REDIRECT` replaced, a broken redirect forgotten, `CLIENT CACHING` kept, prefixes added to
    /// those it has (BCAST without any: the empty prefix). The prefixes new to the client.
    pub fn enable(&mut self, options: &Options) -> Result<Vec<Bytes>, TrackingError> {
        if !options.bcast && !options.prefixes.is_empty() {
            return Err(TrackingError::PrefixWithoutBcast);
        }
        if let Some(on) = &self.on {
            if (on.mode == Mode::Bcast) != options.bcast {
                return Err(TrackingError::BcastSwitch);
            }
        }
        if options.bcast && (options.optin || options.optout) {
            return Err(TrackingError::OptWithBcast);
        }
        if options.optin && options.optout {
            return Err(TrackingError::OptInAndOptOut);
        }
        if let Some(on) = &self.on {
            if (options.optin && on.mode == Mode::OptOut)
                || (options.optout && on.mode == Mode::OptIn)
            {
                return Err(TrackingError::OptSwitch);
            }
        }
        if options.bcast {
            let none = BTreeSet::new();
            let existing = self.on.as_ref().map_or(&none, |on| &on.prefixes);
            prefixes::check(existing, &options.prefixes)?;
        }
        let (caching, mut prefixes) = match self.on.take() {
            Some(on) => (on.caching, on.prefixes),
            None => (false, BTreeSet::new()),
        };
        let mode = match options {
            Options { bcast: true, .. } => Mode::Bcast,
            Options { optin: true, .. } => Mode::OptIn,
            Options { optout: true, .. } => Mode::OptOut,
            _ => Mode::Default,
        };
        let wanted = match (options.bcast, options.prefixes.is_empty()) {
            (true, true) => vec![Bytes::new()],
            (true, false) => options.prefixes.clone(),
            (false, _) => Vec::new(),
        };
        let added = wanted
            .into_iter()
            .filter(|prefix| prefixes.insert(prefix.clone()))
            .collect();
        self.on = Some(On {
            mode,
            noloop: options.noloop,
            redirect: options.redirect,
            caching,
            broken: false,
            prefixes,
        });
        Ok(added)
    }

    /// `CLIENT TRACKING OFF` (and `RESET`): every flag cleared. The prefixes it had.
    pub fn disable(&mut self) -> BTreeSet<Bytes> {
        self.echoes.clear();
        self.on.take().map(|on| on.prefixes).unwrap_or_default()
    }

    /// `CLIENT CACHING YES|NO` (`None`: neither word).
    pub fn caching(&mut self, caching: Option<Caching>) -> Result<(), TrackingError> {
        let on = self.on.as_mut().ok_or(TrackingError::CachingNotTracking)?;
        match (caching, on.mode) {
            (Some(Caching::Yes), Mode::OptIn) | (Some(Caching::No), Mode::OptOut) => {
                on.caching = true;
                Ok(())
            }
            (Some(Caching::Yes), _) => Err(TrackingError::CachingYesWithoutOptIn),
            (Some(Caching::No), _) => Err(TrackingError::CachingNoWithoutOptOut),
            (None, _) => Err(TrackingError::Syntax),
        }
    }

    /// Whether the keys of a read command run now are remembered (`call` and
    /// `trackingRememberKeys`): tracking in default mode, opted in, or not opted out.
    pub fn remembers_reads(&self) -> bool {
        match &self.on {
            Some(on) => match on.mode {
                Mode::Default => true,
                Mode::OptIn => on.caching,
                Mode::OptOut => !on.caching,
                Mode::Bcast => false,
            },
            None => false,
        }
    }

    /// `CLIENT GETREDIR`: -1 when not tracking, 0 without a redirect, else the redirect's id.
    pub fn getredir(&self) -> i64 {
        match &self.on {
            Some(on) => on.redirect.map_or(0, redirect_number),
            None => -1,
        }
    }

    /// `CLIENT TRACKINGINFO`.
    pub fn info(&self) -> TrackingInfo {
        let Some(on) = &self.on else {
            return TrackingInfo {
                flags: vec![Flag::Off],
                redirect: -1,
                prefixes: Vec::new(),
            };
        };
        let mut flags = vec![Flag::On];
        match on.mode {
            Mode::Default => {}
            Mode::Bcast => flags.push(Flag::Bcast),
            Mode::OptIn => {
                flags.push(Flag::OptIn);
                if on.caching {
                    flags.push(Flag::CachingYes);
                }
            }
            Mode::OptOut => {
                flags.push(Flag::OptOut);
                if on.caching {
                    flags.push(Flag::CachingNo);
                }
            }
        }
        if on.noloop {
            flags.push(Flag::NoLoop);
        }
        if on.broken {
            flags.push(Flag::BrokenRedirect);
        }
        TrackingInfo {
            flags,
            redirect: self.getredir(),
            prefixes: on.prefixes.iter().cloned().collect(),
        }
    }
}

/// A client id as Redis replies it (`long long`).
fn redirect_number(id: ClientId) -> i64 {
    i64::try_from(id).unwrap_or(i64::MAX)
}

/// What `CLIENT TRACKINGINFO` answers (a map of `flags`, `redirect` and `prefixes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackingInfo {
    /// In Redis's order: `on`/`off`, then the mode's, `noloop`, `broken_redirect`.
    pub flags: Vec<Flag>,
    /// -1 when not tracking, 0 without a redirect.
    pub redirect: i64,
    /// BCAST prefixes, sorted (the empty prefix when BCAST was asked without any).
    pub prefixes: Vec<Bytes>,
}

/// One of `CLIENT TRACKINGINFO`'s flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    Off,
    On,
    Bcast,
    OptIn,
    CachingYes,
    OptOut,
    CachingNo,
    NoLoop,
    BrokenRedirect,
}

impl Flag {
    /// As Redis writes it.
    pub fn name(self) -> &'static str {
        match self {
            Flag::Off => "off",
            Flag::On => "on",
            Flag::Bcast => "bcast",
            Flag::OptIn => "optin",
            Flag::CachingYes => "caching-yes",
            Flag::OptOut => "optout",
            Flag::CachingNo => "caching-no",
            Flag::NoLoop => "noloop",
            Flag::BrokenRedirect => "broken_redirect",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(f: impl FnOnce(&mut Options)) -> Options {
        let mut options = Options::default();
        f(&mut options);
        options
    }

    fn prefixes(names: &[&'static str]) -> Vec<Bytes> {
        names
            .iter()
            .map(|p| Bytes::from_static(p.as_bytes()))
            .collect()
    }

    /// networking.c (7.0), `clientCommand` "tracking", the checks before `enableTracking`, in
    /// their order.
    #[test]
    fn on_is_checked_against_the_options_and_the_state_in_redis_order() {
        let mut client = Client::default();
        let both = options(|o| {
            o.prefixes = prefixes(&["a"]);
            o.optin = true;
            o.optout = true;
        });
        assert_eq!(client.enable(&both), Err(TrackingError::PrefixWithoutBcast));
        let bcast_opt = options(|o| {
            o.bcast = true;
            o.optin = true;
            o.optout = true;
        });
        assert_eq!(client.enable(&bcast_opt), Err(TrackingError::OptWithBcast));
        let in_and_out = options(|o| {
            o.optin = true;
            o.optout = true;
        });
        assert_eq!(
            client.enable(&in_and_out),
            Err(TrackingError::OptInAndOptOut)
        );
        assert_eq!(client.on, None, "a refused ON changes nothing");

        client.enable(&options(|o| o.optin = true)).unwrap();
        // BCAST on/off is checked before OPTIN with BCAST.
        let bcast = options(|o| {
            o.bcast = true;
            o.optout = true;
        });
        assert_eq!(client.enable(&bcast), Err(TrackingError::BcastSwitch));
        assert_eq!(
            client.enable(&options(|o| o.optout = true)),
            Err(TrackingError::OptSwitch)
        );
        assert_eq!(client.on.as_ref().map(|on| on.mode), Some(Mode::OptIn));
        // Plain ON from OPTIN is no switch (only OPTIN⇄OPTOUT is), and leaves OPTIN…
        client.enable(&Options::default()).unwrap();
        assert_eq!(client.on.as_ref().map(|on| on.mode), Some(Mode::Default));
        // … after which OPTOUT is allowed.
        client.enable(&options(|o| o.optout = true)).unwrap();
        assert_eq!(client.on.as_ref().map(|on| on.mode), Some(Mode::OptOut));
    }

    /// tracking.c (7.0) `enableTracking`: flags and redirect replaced, `BROKEN_REDIR` cleared,
    /// `CACHING` kept, prefixes added to the client's; BCAST without prefixes is the empty one.
    #[test]
    fn on_again_replaces_the_flags_and_adds_prefixes() {
        let mut client = Client::default();
        let first = options(|o| {
            o.bcast = true;
            o.noloop = true;
            o.redirect = Some(9);
            o.prefixes = prefixes(&["b", "a"]);
        });
        assert_eq!(client.enable(&first), Ok(prefixes(&["b", "a"])));
        client.on.as_mut().unwrap().broken = true;
        let again = options(|o| {
            o.bcast = true;
            o.prefixes = prefixes(&["c"]);
        });
        assert_eq!(client.enable(&again), Ok(prefixes(&["c"])));
        let on = client.on.clone().unwrap();
        assert_eq!((on.noloop, on.redirect, on.broken), (false, None, false));
        assert_eq!(
            on.prefixes,
            prefixes(&["a", "b", "c"]).into_iter().collect()
        );
        // BCAST alone adds the empty prefix, with no overlap check (none are given) …
        assert_eq!(
            client.enable(&options(|o| o.bcast = true)),
            Ok(prefixes(&[""]))
        );
        // … and is then a no-op; any prefix now overlaps it.
        assert_eq!(client.enable(&options(|o| o.bcast = true)), Ok(Vec::new()));
        let more = options(|o| {
            o.bcast = true;
            o.prefixes = prefixes(&["d"]);
        });
        assert!(matches!(
            client.enable(&more),
            Err(TrackingError::OverlapsExisting { .. })
        ));
        // OFF forgets every prefix: a new ON starts afresh.
        assert_eq!(client.disable().len(), 4);
        assert_eq!(client.enable(&more), Ok(prefixes(&["d"])));

        let mut optin = Client::default();
        optin.enable(&options(|o| o.optin = true)).unwrap();
        optin.caching(Some(Caching::Yes)).unwrap();
        optin.enable(&options(|o| o.optin = true)).unwrap();
        assert!(optin.remembers_reads(), "CACHING survives ON");
        optin.disable();
        optin.enable(&options(|o| o.optin = true)).unwrap();
        assert!(!optin.remembers_reads(), "but not OFF");
    }

    /// networking.c (7.0), `clientCommand` "caching".
    #[test]
    fn caching_needs_the_matching_mode() {
        let mut client = Client::default();
        assert_eq!(
            client.caching(Some(Caching::Yes)),
            Err(TrackingError::CachingNotTracking)
        );
        // Not tracking is said before a bad word is.
        assert_eq!(client.caching(None), Err(TrackingError::CachingNotTracking));
        client.enable(&Options::default()).unwrap();
        assert_eq!(
            client.caching(Some(Caching::Yes)),
            Err(TrackingError::CachingYesWithoutOptIn)
        );
        assert_eq!(
            client.caching(Some(Caching::No)),
            Err(TrackingError::CachingNoWithoutOptOut)
        );
        assert_eq!(client.caching(None), Err(TrackingError::Syntax));
        client.disable();
        client.enable(&options(|o| o.optout = true)).unwrap();
        assert!(client.remembers_reads());
        assert_eq!(client.caching(Some(Caching::No)), Ok(()));
        assert!(!client.remembers_reads());
        assert_eq!(
            client.caching(Some(Caching::Yes)),
            Err(TrackingError::CachingYesWithoutOptIn)
        );
    }

    #[test]
    fn flags_are_listed_in_redis_order() {
        let mut client = Client::default();
        client
            .enable(&options(|o| {
                o.optout = true;
                o.noloop = true;
                o.redirect = Some(4);
            }))
            .unwrap();
        client.caching(Some(Caching::No)).unwrap();
        client.on.as_mut().unwrap().broken = true;
        let info = client.info();
        let names: Vec<_> = info.flags.iter().map(|flag| flag.name()).collect();
        assert_eq!(
            names,
            ["on", "optout", "caching-no", "noloop", "broken_redirect"]
        );
        assert_eq!((info.redirect, client.getredir()), (4, 4));
    }
}
