//! Whole-keyspace commands, where the policy allows them, act on the keys the caller may touch and
//! no others: `KEYS` (served with SCAN, so Redis never blocks on it), `SCAN`, `DBSIZE`,
//! `RANDOMKEY` and `FLUSHDB`/`FLUSHALL` (as UNLINK of those keys). A tenant's FLUSHDB empties that tenant's
//! keys; a raw server-wide flush never runs on a client lane. Which keys a caller may touch is the
//! policy's own answer for `EXISTS <key>` (reading) or `UNLINK <key>` (flushing).
//!
//! On a cluster they cover every master, in the lanes' stable order: `KEYS` and `DBSIZE` scan each
//! in turn, `SCAN`'s cursor says which master it is on (`cursor`), `RANDOMKEY` draws from the
//! masters in a random order, and a flush's UNLINKs go to each key's slot, one per slot, pipelined.

mod cursor;

use std::collections::{BTreeMap, HashSet};

use bytes::{Bytes, BytesMut};
use futures::future::join_all;
use rand::seq::SliceRandom;
use tollgate_lanes::{CallError, Channel, Reply, Route, Slot};
use tollgate_model::Caller;
use tollgate_policy::Admission;
use tollgate_resp::Frame;

use super::local::Protocol;
use super::replies;

/// Keys asked of Redis per SCAN round.
const PAGE: &str = "1000";
/// RANDOMKEY draws tried before falling back to a scan for any touchable key.
const RANDOM_DRAWS: usize = 16;

/// A whole-keyspace command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whole {
    Keys,
    Scan,
    DbSize,
    RandomKey,
    FlushDb,
}

impl Whole {
    /// The whole-keyspace command a catalog name (`KEYS`, `FLUSHDB`) is, if it is one.
    pub fn of(name: &str) -> Option<Whole> {
        Some(match name {
            "KEYS" => Whole::Keys,
            "SCAN" => Whole::Scan,
            "DBSIZE" => Whole::DbSize,
            "RANDOMKEY" => Whole::RandomKey,
            // The daemon serves one database: FLUSHALL clears what FLUSHDB does.
            "FLUSHDB" | "FLUSHALL" => Whole::FlushDb,
            _ => return None,
        })
    }

    /// The commands the daemon sends to serve it.
    pub fn served_with(self) -> &'static [&'static str] {
        match self {
            Whole::Keys | Whole::Scan | Whole::DbSize => &["SCAN"],
            Whole::RandomKey => &["RANDOMKEY", "SCAN"],
            Whole::FlushDb => &["SCAN", "UNLINK"],
        }
    }
}

/// What the command is run with.
pub struct Scope<'a> {
    pub caller: &'a Caller,
    pub admission: &'a Admission,
    pub channel: &'a Channel,
    pub protocol: Protocol,
    pub servers: Servers,
}

/// The servers a whole-keyspace command covers.
pub enum Servers {
    /// One server: SCAN's cursor is Redis's own, and every command goes where `Route::Any` leads.
    One,
    /// A cluster's masters, in the lanes' stable order.
    Masters(Vec<Route>),
}

impl Servers {
    fn routes(&self) -> &[Route] {
        const ONE: &[Route] = &[Route::Any];
        match self {
            Servers::One => ONE,
            Servers::Masters(masters) => masters,
        }
    }
}

/// Runs `whole` (its words in `argv`) and returns the reply to write.
pub async fn serve(whole: Whole, argv: &[Bytes], scope: Scope<'_>) -> Bytes {
    let outcome = match whole {
        Whole::Keys => keys(argv, &scope).await,
        Whole::Scan => scan(argv, &scope).await,
        Whole::DbSize => db_size(&scope).await,
        Whole::RandomKey => random_key(&scope).await,
        Whole::FlushDb => flush(argv, &scope).await,
    };
    outcome.unwrap_or_else(|failed| failed)
}

/// A reply to give instead: Redis's error, or the lane's failure.
type Failed = Bytes;

async fn keys(argv: &[Bytes], scope: &Scope<'_>) -> Result<Bytes, Failed> {
    let [_, pattern] = argv else {
        return Err(replies::wrong_arity("keys"));
    };
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for route in scope.servers.routes() {
        let options = vec![&b"MATCH"[..], pattern, b"COUNT", PAGE.as_bytes()];
        let mut pages = Pages::new(scope, route, options);
        while let Some(page) = pages.next().await? {
            for key in scope.admission.touchable(scope.caller, "EXISTS", page) {
                if seen.insert(key.clone()) {
                    found.push(Frame::Bulk(key));
                }
            }
        }
    }
    Ok(replies::encode(&Frame::Array(found)))
}

