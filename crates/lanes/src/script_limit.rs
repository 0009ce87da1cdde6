//! The script time limit (`resp.script_time_limit`): a client's script (`EVAL`, `FCALL` and their
//! read-only and `SHA` forms) that runs past its limit is stopped on the SCRIPT lane's kill
//! connection (`kill`), so that Redis answers everyone else again.
//!
//! Each script a limited channel sends is registered here until its reply arrives; from when it
//! becomes the oldest reply owed on its connection (when Redis can have started on it) it is due
//! at that moment plus its limit. One watcher task per node (`stopper`) sleeps until the earliest
//! due script (not at all while none is registered: no timer per command), then asks `FUNCTION
//! STATS` what runs and stops it with `SCRIPT KILL` or `FUNCTION KILL` only when it is one of the
//! daemon's own scripts past its limit (`overrun::decide`). Its caller gets
//! [`CallError::ScriptStopped`].
//! Redis cannot stop a script that has written (`UNKILLABLE`): that is logged, and the script
//! runs to its end.
//!
//! Redis reads nothing, a kill included, until a script passes its `busy-reply-threshold`, and
//! then answers every command it reads meanwhile `BUSY`: the threshold must not be above the limit
//! (the daemon sets it for the server it runs itself), and a command of another caller refused
//! `BUSY` while a script is being stopped is sent again once it has stopped (`resend`).
//!
//! The limit bounds one script, not a caller's share of Redis's one thread: a caller that sends
//! its runaway script again as soon as it is stopped would hold Redis nearly all the time. So a
//! limit may carry a [`Cooldown`], shared by every channel of one caller (the daemon: one user of
//! a principal): once one of its scripts has been stopped, its scripts are refused
//! ([`LaneError::ScriptCooldown`](crate::LaneError::ScriptCooldown)) for the cooldown.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::CallError;
use crate::overrun::{self, Kill, Overdue};
use crate::reply::Reply;

/// A caller's script time limit: what the scripts it sends are watched with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptLimit {
    /// How long one script may run before it is stopped.
    pub after: Duration,
    /// What set it, as the caller's error names it (`resp.script_time_limit`, `quota batch's
    /// script_time_limit`).
    pub set_by: Arc<str>,
    /// Who sent it, for the log (`client 7 principal app uid 1000`).
    pub who: Arc<str>,
    /// How long the caller's scripts are refused once one of them was stopped; `None`: never.
    pub cooldown: Option<Arc<Cooldown>>,
}

/// When a caller's scripts are refused again, after one of them was stopped at its limit.
#[derive(Debug)]
pub struct Cooldown {
    /// How long, from each stop.
    pub after: Duration,
    /// Until when, in nanoseconds after [`Cooldown::epoch`]; 0 while none is running.
    until: AtomicU64,
    epoch: Instant,
}

