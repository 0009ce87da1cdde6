//! The lease scripts and how they reach Redis: EVALSHA on the SCRIPT lane of the lease
//! service's own lanes (its own ACL user, the only one that reaches the reserved keyspace), and on `NOSCRIPT`
//! (a fresh or restarted server, `SCRIPT FLUSH`) one `SCRIPT LOAD` on the same channel and one more
//! EVALSHA. Failures are sorted by whether the script can have run: "not sent" is safe to report as
//! unavailable, "sent, reply unknown" is indeterminate.

use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;
use tollgate_lanes::{CallError, Delivery, Lanes, Route, Shape, Slot};
use tollgate_model::Multiplexed;
use tollgate_resp::Frame;

/// One Lua script and its SHA-1, the name EVALSHA calls it by.
pub struct Script {
    pub name: &'static str,
    pub source: &'static str,
    sha: String,
    /// `EVALSHA` and the SHA as the first two words of a command, encoded once.
    evalsha_head: Vec<u8>,
}

impl Script {
    fn new(name: &'static str, source: &'static str) -> Script {
        let sha = sha1_smol::Sha1::from(source).digest().to_string();
        let mut head = BytesMut::new();
        tollgate_resp::encode_bulk(b"EVALSHA", &mut head);
        tollgate_resp::encode_bulk(sha.as_bytes(), &mut head);
        Script {
            name,
            source,
            sha,
            evalsha_head: head.to_vec(),
        }
    }

    pub fn sha(&self) -> &str {
        &self.sha
    }
}

/// Every script starts with the preludes it may call: fence drawing and shared resources
/// (semaphores, read/write leases), which the exclusive scripts must recognise too.
macro_rules! script {
    ($name:literal, $file:literal) => {
        LazyLock::new(|| {
            Script::new(
                $name,
                concat!(
                    include_str!("lua/fence.lua"),
                    include_str!("lua/shared.lua"),
                    include_str!($file)
                ),
            )
        })
    };
}

pub static ACQUIRE: LazyLock<Script> = script!("acquire", "lua/acquire.lua");
pub static RENEW: LazyLock<Script> = script!("renew", "lua/renew.lua");
pub static RELEASE: LazyLock<Script> = script!("release", "lua/release.lua");
pub static INSPECT: LazyLock<Script> = script!("inspect", "lua/inspect.lua");
pub static ACQUIRE_SHARED: LazyLock<Script> = script!("acquire_shared", "lua/acquire_shared.lua");
pub static WITHDRAW: LazyLock<Script> = script!("withdraw", "lua/withdraw.lua");

/// Why a script gave no usable reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// Nothing ran: the lane refused, Redis was unreachable, or Redis rejected the call up front.
    #[error("{0}")]
    NotSent(String),
    /// The call went out and its reply is unknown; the script may have run.
    #[error("{0}")]
    Indeterminate(String),
}

/// Error replies by which Redis says it refused the command before running any of it (`FENCE`: the
/// acquire script found a corrupt fence counter and wrote nothing).
const REFUSED_UP_FRONT: [&str; 11] = [
    "NOSCRIPT",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "READONLY",
    "OOM",
    "NOPERM",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "NOREPLICAS",
    "FENCE",
];

/// A script's reply and its follow-ups' (`WAIT`), in order: nearly always one or two, kept
/// without a vector of their own.
pub type Frames = SmallVec<[Frame; 2]>;

/// Runs lease scripts on the SCRIPT lane.
#[derive(Clone)]
pub struct ScriptRunner {
    lanes: Lanes,
}

impl ScriptRunner {
    pub fn new(lanes: Lanes) -> ScriptRunner {
        ScriptRunner { lanes }
    }

