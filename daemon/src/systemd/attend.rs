//! Telling systemd when the daemon is ready (only once `/readyz` would answer 200) and petting its
//! watchdog for as long as the daemon's runtime makes progress.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::protocol::Notifier;
use crate::readiness::Readiness;

/// How often readiness is probed until `READY=1` can be sent.
const READY_POLL: Duration = Duration::from_millis(100);

/// Sends `READY=1` once `readiness` has no problem left (saying in `STATUS=` what it waits for
/// meanwhile), then `WATCHDOG=1` at half of `watchdog` until `stop`.
pub async fn attend(
    readiness: &Readiness,
    notifier: Notifier,
    watchdog: Option<Duration>,
    stop: CancellationToken,
) {
    let mut pets = watchdog.map(|interval| {
        let mut ticks = tokio::time::interval(interval / 2);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    if notifier.enabled {
        let mut said = String::new();
        loop {
            let problems = readiness.problems().await;
            if problems.is_empty() {
                notifier.ready();
                break;
            }
            let status = format!("not ready: {}", problems.join("; "));
            if status != said {
                notifier.status(&status);
                said = status;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(READY_POLL) => {}
                () = pet(&mut pets) => notifier.watchdog(),
            }
        }
    }
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = pet(&mut pets) => notifier.watchdog(),
        }
    }
}

/// The watchdog's next tick; never, without a watchdog.
async fn pet(pets: &mut Option<tokio::time::Interval>) {
    match pets {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}
