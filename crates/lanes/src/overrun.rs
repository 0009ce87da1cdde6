//! Which of the daemon's scripts past their time limit Redis is running, and how to stop it: pure
//! decisions on `FUNCTION STATS`'s answer and the kill's, for the script watch (`script_limit`).
//!
//! Redis 7 names the running script only for functions: `FUNCTION STATS` gives an `FCALL`'s whole
//! command and how long it has run. While an `EVAL` runs it answers `BUSY` instead (and `CLIENT
//! LIST`, `INFO` … are refused while busy), so for an `EVAL` the daemon's own record has to do: one
//! of its `EVAL`s has been the oldest reply owed on its connection for its whole limit, and Redis,
//! busy past its `busy-reply-threshold`, says an `EVAL` is running.

use bytes::{Bytes, BytesMut};
use std::time::Duration;
use tollgate_resp::Frame;

/// Which kill stops a script: `SCRIPT KILL` for the `EVAL` family, `FUNCTION KILL` for `FCALL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    Script,
    Function,
}

impl Kill {
    /// The kill for `command` (one encoded command) when it runs a script; `None` for any other.
    pub(crate) fn of(command: &[u8]) -> Option<Kill> {
        match first_word(command)? {
            name if SCRIPTS.iter().any(|eval| name.eq_ignore_ascii_case(eval)) => {
                Some(Kill::Script)
            }
            name if FUNCTIONS
                .iter()
                .any(|fcall| name.eq_ignore_ascii_case(fcall)) =>
            {
                Some(Kill::Function)
            }
            _ => None,
        }
    }

    /// `SCRIPT` or `FUNCTION`: the kill's first word.
    pub fn word(self) -> &'static str {
        match self {
            Kill::Script => "SCRIPT",
            Kill::Function => "FUNCTION",
        }
    }

    /// The kill, encoded.
    pub(crate) fn command(self) -> &'static [u8] {
        match self {
            Kill::Script => crate::busy::SCRIPT_KILL,
            Kill::Function => crate::busy::FUNCTION_KILL,
        }
    }
}

impl std::fmt::Display for Kill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} KILL", self.word())
    }
}

const SCRIPTS: [&[u8]; 4] = [b"EVAL", b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO"];
const FUNCTIONS: [&[u8]; 2] = [b"FCALL", b"FCALL_RO"];

/// The first word of a command encoded as the lanes send every one (`*N` then `$len` strings).
fn first_word(command: &[u8]) -> Option<&[u8]> {
    let rest = command.strip_prefix(b"*")?;
    let rest = &rest[rest.iter().position(|&b| b == b'\n')? + 1..];
    let rest = rest.strip_prefix(b"$")?;
    let eol = rest.iter().position(|&b| b == b'\r')?;
    let len: usize = std::str::from_utf8(&rest[..eol]).ok()?.parse().ok()?;
    rest.get(eol + 2..eol + 2 + len)
}

/// What `FUNCTION STATS` says Redis is running.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Running {
    /// Nothing: Redis is not busy with a script.
    Nothing,
    /// An `EVAL` (of any client), run past Redis's `busy-reply-threshold`: Redis refuses `FUNCTION
    /// STATS` while one runs, with `BUSY`.
    Eval,
    /// A function, with its whole command (encoded as the lanes encode commands) and how long it
    /// has run.
    Function { command: Bytes, ran: Duration },
    /// An answer of another shape (an ACL refusal, a lost connection): nothing is stopped on it.
    Unknown(String),
}

impl Running {
    /// `FUNCTION STATS`'s `reply` (RESP2), parsed.
    pub(crate) fn of(reply: &Frame) -> Running {
        let items = match reply {
            Frame::Error(text) if text.starts_with(b"BUSY") => return Running::Eval,
            Frame::Array(items) => items,
            other => return Running::Unknown(format!("{other:?}")),
        };
        let running = items
            .chunks_exact(2)
            .find(|pair| pair[0].as_bytes().is_some_and(|k| k == "running_script"))
            .map(|pair| &pair[1]);
        let fields = match running {
            Some(Frame::Array(fields)) => fields,
            Some(Frame::Null | Frame::NullArray | Frame::Null3) => return Running::Nothing,
            other => return Running::Unknown(format!("running_script: {other:?}")),
        };
        let field = |name: &str| {
            fields
                .chunks_exact(2)
                .find(|pair| pair[0].as_bytes().is_some_and(|k| k == name))
                .map(|pair| &pair[1])
        };
        match (field("command"), field("duration_ms")) {
            (Some(Frame::Array(argv)), Some(Frame::Integer(ms))) => {
                let words: Option<Vec<&Bytes>> = argv.iter().map(Frame::as_bytes).collect();
                let Some(words) = words else {
                    return Running::Unknown(format!("command: {argv:?}"));
                };
                let mut command = BytesMut::new();
                tollgate_resp::encode_command(&words, &mut command);
                Running::Function {
                    command: command.freeze(),
                    ran: Duration::from_millis((*ms).max(0) as u64),
                }
            }
            _ => Running::Unknown(format!("running_script: {fields:?}")),
        }
    }
}

