//! The decision log: one JSON line per decision (when, principal, the caller's uid, gid and pid,
//! command and lane, keys, verdict, rule, module, generation, latency), written by its own thread.
//! Admission only `try_send`s into a bounded queue, so a slow disk never delays a command: a full
//! queue drops the line and counts it.
//!
//! Admitted and denied commands alike carry what `tollgate policy replay` needs to decide them
//! again: with `keys: digest` (the default) each key's class under the logging policy's key globs
//! (`regions`: a witness key of the same class, such as `acme:x`, never the key itself) beside its
//! digest; with `keys: raw`, the keys. At most [`MAX_KEYS`] keys, each at most [`MAX_KEY_BYTES`],
//! are written; a line cut short says `"cut": true`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tollgate_model::Lane;

use crate::classes::atoms::Atoms;
use crate::decision::Decision;

/// Lines buffered between admission and the writer thread.
const QUEUE: usize = 8192;
/// Keys written per line at most (a `DEL` of a million keys is one line, not a megabyte).
pub const MAX_KEYS: usize = 64;
/// Bytes of a raw key written at most.
pub const MAX_KEY_BYTES: usize = 512;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionLogConfig {
    /// Where the JSON lines go (appended).
    pub path: PathBuf,
    /// How keys are written: `digest` (default; SHA-256, first 16 hex digits) or `raw`.
    #[serde(default)]
    pub keys: KeyRendering,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyRendering {
    #[default]
    Digest,
    Raw,
}

/// What admission hands over; rendering (digests, JSON) happens on the writer thread.
pub struct Entry {
    pub principal: String,
    /// Who the kernel says sent it: the peer's uid, gid and pid, so a line names the process too
    /// and a replay can map the peer to a principal under another policy.
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// The lane the catalog put the command on; `None` when no catalog knows it.
    pub lane: Option<Lane>,
    /// The command's keys (at most [`MAX_KEYS`], admitted or denied): only these of its arguments
    /// are written, so only these are copied.
    pub keys: Vec<Bytes>,
    /// Whether the command had more keys than `keys` holds.
    pub cut: bool,
    /// The logging generation's partition of keys by its globs, for `regions`.
    pub regions: Option<Arc<Atoms>>,
    /// When it was decided, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub decision: Decision,
    pub generation: u64,
    pub latency: Duration,
}

#[derive(Serialize)]
struct Line<'a> {
    ts_ms: u64,
    principal: &'a str,
    uid: u32,
    gid: u32,
    pid: u32,
    command: String,
    lane: Option<&'static str>,
    keys: Vec<String>,
    /// Each key's class under the logging policy's globs, as a witness key (`keys: digest`).
    #[serde(skip_serializing_if = "Option::is_none")]
    regions: Option<Vec<String>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    cut: bool,
    decision: &'static str,
    rule: &'a str,
    module: &'a str,
    cause: Option<&'static str>,
    generation: u64,
    latency_ns: u128,
}

pub struct DecisionLog {
    queue: SyncSender<Entry>,
    dropped: Counter,
}

impl DecisionLog {
    pub fn open(config: &DecisionLogConfig, dropped: Counter) -> std::io::Result<DecisionLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&config.path)?;
        DecisionLog::start(file, config.path.clone(), config.keys, dropped)
    }

    /// The writer thread on `out`; `path` only names it in warnings.
    fn start(
        out: impl Write + Send + 'static,
        path: PathBuf,
        keys: KeyRendering,
        dropped: Counter,
    ) -> std::io::Result<DecisionLog> {
        let (queue, lines) = sync_channel::<Entry>(QUEUE);
        std::thread::Builder::new()
            .name("tollgate-decision-log".into())
            .spawn(move || write_lines(out, &path, keys, lines))?;
        Ok(DecisionLog { queue, dropped })
    }

    pub fn record(&self, entry: Entry) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.queue.try_send(entry)
        {
            self.dropped.inc();
        }
    }
}

