//! Redis 7.0's own `tests/unit/tracking.tcl`, its assertions that are the tracker's logic ported
//! as unit tests (each cites the test's line), and properties over random runs. The tcl's clients:
//! `r` is [`R`], `$rd_redirection` [`REDIR`] (subscribed to `__redis__:invalidate`), `$rd` [`RD`],
//! `$rd_sg` [`SG`] (writes, never tracks).

use bytes::Bytes;
use proptest::prelude::*;
use tollgate_model::Protocol;

use super::testing::{key, keys, message, push, words, Clients};
use super::{ClientId, Delivery, Finished, Flag, Invalidation, Message, Stats, Tracker};
use super::{TrackingError, TrackingInfo};

const R: ClientId = 1;
const REDIR: ClientId = 2;
const RD: ClientId = 3;
const SG: ClientId = 4;

/// A tracker and the clients it serves.
struct World {
    tracker: Tracker,
    clients: Clients,
}

impl World {
    /// `start_server` and the tcl's opening lines: `r` and `$rd` speak RESP2, `$rd_redirection`
    /// subscribed.
    fn new() -> Self {
        let mut clients = Clients::default();
        for id in [R, REDIR, RD, SG] {
            clients.connect(id, Protocol::Resp2);
        }
        clients.subscribed(REDIR, true);
        World {
            tracker: Tracker::default(),
            clients,
        }
    }

    fn tracking(&mut self, id: ClientId, line: &str) -> Result<(), TrackingError> {
        let done = self.tracker.tracking(id, &words(line), &self.clients);
        self.tracker.finished(id, Finished::Client);
        done
    }

    fn on(&mut self, id: ClientId, line: &str) {
        self.tracking(id, line).expect("CLIENT TRACKING");
    }

    fn caching(&mut self, id: ClientId, word: &str) -> Result<(), TrackingError> {
        let done = self.tracker.caching(id, &words(word));
        self.tracker.finished(id, Finished::Client);
        done
    }

    /// A read-only command of `names` by `id`; what it evicted.
    fn read(&mut self, id: ClientId, names: &[&str]) -> Vec<Delivery> {
        let evicted = self.tracker.read(id, &keys(names), &self.clients);
        self.tracker.finished(id, Finished::Command);
        evicted
    }

    /// A write of `names`, by `writer` through the daemon or (`None`) by anyone else.
    fn write(&mut self, writer: Option<ClientId>, names: &[&str]) -> Vec<Delivery> {
        let told = self.tracker.invalidate(&keys(names), writer, &self.clients);
        if let Some(writer) = writer {
            self.tracker.finished(writer, Finished::Command);
        }
        told
    }

    fn hello(&mut self, id: ClientId, protocol: Protocol) {
        self.clients.hello(id, protocol);
    }

    fn quit(&mut self, id: ClientId) {
        self.clients.leave(id);
        self.tracker.forget(id);
    }

    fn flags(&self, id: ClientId) -> Vec<&'static str> {
        let info = self.tracker.info(id);
        info.flags.iter().map(|flag| flag.name()).collect()
    }
}

fn everything(tracking: ClientId, to: ClientId, pubsub: bool) -> Delivery {
    let message = match pubsub {
        true => Message::PubSub(Invalidation::Everything),
        false => Message::Push(Invalidation::Everything),
    };
    Delivery {
        tracking,
        to,
        message,
    }
}

/// tracking.tcl:38-51, "Clients are able to enable tracking and redirect it", "The other
/// connection is able to get invalidations".
#[test]
fn the_other_connection_gets_invalidations_of_keys_read_only() {
    let mut w = World::new();
    w.on(R, "on REDIRECT 2");
    w.write(Some(R), &["a{t}", "b{t}"]);
    w.read(R, &["a{t}"]);
    assert_eq!(w.write(Some(R), &["b{t}"]), vec![], "b{{t}} was not read");
    assert_eq!(
        w.write(Some(R), &["a{t}"]),
        vec![message(R, REDIR, &["a{t}"])]
    );
}

/// tracking.tcl:53-58, "The client is now able to disable tracking"; the keys it read stay in
/// the table, as Redis drops them lazily (tracking.c:61-66).
#[test]
fn tracking_off_leaves_the_keys_read() {
    let mut w = World::new();
    w.on(R, "on REDIRECT 2");
    w.read(R, &["a{t}", "b{t}", "c{t}", "d{t}", "e{t}", "f{t}", "g{t}"]);
    w.on(R, "off");
    let stats = w.tracker.stats();
    assert_eq!((stats.clients, stats.keys, stats.items), (0, 7, 7));
    assert_eq!(w.write(None, &["a{t}"]), vec![], "off: not told");
    assert_eq!(w.tracker.stats().keys, 6, "but the entry is gone");
}

