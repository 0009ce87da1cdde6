//! `MONITOR` through the daemon: Redis's own would stream the shared lane connections' traffic,
//! every tenant's, so the daemon streams the commands its sessions run instead, in Redis's format,
//! each monitor seeing only the sessions its caller may see (`CLIENT LIST`'s rule). Commands the
//! policy refused are not shown: they did not run. Nothing is formatted while no one monitors.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::broadcast;
use tollgate_resp::Command;

use super::clients::Client;

/// Lines a slow monitor may fall behind by before it misses some (Redis would disconnect it at
/// its output-buffer limit; a monitor that skips is kinder to the rest).
const BACKLOG: usize = 4096;

/// The listener's monitors.
pub struct Monitors {
    lines: broadcast::Sender<Arc<Monitored>>,
    /// How many sessions monitor: read on every command, so an atomic rather than the channel's
    /// own count, which takes a lock.
    watching: AtomicUsize,
}

/// One command as monitors see it.
pub struct Monitored {
    principal: String,
    /// The line without its leading `+` and trailing CRLF.
    line: String,
}

/// A session's subscription to the monitors' stream; dropping it stops the stream.
pub struct Watch {
    lines: broadcast::Receiver<Arc<Monitored>>,
    monitors: Arc<Monitors>,
}

impl Default for Monitors {
    fn default() -> Self {
        Self {
            lines: broadcast::channel(BACKLOG).0,
            watching: AtomicUsize::new(0),
        }
    }
}

impl Monitors {
    pub fn watch(self: &Arc<Self>) -> Watch {
        self.watching.fetch_add(1, Ordering::Relaxed);
        Watch {
            lines: self.lines.subscribe(),
            monitors: self.clone(),
        }
    }

    /// Shows that `client` ran `command`, if anyone monitors.
    pub fn ran(&self, client: &Client, command: &Command) {
        if self.watching.load(Ordering::Relaxed) == 0 {
            return;
        }
        let argv: Vec<&[u8]> = command.words().collect();
        let _ = self.lines.send(Arc::new(Monitored {
            principal: client.principal.clone(),
            line: line(SystemTime::now(), client.addr(), &argv),
        }));
    }
}

impl Watch {
    /// The next line `viewer` may see, as the bytes to write (`+… \r\n`); `None` once the daemon
    /// stops. Lines missed by falling behind are skipped.
    pub async fn next(&mut self, viewer: &Client) -> Option<Bytes> {
        loop {
            match self.lines.recv().await {
                Ok(seen) if viewer.sees_principal(&seen.principal) => {
                    return Some(Bytes::from(format!("+{}\r\n", seen.line)))
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.monitors.watching.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `1339518083.107412 [0 unix:/run/resp.sock:7] "set" "k" "v"`: Redis's format, each word quoted
/// and escaped as Redis's `sdscatrepr` does.
fn line(at: SystemTime, addr: &str, argv: &[&[u8]]) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut line = format!(
        "{}.{:06} [0 unix:{addr}]",
        since.as_secs(),
        since.subsec_micros()
    );
    for word in argv {
        line.push(' ');
        quote(word, &mut line);
    }
    line
}

/// `word` quoted and escaped as Redis's `sdscatrepr` writes it: printable ASCII kept.
pub(super) fn quote(word: &[u8], out: &mut String) {
    out.push('"');
    for &byte in word {
        match byte {
            b'\\' => out.push_str("\\\\"),
            b'"' => out.push_str("\\\""),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            printable if printable.is_ascii_graphic() || printable == b' ' => {
                out.push(char::from(printable))
            }
            other => {
                let _ = write!(out, "\\x{other:02x}");
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::server::resp::words::argv;

    #[test]
    fn a_line_is_written_as_redis_writes_it() {
        let at = UNIX_EPOCH + Duration::from_micros(1_339_518_083_107_412);
        assert_eq!(
            line(at, "/run/resp.sock:7", &argv("SET k v")),
            r#"1339518083.107412 [0 unix:/run/resp.sock:7] "SET" "k" "v""#
        );
        let words: [&[u8]; 2] = [b"SET", b"a\"b\\c\n\x01 d"];
        assert_eq!(
            line(at, "s:1", &words),
            r#"1339518083.107412 [0 unix:s:1] "SET" "a\"b\\c\n\x01 d""#
        );
    }
}
