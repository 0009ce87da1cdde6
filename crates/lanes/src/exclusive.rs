//! BLOCKING, TRANSACTION and ADMIN: one connection lent to one borrower at a time, from a pool capped
//! at the lane's ceiling. A connection comes back only clean; one with a reply still owed (the borrower
//! was cancelled or gave up on a blocking command) is closed, never lent again.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate_model::{Lane, Protocol, Tenant};

use crate::ceilings::Outer;
use crate::config::LaneSettings;
use crate::conn::Conn;
use crate::connector::Connector;
use crate::error::{CallError, LaneError, Saturation};
use crate::gate::{Gate, Permit, Queue};
use crate::hygiene::{Cleanup, Session};
use crate::life::Life;
use crate::metrics::{LaneMetrics, Rejection};
use crate::reply::Reply;
use crate::scope_pools::ScopeLogin;
use crate::share::{Share, Shares};
use crate::stream::Probe;

pub(crate) struct ExclusiveLane {
    pub(crate) lane: Lane,
    gate: Gate,
    idle: Mutex<Vec<Conn>>,
    pub(crate) connector: Arc<Connector>,
    pub(crate) metrics: LaneMetrics,
    life: Arc<Life>,
    /// The deadline of a command sent without one of its own; `None`: none.
    command_timeout: Option<Duration>,
    shares: Arc<Shares>,
}

/// A connection lent to one borrower. Send commands with [`Borrowed::send`]; give it back with
/// [`Borrowed::release`]. Dropping it returns it only if it is clean, and closes it otherwise.
pub struct Borrowed {
    conn: Option<Conn>,
    session: Session,
    /// A command was written and its reply not yet read: the connection is out of step.
    owes_reply: bool,
    /// Commands written ahead ([`Borrowed::send_ahead`]) whose replies are still to be read.
    ahead: usize,
    /// The user the connection is logged in as instead of the lane's ([`Borrowed::act_as`]).
    acting: Option<String>,
    lane: Arc<ExclusiveLane>,
    _permit: Permit,
    _share: Option<Share>,
}

impl ExclusiveLane {
    pub(crate) fn new(
        settings: &LaneSettings,
        connector: Arc<Connector>,
        metrics: LaneMetrics,
        life: Arc<Life>,
        outer: Outer,
    ) -> Self {
        ExclusiveLane {
            lane: settings.lane,
            gate: Gate::new(
                settings.lane,
                settings.connections,
                Queue::Bounded(settings.queue_length),
                settings.acquire_timeout,
                metrics.clone(),
            )
            .under(outer.gate),
            idle: Mutex::new(Vec::new()),
            connector,
            metrics,
            life,
            command_timeout: settings.command_timeout,
            shares: Shares::under(
                settings.per_principal,
                settings.acquire_timeout,
                outer.shares,
            ),
        }
    }

    /// A connection speaking `protocol`: an idle one (switched with `HELLO` if it spoke the other
    /// protocol), or a new one; for `tenant`, within its share of the lane (`None`: the
    /// daemon's own work, not counted against any share).
    pub(crate) async fn borrow(
        self: &Arc<Self>,
        protocol: Protocol,
        tenant: Option<&Tenant>,
    ) -> Result<Borrowed, LaneError> {
        if !self.life.is_open() {
            self.metrics.reject(Rejection::Closed);
            return Err(LaneError::Closed);
        }
        let since = Instant::now();
        let share = match tenant {
            Some(tenant) => Some(self.shares.enter(tenant, since).await.map_err(|_| {
                let cause = Saturation::PrincipalShare;
                self.metrics.reject(Rejection::Saturated(cause));
                LaneError::Saturated {
                    lane: self.lane,
                    waited: since.elapsed(),
                    cause,
                }
            })?),
            None => None,
        };
        let permit = self.gate.enter(since).await?;
        let idle = match self.take_idle() {
            Some(mut conn) if conn.protocol() != protocol => {
                conn.switch(protocol).await.ok().map(|()| conn)
            }
            idle => idle,
        };
        let conn = match idle {
            Some(conn) => conn,
            None => self.connector.connect(protocol).await.map_err(|error| {
                self.metrics.reject(Rejection::Unavailable);
                LaneError::Unavailable {
                    reason: error.to_string(),
                }
            })?,
        };
        self.life.lend();
        Ok(Borrowed {
            conn: Some(conn),
            session: Session::default(),
            owes_reply: false,
            ahead: 0,
            acting: None,
            lane: self.clone(),
            _permit: permit,
            _share: share,
        })
    }

