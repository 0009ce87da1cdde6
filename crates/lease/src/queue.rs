//! Waiters on one resource line up here, in arrival order, so that only the head of the line talks
//! to Redis: a release wakes one waiter, not a stampede. The line is a fair (FIFO) Tokio mutex per
//! resource; the map entry goes when the last waiter leaves.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::OwnedMutexGuard;

#[derive(Default)]
pub struct WaitLines {
    lines: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

/// Being at the head of a resource's line; dropping it lets the next waiter through.
pub struct Turn {
    guard: Option<OwnedMutexGuard<()>>,
    key: String,
    lines: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl WaitLines {
    /// Waits (cancel-safe) until every earlier waiter for `key` has left the head of the line.
    pub async fn enter(&self, key: &str) -> Turn {
        let line = self.lines.lock().entry(key.to_owned()).or_default().clone();
        let guard = line.lock_owned().await;
        Turn {
            guard: Some(guard),
            key: key.to_owned(),
            lines: self.lines.clone(),
        }
    }

    /// Callers in line, the heads included, over every resource.
    pub fn waiting(&self) -> usize {
        // The map holds one reference to each line and every caller in it one more.
        self.lines
            .lock()
            .values()
            .map(|line| Arc::strong_count(line) - 1)
            .sum()
    }

    /// Whether nobody waits for any resource.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.lines.lock().is_empty()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut lines = self.lines.lock();
        drop(self.guard.take());
        // Only the map holds the line now: nobody waits, so forget it.
        if lines
            .get(&self.key)
            .is_some_and(|line| Arc::strong_count(line) == 1)
        {
            lines.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn waiters_pass_one_at_a_time_in_arrival_order() {
        let lines = Arc::new(WaitLines::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = lines.enter("r").await;
        let mut tasks = Vec::new();
        for n in 0..5 {
            let (lines, order) = (lines.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _turn = lines.enter("r").await;
                order.lock().push(n);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }));
            // Let each task queue before the next arrives.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(order.lock().is_empty(), "nobody passes the head");
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*order.lock(), vec![0, 1, 2, 3, 4]);
        assert!(lines.is_empty(), "an empty line is forgotten");
    }
}