/// One of the daemon's scripts past its limit, as the decision sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Overdue<'a> {
    pub(crate) id: u64,
    pub(crate) kill: Kill,
    /// The command as sent.
    pub(crate) command: &'a [u8],
    pub(crate) limit: Duration,
}

/// What to do about the scripts past their limit.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Send this kill: the running script is one of these (only these) scripts of the daemon.
    Stop(Kill, Vec<u64>),
    /// Stop nothing (yet): what runs is not one of the daemon's scripts past its limit (another
    /// client's script, or one of the daemon's that has not run its limit), or nothing runs.
    Leave,
}

/// Whether what Redis is `running` is one of the `overdue` scripts, and which kill stops it.
pub(crate) fn decide(running: &Running, overdue: &[Overdue<'_>]) -> Verdict {
    let stop = |kill: Kill, ids: Vec<u64>| {
        if ids.is_empty() {
            Verdict::Leave
        } else {
            Verdict::Stop(kill, ids)
        }
    };
    match running {
        // Which of several overdue `EVAL`s runs cannot be told: whichever it is, it has run its
        // limit (each was owed its reply that long, and Redis runs one script at a time).
        Running::Eval => stop(
            Kill::Script,
            overdue
                .iter()
                .filter(|script| script.kill == Kill::Script)
                .map(|script| script.id)
                .collect(),
        ),
        // The same function called the same way by two callers: stopped only past the longer
        // limit, so that neither is stopped before its own.
        Running::Function { command, ran } => {
            let same: Vec<&Overdue<'_>> = overdue
                .iter()
                .filter(|script| script.kill == Kill::Function && script.command == &command[..])
                .collect();
            let longest = same.iter().map(|script| script.limit).max();
            match longest {
                Some(limit) if *ran >= limit => stop(
                    Kill::Function,
                    same.iter().map(|script| script.id).collect(),
                ),
                _ => Verdict::Leave,
            }
        }
        Running::Nothing | Running::Unknown(_) => Verdict::Leave,
    }
}

/// How Redis answered a kill.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Killed {
    /// The script stops at its next instruction hook; its caller gets "killed by user".
    Stopped,
    /// It has written: Redis cannot stop it (only `SHUTDOWN NOSAVE` could); it runs to its end.
    Unkillable,
    /// Anything else (`NOTBUSY`: it ended meanwhile; `BUSY`: the other kind runs; refused).
    Not(String),
}

impl Killed {
    pub(crate) fn of(reply: &[u8]) -> Killed {
        if reply.starts_with(b"+OK") {
            Killed::Stopped
        } else if reply.starts_with(b"-UNKILLABLE") {
            Killed::Unkillable
        } else {
            Killed::Not(String::from_utf8_lossy(reply.trim_ascii_end()).into_owned())
        }
    }
}

/// Whether `reply` is Redis's answer to a script stopped by a kill ("Script killed by user with
/// SCRIPT KILL…" / "…FUNCTION KILL…").
pub(crate) fn is_killed_reply(reply: &[u8]) -> bool {
    const KILLED: &[u8] = b"Script killed by user";
    matches!(reply.first(), Some(b'-' | b'!')) && reply.windows(KILLED.len()).any(|w| w == KILLED)
}