    /// Runs `script` and returns its reply; follow-up commands that must share its connection
    /// (`WAIT`) go in `then`, and their replies follow in order.
    pub async fn run(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        then: &[&[&[u8]]],
    ) -> Result<Frames, ScriptError> {
        let channel = self
            .lanes
            .multiplexed(Multiplexed::Script)
            .map_err(|error| ScriptError::NotSent(error.to_string()))?;
        // On a cluster every key of a resource shares its hash tag, so the first names the node;
        // a script loaded after NOSCRIPT must be loaded on that same node. On one server every
        // route leads to it, and the slot is not worth computing.
        let route = match (self.lanes.shape(), keys.first()) {
            (Shape::Cluster(_), Some(key)) => Route::Slot(Slot::of(key.as_bytes())),
            _ => Route::Any,
        };
        // Handed over, not kept for the rare resend after NOSCRIPT, which writes it again: a kept
        // copy would cost the shared header of a second handle on every call.
        let first = send_all(&channel, &route, evalsha(script, keys, args), then).await?;
        if !is_noscript(&first[0]) {
            return first.into_iter().map(checked).collect();
        }
        tracing::info!(script = script.name, "NOSCRIPT: loading the script once");
        let load = command(&[b"SCRIPT".as_slice(), b"LOAD", script.source.as_bytes()]);
        let load = channel.send_to(route.clone(), load).await.map_err(sorted)?;
        if load.is_error() {
            let message = load
                .frame()
                .map_or_else(|e| e.to_string(), |f| describe(&f));
            return Err(ScriptError::NotSent(message));
        }
        send_all(&channel, &route, evalsha(script, keys, args), then)
            .await?
            .into_iter()
            .map(checked)
            .collect()
    }
}

/// Queues the script and its follow-ups in order (each `send` queues at once), then awaits all.
async fn send_all(
    channel: &tollgate_lanes::Channel,
    route: &Route,
    evalsha: Bytes,
    then: &[&[&[u8]]],
) -> Result<Frames, ScriptError> {
    let send = |command: Bytes| channel.send_to(route.clone(), command);
    if then.is_empty() {
        // The usual call: the script alone, without a vector of one pending reply.
        let reply = send(evalsha).await.map_err(sorted)?;
        let frame = reply
            .frame()
            .map_err(|error| ScriptError::Indeterminate(error.to_string()))?;
        return Ok(smallvec::smallvec![frame]);
    }
    let mut pending = vec![send(evalsha)];
    pending.extend(then.iter().map(|argv| send(command(argv))));
    let mut frames = Frames::with_capacity(pending.len());
    for (index, reply) in pending.into_iter().enumerate() {
        match reply.await {
            // The call went out: a reply that cannot be read leaves its outcome unknown.
            Ok(reply) => frames.push(
                reply
                    .frame()
                    .map_err(|error| ScriptError::Indeterminate(error.to_string()))?,
            ),
            // Once the script itself went out, a later failure no longer means "not sent".
            Err(error) if index > 0 => {
                return Err(ScriptError::Indeterminate(error.to_string()));
            }
            Err(error) => return Err(sorted(error)),
        }
    }
    Ok(frames)
}

/// `EVALSHA <sha> <numkeys> <keys…> <args…>`, written straight into one buffer of its size:
/// this runs for every lease call, and an argument vector and a formatted key count around
/// `encode_command` cost it a third more.
fn evalsha(script: &Script, keys: &[&str], args: &[&[u8]]) -> Bytes {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    let counted;
    let numkeys = match DIGITS.get(keys.len()) {
        Some(digit) => *digit,
        None => {
            counted = keys.len().to_string();
            counted.as_str()
        }
    };
    let words = 3 + keys.len() + args.len();
    // Exactly its size: a buffer with room to spare would need a second allocation (the shared
    // header `Bytes` keeps for a vector whose length is not its capacity) when frozen.
    let size = tollgate_resp::header_len(words)
        + script.evalsha_head.len()
        + std::iter::once(numkeys.len())
            .chain(keys.iter().map(|key| key.len()))
            .chain(args.iter().map(|arg| arg.len()))
            .map(tollgate_resp::bulk_len)
            .sum::<usize>();
    let mut out = BytesMut::with_capacity(size);
    tollgate_resp::encode_header(b'*', words, &mut out);
    out.extend_from_slice(&script.evalsha_head);
    for word in std::iter::once(numkeys.as_bytes())
        .chain(keys.iter().map(|key| key.as_bytes()))
        .chain(args.iter().copied())
    {
        tollgate_resp::encode_bulk(word, &mut out);
    }
    debug_assert_eq!(out.len(), size, "the command's size, computed in advance");
    out.freeze()
}