    /// An idle connection that still looks alive; dead or out-of-step ones are closed on the way.
    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock();
        while let Some(conn) = idle.pop() {
            self.metrics.idle.dec();
            if !self.connector.is_current(&conn) {
                continue;
            }
            match conn.probe() {
                Probe::Quiet => return Some(conn),
                Probe::Gone => self.connector.note_lost(),
                Probe::Unexpected => {}
            }
        }
        None
    }

    fn give_back(&self, conn: Conn) {
        if self.life.is_open() && self.connector.is_current(&conn) {
            self.idle.lock().push(conn);
            self.metrics.idle.inc();
        }
    }

    /// Refuses new borrowers (draining).
    pub(crate) fn close_gate(&self) {
        self.gate.close();
    }

    /// Closes every idle connection.
    pub(crate) fn close_idle(&self) {
        let closed = std::mem::take(&mut *self.idle.lock());
        self.metrics.idle.dec_by(closed.len() as i64);
    }
}

impl Borrowed {
    pub fn lane(&self) -> Lane {
        self.lane.lane
    }

    /// Sends one encoded command and waits for its reply, within the lane's command timeout.
    pub async fn send(&mut self, command: Bytes) -> Result<Reply, CallError> {
        self.send_within(command, self.lane.command_timeout).await
    }

    /// [`Borrowed::send`] with the command's own deadline (`None`: none, for commands that may
    /// block forever). Past it the connection is closed (Redis may still answer later, so it can
    /// never be lent again) and the outcome is indeterminate.
    pub async fn send_within(
        &mut self,
        command: Bytes,
        deadline: Option<Duration>,
    ) -> Result<Reply, CallError> {
        self.session.observe(&command);
        self.bounded(command, deadline).await
    }

    /// Sends the lane's own command (not the borrower's: the session's state is not read from
    /// it), within the lane's command timeout.
    async fn send_unobserved(&mut self, command: Bytes) -> Result<Reply, CallError> {
        self.bounded(command, self.lane.command_timeout).await
    }

    /// `command` sent within `deadline` (`None`: none). Past it the connection is closed.
    async fn bounded(
        &mut self,
        command: Bytes,
        deadline: Option<Duration>,
    ) -> Result<Reply, CallError> {
        let Some(deadline) = deadline else {
            return self.send_raw(command).await;
        };
        match tokio::time::timeout(deadline, self.send_raw(command)).await {
            Ok(outcome) => outcome,
            Err(_) => {
                self.conn = None;
                Err(CallError::Indeterminate {
                    reason: format!("no reply within {deadline:?}; the connection was closed"),
                })
            }
        }
    }

    async fn send_raw(&mut self, command: Bytes) -> Result<Reply, CallError> {
        // A reply owed, or replies written ahead and not collected, would be read as this one's.
        let in_step = !self.owes_reply && self.ahead == 0;
        let generation = self.usable(in_step)?.generation();
        self.owes_reply = true;
        let conn = self.conn.as_mut().expect("usable");
        let outcome = tokio::select! {
            outcome = conn.call(&command) => outcome.map_err(|e| e.to_string()),
            reason = interrupted(&self.lane, generation) => Err(reason),
        };
        match outcome {
            Ok(reply) => {
                self.owes_reply = false;
                if reply.is_readonly() {
                    self.lane.connector.refused_write();
                }
                Ok(reply)
            }
            Err(reason) => Err(self.lost(reason)),
        }
    }

    /// Writes one encoded command without waiting for its reply, within `deadline` (`None`:
    /// none): a transaction's queued commands, whose replies only say they were queued, go out as
    /// the client pipelines them instead of one round trip each. [`Borrowed::collect_ahead`] reads
    /// their replies; until then nothing else may be sent (the connection would be closed), and a
    /// connection dropped or released before is closed, never lent again out of step.
    pub async fn send_ahead(
        &mut self,
        command: Bytes,
        deadline: Option<Duration>,
    ) -> Result<(), CallError> {
        self.session.observe(&command);
        let in_step = !self.owes_reply;
        self.usable(in_step)?;
        // Counted first: a write cut short may have reached Redis in part.
        self.ahead += 1;
        let conn = self.conn.as_mut().expect("usable");
        let write = async { conn.write(&command).await.map_err(|e| e.to_string()) };
        within(deadline, write, "redis read nothing")
            .await
            .map_err(|reason| self.lost(reason))
    }

    /// How many commands were written ahead and their replies not yet collected.
    pub fn ahead(&self) -> usize {
        self.ahead
    }

    /// Reads the replies of the commands written ahead and hands each to `each`, oldest first,
    /// all within `deadline` (`None`: none); none is kept here, so a transaction of a million
    /// queued commands costs a million small reads, not a million replies held. Past the
    /// deadline, or if the connection fails, it is closed and the outcome is indeterminate.
    pub async fn collect_ahead(
        &mut self,
        deadline: Option<Duration>,
        mut each: impl FnMut(Reply),
    ) -> Result<(), CallError> {
        let ahead = &mut self.ahead;
        let lane = &self.lane;
        let collected = async {
            let Some(conn) = self.conn.as_mut() else {
                return Err("this connection was closed after an earlier failure".to_owned());
            };
            let generation = conn.generation();
            while *ahead > 0 {
                let reply = tokio::select! {
                    reply = conn.read_reply() => reply.map_err(|e| e.to_string())?,
                    reason = interrupted(lane, generation) => return Err(reason),
                };
                *ahead -= 1;
                if reply.is_readonly() {
                    lane.connector.refused_write();
                }
                each(reply);
            }
            Ok(())
        };
        within(deadline, collected, "no reply")
            .await
            .map_err(|reason| self.lost(reason))
    }

