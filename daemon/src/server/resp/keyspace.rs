//! Whole-keyspace commands, where the policy allows them, act on the keys the caller may touch and
//! no others: `KEYS` (served with SCAN, so Redis never blocks on it), `SCAN`, `DBSIZE`,
//! `RANDOMKEY` and `FLUSHDB`/`FLUSHALL` (as UNLINK of those keys). A tenant's FLUSHDB empties that tenant's
//! keys; a raw server-wide flush never runs on a client lane. Which keys a caller may touch is the
//! policy's own answer for `EXISTS <key>` (reading) or `UNLINK <key>` (flushing).

use std::collections::HashSet;

use bytes::{Bytes, BytesMut};
use tollgate_lanes::Channel;
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
    let mut pages = Pages::new(scope, vec![b"MATCH", pattern, b"COUNT", PAGE.as_bytes()]);
    while let Some(page) = pages.next().await? {
        for key in scope.admission.touchable(scope.caller, "EXISTS", page) {
            if seen.insert(key.clone()) {
                found.push(Frame::Bulk(key));
            }
        }
    }
    Ok(replies::encode(&Frame::Array(found)))
}

/// SCAN as the client sent it, each page cut to the keys the caller may touch; the cursor is
/// Redis's, so a scan resumes and ends as it would.
async fn scan(argv: &[Bytes], scope: &Scope<'_>) -> Result<Bytes, Failed> {
    let Some(cursor) = argv.get(1) else {
        return Err(replies::wrong_arity("scan"));
    };
    let options: Vec<&[u8]> = argv[2..].iter().map(|word| &word[..]).collect();
    let (next, page) = scan_page(scope, cursor, &options).await?;
    let keys = scope.admission.touchable(scope.caller, "EXISTS", page);
    Ok(replies::encode(&Frame::Array(vec![
        Frame::Bulk(next),
        Frame::Array(keys.into_iter().map(Frame::Bulk).collect()),
    ])))
}

/// The number of touchable keys. A key that Redis's SCAN returns twice (while its table is being
/// resized) is counted twice: an exact count would hold every key name in memory.
async fn db_size(scope: &Scope<'_>) -> Result<Bytes, Failed> {
    let mut count = 0usize;
    let mut pages = Pages::new(scope, vec![b"COUNT", PAGE.as_bytes()]);
    while let Some(page) = pages.next().await? {
        count += scope
            .admission
            .touchable(scope.caller, "EXISTS", page)
            .len();
    }
    Ok(replies::encode(&Frame::Integer(count as i64)))
}

async fn random_key(scope: &Scope<'_>) -> Result<Bytes, Failed> {
    for _ in 0..RANDOM_DRAWS {
        let drawn = match call(scope, &[b"RANDOMKEY"]).await? {
            Frame::Bulk(key) => key,
            // An empty database.
            _ => return Ok(null(scope.protocol)),
        };
        if let Some(key) = scope
            .admission
            .touchable(scope.caller, "EXISTS", vec![drawn])
            .pop()
        {
            return Ok(replies::encode(&Frame::Bulk(key)));
        }
    }
    // Few of the keys are the caller's: any one of them, found by scanning.
    let mut pages = Pages::new(scope, vec![b"COUNT", PAGE.as_bytes()]);
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
    Ok(null(scope.protocol))
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
    let mut pages = Pages::new(scope, vec![b"COUNT", PAGE.as_bytes()]);
    while let Some(page) = pages.next().await? {
        let doomed = scope.admission.touchable(scope.caller, "UNLINK", page);
        if !doomed.is_empty() {
            let mut unlink: Vec<&[u8]> = vec![b"UNLINK"];
            unlink.extend(doomed.iter().map(|key| &key[..]));
            call(scope, &unlink).await?;
        }
    }
    Ok(replies::ok())
}

/// A whole scan, page by page: Redis's cursor from 0 until it comes back to 0.
struct Pages<'a> {
    scope: &'a Scope<'a>,
    options: Vec<&'a [u8]>,
    /// The cursor of the next round; `None` once the scan is done.
    cursor: Option<Bytes>,
}

impl<'a> Pages<'a> {
    fn new(scope: &'a Scope<'a>, options: Vec<&'a [u8]>) -> Self {
        Self {
            scope,
            options,
            cursor: Some(Bytes::from_static(b"0")),
        }
    }

    /// The next page's keys, or `None` after the last page.
    async fn next(&mut self) -> Result<Option<Vec<Bytes>>, Failed> {
        let Some(cursor) = self.cursor.take() else {
            return Ok(None);
        };
        let (next, page) = scan_page(self.scope, &cursor, &self.options).await?;
        if &next[..] != b"0" {
            self.cursor = Some(next);
        }
        Ok(Some(page))
    }
}

/// One `SCAN cursor options…` round: the next cursor and the page's keys.
async fn scan_page(
    scope: &Scope<'_>,
    cursor: &Bytes,
    options: &[&[u8]],
) -> Result<(Bytes, Vec<Bytes>), Failed> {
    let mut argv: Vec<&[u8]> = vec![b"SCAN", cursor];
    argv.extend_from_slice(options);
    let reply = call(scope, &argv).await?;
    let Frame::Array(mut parts) = reply else {
        return Err(replies::error(
            "ERR tollgate: SCAN answered unexpectedly".to_owned(),
        ));
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
        _ => Err(replies::error(
            "ERR tollgate: SCAN answered unexpectedly".to_owned(),
        )),
    }
}

/// Sends one command on the caller's REGULAR channel; Redis's error reply is the client's.
async fn call(scope: &Scope<'_>, argv: &[&[u8]]) -> Result<Frame, Failed> {
    let mut encoded = BytesMut::new();
    tollgate_resp::encode_command(argv, &mut encoded);
    let reply = scope
        .channel
        .send(encoded.freeze())
        .await
        .map_err(|error| replies::call_failed(&error))?;
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