/// tracking.tcl:60-68, "Clients can enable the BCAST mode with the empty prefix", "The
/// connection gets invalidation messages about all the keys": one message for `MSET`'s keys.
#[test]
fn bcast_with_the_empty_prefix_hears_of_every_key_in_one_message() {
    let mut w = World::new();
    w.on(R, "on BCAST REDIRECT 2");
    assert_eq!(
        w.write(Some(R), &["c{t}", "a{t}", "b{t}"]),
        vec![message(R, REDIR, &["a{t}", "b{t}", "c{t}"])]
    );
}

/// tracking.tcl:70-94, "Clients can enable the BCAST mode with prefixes" (a message per prefix;
/// `c:1{t}` under none), "Adding prefixes to BCAST mode works".
#[test]
fn bcast_with_prefixes_hears_of_their_keys_a_message_per_prefix() {
    let mut w = World::new();
    w.on(R, "off");
    w.on(R, "on BCAST REDIRECT 2 PREFIX a: PREFIX b:");
    let exec = ["a:1{t}", "a:2{t}", "b:1{t}", "b:2{t}", "c:1{t}"];
    assert_eq!(
        w.write(Some(R), &exec),
        vec![
            message(R, REDIR, &["a:1{t}", "a:2{t}"]),
            message(R, REDIR, &["b:1{t}", "b:2{t}"]),
        ]
    );
    w.on(R, "on BCAST REDIRECT 2 PREFIX c:");
    assert_eq!(
        w.write(Some(R), &["c:1234"]),
        vec![message(R, REDIR, &["c:1234"])]
    );
    assert_eq!(w.tracker.info(R).prefixes, keys(&["a:", "b:", "c:"]));
}

/// tracking.tcl:96-109, "Tracking NOLOOP mode in standard mode works": the client's own write
/// is not told, and its entry is gone with the others' (tracking.c:399-403, 417-421).
#[test]
fn noloop_in_default_mode_skips_the_clients_own_writes() {
    let mut w = World::new();
    w.on(R, "off");
    w.on(R, "on REDIRECT 2 NOLOOP");
    w.read(R, &["otherkey1{t}", "loopkey{t}", "otherkey2{t}"]);
    assert_eq!(
        w.write(Some(SG), &["otherkey1{t}"]),
        vec![message(R, REDIR, &["otherkey1{t}"])]
    );
    assert_eq!(w.write(Some(R), &["loopkey{t}"]), vec![]);
    assert_eq!(
        w.write(Some(SG), &["otherkey2{t}"]),
        vec![message(R, REDIR, &["otherkey2{t}"])]
    );
    assert_eq!(
        w.write(Some(SG), &["loopkey{t}"]),
        vec![],
        "read once, told once"
    );
}

/// tracking.tcl:111-149, "Tracking NOLOOP mode in BCAST mode works", "Tracking gets
/// notification of expired keys", "… of lazy expired keys" (the client's `SET` is skipped, the
/// expiry, by no client, is told).
#[test]
fn noloop_in_bcast_mode_skips_the_clients_own_writes() {
    let mut w = World::new();
    w.on(R, "off");
    w.on(R, "on BCAST REDIRECT 2 NOLOOP");
    assert_eq!(
        w.write(Some(SG), &["otherkey1"]),
        vec![message(R, REDIR, &["otherkey1"])]
    );
    assert_eq!(w.write(Some(R), &["loopkey"]), vec![]);
    assert_eq!(
        w.write(Some(SG), &["otherkey2"]),
        vec![message(R, REDIR, &["otherkey2"])]
    );
    assert_eq!(w.write(Some(R), &["mykey", "mykeyotherkey"]), vec![]);
    assert_eq!(
        w.write(None, &["mykey"]),
        vec![message(R, REDIR, &["mykey"])]
    );
}

/// tracking.tcl:173-209, "RESP3 based basic invalidation", "RESP3 tracking redirection",
/// "Invalidations of previous keys can be redirected after switching to RESP3", "… of new keys".
#[test]
fn resp3_pushes_on_its_own_connection_unless_redirected() {
    let mut w = World::new();
    w.hello(R, Protocol::Resp3);
    w.on(R, "off");
    w.on(R, "on");
    w.write(Some(SG), &["key1"]);
    w.read(R, &["key1"]);
    assert_eq!(w.write(Some(SG), &["key1"]), vec![push(R, R, &["key1"])]);

    w.on(R, "off");
    w.on(R, "on REDIRECT 2");
    w.read(R, &["key1"]);
    assert_eq!(
        w.write(Some(SG), &["key1"]),
        vec![message(R, REDIR, &["key1"])]
    );

    w.hello(R, Protocol::Resp2);
    w.read(R, &["key1"]);
    w.hello(R, Protocol::Resp3);
    assert_eq!(
        w.write(Some(SG), &["key1"]),
        vec![message(R, REDIR, &["key1"])]
    );
}