    /// The connection, if a command may be written on it: it is `in_step` (else it is closed
    /// now), still open, and the lanes are not closing.
    fn usable(&mut self, in_step: bool) -> Result<&mut Conn, CallError> {
        if !in_step || self.lane.life.killed().is_cancelled() {
            let closing = self.conn.is_some() && in_step;
            self.conn = None;
            if closing {
                return Err(CallError::NotSent(LaneError::Closed));
            }
        }
        self.conn.as_mut().ok_or_else(|| {
            CallError::NotSent(LaneError::Unavailable {
                reason: "this connection was closed after an earlier failure; borrow another"
                    .into(),
            })
        })
    }

    /// The connection failed midway: closed (never lent again) and the outcome indeterminate.
    fn lost(&mut self, reason: String) -> CallError {
        self.conn = None;
        self.lane.connector.note_lost();
        CallError::Indeterminate { reason }
    }

    /// The user the connection is logged in as, when not the lane's.
    pub fn acting_as(&self) -> Option<&str> {
        self.acting.as_deref()
    }

    /// Logs the connection in as `login`'s user until it is released: what the borrower sends
    /// from now on runs with that user's permissions, and [`Borrowed::release`] logs it back in
    /// as the lane's own user (or closes it). `Err`: Redis refused the login or the connection
    /// failed; the connection is closed either way, never lent again as the wrong user.
    pub async fn act_as(&mut self, login: &ScopeLogin) -> Result<(), CallError> {
        let mut auth = bytes::BytesMut::new();
        tollgate_resp::encode_command(&["AUTH", &login.user, &login.password], &mut auth);
        // Marked first: whatever happens next, the connection no longer comes back as it was.
        self.acting = Some(login.user.clone());
        match self.send_unobserved(auth.freeze()).await {
            Ok(reply) if !reply.is_error() => Ok(()),
            Ok(reply) => {
                self.conn = None;
                Err(CallError::NotSent(LaneError::Scope {
                    user: login.user.clone(),
                    reason: String::from_utf8_lossy(reply.bytes()).trim().to_owned(),
                }))
            }
            Err(error) => {
                self.conn = None;
                Err(error)
            }
        }
    }

    /// Gives the connection back clean: an open transaction is discarded, watched keys unwatched,
    /// a connection that acted as another user logged back in as the lane's. A connection that
    /// cannot be made clean is closed instead.
    pub async fn release(mut self) {
        if self.ahead > 0 {
            // Replies written ahead and never read: out of step, never lent again.
            self.conn = None;
            return;
        }
        let command: Option<&[u8]> = match self.session.cleanup() {
            Cleanup::Nothing => None,
            Cleanup::Close => {
                self.conn = None;
                return;
            }
            Cleanup::Discard => Some(b"*1\r\n$7\r\nDISCARD\r\n"),
            Cleanup::Unwatch => Some(b"*1\r\n$7\r\nUNWATCH\r\n"),
        };
        if let Some(command) = command {
            let cleaned = self.send(Bytes::from_static(command)).await;
            if !matches!(cleaned, Ok(ref reply) if !reply.is_error()) {
                self.conn = None;
                return;
            }
        }
        if self.acting.is_some() {
            let Some(reauth) = self.lane.connector.reauth() else {
                self.conn = None;
                return;
            };
            match self.send_unobserved(reauth).await {
                Ok(reply) if !reply.is_error() => self.acting = None,
                _ => self.conn = None,
            }
        }
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        let clean = !self.owes_reply
            && self.ahead == 0
            && self.session.cleanup() == Cleanup::Nothing
            && self.acting.is_none();
        if let (Some(conn), true) = (self.conn.take(), clean) {
            self.lane.give_back(conn);
        }
        self.lane.life.give_back();
    }
}

/// Resolves, saying why, once the lanes close or the master the connection (of `generation`)
/// reached has moved: a reply awaited then is lost with the connection.
async fn interrupted(lane: &ExclusiveLane, generation: u64) -> String {
    tokio::select! {
        _ = lane.life.killed().cancelled() => "lanes closed before the reply arrived".to_owned(),
        _ = lane.connector.moved(generation) => "the redis master moved to another server".to_owned(),
    }
}

/// `work` within `deadline` (`None`: none); past it, `Err` says that `what` happened in time.
async fn within<T>(
    deadline: Option<Duration>,
    work: impl std::future::Future<Output = Result<T, String>>,
    what: &str,
) -> Result<T, String> {
    match deadline {
        Some(deadline) => tokio::time::timeout(deadline, work)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "{what} within {deadline:?}; the connection was closed"
                ))
            }),
        None => work.await,
    }
}
