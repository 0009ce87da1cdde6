//! SCRIPT KILL, FUNCTION KILL and FUNCTION STATS on a connection of their own: the SCRIPT lane's
//! commands Redis serves while a script is busy. While a script runs, Redis reads nothing until the
//! script passes `busy-reply-threshold`, and then serves only the commands it allows while busy. A
//! kill (or the FUNCTION STATS that tells what to kill) sent on the SCRIPT lane's connections could
//! sit behind the busy script itself, and one that has to open a connection first can see its
//! handshake time out before Redis starts reading. So the SCRIPT lane keeps one more connection,
//! opened at start and kept open with a PING every [`WARM_EVERY`], on which it sends these alone:
//! Redis reads them as soon as it reads anything, and answers them at once.
//!
//! It is a connection of the SCRIPT lane (its ACL user, so the policy's grant of `script|kill` and
//! `function|kill` decides, and its metrics), one per protocol, as the lane's other connections
//! (FUNCTION STATS is a map in RESP3).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinSet;
use tollgate_model::Protocol;

use crate::ceilings::Outer;
use crate::config::LaneSettings;
use crate::connector::Connector;
use crate::life::Life;
use crate::metrics::LaneMetrics;
use crate::multiplex::{MultiplexedLane, Scripts};

/// How often the kill connection is pinged: it is opened again this soon after it is lost (a Redis
/// restart, an idle `timeout`), so that the next kill finds it open.
pub(crate) const WARM_EVERY: Duration = Duration::from_secs(5);

/// Kills one caller may have queued at once on the kill connection, and in all.
const IN_FLIGHT: usize = 4;
const QUEUE_LENGTH: usize = 64;

/// `PING`, encoded: what keeps the kill connection warm, and the lanes' own liveness check.
pub(crate) const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// The kill connection, as a multiplexed lane of one connection, started with its warming task.
pub(crate) fn start(
    script: &LaneSettings,
    connector: Arc<Connector>,
    metrics: LaneMetrics,
    life: &Arc<Life>,
    drivers: &mut JoinSet<()>,
) -> Arc<MultiplexedLane> {
    let settings = LaneSettings {
        connections: 1,
        in_flight: IN_FLIGHT,
        queue_length: QUEUE_LENGTH,
        ..script.clone()
    };
    let kills = MultiplexedLane::start(
        &settings,
        connector,
        metrics,
        life.clone(),
        Scripts::default(),
        Outer::default(),
        drivers,
    );
    drivers.spawn(keep_warm(kills.clone(), life.clone()));
    kills
}

/// Pings the kill connections now and every [`WARM_EVERY`] until the lanes drain. A ping has no
/// deadline: during a busy script it waits, unanswered, rather than have its connection closed
/// as overdue — the moment a kill is needed most.
async fn keep_warm(kills: Arc<MultiplexedLane>, life: Arc<Life>) {
    let draining = life.draining();
    loop {
        let ping = futures::future::join_all(Protocol::ALL.map(|protocol| {
            kills
                .channel(protocol)
                .send_within(Bytes::from_static(PING), None)
        }));
        tokio::select! {
            biased;
            _ = draining.cancelled() => return,
            // Unavailable or not, the connection is tried again on the next round.
            _ = ping => {}
        }
        tokio::select! {
            biased;
            _ = draining.cancelled() => return,
            _ = tokio::time::sleep(WARM_EVERY) => {}
        }
    }
}
