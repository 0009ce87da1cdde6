//! What a lent connection's borrower has changed about it, learned from the commands it sent, and
//! what it takes to make the connection clean again before another borrower gets it.

/// Connection state a borrower can leave behind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Session {
    in_multi: bool,
    watching: bool,
    /// State we cannot undo cheaply (another database, tracking, a subscription …).
    tainted: bool,
}

/// What returning a connection requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cleanup {
    Nothing,
    /// `DISCARD` ends the transaction and forgets the watched keys.
    Discard,
    Unwatch,
    /// Not worth saving: close it.
    Close,
}

impl Session {
    /// Updates the state from one encoded command about to be sent.
    pub(crate) fn observe(&mut self, command: &[u8]) {
        let mut argv = leading_args(command);
        let Some(name) = argv.next() else {
            self.tainted = true;
            return;
        };
        let is = |expected: &str| name.eq_ignore_ascii_case(expected.as_bytes());
        if is("MULTI") {
            self.in_multi = true;
        } else if is("EXEC") || is("DISCARD") {
            self.in_multi = false;
            self.watching = false;
        } else if is("WATCH") {
            self.watching = true;
        } else if is("UNWATCH") {
            self.watching = false;
        } else if is("CLIENT") {
            // Reading about connections is harmless; anything else may change this one.
            let read_only = ["LIST", "INFO", "ID", "GETNAME", "GETREDIR", "TRACKINGINFO"];
            let sub = argv.next().unwrap_or_default();
            if !read_only
                .iter()
                .any(|r| sub.eq_ignore_ascii_case(r.as_bytes()))
            {
                self.tainted = true;
            }
        } else if [
            "SELECT",
            "HELLO",
            "AUTH",
            "RESET",
            "MONITOR",
            "SUBSCRIBE",
            "PSUBSCRIBE",
            "SSUBSCRIBE",
            "READONLY",
            "READWRITE",
            "ASKING",
            "SYNC",
            "PSYNC",
        ]
        .into_iter()
        .any(is)
        {
            self.tainted = true;
        }
    }

    pub(crate) fn cleanup(&self) -> Cleanup {
        if self.tainted {
            Cleanup::Close
        } else if self.in_multi {
            Cleanup::Discard
        } else if self.watching {
            Cleanup::Unwatch
        } else {
            Cleanup::Nothing
        }
    }
}

/// The leading arguments of an encoded command (`*N\r\n$L\r\nNAME\r\n…`), read lazily so that
/// a large value is never looked at.
fn leading_args(command: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = command
        .strip_prefix(b"*")
        .and_then(|r| r.iter().position(|&b| b == b'\n').map(|at| &r[at + 1..]))
        .unwrap_or_default();
    std::iter::from_fn(move || {
        let body = rest.strip_prefix(b"$")?;
        let newline = body.iter().position(|&b| b == b'\n')?;
        let len: usize = std::str::from_utf8(&body[..newline])
            .ok()?
            .trim_end()
            .parse()
            .ok()?;
        let arg = body.get(newline + 1..newline + 1 + len)?;
        rest = body.get(newline + 3 + len..).unwrap_or_default();
        Some(arg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(commands: &[&[&str]]) -> Session {
        let mut session = Session::default();
        for argv in commands {
            let mut out = bytes::BytesMut::new();
            tollgate_resp::encode_command(argv, &mut out);
            session.observe(&out);
        }
        session
    }

    #[test]
    fn transactions_and_watches_are_undone_and_foreign_state_closes() {
        assert_eq!(session(&[&["GET", "k"]]).cleanup(), Cleanup::Nothing);
        assert_eq!(session(&[&["WATCH", "k"]]).cleanup(), Cleanup::Unwatch);
        assert_eq!(
            session(&[&["watch", "k"], &["multi"]]).cleanup(),
            Cleanup::Discard
        );
        assert_eq!(
            session(&[&["WATCH", "k"], &["MULTI"], &["EXEC"]]).cleanup(),
            Cleanup::Nothing
        );
        assert_eq!(
            session(&[&["WATCH", "k"], &["UNWATCH"]]).cleanup(),
            Cleanup::Nothing
        );
        assert_eq!(session(&[&["SELECT", "2"]]).cleanup(), Cleanup::Close);
        assert_eq!(
            session(&[&["CLIENT", "TRACKING", "on"]]).cleanup(),
            Cleanup::Close
        );
        assert_eq!(session(&[&["client", "list"]]).cleanup(), Cleanup::Nothing);
    }

    #[test]
    fn reads_the_leading_arguments_of_an_encoded_command() {
        let args: Vec<_> =
            leading_args(b"*3\r\n$6\r\nCLIENT\r\n$4\r\nLIST\r\n$1\r\nx\r\n").collect();
        assert_eq!(args, [&b"CLIENT"[..], b"LIST", b"x"]);
        assert_eq!(leading_args(b"PING\r\n").next(), None);
    }
}