/// tracking.tcl:211-222, "Invalid keys should not be tracked for scripts in NOLOOP mode": a
/// script's write of a key the NOLOOP client read tells it nothing, and its next read is fresh.
#[test]
fn a_noloop_clients_script_write_tells_it_nothing() {
    let mut w = World::new();
    w.hello(SG, Protocol::Resp3);
    w.on(SG, "off");
    w.on(SG, "on NOLOOP");
    w.read(SG, &["key1"]);
    assert_eq!(w.write(Some(SG), &["key1"]), vec![]);
    assert_eq!(w.tracker.stats().keys, 0);
}

/// tracking.tcl:251-273 and 722-740, "RESP3 Client gets tracking-redir-broken push message
/// after cached key changed when rediretion client is terminated", "CLIENT TRACKINGINFO provides
/// reasonable results when tracking redir broken".
#[test]
fn a_gone_redirect_target_is_reported_broken() {
    let mut w = World::new();
    w.hello(R, Protocol::Resp3);
    w.on(R, "on REDIRECT 2");
    w.read(R, &["key1"]);
    w.quit(REDIR);
    let broken = Delivery {
        tracking: R,
        to: R,
        message: Message::RedirectBroken(REDIR),
    };
    assert_eq!(w.write(Some(SG), &["key1"]), vec![broken]);
    assert_eq!(w.flags(R), ["on", "broken_redirect"]);
    let info = w.tracker.info(R);
    assert_eq!((info.redirect, info.prefixes.len()), (2, 0));
    // A new ON forgets it.
    w.clients.connect(5, Protocol::Resp2);
    w.on(R, "on REDIRECT 5");
    assert_eq!(w.flags(R), ["on"]);
}

/// tracking.tcl:275-308, "Different clients can redirect to the same connection", "Different
/// clients using different protocols can track the same key".
#[test]
fn several_clients_track_one_key_each_its_own_way() {
    let mut w = World::new();
    w.on(R, "on REDIRECT 2");
    w.on(RD, "on REDIRECT 2");
    w.read(R, &["key1{t}"]);
    w.read(RD, &["key2{t}"]);
    assert_eq!(
        w.write(Some(SG), &["key1{t}"]),
        vec![message(R, REDIR, &["key1{t}"])]
    );
    assert_eq!(
        w.write(Some(SG), &["key2{t}"]),
        vec![message(RD, REDIR, &["key2{t}"])]
    );

    w.hello(RD, Protocol::Resp3);
    w.on(RD, "on");
    w.read(R, &["key1"]);
    w.read(RD, &["key1"]);
    assert_eq!(
        w.write(Some(SG), &["key1"]),
        vec![message(R, REDIR, &["key1"]), push(RD, RD, &["key1"])]
    );
}

/// tracking.tcl:310-356: OPTIN tracks only after `CLIENT CACHING yes`, OPTOUT all but after
/// `CLIENT CACHING no`, each for the next command only.
#[test]
fn optin_and_optout_follow_client_caching_for_the_next_command() {
    let mut w = World::new();
    w.on(R, "on OPTIN REDIRECT 2");
    w.read(R, &["key1"]);
    assert_eq!(w.write(Some(SG), &["key1"]), vec![]);
    w.caching(R, "yes").unwrap();
    w.read(R, &["key1"]);
    w.read(R, &["key3"]);
    assert_eq!(
        w.write(Some(SG), &["key1"]),
        vec![message(R, REDIR, &["key1"])]
    );
    assert_eq!(
        w.write(Some(SG), &["key3"]),
        vec![],
        "the next command only"
    );

    w.on(R, "off");
    w.on(R, "on OPTOUT REDIRECT 2");
    w.read(R, &["key1"]);
    assert_eq!(
        w.write(Some(SG), &["key1"]),
        vec![message(R, REDIR, &["key1"])]
    );
    w.caching(R, "no").unwrap();
    w.read(R, &["key1"]);
    assert_eq!(w.write(Some(SG), &["key1"]), vec![]);
    w.read(R, &["key2"]);
    assert_eq!(
        w.write(Some(SG), &["key2"]),
        vec![message(R, REDIR, &["key2"])]
    );
}

