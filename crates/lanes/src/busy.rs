//! The commands Redis serves while a script is busy (`SCRIPT KILL`, `FUNCTION KILL`, `FUNCTION
//! STATS`): the SCRIPT lane sends these on its kill connection (`kill.rs`) instead of its own.

pub(crate) const SCRIPT_KILL: &[u8] = b"*2\r\n$6\r\nSCRIPT\r\n$4\r\nKILL\r\n";
pub(crate) const FUNCTION_KILL: &[u8] = b"*2\r\n$8\r\nFUNCTION\r\n$4\r\nKILL\r\n";
pub(crate) const FUNCTION_STATS: &[u8] = b"*2\r\n$8\r\nFUNCTION\r\n$5\r\nSTATS\r\n";

/// The commands sent on the kill connection, encoded: each takes no further argument.
const WHILE_BUSY: [&[u8]; 3] = [SCRIPT_KILL, FUNCTION_KILL, FUNCTION_STATS];

/// Whether `command` (encoded as a RESP array of bulk strings, as the lanes send every command) is
/// `SCRIPT KILL`, `FUNCTION KILL` or `FUNCTION STATS`, compared whole, ignoring case.
pub(crate) fn is_kill(command: &[u8]) -> bool {
    WHILE_BUSY
        .iter()
        .any(|busy| command.eq_ignore_ascii_case(busy))
}

#[cfg(test)]
mod tests {
    use super::is_kill;

    #[test]
    fn only_the_kills_and_function_stats_in_any_case_go_there() {
        assert!(is_kill(b"*2\r\n$6\r\nscript\r\n$4\r\nKill\r\n"));
        assert!(is_kill(b"*2\r\n$8\r\nFUNCTION\r\n$4\r\nKILL\r\n"));
        assert!(is_kill(b"*2\r\n$8\r\nfunction\r\n$5\r\nstats\r\n"));
        assert!(!is_kill(b"*2\r\n$6\r\nSCRIPT\r\n$5\r\nFLUSH\r\n"));
        assert!(!is_kill(b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nKILL\r\n$1\r\nx\r\n"));
        assert!(!is_kill(
            b"*3\r\n$4\r\nEVAL\r\n$8\r\nreturn 1\r\n$1\r\n0\r\n"
        ));
    }
}
