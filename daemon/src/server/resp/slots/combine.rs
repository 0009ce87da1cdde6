//! How the replies of several nodes become the one reply a client gets: summed, all `+OK`, all
//! alike, ANDed element by element, concatenated, the first that is not null, the least. A node's
//! error wins (the first in the order the nodes were asked), and a reply that is not the shape the
//! command answers gives `-ERR tollgate: …` rather than a guess.

use bytes::Bytes;
use tollgate_resp::Frame;

use super::super::replies;
use super::cross::shown;

/// How the replies of every master, or of every part of a split command, are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// Integers added: split `DEL`, `UNLINK`, `EXISTS`, `TOUCH`.
    Sum,
    /// `+OK` when every node said `+OK`: `SCRIPT|FUNCTION FLUSH`, `FUNCTION DELETE|RESTORE`, split
    /// `MSET`.
    AllOk,
    /// The one reply every node gave alike: `SCRIPT LOAD`'s sha, `FUNCTION LOAD`'s library name.
    Same,
    /// Arrays of 0/1 (or RESP3 booleans) ANDed element by element: `SCRIPT EXISTS`. A script
    /// exists for the client only if every master has it, since its `EVALSHA` may land on any.
    EveryHas,
    /// The least integer: `WAIT`, the replicas that acknowledged on every master.
    Least,
}

impl Combine {
    /// The reply to write for `replies`, one per node in the order the nodes were asked. A node
    /// that could not be asked, or whose reply was lost, is passed as its error reply.
    pub fn combine(self, replies: Vec<Frame>) -> Bytes {
        finish(self.frame(replies))
    }

    pub(super) fn frame(self, replies: Vec<Frame>) -> Result<Frame, Failure> {
        let replies = without_errors(replies)?;
        if replies.is_empty() {
            return Err(Misshapen::NoReplies.into());
        }
        let combined = match self {
            Combine::Sum => sum(&replies),
            Combine::AllOk => all_ok(&replies),
            Combine::Same => same(replies),
            Combine::EveryHas => every_has(replies),
            Combine::Least => least(&replies),
        };
        combined.map_err(Failure::from)
    }
}

/// Why a combined reply is not a value: a node's own error, or a reply of the wrong shape.
#[derive(Debug)]
pub(super) enum Failure {
    Answered(Frame),
    Misshapen(Misshapen),
}

impl From<Misshapen> for Failure {
    fn from(misshapen: Misshapen) -> Failure {
        Failure::Misshapen(misshapen)
    }
}

