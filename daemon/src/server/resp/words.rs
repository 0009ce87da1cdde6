//! Commands from their words, for unit tests.

/// A command's words.
pub fn argv(words: &str) -> Vec<&[u8]> {
    words.split_whitespace().map(str::as_bytes).collect()
}

/// A command as the session reads it, from its words, for unit tests.
pub fn command(words: &str) -> tollgate_resp::Command {
    let mut wire = bytes::BytesMut::from(format!("{words}\r\n").as_str());
    tollgate_resp::parse_command(&mut wire, &tollgate_resp::Limits::default())
        .expect("well formed")
        .expect("complete")
}
