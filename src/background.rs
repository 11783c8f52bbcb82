//! Work a manager leaves running after a call returns (releases finishing
//! on slow nodes, rollbacks of failed attempts, releases of dropped
//! locks), counted so that [`LockManager::settle`](crate::LockManager::settle)
//! can wait for it before a process exits.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Spawns and counts background tasks; each is bounded by its own deadline.
#[derive(Default)]
pub(crate) struct Background {
    running: AtomicUsize,
    idle: Notify,
}

impl Background {
    /// Runs `work` on the current tokio runtime; without one, it is dropped
    /// (what it would have deleted then expires by TTL).
    pub(crate) fn spawn(
        self: &std::sync::Arc<Self>,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.running.fetch_add(1, Ordering::SeqCst);
        let this = std::sync::Arc::clone(self);
        runtime.spawn(async move {
            work.await;
            if this.running.fetch_sub(1, Ordering::SeqCst) == 1 {
                this.idle.notify_waiters();
            }
        });
    }

    /// Until no background task is running.
    pub(crate) async fn settle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Register before checking, so a task ending in between is seen.
            idle.as_mut().enable();
            if self.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}
