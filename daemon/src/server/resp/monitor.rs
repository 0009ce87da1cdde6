//! `MONITOR` through the daemon: Redis's own would stream the shared lane connections' traffic,
//! every tenant's, so the daemon streams the commands its sessions run instead, in Redis's format,
//! each monitor seeing only the sessions its caller may see (`CLIENT LIST`'s rule). Commands the
//! policy refused are not shown: they did not run. Nothing is formatted while no one monitors.
//! As in Redis, administrative commands are never shown, and credentials are written
//! `(redacted)`: AUTH's arguments, HELLO's after AUTH, MIGRATE's after AUTH and AUTH2 ([`redact`]).

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
        let mut argv: Vec<&[u8]> = command.words().collect();
        redact(&mut argv);
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

/// What Redis shows in place of a credential.
const REDACTED: &[u8] = b"(redacted)";

/// Replaces the credentials in `argv` as Redis's `redactClientCommandArgument` calls do (7.0):
/// every argument of AUTH; the user and password after HELLO's AUTH; the password after
/// MIGRATE's AUTH, the user and password after its AUTH2. (ACL SETUSER and CONFIG SET, which
/// Redis redacts too, are administrative: never shown at all.)
fn redact(argv: &mut [&[u8]]) {
    let Some(name) = argv.first() else {
        return;
    };
    let is = |word: &[u8], expected: &[u8]| word.eq_ignore_ascii_case(expected);
    if is(name, b"AUTH") {
        argv[1..].fill(REDACTED);
    } else if is(name, b"HELLO") {
        // `HELLO [protover [AUTH username password] [SETNAME clientname]]`
        let mut at = 2;
        while at < argv.len() {
            let more = argv.len() - at - 1;
            if is(argv[at], b"AUTH") && more >= 2 {
                argv[at + 1..at + 3].fill(REDACTED);
                at += 3;
            } else if is(argv[at], b"SETNAME") && more >= 1 {
                at += 2;
            } else {
                break;
            }
        }
    } else if is(name, b"MIGRATE") {
        // `MIGRATE host port key db timeout [COPY] [REPLACE] [AUTH pw | AUTH2 user pw] [KEYS …]`
        let mut at = 6;
        while at < argv.len() {
            let more = argv.len() - at - 1;
            if is(argv[at], b"AUTH") && more >= 1 {
                argv[at + 1] = REDACTED;
                at += 2;
            } else if is(argv[at], b"AUTH2") && more >= 2 {
                argv[at + 1..at + 3].fill(REDACTED);
                at += 3;
            } else if is(argv[at], b"KEYS") {
                break;
            } else {
                at += 1;
            }
        }
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

    fn redacted(words: &str) -> String {
        let words = argv(words);
        let mut words: Vec<&[u8]> = words.to_vec();
        redact(&mut words);
        let words: Vec<String> = words
            .iter()
            .map(|word| String::from_utf8_lossy(word).into_owned())
            .collect();
        words.join(" ")
    }

    #[test]
    fn credentials_are_redacted_as_redis_redacts_them() {
        for (sent, shown) in [
            ("auth pw", "auth (redacted)"),
            ("AUTH user pw", "AUTH (redacted) (redacted)"),
            (
                "hello 3 auth user pw setname x",
                "hello 3 auth (redacted) (redacted) setname x",
            ),
            (
                "HELLO 3 SETNAME x AUTH u p",
                "HELLO 3 SETNAME x AUTH (redacted) (redacted)",
            ),
            (
                "migrate h 1 k 0 100 AUTH secretpw",
                "migrate h 1 k 0 100 AUTH (redacted)",
            ),
            (
                "migrate h 1 k 0 100 COPY AUTH2 user pw KEYS auth a",
                "migrate h 1 k 0 100 COPY AUTH2 (redacted) (redacted) KEYS auth a",
            ),
            // Keys are not credentials, whatever they are called.
            ("migrate h 1 auth 0 100", "migrate h 1 auth 0 100"),
            ("set auth pw", "set auth pw"),
        ] {
            assert_eq!(redacted(sent), shown, "{sent}");
        }
    }

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