/// networking.c (7.0):2091-2095, `resetClient`: `CLIENT CACHING` holds across `CLIENT`
/// commands and a whole transaction, and is spent by the command after.
#[test]
fn client_caching_holds_across_client_commands_and_a_transaction() {
    let mut w = World::new();
    w.on(R, "on OPTIN");
    w.caching(R, "yes").unwrap();
    w.tracker.finished(R, Finished::Client); // CLIENT ID
    assert_eq!(w.flags(R), ["on", "optin", "caching-yes"]);
    w.tracker.finished(R, Finished::InMulti); // MULTI
    w.tracker.finished(R, Finished::InMulti); // GET a (queued)
    w.tracker.finished(R, Finished::InMulti); // GET b (queued)
                                              // EXEC runs both reads with the flag set, then spends it.
    w.tracker.read(R, &keys(&["a"]), &w.clients);
    w.tracker.read(R, &keys(&["b"]), &w.clients);
    w.tracker.finished(R, Finished::Command);
    assert_eq!(w.flags(R), ["on", "optin"]);
    assert_eq!(w.tracker.stats().keys, 2);
    // A write spends it too.
    w.caching(R, "yes").unwrap();
    w.write(Some(R), &["c"]);
    w.read(R, &["d"]);
    assert_eq!(w.tracker.stats().keys, 2);
}

/// tracking.tcl:358-376, "Able to redirect to a RESP3 client": a push, subscribed or not.
#[test]
fn a_resp3_redirect_target_gets_a_push() {
    let mut w = World::new();
    w.hello(REDIR, Protocol::Resp3);
    w.on(R, "on REDIRECT 2");
    w.read(R, &["key1"]);
    assert_eq!(
        w.write(Some(SG), &["key1"]),
        vec![push(R, REDIR, &["key1"])]
    );
}

/// tracking.tcl:378-390, "After switching from normal tracking to BCAST mode, no invalidation
/// message is produced for pre-BCAST keys" (tracking.c:385-395).
#[test]
fn keys_read_before_bcast_are_not_told_twice() {
    let mut w = World::new();
    w.hello(R, Protocol::Resp3);
    w.on(R, "on");
    w.read(R, &["key1"]);
    w.on(R, "off");
    w.on(R, "on BCAST");
    assert_eq!(w.write(Some(SG), &["key1"]), vec![push(R, R, &["key1"])]);
}

/// tracking.tcl:519-523's comment (the table drops ids lazily): keys read before `OFF` are told
/// after `ON` again.
#[test]
fn keys_read_before_off_are_told_after_on_again() {
    let mut w = World::new();
    w.on(R, "on REDIRECT 2");
    w.read(R, &["key1"]);
    w.on(R, "off");
    w.read(R, &["key2"]);
    w.on(R, "on REDIRECT 2");
    assert_eq!(
        w.write(Some(SG), &["key1"]),
        vec![message(R, REDIR, &["key1"])]
    );
    assert_eq!(w.write(Some(SG), &["key2"]), vec![], "read while off");
}

/// tracking.tcl:392-408, "BCAST with prefix collisions throw errors", through the tracker: a
/// refused command changes nothing.
#[test]
fn overlapping_prefixes_are_refused_and_change_nothing() {
    let mut w = World::new();
    let err = w
        .tracking(RD, "ON BCAST PREFIX FOOBAR PREFIX FOO")
        .unwrap_err();
    assert!(err.to_string().starts_with("ERR Prefix 'FOOBAR'"), "{err}");
    assert!(!w.tracker.is_tracking(RD));
    let err = w
        .tracking(RD, "ON BCAST PREFIX FOO PREFIX FOOBAR")
        .unwrap_err();
    assert!(err.to_string().starts_with("ERR Prefix 'FOO'"), "{err}");
    w.on(RD, "ON BCAST PREFIX FOO PREFIX BAR");
    let err = w.tracking(RD, "ON BCAST PREFIX FO").unwrap_err();
    assert!(err.to_string().contains("'FO'") && err.to_string().contains("'FOO'"));
    let err = w.tracking(RD, "ON BCAST PREFIX BARB").unwrap_err();
    assert!(err.to_string().contains("'BARB'") && err.to_string().contains("'BAR'"));
    assert_eq!(w.tracker.info(RD).prefixes, keys(&["BAR", "FOO"]));
    assert_eq!(w.tracker.stats().prefixes, 2);
    w.on(RD, "OFF");
    assert_eq!(w.tracker.stats().prefixes, 0);
}

