//! The watcher of one node's scripts (`script_limit`): asleep until the earliest registered
//! script is due, then asks `FUNCTION STATS` on the SCRIPT lane's kill connection what runs, and
//! sends `SCRIPT KILL` or `FUNCTION KILL` there when it is one of the daemon's own scripts past its
//! limit (`overrun::decide`). A kill Redis answers `UNKILLABLE` is logged with who sent the script.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_model::Protocol;

use crate::error::CallError;
use crate::life::Life;
use crate::multiplex::MultiplexedLane;
use crate::overrun::{self, Killed, Overdue, Running, Verdict};
use crate::reply::Reply;
use crate::script_limit::{Entry, Watch};

/// A kill answered later than this after it was sent waited for Redis's busy threshold.
const LATE_KILL: Duration = Duration::from_millis(250);

/// The watcher of one node's scripts: until the lanes drain, stops each of the daemon's scripts
/// that runs past its limit, on the kill connection.
pub(crate) async fn watch_over(watch: Arc<Watch>, kills: Arc<MultiplexedLane>, life: Arc<Life>) {
    let draining = life.draining().clone();
    loop {
        let changed = watch.changed();
        let due = watch.next_due();
        tokio::select! {
            biased;
            _ = draining.cancelled() => return,
            _ = changed => continue,
            _ = sleep_until(due) => {}
        }
        let overdue = watch.take_overdue(Instant::now());
        if overdue.is_empty() {
            continue;
        }
        if stop_overdue(&watch, &kills, &overdue, &draining)
            .await
            .is_none()
        {
            return;
        }
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Asks what runs and stops it if it is one of `overdue` (all just taken as due); every one not
/// stopped is watched again. `None`: the lanes are draining.
async fn stop_overdue(
    watch: &Watch,
    kills: &Arc<MultiplexedLane>,
    overdue: &[Arc<Entry>],
    draining: &CancellationToken,
) -> Option<()> {
    let stats = ask(kills, crate::busy::FUNCTION_STATS, draining).await?;
    let running = match &stats {
        Ok(reply) => reply
            .frame()
            .map(|frame| Running::of(&frame))
            .unwrap_or_else(|error| Running::Unknown(error.to_string())),
        Err(error) => Running::Unknown(error.to_string()),
    };
    let views: Vec<Overdue<'_>> = overdue.iter().map(|entry| entry.overdue()).collect();
    let (kill, ids) = match overrun::decide(&running, &views) {
        Verdict::Stop(kill, ids) => (kill, ids),
        Verdict::Leave => {
            if let Running::Unknown(answer) = &running {
                tracing::debug!(%answer, "FUNCTION STATS did not say what runs");
            }
            for entry in overdue {
                watch.recheck(entry);
            }
            return Some(());
        }
    };
    let (stopping, left): (Vec<&Arc<Entry>>, Vec<&Arc<Entry>>) =
        overdue.iter().partition(|entry| ids.contains(&entry.id()));
    for entry in left {
        watch.recheck(entry);
    }
    let stopping: Vec<&Arc<Entry>> = stopping
        .into_iter()
        .filter(|entry| watch.stopping(entry))
        .collect();
    if stopping.is_empty() {
        return Some(());
    }
    let sent = Instant::now();
    let answer = match ask(kills, kill.command(), draining).await? {
        Ok(reply) => Killed::of(reply.bytes()),
        Err(error) => Killed::Not(error.to_string()),
    };
    let waited = sent.elapsed();
    if waited > LATE_KILL {
        tracing::warn!(
            ?waited,
            "{kill} waited for redis to read it: is its busy-reply-threshold above \
             resp.script_time_limit? Redis reads nothing while a script runs until then"
        );
    }
    for entry in stopping {
        let (who, limit) = (&entry.limit().who, entry.limit().after);
        match &answer {
            Killed::Stopped => {
                tracing::info!(%who, ?limit, %kill, "stopped a script past its time limit")
            }
            Killed::Unkillable => {
                if watch.unkillable(entry) {
                    tracing::warn!(
                        %who,
                        ?limit,
                        "a script ran past its time limit and cannot be stopped: it has written \
                         (UNKILLABLE). Redis answers other clients BUSY until it ends; only \
                         SHUTDOWN NOSAVE would stop it"
                    );
                }
            }
            Killed::Not(answer) => {
                tracing::debug!(%who, %answer, "{kill} did not stop the script");
                watch.not_stopped(entry);
            }
        }
    }
    Some(())
}

/// `command` on the kill connection (RESP2), without a deadline: Redis reads it only once the
/// script passes its busy threshold. `None`: the lanes are draining.
async fn ask(
    kills: &Arc<MultiplexedLane>,
    command: &'static [u8],
    draining: &CancellationToken,
) -> Option<Result<Reply, CallError>> {
    let sent = kills
        .channel(Protocol::Resp2)
        .send_within(Bytes::from_static(command), None);
    tokio::select! {
        biased;
        _ = draining.cancelled() => None,
        reply = sent => Some(reply),
    }
}
