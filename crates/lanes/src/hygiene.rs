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
        let Some(name) = command_name(command) else {
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
        } else if [
            "SELECT",
            "HELLO",
            "AUTH",
            "CLIENT",
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

/// The first element of an encoded command (`*N\r\n$L\r\nNAME\r\n…`), without parsing the rest.
fn command_name(command: &[u8]) -> Option<&[u8]> {
    let rest = command.strip_prefix(b"*")?;
    let rest = &rest[rest.iter().position(|&b| b == b'\n')? + 1..];
    let rest = rest.strip_prefix(b"$")?;
    let newline = rest.iter().position(|&b| b == b'\n')?;
    let len: usize = std::str::from_utf8(&rest[..newline])
        .ok()?
        .trim_end()
        .parse()
        .ok()?;
    rest.get(newline + 1..newline + 1 + len)
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
    }

    #[test]
    fn reads_the_name_of_an_encoded_command() {
        assert_eq!(
            command_name(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"),
            Some(&b"GET"[..])
        );
        assert_eq!(command_name(b"PING\r\n"), None);
    }
}
