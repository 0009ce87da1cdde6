//! The lifecycle every lane shares: OPEN → DRAINING → CLOSED, with the signals that tell drivers and
//! borrowers to finish (draining) or to stop at once (killed, when the drain deadline passes).

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LifeState {
    Open,
    Draining,
    Closed,
}

pub(crate) struct Life {
    state: AtomicU8,
    draining: CancellationToken,
    killed: CancellationToken,
    /// Exclusive connections currently lent out, so that a drain knows when they are all back.
    lent: AtomicUsize,
    returned: Notify,
}

impl Life {
    pub(crate) fn new() -> Self {
        Life {
            state: AtomicU8::new(0),
            draining: CancellationToken::new(),
            killed: CancellationToken::new(),
            lent: AtomicUsize::new(0),
            returned: Notify::new(),
        }
    }

    pub(crate) fn state(&self) -> LifeState {
        match self.state.load(Ordering::Acquire) {
            0 => LifeState::Open,
            1 => LifeState::Draining,
            _ => LifeState::Closed,
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) == 0
    }

    pub(crate) fn start_draining(&self) {
        self.state.store(1, Ordering::Release);
        self.draining.cancel();
    }

    pub(crate) fn kill(&self) {
        self.killed.cancel();
    }

    pub(crate) fn mark_closed(&self) {
        self.state.store(2, Ordering::Release);
    }

    pub(crate) fn draining(&self) -> &CancellationToken {
        &self.draining
    }

    /// Runs `work` among `drivers` until it ends or the lanes start draining, whichever is first.
    pub(crate) fn spawn_until_draining(
        &self,
        drivers: &mut tokio::task::JoinSet<()>,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let draining = self.draining.clone();
        drivers.spawn(async move {
            draining.run_until_cancelled_owned(work).await;
        });
    }

    pub(crate) fn killed(&self) -> &CancellationToken {
        &self.killed
    }

    pub(crate) fn lend(&self) {
        self.lent.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn give_back(&self) {
        if self.lent.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.returned.notify_waiters();
        }
    }

    /// Resolves once no exclusive connection is lent out.
    pub(crate) async fn all_returned(&self) {
        loop {
            let notified = self.returned.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lent.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}