/// networking.c (7.0), `clientCommand` "tracking": the refusals a client can meet.
#[test]
fn client_tracking_answers_redis_errors() {
    let mut w = World::new();
    let cases = [
        (
            "on REDIRECT 99",
            "ERR The client ID you want redirect to does not exist",
        ),
        (
            "on REDIRECT 2 REDIRECT 3",
            "ERR A client can only redirect to a single other client",
        ),
        (
            "on REDIRECT two",
            "ERR value is not an integer or out of range",
        ),
        (
            "on PREFIX a",
            "ERR PREFIX option requires BCAST mode to be enabled",
        ),
        (
            "on BCAST OPTIN",
            "ERR OPTIN and OPTOUT are not compatible with BCAST",
        ),
        (
            "on OPTIN OPTOUT",
            "ERR You can't specify both OPTIN mode and OPTOUT mode",
        ),
        ("on NOSUCH", "ERR syntax error"),
        ("sideways", "ERR syntax error"),
    ];
    for (line, error) in cases {
        assert_eq!(
            w.tracking(R, line).unwrap_err().to_string(),
            error,
            "{line}"
        );
    }
    w.on(R, "on");
    assert_eq!(
        w.tracking(R, "on BCAST").unwrap_err(),
        TrackingError::BcastSwitch
    );
    w.on(R, "on OPTIN");
    assert_eq!(
        w.tracking(R, "on OPTOUT").unwrap_err(),
        TrackingError::OptSwitch
    );
    // Redirecting to oneself is allowed: the client exists.
    w.on(R, "on REDIRECT 1");
    assert_eq!(w.tracker.getredir(R), 1);
}

/// networking.c (7.0), `clientCommand` "caching", through the tracker.
#[test]
fn client_caching_answers_redis_errors() {
    let mut w = World::new();
    let not_tracking = "ERR CLIENT CACHING can be called only when the client is in tracking \
                        mode with OPTIN or OPTOUT mode enabled";
    assert_eq!(w.caching(R, "yes").unwrap_err().to_string(), not_tracking);
    w.on(R, "on");
    assert_eq!(
        w.caching(R, "yes").unwrap_err().to_string(),
        "ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode."
    );
    assert_eq!(
        w.caching(R, "no").unwrap_err().to_string(),
        "ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode."
    );
    assert_eq!(w.caching(R, "perhaps").unwrap_err(), TrackingError::Syntax);
    w.on(R, "off");
    assert_eq!(w.caching(R, "yes").unwrap_err().to_string(), not_tracking);
}

/// tracking.tcl:511-531, "Tracking gets notification on tracking table key eviction", and
/// tracking.c:504-541 (`trackingLimitUsedSlots` invalidates without BCAST and without a writer).
#[test]
fn an_evicted_key_is_told_to_its_readers() {
    let mut w = World::new();
    w.on(R, "on REDIRECT 2 NOLOOP");
    w.on(RD, "on BCAST REDIRECT 2");
    w.read(R, &["key1{t}", "key2{t}"]);
    let evicted = w.tracker.set_max_keys(1, &w.clients);
    assert_eq!(evicted, vec![message(R, REDIR, &["key1{t}"])]);
    assert_eq!(w.tracker.stats().keys, 1);
    // Reading past the limit evicts as it reads.
    assert_eq!(
        w.read(R, &["key3{t}"]),
        vec![message(R, REDIR, &["key2{t}"])]
    );
}

/// tracking.tcl:583-602, "Server is able to evacuate enough keys when num of keys surpasses
/// limit by more than defined initial effort": 249 of 250 keys told, no more.
#[test]
fn the_limit_is_reached_however_far_over_it_is() {
    let mut w = World::new();
    w.on(R, "on REDIRECT 2");
    for i in 0..250 {
        w.read(R, &[format!("key{i}").as_str()]);
    }
    let evicted = w.tracker.set_max_keys(1, &w.clients);
    assert_eq!(evicted.len(), 249);
    assert_eq!(w.tracker.stats().keys, 1);
    assert_eq!(w.tracker.set_max_keys(1, &w.clients), vec![]);
}

/// tracking.tcl:533-576, "Invalidation message received for flushall", "… for flushdb", "Test
/// ASYNC flushall", "flushdb tracking invalidation message is not interleaved with transaction
/// response"; tracking.c:464-492 (every tracking client, BCAST and NOLOOP too; the table emptied).
#[test]
fn a_flush_tells_every_tracking_client_everything() {
    let mut w = World::new();
    w.on(R, "on REDIRECT 2");
    w.read(R, &["key1", "key2"]);
    assert_eq!(w.tracker.stats().keys, 2);
    w.hello(RD, Protocol::Resp3);
    w.on(RD, "on BCAST NOLOOP");
    w.hello(SG, Protocol::Resp3);
    w.on(SG, "on");
    w.on(SG, "off");
    assert_eq!(
        w.tracker.flush(&w.clients),
        vec![everything(R, REDIR, true), everything(RD, RD, false)]
    );
    assert_eq!(w.tracker.stats().keys, 0);
    // `key1`'s entry is gone: only the BCAST client hears of it now.
    assert_eq!(w.write(Some(SG), &["key1"]), vec![push(RD, RD, &["key1"])]);
}