fn write_lines(
    out: impl Write,
    path: &Path,
    keys: KeyRendering,
    lines: std::sync::mpsc::Receiver<Entry>,
) {
    let mut out = std::io::BufWriter::new(out);
    while let Ok(first) = lines.recv() {
        // Write whatever is queued, then flush once: one syscall per burst, not per line.
        for entry in std::iter::once(first).chain(lines.try_iter()) {
            let line = render(&entry, keys);
            if let Err(error) = serde_json::to_writer(&mut out, &line)
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n"))
            {
                tracing::warn!(path = %path.display(), %error, "decision log write failed");
            }
        }
        if let Err(error) = out.flush() {
            tracing::warn!(path = %path.display(), %error, "decision log flush failed");
        }
    }
}

fn render(entry: &Entry, keys: KeyRendering) -> Line<'_> {
    let show = |key: &Bytes| match keys {
        KeyRendering::Raw => {
            String::from_utf8_lossy(&key[..key.len().min(MAX_KEY_BYTES)]).into_owned()
        }
        KeyRendering::Digest => hex::encode(&Sha256::digest(key)[..8]),
    };
    let regions = match (keys, &entry.regions) {
        (KeyRendering::Digest, Some(atoms)) => Some(
            entry
                .keys
                .iter()
                .map(|key| {
                    atoms
                        .atom_of(key)
                        .map(|at| String::from_utf8_lossy(&atoms.atoms[at].witness).into_owned())
                        .unwrap_or_default()
                })
                .collect(),
        ),
        _ => None,
    };
    let cut = entry.cut
        || keys == KeyRendering::Raw && entry.keys.iter().any(|k| k.len() > MAX_KEY_BYTES);
    let (decision, rule, module, cause, command, key_list) = match &entry.decision {
        Decision::Admitted {
            descriptor, rule, ..
        } => (
            "admitted",
            &**rule,
            "",
            None,
            descriptor.name.clone(),
            entry.keys.iter().map(show).collect(),
        ),
        Decision::Denied(denial) => (
            "denied",
            denial.rule.as_str(),
            denial.module.as_str(),
            Some(denial.cause.as_str()),
            denial.command.clone(),
            entry.keys.iter().map(show).collect(),
        ),
    };
    Line {
        ts_ms: entry.at_ms,
        principal: &entry.principal,
        uid: entry.uid,
        gid: entry.gid,
        pid: entry.pid,
        command,
        lane: entry.lane.map(Lane::as_str),
        keys: key_list,
        regions,
        cut,
        decision,
        rule,
        module,
        cause,
        generation: entry.generation,
        latency_ns: entry.latency.as_nanos(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{channel, Receiver, Sender};

    use super::*;
    use crate::decision::{Denial, DenyCause};

    /// A disk that never finishes a write: reports that a write began, then blocks until dropped.
    struct Stalled {
        began: Sender<()>,
        release: Receiver<()>,
    }

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.began.send(());
            let _ = self.release.recv();
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn entry() -> Entry {
        Entry {
            principal: "app".into(),
            uid: 1000,
            gid: 1000,
            pid: 1,
            lane: None,
            keys: Vec::new(),
            cut: false,
            regions: None,
            at_ms: 0,
            decision: Decision::Denied(Box::new(Denial {
                rule: "no-wipe".into(),
                module: "yaml-guard".into(),
                reason: "no".into(),
                cause: DenyCause::Rule,
                command: "FLUSHALL".into(),
            })),
            generation: 1,
            latency: Duration::from_micros(1),
        }
    }

    #[test]
    fn a_stalled_writer_drops_and_counts_lines_instead_of_blocking_admission() {
        let (began, writing) = channel();
        let (release, stalled) = channel();
        let dropped = Counter::default();
        let log = DecisionLog::start(
            Stalled {
                began,
                release: stalled,
            },
            PathBuf::from("<stalled>"),
            KeyRendering::Digest,
            dropped.clone(),
        )
        .unwrap();
        // The writer takes the first line and blocks writing it; the queue is empty again.
        log.record(entry());
        writing.recv().unwrap();
        for _ in 0..QUEUE + 5 {
            log.record(entry());
        }
        assert_eq!(dropped.get(), 5);
        drop(release);
    }
}
