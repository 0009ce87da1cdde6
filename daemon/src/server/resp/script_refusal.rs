//! Naming the policy rule behind a call a script could not make. A script's `redis.call`s are not
//! admitted one by one: they run as the lane's ACL user, which the policy shaped (docs/lanes.md),
//! and Redis refuses one with its bare `The user executing the script can't run this command or
//! subcommand`, naming neither the command nor a rule. Redis does say on which line of the script
//! (`@user_script:3`); for `EVAL`, whose body crossed the daemon, the calls on that line are read
//! (`redis.call('KEYS', …)`, the command named by a literal) and judged for the caller as the
//! policy would judge them, and the reply gains which rule refuses which. Otherwise (`EVALSHA`,
//! `FCALL`, a command named by a variable) it says what the script's user may run.

use std::sync::Arc;

use bytes::Bytes;
use tollgate_model::Caller;
use tollgate_policy::{Decision, DenyCause, Generation};
use tollgate_resp::Frame;

use super::namespace::InFlight;

/// Redis's words for a call its ACL refused inside a script.
const REFUSED: &[u8] = b"The user executing the script can't run this command or subcommand";
/// Redis's words for a call on a key the script's user may not touch (a scope's refusal).
const KEY_REFUSED: &[u8] =
    b"The user executing the script can't access at least one of the keys mentioned";
/// Redis's words for a `PUBLISH` on a channel the script's user may not reach (a scope's
/// refusal: its `&` patterns are the policy's channel grants).
const CHANNEL_REFUSED: &[u8] = b"The user executing the script can't publish to the channel";
/// Where Redis says which line of an `EVAL` body failed.
const LINE: &[u8] = b"@user_script:";
/// The calls a script makes.
const CALLS: [&str; 2] = ["redis.call(", "redis.pcall("];

/// What a script's refused call is judged by: the policy generation that admitted the script, its
/// caller, and the body when the client sent it (`EVAL`).
pub struct ScriptNote {
    pub generation: Arc<Generation>,
    pub caller: Caller,
    pub body: Option<Bytes>,
    /// The script counted in flight until its reply is amended (`namespace.rs`: a tenant's kill
    /// stops only its own).
    pub in_flight: Option<InFlight>,
}

impl std::fmt::Debug for ScriptNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptNote")
            .field("generation", &self.generation.info.number)
            .field("principal", &self.caller.principal)
            .field("body", &self.body.as_ref().map(Bytes::len))
            .finish()
    }
}

/// The same note: of one generation, for one caller, about one body.
impl PartialEq for ScriptNote {
    fn eq(&self, other: &ScriptNote) -> bool {
        Arc::ptr_eq(&self.generation, &other.generation)
            && self.caller == other.caller
            && self.body == other.body
    }
}

impl ScriptNote {
    /// Redis's `reply`, with the note appended when it is a refused call.
    pub fn apply(self, reply: Bytes) -> Bytes {
        let refused = contains(&reply, REFUSED);
        let channel = contains(&reply, CHANNEL_REFUSED);
        if !reply.starts_with(b"-") || !(refused || channel || contains(&reply, KEY_REFUSED)) {
            return reply;
        }
        let Some(line) = reply.strip_suffix(b"\r\n") else {
            return reply;
        };
        let note = match refused {
            true => self.note(line),
            false => match scope_words(&self.generation, &self.caller, channel) {
                Some(words) => words,
                None => return reply,
            },
        };
        let mut out = appended(line, &note);
        out.extend_from_slice(b"\r\n");
        Bytes::from(out)
    }

    fn note(&self, error: &[u8]) -> String {
        let called = self
            .body
            .as_ref()
            .zip(failed_line(error))
            .map(|(body, line)| called_on(body, line))
            .unwrap_or_default();
        let reasons: Vec<String> = called.iter().filter_map(|name| self.why(name)).collect();
        if reasons.is_empty() {
            return format!(
                "(tollgate: a script runs only the commands the policy lets {} run; `tollgate \
                 policy explain` says which rule refuses a command)",
                self.caller.principal
            );
        }
        format!("(tollgate: {})", reasons.join("; "))
    }

    /// Why the script's user may not run `name` (`KEYS`, `CLIENT KILL`), if the policy or the
    /// daemon says.
    fn why(&self, name: &str) -> Option<String> {
        let argv: Vec<&str> = name.split(' ').collect();
        let descriptor = self.generation.describe_any_arity(&argv)?;
        let named = descriptor.name.replace('|', " ");
        let decision = self
            .generation
            .judge_sample(&self.caller, &descriptor, Vec::new());
        Some(match decision {
            Decision::Denied(denial) if denial.cause == DenyCause::Rule => {
                format!("the policy's rule {} denies {named}", denial.rule)
            }
            Decision::Denied(denial) if denial.cause == DenyCause::NoRule => {
                format!("no rule of the policy allows {named}")
            }
            Decision::Denied(denial) => format!("{named} is refused: {}", denial.reason),
            // Admitted, yet refused to the script's user: the daemon refuses it to every script
            // (docs/lanes.md, "always refused").
            Decision::Admitted { .. } => format!(
                "the daemon refuses {named} to every script's user, whatever the policy allows"
            ),
        })
    }
}