/// tracking.tcl:604-624, "Tracking info is correct".
#[test]
fn info_counts_clients_keys_items_and_prefixes() {
    let mut w = World::new();
    w.on(R, "on REDIRECT 2");
    w.read(R, &["key1"]);
    w.read(R, &["key2"]);
    w.on(RD, "on BCAST PREFIX prefix:");
    w.write(Some(SG), &["prefix:key1"]);
    w.write(Some(SG), &["prefix:key2"]);
    let stats = Stats {
        clients: 2,
        keys: 2,
        items: 2,
        prefixes: 1,
    };
    assert_eq!(w.tracker.stats(), stats);
}

/// tracking.tcl:626-635, "CLIENT GETREDIR provides correct client id".
#[test]
fn getredir_is_minus_one_off_zero_unredirected_else_the_target() {
    let mut w = World::new();
    w.on(R, "on REDIRECT 2");
    assert_eq!(w.tracker.getredir(R), 2);
    w.on(R, "off");
    assert_eq!(w.tracker.getredir(R), -1);
    w.on(R, "on");
    assert_eq!(w.tracker.getredir(R), 0);
    assert_eq!(w.tracker.getredir(77), -1);
}

/// tracking.tcl:637-720, the "CLIENT TRACKINGINFO provides reasonable results …" tests.
#[test]
fn trackinginfo_shows_the_flags_redirect_and_prefixes() {
    let mut w = World::new();
    let off = TrackingInfo {
        flags: vec![Flag::Off],
        redirect: -1,
        prefixes: vec![],
    };
    assert_eq!(w.tracker.info(R), off);
    w.on(R, "on");
    assert_eq!((w.flags(R), w.tracker.info(R).redirect), (vec!["on"], 0));
    w.on(R, "on REDIRECT 2 noloop");
    assert_eq!(
        (w.flags(R), w.tracker.info(R).redirect),
        (vec!["on", "noloop"], 2)
    );
    w.on(R, "off");
    assert_eq!(w.tracker.info(R), off);
    w.on(R, "on optin");
    assert_eq!(w.flags(R), ["on", "optin"]);
    w.caching(R, "yes").unwrap();
    assert_eq!(w.flags(R), ["on", "optin", "caching-yes"]);
    w.on(R, "off");
    w.on(R, "on optout");
    assert_eq!(w.flags(R), ["on", "optout"]);
    w.caching(R, "no").unwrap();
    assert_eq!(w.flags(R), ["on", "optout", "caching-no"]);
    w.on(R, "off");
    w.on(R, "on BCAST PREFIX foo PREFIX bar");
    assert_eq!(w.flags(R), ["on", "bcast"]);
    assert_eq!(w.tracker.info(R).prefixes, keys(&["bar", "foo"]));
    w.on(R, "off");
    w.on(R, "on BCAST");
    assert_eq!(w.tracker.info(R).prefixes, vec![key("")]);
}

/// tracking.tcl:780-808, "RESP2 based basic invalidation with client reply off": a RESP2 client
/// without a redirect is told nothing, and its entry is gone all the same (tracking.c:304-311).
#[test]
fn resp2_without_redirect_is_told_nothing() {
    let mut w = World::new();
    w.on(RD, "on");
    w.read(RD, &["foo"]);
    assert_eq!(w.write(Some(SG), &["foo"]), vec![]);
    assert_eq!(w.tracker.stats().keys, 0);
    w.hello(RD, Protocol::Resp3);
    w.read(RD, &["foo"]);
    assert_eq!(w.write(Some(SG), &["foo"]), vec![push(RD, RD, &["foo"])]);
}

/// Confinement: a BCAST client hears only of keys its principal may read; a default-mode client
/// only tracks what it read (admitted), so it is not checked again.
#[test]
fn bcast_clients_hear_only_of_keys_they_may_read() {
    let mut w = World::new();
    w.hello(R, Protocol::Resp3);
    w.clients.refuse(R, "secret:");
    w.on(R, "on BCAST");
    assert_eq!(
        w.write(Some(SG), &["secret:a", "public:a"]),
        vec![push(R, R, &["public:a"])]
    );
    assert_eq!(w.write(Some(SG), &["secret:b"]), vec![]);
    w.hello(RD, Protocol::Resp3);
    w.on(RD, "on BCAST PREFIX secret:");
    assert_eq!(
        w.write(None, &["secret:c"]),
        vec![push(RD, RD, &["secret:c"])]
    );
}