/// SCAN as the client sent it, each page cut to the keys the caller may touch. On one server the
/// cursor is Redis's, so a scan resumes and ends as it would; on a cluster it carries the master
/// too (`cursor`).
async fn scan(argv: &[Bytes], scope: &Scope<'_>) -> Result<Bytes, Failed> {
    let Some(cursor) = argv.get(1) else {
        return Err(replies::wrong_arity("scan"));
    };
    let options: Vec<&[u8]> = argv[2..].iter().map(|word| &word[..]).collect();
    let (next, page) = match &scope.servers {
        Servers::One => scan_page(scope, &Route::Any, cursor, &options).await?,
        Servers::Masters(masters) => scan_masters(scope, masters, cursor, &options).await?,
    };
    let keys = scope.admission.touchable(scope.caller, "EXISTS", page);
    Ok(replies::encode(&Frame::Array(vec![
        Frame::Bulk(next),
        Frame::Array(keys.into_iter().map(Frame::Bulk).collect()),
    ])))
}

/// One round of a cluster's SCAN: on the master the client's cursor names, the client's next cursor.
async fn scan_masters(
    scope: &Scope<'_>,
    masters: &[Route],
    cursor: &[u8],
    options: &[&[u8]],
) -> Result<(Bytes, Vec<Bytes>), Failed> {
    let invalid = || replies::error("ERR invalid cursor".to_owned());
    let cursor = decimal(cursor).ok_or_else(invalid)?;
    let refused = |error: cursor::CursorError| replies::error(error.to_string());
    let layout = cursor::Layout::of(masters).map_err(refused)?;
    let at = layout.resume(cursor);
    let node_cursor = Bytes::from(at.node_cursor.to_string());
    // Only an empty list has no master at the start: the slot map lost every master.
    let Some(master) = masters.get(at.master) else {
        return Err(replies::error(
            "ERR tollgate: no master in the slot map".to_owned(),
        ));
    };
    let (node_next, page) = scan_page(scope, master, &node_cursor, options).await?;
    let node_next = decimal(&node_next).ok_or_else(unexpected_scan)?;
    let next = layout.next(at.master, node_next).map_err(refused)?;
    Ok((Bytes::from(next.to_string()), page))
}

/// An unsigned decimal, as SCAN's cursors are.
fn decimal(word: &[u8]) -> Option<u64> {
    std::str::from_utf8(word).ok()?.parse().ok()
}

/// The number of touchable keys. A key that Redis's SCAN returns twice (while its table is being
/// resized) is counted twice: an exact count would hold every key name in memory.
async fn db_size(scope: &Scope<'_>) -> Result<Bytes, Failed> {
    let mut count = 0usize;
    for route in scope.servers.routes() {
        let mut pages = Pages::new(scope, route, vec![b"COUNT", PAGE.as_bytes()]);
        while let Some(page) = pages.next().await? {
            count += scope
                .admission
                .touchable(scope.caller, "EXISTS", page)
                .len();
        }
    }
    Ok(replies::encode(&Frame::Integer(count as i64)))
}

/// A touchable key: drawn with RANDOMKEY from the masters in a random order (an empty master is
/// passed over at its first draw), else the first one a scan of the masters that have keys finds.
/// On a cluster the draw is not uniform over keys: a master is picked first.
async fn random_key(scope: &Scope<'_>) -> Result<Bytes, Failed> {
    let mut masters: Vec<&Route> = scope.servers.routes().iter().collect();
    masters.shuffle(&mut rand::rng());
    let mut holding = Vec::with_capacity(masters.len());
    for route in masters {
        match draw(scope, route).await? {
            Drawn::Touchable(key) => return Ok(replies::encode(&Frame::Bulk(key))),
            Drawn::Empty => {}
            Drawn::Others => holding.push(route),
        }
    }
    // Few of the keys are the caller's: any one of them, found by scanning.
    for route in holding {
        let mut pages = Pages::new(scope, route, vec![b"COUNT", PAGE.as_bytes()]);
        while let Some(page) = pages.next().await? {
            if let Some(key) = scope
                .admission
                .touchable(scope.caller, "EXISTS", page)
                .into_iter()
                .next()
            {
                return Ok(replies::encode(&Frame::Bulk(key)));
            }
        }
    }
    Ok(null(scope.protocol))
}

/// What RANDOMKEY drew from one server.
enum Drawn {
    Touchable(Bytes),
    /// The server holds no key.
    Empty,
    /// [`RANDOM_DRAWS`] keys, none of them the caller's.
    Others,
}

async fn draw(scope: &Scope<'_>, route: &Route) -> Result<Drawn, Failed> {
    for _ in 0..RANDOM_DRAWS {
        let drawn = match call(scope, route, &[b"RANDOMKEY"]).await? {
            Frame::Bulk(key) => key,
            _ => return Ok(Drawn::Empty),
        };
        if let Some(key) = scope
            .admission
            .touchable(scope.caller, "EXISTS", vec![drawn])
            .pop()
        {
            return Ok(Drawn::Touchable(key));
        }
    }
    Ok(Drawn::Others)
}