fn command(argv: &[&[u8]]) -> Bytes {
    let mut out = BytesMut::new();
    tollgate_resp::encode_command(argv, &mut out);
    out.freeze()
}

fn sorted(error: CallError) -> ScriptError {
    match error.delivery() {
        Delivery::NotSent => ScriptError::NotSent(error.to_string()),
        Delivery::MaybeRan | Delivery::Ran => ScriptError::Indeterminate(error.to_string()),
    }
}

fn is_noscript(frame: &Frame) -> bool {
    frame.is_error() && error_code(frame) == Some("NOSCRIPT")
}

fn error_code(frame: &Frame) -> Option<&str> {
    let text = std::str::from_utf8(frame.as_bytes()?).ok()?;
    text.split_whitespace().next()
}

/// An error reply is "not sent" when Redis says it refused up front; any other error may have
/// come from inside a script that already wrote, so it is indeterminate.
fn checked(frame: Frame) -> Result<Frame, ScriptError> {
    if !frame.is_error() {
        return Ok(frame);
    }
    let message = describe(&frame);
    if error_code(&frame) == Some("FENCE") {
        tracing::error!(%message, "a fence counter is corrupt; the lease is refused");
    }
    match error_code(&frame) {
        Some(code) if REFUSED_UP_FRONT.contains(&code) => Err(ScriptError::NotSent(message)),
        _ => Err(ScriptError::Indeterminate(message)),
    }
}

fn describe(frame: &Frame) -> String {
    match frame.as_bytes() {
        Some(bytes) => format!("redis: {}", String::from_utf8_lossy(bytes)),
        None => format!("redis: unexpected reply {frame:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_shas_are_redis_sha1_of_the_source() {
        // SHA-1 of the empty string, as `SCRIPT LOAD ""` would name it.
        assert_eq!(
            Script::new("empty", "").sha(),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
        let shas = [
            &ACQUIRE,
            &RENEW,
            &RELEASE,
            &INSPECT,
            &ACQUIRE_SHARED,
            &WITHDRAW,
        ]
        .map(|s| s.sha().to_owned());
        assert!(shas.iter().all(|sha| sha.len() == 40));
        assert_eq!(
            shas.iter().collect::<std::collections::HashSet<_>>().len(),
            shas.len()
        );
    }

    #[test]
    fn evalsha_is_the_command_encode_command_writes() {
        let script = Script::new("t", "return 1");
        let args: [&[u8]; 3] = [b"owner", b"", &[b'v'; 300]];
        for keys in [vec![], vec!["a"], vec!["k"; 12]] {
            let numkeys = keys.len().to_string();
            let mut argv: Vec<&[u8]> = vec![b"EVALSHA", script.sha.as_bytes(), numkeys.as_bytes()];
            argv.extend(keys.iter().map(|key| key.as_bytes()));
            argv.extend(args);
            assert_eq!(evalsha(&script, &keys, &args), command(&argv));
        }
    }

    #[test]
    fn error_replies_are_sorted_by_whether_anything_ran() {
        let refused = Frame::Error(Bytes::from_static(b"OOM command not allowed"));
        assert!(matches!(checked(refused), Err(ScriptError::NotSent(_))));
        let midway = Frame::Error(Bytes::from_static(b"ERR user_script:3: something"));
        assert!(matches!(
            checked(midway),
            Err(ScriptError::Indeterminate(_))
        ));
        assert!(is_noscript(&Frame::Error(Bytes::from_static(
            b"NOSCRIPT No matching script."
        ))));
    }
}