/// Whether `reply` is Redis refusing a command because a script runs past its busy threshold.
pub(crate) fn is_busy_reply(reply: &[u8]) -> bool {
    reply.starts_with(b"-BUSY Redis is busy running a script")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(words: &[&str]) -> Bytes {
        let mut out = BytesMut::new();
        tollgate_resp::encode_command(words, &mut out);
        out.freeze()
    }

    fn bulk(text: &str) -> Frame {
        Frame::Bulk(Bytes::copy_from_slice(text.as_bytes()))
    }

    fn stats(running: Frame) -> Frame {
        Frame::Array(vec![
            bulk("running_script"),
            running,
            bulk("engines"),
            Frame::Array(vec![]),
        ])
    }

    #[test]
    fn the_kill_follows_the_command_in_any_case() {
        assert_eq!(
            Kill::of(&encoded(&["eval", "return 1", "0"])),
            Some(Kill::Script)
        );
        assert_eq!(
            Kill::of(&encoded(&["EVALSHA_RO", "ab", "0"])),
            Some(Kill::Script)
        );
        assert_eq!(
            Kill::of(&encoded(&["Fcall", "f", "0"])),
            Some(Kill::Function)
        );
        assert_eq!(
            Kill::of(&encoded(&["FCALL_RO", "f", "0"])),
            Some(Kill::Function)
        );
        assert_eq!(Kill::of(&encoded(&["EVALX", "f", "0"])), None);
        assert_eq!(Kill::of(&encoded(&["SCRIPT", "LOAD", "x"])), None);
        assert_eq!(Kill::of(b"*1\r\n$4\r\nEVA"), None);
        assert_eq!(Kill::of(b""), None);
    }

    #[test]
    fn function_stats_says_what_runs() {
        assert_eq!(Running::of(&stats(Frame::Null)), Running::Nothing);
        assert_eq!(Running::of(&stats(Frame::NullArray)), Running::Nothing);
        let busy = Frame::Error(Bytes::from_static(b"BUSY Redis is busy running a script."));
        assert_eq!(Running::of(&busy), Running::Eval);
        let running = Frame::Array(vec![
            bulk("name"),
            bulk("spin"),
            bulk("command"),
            Frame::Array(vec![bulk("FCALL"), bulk("spin"), bulk("0")]),
            bulk("duration_ms"),
            Frame::Integer(1002),
        ]);
        assert_eq!(
            Running::of(&stats(running)),
            Running::Function {
                command: encoded(&["FCALL", "spin", "0"]),
                ran: Duration::from_millis(1002),
            }
        );
        let refused = Frame::Error(Bytes::from_static(b"NOPERM no"));
        assert!(matches!(Running::of(&refused), Running::Unknown(_)));
    }

    #[test]
    fn only_the_daemons_own_scripts_past_their_limit_are_stopped() {
        let spin = encoded(&["FCALL", "spin", "0"]);
        let other = encoded(&["FCALL", "other", "0"]);
        let eval = encoded(&["EVAL", "while true do end", "0"]);
        let second = Duration::from_secs(1);
        let overdue = [
            Overdue {
                id: 1,
                kill: Kill::Script,
                command: &eval,
                limit: second,
            },
            Overdue {
                id: 2,
                kill: Kill::Function,
                command: &spin,
                limit: second,
            },
            Overdue {
                id: 3,
                kill: Kill::Function,
                command: &spin,
                limit: 2 * second,
            },
        ];
        assert_eq!(
            decide(&Running::Eval, &overdue),
            Verdict::Stop(Kill::Script, vec![1])
        );
        // No EVAL of the daemon's is overdue: the running EVAL is someone else's.
        assert_eq!(decide(&Running::Eval, &overdue[1..]), Verdict::Leave);
        let function = |command: &Bytes, ms| Running::Function {
            command: command.clone(),
            ran: Duration::from_millis(ms),
        };
        // Called the same way with two limits: not before the longer one.
        assert_eq!(decide(&function(&spin, 1500), &overdue), Verdict::Leave);
        assert_eq!(
            decide(&function(&spin, 2000), &overdue),
            Verdict::Stop(Kill::Function, vec![2, 3])
        );
        assert_eq!(
            decide(&function(&spin, 1000), &overdue[..2]),
            Verdict::Stop(Kill::Function, vec![2])
        );
        // A function the daemon did not send (or sent with other arguments) runs: left alone.
        assert_eq!(decide(&function(&other, 9000), &overdue), Verdict::Leave);
        assert_eq!(decide(&Running::Nothing, &overdue), Verdict::Leave);
        assert_eq!(
            decide(&Running::Unknown("?".into()), &overdue),
            Verdict::Leave
        );
    }

    #[test]
    fn redis_answers_are_read() {
        assert_eq!(Killed::of(b"+OK\r\n"), Killed::Stopped);
        assert_eq!(
            Killed::of(b"-UNKILLABLE Sorry the script already executed write commands\r\n"),
            Killed::Unkillable
        );
        assert!(matches!(
            Killed::of(b"-NOTBUSY No scripts\r\n"),
            Killed::Not(_)
        ));
        assert!(is_killed_reply(
            b"-ERR Script killed by user with SCRIPT KILL... script: 8c, on @user_script:1.\r\n"
        ));
        assert!(is_killed_reply(
            b"-ERR Script killed by user with FUNCTION KILL...\r\n"
        ));
        assert!(!is_killed_reply(b"$21\r\nScript killed by user\r\n"));
        assert!(is_busy_reply(
            b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n"
        ));
        assert!(!is_busy_reply(
            b"-BUSYKEY Target key name already exists.\r\n"
        ));
    }
}