/// One caller's cooldown is the same cooldown wherever it is held.
impl PartialEq for Cooldown {
    fn eq(&self, other: &Cooldown) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Cooldown {}

impl Cooldown {
    pub fn new(after: Duration) -> Cooldown {
        Cooldown {
            after,
            until: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// One of the caller's scripts was stopped: refuse its scripts for `after` from now.
    pub fn start(&self) {
        let until = self
            .now()
            .saturating_add(u64::try_from(self.after.as_nanos()).unwrap_or(u64::MAX));
        self.until.fetch_max(until, Ordering::AcqRel);
    }

    /// How much longer the caller's scripts are refused; `None` when they are not.
    pub fn remaining(&self) -> Option<Duration> {
        let until = self.until.load(Ordering::Acquire);
        let now = self.now();
        (until > now).then(|| Duration::from_nanos(until - now))
    }
}

/// How soon a script past its limit that Redis did not show running is asked about again.
const RECHECK: Duration = Duration::from_millis(50);
/// How long a command refused `BUSY` waits at most for the scripts being stopped to end.
const SETTLE_PATIENCE: Duration = Duration::from_secs(1);
/// A command refused `BUSY` this soon after a stopped script ended was refused while it was being
/// stopped (Redis answers both in the same turn of its loop).
const JUST_STOPPED: Duration = Duration::from_millis(250);
/// A script due this soon is about to be asked about: a `BUSY` now waits for the watcher.
const SOON: Duration = Duration::from_millis(20);
/// How far off a running script's due time may be for a command refused `BUSY` to wait for it
/// (the server's threshold lowered below its limit by a quota's).
const LOWERED_PATIENCE: Duration = Duration::from_secs(10);

// A registered script's state.
/// Running, not yet past its limit (or not shown running when it was).
const WATCHING: u8 = 0;
/// Past its limit; `FUNCTION STATS` is being asked what runs.
const CHECKING: u8 = 1;
/// A kill was sent for it (and, unless Redis refused it, succeeded).
const STOPPED: u8 = 2;
/// Redis would not stop it: it has written.
const UNKILLABLE: u8 = 3;
/// Its reply arrived.
const DONE: u8 = 4;

/// One node's registered scripts and its watcher's wake-ups.
pub(crate) struct Watch {
    scripts: Mutex<BTreeMap<u64, Registered>>,
    next_id: AtomicU64,
    /// How many scripts are registered: whether another caller's `BUSY` may be one to send again.
    registered: AtomicUsize,
    /// Wakes the watcher: a script became due earlier than it sleeps for.
    changed: Notify,
    /// Scripts being asked about or stopped (`CHECKING`, `STOPPED`).
    stopping: AtomicUsize,
    /// Told when `stopping` falls to zero.
    settled: Notify,
    /// When a stopped script's reply last arrived: ms after `epoch`, plus one; 0: never.
    last_stop: AtomicU64,
    /// How many scripts Redis could have been running (started) have had their reply, stopped
    /// or not.
    ended: AtomicU64,
    epoch: Instant,
}

struct Registered {
    entry: Arc<Entry>,
    /// When it passes its limit (`None`: not yet started), or when to ask about it again.
    due: Option<Instant>,
}

/// A registered script, as the watcher sees it.
pub(crate) struct Entry {
    id: u64,
    kill: Kill,
    command: Bytes,
    limit: ScriptLimit,
    state: AtomicU8,
}

impl Entry {
    pub(crate) fn overdue(&self) -> Overdue<'_> {
        Overdue {
            id: self.id,
            kill: self.kill,
            command: &self.command,
            limit: self.limit.after,
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn limit(&self) -> &ScriptLimit {
        &self.limit
    }
}

/// A registered script, from when it is sent until its reply arrives (dropped: deregistered).
pub(crate) struct Watched {
    entry: Arc<Entry>,
    watch: Arc<Watch>,
}

impl Watch {
    pub(crate) fn new() -> Arc<Watch> {
        Arc::new(Watch {
            scripts: Mutex::default(),
            next_id: AtomicU64::new(0),
            registered: AtomicUsize::new(0),
            changed: Notify::new(),
            stopping: AtomicUsize::new(0),
            settled: Notify::new(),
            last_stop: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// Registers `command` when it runs a script; `None` for any other command (or a zero limit).
    pub(crate) fn register(
        self: &Arc<Self>,
        command: &Bytes,
        limit: &ScriptLimit,
    ) -> Option<Watched> {
        if limit.after.is_zero() {
            return None;
        }
        let kill = Kill::of(command)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            id,
            kill,
            command: command.clone(),
            limit: limit.clone(),
            state: AtomicU8::new(WATCHING),
        });
        self.scripts.lock().insert(
            id,
            Registered {
                entry: entry.clone(),
                due: None,
            },
        );
        self.registered.fetch_add(1, Ordering::Relaxed);
        Some(Watched {
            entry,
            watch: self.clone(),
        })
    }

    /// Whether any script is registered: only then can a `BUSY` be one the daemon is ending.
    pub(crate) fn busy(&self) -> bool {
        self.registered.load(Ordering::Relaxed) > 0
    }

    /// After a command was refused `BUSY`: waits (boundedly) for the scripts being stopped to end,
    /// and says whether one did just now, so that the command is worth sending again. When a
    /// quota's shorter limit lowered the server's busy threshold (`busy_threshold` in the daemon),
    /// a script allowed longer has Redis answer `BUSY` before it is due: the command waits for the
    /// daemon's running scripts to end, or to be stopped, and is sent again once one has.
    pub(crate) async fn after_stop(&self) -> bool {
        let ended = self.ended.load(Ordering::Acquire);
        let start = Instant::now();
        // The earliest due of the daemon's scripts now: waited for, not a recheck after it (a
        // script Redis did not show running, behind a function of someone else's).
        let horizon = self
            .next_due()
            .filter(|due| *due <= start + LOWERED_PATIENCE);
        let until = horizon
            .map_or(start, |due| due + SOON)
            .max(start + SETTLE_PATIENCE);
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.stopping.load(Ordering::Acquire) == 0 {
                // A script of the daemon's that Redis can be running: its `BUSY` lasts until it
                // ends or is stopped when it is due (Redis may also answer `BUSY` a moment before
                // the watcher wakes for it: its threshold at the limit, counted from a start a
                // little later than the daemon's).
                let waited_for =
                    |due: Instant| horizon.is_some_and(|horizon| due <= horizon + SOON);
                if self.next_due().is_some_and(waited_for) {
                    if Instant::now() >= until {
                        return false;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                break;
            }
            if tokio::time::timeout_at(until, settled).await.is_err() {
                return false;
            }
        }
        let last = self.last_stop.load(Ordering::Acquire);
        let just_stopped =
            last != 0 && self.clock().saturating_sub(last) <= JUST_STOPPED.as_millis() as u64;
        just_stopped || self.ended.load(Ordering::Acquire) > ended
    }

    fn clock(&self) -> u64 {
        (self.epoch.elapsed().as_millis() as u64).saturating_add(1)
    }

    /// One script fewer being stopped; the last wakes the callers waiting in [`Watch::after_stop`].
    fn one_less_stopping(&self) {
        if self.stopping.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.settled.notify_waiters();
        }
    }

    /// `entry` moves from `from` to `to`; false when it had moved on (its reply arrived).
    fn shift(&self, entry: &Entry, from: u8, to: u8) -> bool {
        let shifted = entry
            .state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        let counted = |state| matches!(state, CHECKING | STOPPED);
        if shifted && counted(from) && !counted(to) {
            self.one_less_stopping();
        }
        shifted
    }

    /// Resolves when a script became due earlier than the watcher sleeps for.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await
    }

    /// The earliest time a watched script is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.scripts
            .lock()
            .values()
            .filter(|script| script.entry.state.load(Ordering::Acquire) == WATCHING)
            .filter_map(|script| script.due)
            .min()
    }

    /// The watched scripts due at `now`, each now `CHECKING`.
    pub(crate) fn take_overdue(&self, now: Instant) -> Vec<Arc<Entry>> {
        let scripts = self.scripts.lock();
        let mut overdue = Vec::new();
        for script in scripts.values() {
            if script.due.is_some_and(|due| due <= now) {
                // Counted before it shows as checking, so that no waiter sees it checking and
                // uncounted.
                self.stopping.fetch_add(1, Ordering::AcqRel);
                if self.shift(&script.entry, WATCHING, CHECKING) {
                    overdue.push(script.entry.clone());
                } else {
                    self.one_less_stopping();
                }
            }
        }
        overdue
    }

    /// `entry`, checked, is not running past its limit: asked about again after [`RECHECK`].
    pub(crate) fn recheck(&self, entry: &Entry) {
        self.watch_again(entry, CHECKING);
    }

    /// A kill is about to be sent for `entry` (checked); false if its reply arrived meanwhile.
    /// Marked before the kill is sent: the script's "killed by user" may arrive before the kill's
    /// own `OK`, and must be told apart from a kill its client asked for.
    pub(crate) fn stopping(&self, entry: &Entry) -> bool {
        self.shift(entry, CHECKING, STOPPED)
    }

    /// Redis answered the kill for `entry` `UNKILLABLE`; false if its reply arrived meanwhile.
    pub(crate) fn unkillable(&self, entry: &Entry) -> bool {
        self.shift(entry, STOPPED, UNKILLABLE)
    }

    /// The kill for `entry` stopped nothing (it had ended, or a function runs): watched again.
    pub(crate) fn not_stopped(&self, entry: &Entry) {
        self.watch_again(entry, STOPPED);
    }

    fn watch_again(&self, entry: &Entry, from: u8) {
        if self.shift(entry, from, WATCHING) {
            if let Some(script) = self.scripts.lock().get_mut(&entry.id) {
                script.due = Some(Instant::now() + RECHECK);
            }
        }
    }
}

impl Watched {
    /// The script is now the oldest reply owed on its connection: Redis can have started on it.
    pub(crate) fn started(&self) {
        let mut scripts = self.watch.scripts.lock();
        if let Some(script) = scripts.get_mut(&self.entry.id) {
            if script.due.is_none() {
                script.due = Some(Instant::now() + self.entry.limit.after);
                drop(scripts);
                self.watch.changed.notify_one();
            }
        }
    }

    /// The script's outcome: a script the watcher stopped fails as [`CallError::ScriptStopped`];
    /// an error of one it could not stop says so.
    pub(crate) fn outcome(&self, reply: Reply) -> Result<Reply, CallError> {
        match self.entry.state.load(Ordering::Acquire) {
            STOPPED if overrun::is_killed_reply(reply.bytes()) => Err(CallError::ScriptStopped {
                limit: self.entry.limit.after,
                set_by: self.entry.limit.set_by.clone(),
                kill: self.entry.kill,
            }),
            UNKILLABLE if reply.is_error() => Ok(unkillable_noted(reply, self.entry.limit.after)),
            _ => Ok(reply),
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let watch = &self.watch;
        let removed = watch.scripts.lock().remove(&self.entry.id);
        if removed.is_some_and(|script| script.due.is_some()) {
            watch.ended.fetch_add(1, Ordering::AcqRel);
        }
        watch.registered.fetch_sub(1, Ordering::Relaxed);
        let state = self.entry.state.swap(DONE, Ordering::AcqRel);
        if state == STOPPED {
            watch.last_stop.store(watch.clock(), Ordering::Release);
            if let Some(cooldown) = &self.entry.limit.cooldown {
                cooldown.start();
            }
        }
        if matches!(state, CHECKING | STOPPED) {
            watch.one_less_stopping();
        }
    }
}

/// An error reply of a script that ran past its limit and could not be stopped, with why.
fn unkillable_noted(reply: Reply, limit: Duration) -> Reply {
    let bytes = reply.bytes();
    let Some(line) = bytes
        .strip_suffix(b"\r\n")
        .filter(|_| bytes.starts_with(b"-"))
    else {
        return reply;
    };
    let mut noted = BytesMut::with_capacity(line.len() + 160);
    noted.extend_from_slice(line);
    noted.extend_from_slice(
        format!(
            " (tollgate: the script ran past its time limit ({limit:?}) and could not be stopped: \
             it had written, UNKILLABLE)\r\n"
        )
        .as_bytes(),
    );
    Reply::new(noted.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(ms: u64) -> ScriptLimit {
        ScriptLimit {
            cooldown: None,
            after: Duration::from_millis(ms),
            set_by: Arc::from("resp.script_time_limit"),
            who: Arc::from("client 1"),
        }
    }

    fn encoded(words: &[&str]) -> Bytes {
        let mut out = BytesMut::new();
        tollgate_resp::encode_command(words, &mut out);
        out.freeze()
    }

    #[tokio::test]
    async fn scripts_are_due_from_their_start_and_forgotten_with_their_reply() {
        let watch = Watch::new();
        assert!(watch
            .register(&encoded(&["GET", "k"]), &limit(1000))
            .is_none());
        assert!(watch
            .register(&encoded(&["EVAL", "return 1", "0"]), &limit(0))
            .is_none());
        let eval = watch
            .register(&encoded(&["EVAL", "return 1", "0"]), &limit(1000))
            .expect("an EVAL is watched");
        assert!(watch.busy());
        assert_eq!(watch.next_due(), None, "not started, not due");
        eval.started();
        let due = watch.next_due().expect("due once started");
        let limit = Duration::from_millis(1000);
        assert!(due > Instant::now() + limit / 2 && due <= Instant::now() + limit);
        eval.started();
        assert_eq!(watch.next_due(), Some(due), "its start is its first");
        assert!(watch.take_overdue(Instant::now()).is_empty());
        let overdue = watch.take_overdue(due);
        assert_eq!(overdue.len(), 1);
        assert_eq!(watch.stopping.load(Ordering::Relaxed), 1);
        // Checked, not shown running: asked about again soon.
        watch.recheck(&overdue[0]);
        assert_eq!(watch.stopping.load(Ordering::Relaxed), 0);
        assert!(
            watch.next_due().is_some_and(
                |due| due <= Instant::now() + RECHECK && due < Instant::now() + limit / 2
            )
        );
        drop(eval);
        assert!(!watch.busy());
        assert_eq!(watch.next_due(), None);
    }

    #[tokio::test]
    async fn a_stopped_scripts_reply_is_typed_and_lets_busy_commands_go_again() {
        let watch = Watch::new();
        let killed = Reply::new(Bytes::from_static(
            b"-ERR Script killed by user with SCRIPT KILL... script: 8c, on @user_script:1.\r\n",
        ));
        let eval = watch
            .register(&encoded(&["EVAL", "while true do end", "0"]), &limit(1000))
            .unwrap();
        // A kill the client asked for itself is Redis's to answer.
        assert!(matches!(eval.outcome(killed.clone()), Ok(reply) if reply == killed));
        eval.started();
        let overdue = watch.take_overdue(Instant::now() + Duration::from_secs(1));
        assert!(watch.stopping(&overdue[0]));
        assert!(matches!(
            eval.outcome(killed.clone()),
            Err(CallError::ScriptStopped { limit, kill: Kill::Script, .. }) if limit == Duration::from_secs(1)
        ));
        // A BUSY meanwhile waits for the stopped script's reply, then goes again.
        let waiting = tokio::spawn({
            let watch = watch.clone();
            async move { watch.after_stop().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(eval);
        assert!(waiting.await.unwrap());
        // Long after, a BUSY is Redis's own (another client's script): not sent again.
        tokio::time::sleep(JUST_STOPPED + Duration::from_millis(50)).await;
        assert!(!watch.after_stop().await);
    }

    #[tokio::test]
    async fn an_unkillable_scripts_error_says_why() {
        let watch = Watch::new();
        let eval = watch
            .register(
                &encoded(&["EVAL", "redis.call('SET','k','v') while true do end", "0"]),
                &limit(1000),
            )
            .unwrap();
        eval.started();
        let overdue = watch.take_overdue(Instant::now() + Duration::from_secs(1));
        assert!(watch.stopping(&overdue[0]));
        assert!(watch.unkillable(&overdue[0]));
        assert_eq!(watch.stopping.load(Ordering::Relaxed), 0);
        let fine = Reply::new(Bytes::from_static(b":5\r\n"));
        assert!(matches!(eval.outcome(fine.clone()), Ok(reply) if reply == fine));
        let failed = Reply::new(Bytes::from_static(b"-ERR oops\r\n"));
        let noted = eval.outcome(failed).unwrap();
        let text = String::from_utf8_lossy(noted.bytes()).into_owned();
        assert!(text.starts_with("-ERR oops (tollgate: "), "{text}");
        assert!(
            text.contains("UNKILLABLE") && text.ends_with(")\r\n"),
            "{text}"
        );
        drop(eval);
        assert!(!watch.after_stop().await);
    }

    /// A quota's shorter limit lowered the server's busy threshold: another caller's command
    /// refused `BUSY` while a script allowed longer runs waits for it to end, then goes again; one
    /// refused while none of the daemon's scripts runs is Redis's answer.
    #[tokio::test]
    async fn a_busy_before_a_running_script_is_due_waits_for_its_end() {
        let watch = Watch::new();
        let eval = watch
            .register(&encoded(&["EVAL", "return 1", "0"]), &limit(1000))
            .unwrap();
        eval.started();
        let waiting = tokio::spawn({
            let watch = watch.clone();
            async move { watch.after_stop().await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished(), "it waits while the script runs");
        drop(eval);
        assert!(waiting.await.unwrap(), "sent again once it ended");
        assert!(
            !watch.after_stop().await,
            "no script runs: Redis's own BUSY"
        );
        // A script registered but not yet started (queued behind another) is not waited for.
        let queued = watch
            .register(&encoded(&["EVAL", "return 1", "0"]), &limit(1000))
            .unwrap();
        assert!(!watch.after_stop().await);
        drop(queued);
    }
}
