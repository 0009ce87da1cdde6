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
    /// Classified; a command of Redis's read in a pipelined run is admitted already, together with
    /// the rest of the run (`decision`), and any other is admitted, if it needs to be, when its
    /// turn comes.
    Command {
        command: Command,
        kind: Kind,
        decision: Option<Decision>,
    },
    /// Unreadable input: the connection closes when its turn comes.
    Invalid(ProtocolError),
}

impl Read {
    fn parsed(command: Command, kind: Kind) -> Read {
        Read::Command {
            command,
            kind,
            decision: None,
        }
    }
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
        debug_assert!(
            self.queue.is_empty(),
            "read only once the last read is used up"
        );
        // The run goes straight into the queue and its decisions are set in place: commands are
        // large, and moving each through a vector of its own, then a vector of decided commands,
        // into the queue cost a pipelined command a tenth of its instructions.
        let ended = loop {
            if self.queue.len() == ADMIT_TOGETHER {
                break None;
            }
            match tollgate_resp::parse_command(input, admitting.limits) {
                Ok(Some(command)) => {
                    let kind = Kind::of(&command);
                    // A lone command (unpipelined) is planned as it is.
                    if self.queue.is_empty() && input.is_empty() {
                        return Some(Read::parsed(command, kind));
                    }
                    if kind == Kind::Redis && !admitting.subscribed {
                        self.queue.push_back(Read::parsed(command, kind));
                    } else {
                        break Some(Read::parsed(command, kind));
                    }
                }
                Ok(None) => break None,
                Err(error) => break Some(Read::Invalid(error)),
            }
        };
        if self.queue.len() > 1 {
            let decisions = admit_run(&self.queue, &admitting);
            for (read, decided) in self.queue.iter_mut().zip(decisions) {
                if let Read::Command { decision, .. } = read {
                    *decision = Some(decided);
                }
            }
        }
        if let Some(ended) = ended {
            self.queue.push_back(ended);
        }
        self.queue.pop_front()
    }
}

/// The decisions on a run of Redis's commands, admitted together, in order.
fn admit_run(run: &VecDeque<Read>, admitting: &Admitting<'_>) -> Vec<Decision> {
    let commands = || {
        run.iter().filter_map(|read| match read {
            Read::Command { command, .. } => Some(command),
            Read::Invalid(_) => None,
        })
    };
    // Every command's words in one buffer, and each command's share of it. Sized first: a
    // `flat_map` does not know its length, and collecting it grew the vector by doubling, four
    // reallocations for a batch of sixteen GETs.
    let mut words: Vec<&[u8]> = Vec::with_capacity(commands().map(Command::len).sum());
    for command in commands() {
        words.extend(command.words());
    }
    let mut rest = &words[..];
    // Sized first too: the filter hides the run's length from `collect`.
    let mut argvs: Vec<&[&[u8]]> = Vec::with_capacity(run.len());
    argvs.extend(commands().map(|command| {
        let (argv, after) = rest.split_at(command.len());
        rest = after;
        argv
    }));
    let started = tokio::time::Instant::now();
    let decisions = admitting.admission.admit_all(admitting.caller, &argvs);
    admitting.clock.spent(started);
    decisions
}