/// Redis's `reply` to a command of a scoped principal's transaction, on the connection logged in
/// as its scope user (`scoped.rs`): a script run after `WATCH`, or `EXEC` with the scripts it
/// queued. Each key or channel refusal in it, at the top or one of `EXEC`'s answers, gains the
/// scope's words as on the SCRIPT channel. A reply without Redis's words of refusal is given back
/// as it came, unread beyond that search.
pub fn in_transaction(reply: Bytes, generation: &Generation, caller: &Caller) -> Bytes {
    if !contains(&reply, KEY_REFUSED) && !contains(&reply, CHANNEL_REFUSED) {
        return reply;
    }
    let amend = |message: &[u8]| -> Option<Vec<u8>> {
        let channel = contains(message, CHANNEL_REFUSED);
        if !channel && !contains(message, KEY_REFUSED) {
            return None;
        }
        Some(appended(
            message,
            &scope_words(generation, caller, channel)?,
        ))
    };
    let mut wire = bytes::BytesMut::from(&reply[..]);
    let frame = match tollgate_resp::parse(&mut wire, &tollgate_resp::Limits::default()) {
        Ok(Some(frame)) if wire.is_empty() => frame,
        _ => return reply,
    };
    let amended = match frame {
        Frame::Error(message) => match amend(&message) {
            Some(message) => Frame::Error(message.into()),
            None => return reply,
        },
        Frame::Array(answers) => Frame::Array(
            answers
                .into_iter()
                .map(|answer| match answer {
                    Frame::Error(message) => match amend(&message) {
                        Some(message) => Frame::Error(message.into()),
                        None => Frame::Error(message),
                    },
                    answer => answer,
                })
                .collect(),
        ),
        _ => return reply,
    };
    let mut out = bytes::BytesMut::with_capacity(reply.len() + 80);
    tollgate_resp::encode(&amended, &mut out);
    out.freeze()
}

/// The words a scope user's refusal of a key (or of a channel) gains: whose grants the scope
/// holds. `None` when `caller` has no scope (only a scope's user is refused keys).
fn scope_words(generation: &Generation, caller: &Caller, channel: bool) -> Option<String> {
    let scope = generation.scopes().of(&caller.principal)?;
    Some(match channel {
        true => format!("({})", scope.channel_words()),
        false => format!("({})", scope.words()),
    })
}

/// `line` and `note` after a blank, the note kept on one line.
fn appended(line: &[u8], note: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len() + note.len() + 3);
    out.extend_from_slice(line);
    out.push(b' ');
    out.extend(note.bytes().filter(|b| *b != b'\r' && *b != b'\n'));
    out
}

/// The line number Redis names in `error` (`… on @user_script:3.`).
fn failed_line(error: &[u8]) -> Option<usize> {
    let at = error.windows(LINE.len()).position(|w| w == LINE)? + LINE.len();
    let digits: Vec<u8> = error[at..]
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// The commands named by a string literal in the calls on line `line` (from 1) of `body`, each
/// with its subcommand when a second literal follows (`CLIENT KILL`); the judge ignores a second
/// word that is no subcommand.
fn called_on(body: &[u8], line: usize) -> Vec<String> {
    let Some(text) = body
        .split(|&b| b == b'\n')
        .nth(line.saturating_sub(1))
        .and_then(|text| std::str::from_utf8(text).ok())
    else {
        return Vec::new();
    };
    let mut called = Vec::new();
    for call in CALLS {
        for (at, _) in text.match_indices(call) {
            let rest = &text[at + call.len()..];
            let Some((name, rest)) = literal(rest) else {
                continue;
            };
            let sub = rest
                .trim_start()
                .strip_prefix(',')
                .and_then(literal)
                .map(|(sub, _)| sub);
            called.push(match sub {
                Some(sub) if is_word(sub) => format!("{name} {sub}"),
                _ => name.to_owned(),
            });
        }
    }
    called.retain(|name| is_word(name.split(' ').next().unwrap_or_default()));
    called
}

/// A quoted literal at the start of `text` (after blanks), and what follows it.
fn literal(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start();
    let quote = text.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let inner = &text[1..];
    let end = inner.find(quote)?;
    Some((&inner[..end], &inner[end + 1..]))
}

fn is_word(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 32
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failed_line_and_its_calls_are_read() {
        let error = b"-ERR The user executing the script can't run this command or subcommand script: 08ff, on @user_script:2.";
        assert_eq!(failed_line(error), Some(2));
        let body =
            b"local x = 1\nreturn redis.call('KEYS', ARGV[1]) .. redis.pcall(\"client\", \"kill\")";
        assert_eq!(called_on(body, 2), ["KEYS", "client kill"]);
        assert_eq!(called_on(b"redis.call(name, 'x')", 1), Vec::<String>::new());
        assert_eq!(called_on(body, 9), Vec::<String>::new());
    }
}