/// A client that leaves takes its keys and prefixes with it; clients redirecting to it find
/// the redirect broken.
#[test]
fn a_client_that_leaves_takes_its_tracking_with_it() {
    let mut w = World::new();
    w.on(R, "on REDIRECT 2");
    w.on(RD, "on");
    w.read(R, &["a", "b"]);
    w.read(RD, &["b"]);
    w.on(REDIR, "on BCAST PREFIX x");
    w.quit(R);
    assert_eq!(
        w.tracker.stats(),
        Stats {
            clients: 2,
            keys: 1,
            items: 1,
            prefixes: 1
        }
    );
    assert!(!w.tracker.is_idle());
    w.quit(REDIR);
    assert_eq!(w.tracker.stats().prefixes, 0);
    w.quit(RD);
    assert!(w.tracker.is_idle());
    assert_eq!(w.tracker.info(R).flags, vec![Flag::Off]);
}

proptest! {
    /// The brief's property: whatever default-mode clients read (RESP3, or redirected to a
    /// RESP3 client), one write of every key tells each client of each key it read exactly
    /// once, and a second write without a new read tells nothing.
    #[test]
    fn every_read_key_is_told_once_per_read(
        reads in proptest::collection::vec((1u64..=4, proptest::collection::vec(0u8..12, 1..4)), 0..40),
        redirect in proptest::option::of(1u64..=4),
        batch in 1usize..5,
    ) {
        let mut clients = Clients::default();
        for id in 1..=4 {
            clients.connect(id, Protocol::Resp3);
        }
        let mut tracker = Tracker::new(0);
        for id in 1..=4u64 {
            let line = match redirect {
                Some(to) if to != id => format!("on REDIRECT {to}"),
                _ => "on".to_owned(),
            };
            tracker.tracking(id, &words(&line), &clients).unwrap();
        }
        let mut read = std::collections::BTreeSet::new();
        for (id, names) in &reads {
            let names: Vec<_> = names.iter().map(|n| key(&format!("k{n}"))).collect();
            prop_assert_eq!(tracker.read(*id, &names, &clients), vec![]);
            read.extend(names.into_iter().map(|k| (*id, k)));
        }
        let all: Vec<_> = (0..12).map(|n| key(&format!("k{n}"))).collect();
        let mut told = std::collections::BTreeMap::new();
        for chunk in all.chunks(batch) {
            for delivery in tracker.invalidate(chunk, None, &clients) {
                let Message::Push(Invalidation::Keys(keys)) = delivery.message else {
                    panic!("a push of keys: {delivery:?}");
                };
                for key in keys {
                    *told.entry((delivery.tracking, key)).or_insert(0) += 1;
                }
            }
        }
        prop_assert!(told.values().all(|&n| n == 1));
        prop_assert_eq!(told.keys().cloned().collect::<std::collections::BTreeSet<_>>(), read);
        prop_assert_eq!(tracker.invalidate(&all, None, &clients), vec![]);
        prop_assert_eq!(tracker.stats().keys, 0);
    }
}

/// One step of a run against the reference model.
#[derive(Debug, Clone)]
enum Op {
    Read(ClientId, Vec<u8>),
    Write(Option<ClientId>, Vec<u8>),
    On(ClientId, bool),
    Off(ClientId),
    Flush,
    Leave(ClientId),
}