/// Replies the daemon cannot combine. Redis never answers these commands so; a node that does is
/// not one the merge can trust, and the client is told rather than given a made-up value.
#[derive(Debug, thiserror::Error)]
pub(super) enum Misshapen {
    #[error("a node answered {got} where {expected} was expected")]
    Shape { expected: &'static str, got: String },
    #[error("a node answered an array of {got} where an array of {expected} was expected")]
    Length { expected: usize, got: usize },
    #[error("the nodes answered differently: {first} and {other}")]
    Different { first: String, other: String },
    #[error("the sum of the nodes' replies overflows")]
    Overflow,
    #[error("{got} replies for {parts} parts")]
    Count { parts: usize, got: usize },
    #[error("no node answered")]
    NoReplies,
}

impl Misshapen {
    pub(super) fn shape(expected: &'static str, got: &Frame) -> Misshapen {
        Misshapen::Shape {
            expected,
            got: described(got),
        }
    }
}

/// `replies` if none is an error; the first error otherwise. The parts of a split command ran
/// independently, so an error does not mean that nothing was applied.
pub(super) fn without_errors(mut replies: Vec<Frame>) -> Result<Vec<Frame>, Failure> {
    match replies.iter().position(Frame::is_error) {
        Some(at) => Err(Failure::Answered(replies.swap_remove(at))),
        None => Ok(replies),
    }
}

/// The bytes to write for a combined reply or its failure.
pub(super) fn finish(combined: Result<Frame, Failure>) -> Bytes {
    match combined {
        Ok(frame) | Err(Failure::Answered(frame)) => replies::encode(&frame),
        Err(Failure::Misshapen(misshapen)) => replies::error(format!("ERR tollgate: {misshapen}")),
    }
}

fn integer(reply: &Frame) -> Result<i64, Misshapen> {
    match reply {
        Frame::Integer(n) => Ok(*n),
        other => Err(Misshapen::shape("an integer", other)),
    }
}

fn sum(replies: &[Frame]) -> Result<Frame, Misshapen> {
    replies
        .iter()
        .try_fold(0i64, |total, reply| {
            total
                .checked_add(integer(reply)?)
                .ok_or(Misshapen::Overflow)
        })
        .map(Frame::Integer)
}

fn least(replies: &[Frame]) -> Result<Frame, Misshapen> {
    replies
        .iter()
        .try_fold(i64::MAX, |least, reply| Ok(least.min(integer(reply)?)))
        .map(Frame::Integer)
}

fn all_ok(replies: &[Frame]) -> Result<Frame, Misshapen> {
    let ok = Frame::Simple(Bytes::from_static(b"OK"));
    match replies.iter().find(|reply| **reply != ok) {
        Some(other) => Err(Misshapen::shape("+OK", other)),
        None => Ok(ok),
    }
}

fn same(replies: Vec<Frame>) -> Result<Frame, Misshapen> {
    let mut replies = replies.into_iter();
    let first = replies.next().ok_or(Misshapen::NoReplies)?;
    match replies.find(|reply| *reply != first) {
        Some(other) => Err(Misshapen::Different {
            first: described(&first),
            other: described(&other),
        }),
        None => Ok(first),
    }
}

/// The elements of an array.
fn elements(reply: Frame, expected: &'static str) -> Result<Vec<Frame>, Misshapen> {
    match reply {
        Frame::Array(items) => Ok(items),
        other => Err(Misshapen::shape(expected, &other)),
    }
}

fn every_has(replies: Vec<Frame>) -> Result<Frame, Misshapen> {
    const EXPECTED: &str = "an array of 0 and 1";
    let mut replies = replies.into_iter();
    let first = replies.next().ok_or(Misshapen::NoReplies)?;
    // The first node's elements keep their form (integer or RESP3 boolean) and take the AND.
    let mut combined = elements(first, EXPECTED)?;
    let mut truths = combined.iter().map(truth).collect::<Result<Vec<_>, _>>()?;
    for reply in replies {
        let items = elements(reply, EXPECTED)?;
        if items.len() != truths.len() {
            return Err(Misshapen::Length {
                expected: truths.len(),
                got: items.len(),
            });
        }
        for (held, item) in truths.iter_mut().zip(&items) {
            *held &= truth(item)?;
        }
    }
    for (item, held) in combined.iter_mut().zip(truths) {
        *item = match item {
            Frame::Boolean(_) => Frame::Boolean(held),
            _ => Frame::Integer(i64::from(held)),
        };
    }
    Ok(Frame::Array(combined))
}

fn truth(item: &Frame) -> Result<bool, Misshapen> {
    match item {
        Frame::Integer(0) | Frame::Boolean(false) => Ok(false),
        Frame::Integer(1) | Frame::Boolean(true) => Ok(true),
        other => Err(Misshapen::shape("0 or 1", other)),
    }
}

/// A reply as an error message shows it: its kind, and for strings its (safely shown) value.
pub(super) fn described(frame: &Frame) -> String {
    let counted = |kind: &str, len: usize| format!("{kind} of {len}");
    match frame {
        Frame::Simple(text) => format!("a simple string {}", shown(text)),
        Frame::Error(text) | Frame::BulkError(text) => format!("an error {}", shown(text)),
        Frame::Bulk(text) => format!("a bulk string {}", shown(text)),
        Frame::Verbatim { text, .. } => format!("a verbatim string {}", shown(text)),
        Frame::BigNumber(text) => format!("a big number {}", shown(text)),
        Frame::Integer(n) => format!("the integer {n}"),
        Frame::Double(d) => format!("the double {d}"),
        Frame::Boolean(b) => format!("the boolean {b}"),
        Frame::Null | Frame::Null3 => "null".to_owned(),
        Frame::NullArray => "a null array".to_owned(),
        Frame::Array(items) => counted("an array", items.len()),
        Frame::Set(items) => counted("a set", items.len()),
        Frame::Push(items) => counted("a push", items.len()),
        Frame::Map(pairs) => counted("a map", pairs.len()),
        Frame::Attribute { value, .. } => format!("{} with attributes", described(value)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{bulk, error, ok};
    use super::*;

    fn integers(values: &[i64]) -> Frame {
        Frame::Array(values.iter().copied().map(Frame::Integer).collect())
    }

    fn booleans(values: &[bool]) -> Frame {
        Frame::Array(values.iter().copied().map(Frame::Boolean).collect())
    }

    fn combined(combine: Combine, replies: Vec<Frame>) -> String {
        String::from_utf8(combine.combine(replies).to_vec()).unwrap()
    }

    fn misshapen(combine: Combine, replies: Vec<Frame>) -> String {
        let text = combined(combine, replies);
        assert!(text.starts_with("-ERR tollgate: "), "{text:?}");
        text
    }

    #[test]
    fn sums_and_the_least_are_integers_in_either_protocol() {
        let counts = vec![Frame::Integer(3), Frame::Integer(0), Frame::Integer(4)];
        assert_eq!(combined(Combine::Sum, counts.clone()), ":7\r\n");
        assert_eq!(combined(Combine::Least, counts), ":0\r\n");
        assert_eq!(
            combined(Combine::Least, vec![Frame::Integer(2), Frame::Integer(1)]),
            ":1\r\n"
        );
        misshapen(Combine::Sum, vec![Frame::Integer(1), Frame::Double(1.0)]);
        misshapen(Combine::Least, vec![Frame::Null3]);
    }

    #[test]
    fn all_ok_is_ok_only_when_every_node_said_ok() {
        assert_eq!(combined(Combine::AllOk, vec![ok(), ok(), ok()]), "+OK\r\n");
        assert_eq!(
            misshapen(Combine::AllOk, vec![ok(), bulk("OK")]),
            "-ERR tollgate: a node answered a bulk string \"OK\" where +OK was expected\r\n"
        );
    }

    #[test]
    fn same_gives_the_one_reply_every_node_gave() {
        let sha = bulk("e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
        assert_eq!(
            combined(Combine::Same, vec![sha.clone(), sha.clone()]),
            "$40\r\ne0e1f9fabfc9d4800c877a703b823ac0578ff8db\r\n"
        );
        assert_eq!(
            misshapen(Combine::Same, vec![sha, bulk("other")]),
            "-ERR tollgate: the nodes answered differently: a bulk string \
             \"e0e1f9fabfc9d4800c877a703b823ac0578ff8db\" and a bulk string \"other\"\r\n"
        );
    }

    #[test]
    fn every_has_ands_element_by_element_keeping_resp3_booleans() {
        let replies = vec![integers(&[1, 1, 0, 1]), integers(&[1, 0, 0, 1])];
        assert_eq!(
            combined(Combine::EveryHas, replies),
            "*4\r\n:1\r\n:0\r\n:0\r\n:1\r\n"
        );
        let replies = vec![booleans(&[true, true]), booleans(&[false, true])];
        assert_eq!(combined(Combine::EveryHas, replies), "*2\r\n#f\r\n#t\r\n");
        assert_eq!(
            misshapen(Combine::EveryHas, vec![integers(&[1, 1]), integers(&[1])]),
            "-ERR tollgate: a node answered an array of 1 where an array of 2 was expected\r\n"
        );
        misshapen(Combine::EveryHas, vec![integers(&[1]), integers(&[2])]);
        misshapen(Combine::EveryHas, vec![Frame::Set(vec![Frame::Integer(1)])]);
    }

    #[test]
    fn a_nodes_error_wins_over_every_combine_the_first_in_node_order() {
        let replies = vec![
            Frame::Integer(1),
            Frame::BulkError(Bytes::from_static(b"ERR first")),
            error("ERR second"),
        ];
        for combine in [
            Combine::Sum,
            Combine::AllOk,
            Combine::Same,
            Combine::EveryHas,
            Combine::Least,
        ] {
            assert_eq!(
                combined(combine, replies.clone()),
                "!9\r\nERR first\r\n",
                "{combine:?}"
            );
        }
        assert_eq!(
            misshapen(Combine::Sum, vec![]),
            "-ERR tollgate: no node answered\r\n"
        );
    }
}
