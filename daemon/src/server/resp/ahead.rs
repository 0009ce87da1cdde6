//! Commands read from a client's input ahead of their turn. A pipeline's run of ordinary commands
//! is admitted together, which enters each guard once for the run instead of once per command;
//! each command is classified ([`Kind`]) as it is read, once.

use std::collections::VecDeque;

use bytes::BytesMut;
use tollgate_model::Caller;
use tollgate_policy::{Admission, Decision};
use tollgate_resp::{Command, Limits, ProtocolError};

use super::admission_clock::AdmissionClock;
use super::kind::Kind;

/// The most commands of a pipeline admitted together.
const ADMIT_TOGETHER: usize = 64;

/// One command read, in the state its turn finds it.
pub enum Read {
    /// Redis's, admitted already together with the rest of its run.
    Decided(Command, Decision),
    /// Classified, and admitted if it needs to be, when its turn comes.
    Parsed(Command, Kind),
    /// Unreadable input: the connection closes when its turn comes.
    Invalid(ProtocolError),
}

/// What admitting ahead needs.
pub struct Admitting<'a> {
    pub admission: &'a Admission,
    pub caller: &'a Caller,
    /// Where the time admitting takes is counted, for the caller's tenant.
    pub clock: &'a AdmissionClock,
    pub limits: &'a Limits,
    /// A client holding subscriptions: in RESP2 that changes which commands it may send, so
    /// nothing is admitted before the commands read before it have run.
    pub subscribed: bool,
}

/// Commands read and not yet run, oldest first.
#[derive(Default)]
pub struct Ahead {
    queue: VecDeque<Read>,
}

impl Ahead {
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// The next command to plan, read from `input` when nothing is left from the last read.
    pub fn next(&mut self, input: &mut BytesMut, admitting: Admitting<'_>) -> Option<Read> {
        match self.queue.pop_front() {
            Some(next) => Some(next),
            // Nothing left and nothing read: most turns of an unpipelined session (a reply came,
            // the socket took what was owed) end here, so this costs a check, not a parse.
            None if input.is_empty() => None,
            None => self.read(input, admitting),
        }
    }

    /// Reads the run of commands for Redis at the front of `input` (up to [`ADMIT_TOGETHER`]) and
    /// admits them together; the command that ended the run, if any, is kept as read. Returns the
    /// first command read; the others wait their turn. Only Redis's commands are admitted ahead:
    /// admission depends only on the caller and the command, but a connection-scoped command is
    /// the session's own.
    fn read(&mut self, input: &mut BytesMut, admitting: Admitting<'_>) -> Option<Read> {
        let mut run = Vec::new();
        let ended = loop {
            if run.len() == ADMIT_TOGETHER {
                break None;
            }
            match tollgate_resp::parse_command(input, admitting.limits) {
                Ok(Some(command)) => {
                    let kind = Kind::of(&command);
                    // A lone command (unpipelined) is planned as it is.
                    if run.is_empty() && input.is_empty() {
                        return Some(Read::Parsed(command, kind));
                    }
                    if kind == Kind::Redis && !admitting.subscribed {
                        // Room for a whole run at once, not grown by doubling as it is read.
                        if run.capacity() == 0 {
                            run.reserve_exact(ADMIT_TOGETHER);
                        }
                        run.push(command);
                    } else {
                        break Some(Read::Parsed(command, kind));
                    }
                }
                Ok(None) => break None,
                Err(error) => break Some(Read::Invalid(error)),
            }
        };
        if run.len() > 1 {
            // Every command's words in one buffer, and each command's share of it.
            // Sized first: a `flat_map` does not know its length, and collecting it grew the
            // vector by doubling, four reallocations for a batch of sixteen GETs.
            let mut words: Vec<&[u8]> = Vec::with_capacity(run.iter().map(Command::len).sum());
            words.extend(run.iter().flat_map(Command::words));
            let mut rest = &words[..];
            let argvs: Vec<&[&[u8]]> = run
                .iter()
                .map(|command| {
                    let (argv, after) = rest.split_at(command.len());
                    rest = after;
                    argv
                })
                .collect();
            let started = tokio::time::Instant::now();
            let decisions = admitting.admission.admit_all(admitting.caller, &argvs);
            admitting.clock.spent(started);
            let decided = run.into_iter().zip(decisions);
            self.queue
                .extend(decided.map(|(command, decision)| Read::Decided(command, decision)));
        } else if let Some(command) = run.pop() {
            self.queue.push_back(Read::Parsed(command, Kind::Redis));
        }
        if let Some(ended) = ended {
            self.queue.push_back(ended);
        }
        self.queue.pop_front()
    }
}