/// `FLUSHDB [ASYNC|SYNC]` as UNLINK of the keys the caller may delete, page by page.
async fn flush(argv: &[Bytes], scope: &Scope<'_>) -> Result<Bytes, Failed> {
    match argv {
        [_] => {}
        [_, mode] if mode.eq_ignore_ascii_case(b"ASYNC") || mode.eq_ignore_ascii_case(b"SYNC") => {}
        [_, _] => return Err(replies::error("ERR syntax error".to_owned())),
        _ => {
            let name = String::from_utf8_lossy(&argv[0]).to_ascii_lowercase();
            return Err(replies::wrong_arity(&name));
        }
    }
    for route in scope.servers.routes() {
        let mut pages = Pages::new(scope, route, vec![b"COUNT", PAGE.as_bytes()]);
        while let Some(page) = pages.next().await? {
            let doomed = scope.admission.touchable(scope.caller, "UNLINK", page);
            unlink(scope, doomed).await?;
        }
    }
    Ok(replies::ok())
}

/// UNLINKs `doomed`: at once on one server; on a cluster one UNLINK per slot (a node refuses keys
/// of two slots in one command), all sent before any reply is awaited, each to its slot's master.
async fn unlink(scope: &Scope<'_>, doomed: Vec<Bytes>) -> Result<(), Failed> {
    if doomed.is_empty() {
        return Ok(());
    }
    let groups = match scope.servers {
        Servers::One => vec![(Route::Any, doomed)],
        Servers::Masters(_) => {
            let mut slots: BTreeMap<Slot, Vec<Bytes>> = BTreeMap::new();
            for key in doomed {
                slots.entry(Slot::of(&key)).or_default().push(key);
            }
            let slots = slots.into_iter();
            slots
                .map(|(slot, keys)| (Route::Slot(slot), keys))
                .collect()
        }
    };
    let sent: Vec<_> = groups
        .into_iter()
        .map(|(route, keys)| {
            let mut unlink: Vec<&[u8]> = vec![b"UNLINK"];
            unlink.extend(keys.iter().map(|key| &key[..]));
            scope.channel.send_to(route, encoded(&unlink))
        })
        .collect();
    for reply in join_all(sent).await {
        answered(reply)?;
    }
    Ok(())
}

/// A whole scan of one server, page by page: its cursor from 0 until it comes back to 0.
struct Pages<'a> {
    scope: &'a Scope<'a>,
    route: &'a Route,
    options: Vec<&'a [u8]>,
    /// The cursor of the next round; `None` once the scan is done.
    cursor: Option<Bytes>,
}

impl<'a> Pages<'a> {
    fn new(scope: &'a Scope<'a>, route: &'a Route, options: Vec<&'a [u8]>) -> Self {
        Self {
            scope,
            route,
            options,
            cursor: Some(Bytes::from_static(b"0")),
        }
    }

    /// The next page's keys, or `None` after the last page.
    async fn next(&mut self) -> Result<Option<Vec<Bytes>>, Failed> {
        let Some(cursor) = self.cursor.take() else {
            return Ok(None);
        };
        let (next, page) = scan_page(self.scope, self.route, &cursor, &self.options).await?;
        if &next[..] != b"0" {
            self.cursor = Some(next);
        }
        Ok(Some(page))
    }
}

/// One `SCAN cursor options…` round on `route`'s server: its next cursor and the page's keys.
async fn scan_page(
    scope: &Scope<'_>,
    route: &Route,
    cursor: &[u8],
    options: &[&[u8]],
) -> Result<(Bytes, Vec<Bytes>), Failed> {
    let mut argv: Vec<&[u8]> = vec![b"SCAN", cursor];
    argv.extend_from_slice(options);
    let reply = call(scope, route, &argv).await?;
    let Frame::Array(mut parts) = reply else {
        return Err(unexpected_scan());
    };
    match (parts.pop(), parts.pop()) {
        (Some(Frame::Array(keys)), Some(Frame::Bulk(next))) => {
            let keys = keys
                .into_iter()
                .filter_map(|key| match key {
                    Frame::Bulk(key) => Some(key),
                    _ => None,
                })
                .collect();
            Ok((next, keys))
        }
        _ => Err(unexpected_scan()),
    }
}

fn unexpected_scan() -> Failed {
    replies::error("ERR tollgate: SCAN answered unexpectedly".to_owned())
}

/// Sends one command on the caller's REGULAR channel to `route`'s server; Redis's error reply is
/// the client's.
async fn call(scope: &Scope<'_>, route: &Route, argv: &[&[u8]]) -> Result<Frame, Failed> {
    answered(scope.channel.send_to(route.clone(), encoded(argv)).await)
}

fn encoded(argv: &[&[u8]]) -> Bytes {
    let mut encoded = BytesMut::new();
    tollgate_resp::encode_command(argv, &mut encoded);
    encoded.freeze()
}

/// A reply as a frame, or what the client gets instead: Redis's error, or the lane's failure.
fn answered(reply: Result<Reply, CallError>) -> Result<Frame, Failed> {
    let reply = reply.map_err(|error| replies::call_failed(&error))?;
    if reply.is_error() {
        return Err(reply.into_bytes());
    }
    reply
        .frame()
        .map_err(|error| replies::error(format!("ERR tollgate: unreadable reply: {error}")))
}

fn null(protocol: Protocol) -> Bytes {
    replies::encode(&super::local::null(protocol))
}