fn op() -> impl Strategy<Value = Op> {
    let client = 1u64..=3;
    let names = proptest::collection::vec(0u8..6, 1..4);
    prop_oneof![
        4 => (client.clone(), names.clone()).prop_map(|(c, k)| Op::Read(c, k)),
        4 => (proptest::option::of(client.clone()), names).prop_map(|(w, k)| Op::Write(w, k)),
        1 => (client.clone(), any::<bool>()).prop_map(|(c, noloop)| Op::On(c, noloop)),
        1 => client.clone().prop_map(Op::Off),
        1 => Just(Op::Flush),
        1 => client.prop_map(Op::Leave),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every run of reads, writes (by a tracking client or anyone else), ON (with or without
    /// NOLOOP), OFF, flushes and clients leaving tells exactly what a direct model of Redis's
    /// default mode tells: per key in the table, its readers that track, less a NOLOOP writer,
    /// each entry gone once told; OFF keeps a client's entries; a flush tells every tracking
    /// client and empties the table. The table's counts match the model's after every step.
    #[test]
    fn default_mode_matches_a_model_of_redis(ops in proptest::collection::vec(op(), 1..120)) {
        use std::collections::{BTreeMap, BTreeSet};
        let mut clients = Clients::default();
        for id in 1..=3 {
            clients.connect(id, Protocol::Resp3);
        }
        let mut tracker = Tracker::new(0);
        // The model: per client, tracking (with NOLOOP?) or not, and the keys it is in the table for.
        let mut noloop: BTreeMap<ClientId, Option<bool>> = (1..=3).map(|id| (id, None)).collect();
        let mut table: BTreeMap<ClientId, BTreeSet<Bytes>> = BTreeMap::new();
        for op in ops {
            let mut expected: Vec<Delivery> = Vec::new();
            let got = match op {
                Op::Read(id, names) => {
                    let names: Vec<_> = names.iter().map(|n| key(&format!("k{n}"))).collect();
                    if noloop[&id].is_some() {
                        table.entry(id).or_default().extend(names.iter().cloned());
                    }
                    tracker.read(id, &names, &clients)
                }
                Op::Write(writer, names) => {
                    let names: Vec<_> = names.iter().map(|n| key(&format!("k{n}"))).collect();
                    for name in &names {
                        for (&id, keys) in table.iter_mut() {
                            if keys.remove(name) {
                                let own = writer == Some(id) && noloop[&id] == Some(true);
                                if noloop[&id].is_some() && !own {
                                    expected.push(push(id, id, &[std::str::from_utf8(name).unwrap()]));
                                }
                            }
                        }
                    }
                    tracker.invalidate(&names, writer, &clients)
                }
                Op::On(id, with_noloop) => {
                    let line = if with_noloop { "on NOLOOP" } else { "on" };
                    tracker.tracking(id, &words(line), &clients).unwrap();
                    noloop.insert(id, Some(with_noloop));
                    Vec::new()
                }
                Op::Off(id) => {
                    tracker.off(id);
                    noloop.insert(id, None);
                    Vec::new()
                }
                Op::Flush => {
                    for (&id, on) in &noloop {
                        if on.is_some() {
                            expected.push(everything(id, id, false));
                        }
                    }
                    table.clear();
                    tracker.flush(&clients)
                }
                Op::Leave(id) => {
                    // It leaves, and a new connection takes the same place in the model.
                    tracker.forget(id);
                    table.remove(&id);
                    noloop.insert(id, None);
                    Vec::new()
                }
            };
            prop_assert_eq!(got, expected);
            let keys: BTreeSet<_> = table.values().flatten().collect();
            let items: usize = table.values().map(BTreeSet::len).sum();
            let stats = tracker.stats();
            prop_assert_eq!((stats.keys, stats.items), (keys.len(), items));
        }
    }

    /// With a limit, the table never holds more keys than it after a read, and every key a
    /// client read is, at every moment, either still tracked for it or was told to it once.
    #[test]
    fn the_limit_holds_and_nothing_read_is_lost(
        reads in proptest::collection::vec((1u64..=3, proptest::collection::vec(0u8..20, 1..5)), 1..60),
        max_keys in 1usize..8,
    ) {
        use std::collections::BTreeSet;
        let mut clients = Clients::default();
        for id in 1..=3 {
            clients.connect(id, Protocol::Resp3);
        }
        let mut tracker = Tracker::new(max_keys);
        for id in 1..=3u64 {
            tracker.tracking(id, &words("on"), &clients).unwrap();
        }
        let mut read: BTreeSet<(ClientId, Bytes)> = BTreeSet::new();
        let mut told: BTreeSet<(ClientId, Bytes)> = BTreeSet::new();
        for (id, names) in reads {
            let names: Vec<_> = names.iter().map(|n| key(&format!("k{n}"))).collect();
            for name in &names {
                // A key told and read again is tracked again.
                told.remove(&(id, name.clone()));
                read.insert((id, name.clone()));
            }
            for delivery in tracker.read(id, &names, &clients) {
                let Message::Push(Invalidation::Keys(keys)) = delivery.message else {
                    panic!("a push of keys: {delivery:?}");
                };
                for key in keys {
                    prop_assert!(told.insert((delivery.tracking, key)), "told twice");
                }
            }
            prop_assert!(tracker.stats().keys <= max_keys);
        }
        let all: Vec<_> = (0..20).map(|n| key(&format!("k{n}"))).collect();
        for delivery in tracker.invalidate(&all, None, &clients) {
            let Message::Push(Invalidation::Keys(keys)) = delivery.message else {
                panic!("a push of keys: {delivery:?}");
            };
            for key in keys {
                prop_assert!(told.insert((delivery.tracking, key)), "told twice");
            }
        }
        prop_assert_eq!(told, read);
    }
}
