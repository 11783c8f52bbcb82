//! Work a manager leaves running after a call returns (releases finishing
//! on slow nodes, rollbacks of failed or dropped attempts, releases of
//! dropped locks, replies still owed by decided rounds), counted so that
//! [`LockManager::settle`](crate::LockManager::settle) can wait for it
//! before a process exits.
//!
//! Counting is done with [`Ticket`]s, decremented on drop, so work that
//! never finishes (its task dropped by a runtime shutting down) is never
//! waited for. Cleanup jobs that are dropped unfinished, or that find no
//! runtime to run on, are kept and run again on the next runtime that
//! calls [`Background::take_deferred`]: cleanup is idempotent
//! (compare-and-delete), so running one twice is harmless.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Counts background work; `J` is the kind of cleanup job it can defer.
pub(crate) struct Background<J> {
    running: AtomicUsize,
    idle: Notify,
    deferred: Mutex<Vec<J>>,
    /// Set while `deferred` may be non-empty, so the hot path checks one
    /// atomic instead of taking the mutex.
    has_deferred: AtomicBool,
}

impl<J> Default for Background<J> {
    fn default() -> Self {
        Self {
            running: AtomicUsize::new(0),
            idle: Notify::new(),
            deferred: Mutex::new(Vec::new()),
            has_deferred: AtomicBool::new(false),
        }
    }
}

/// One unit of counted work: `settle()` waits while any ticket lives.
pub(crate) struct Ticket<J> {
    background: Arc<Background<J>>,
}

impl<J> Drop for Ticket<J> {
    fn drop(&mut self) {
        if self.background.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.background.idle.notify_waiters();
        }
    }
}

/// Puts a cleanup job back on the deferred list unless it finished.
struct Requeue<J> {
    background: Arc<Background<J>>,
    job: Option<J>,
}

impl<J> Requeue<J> {
    fn finished(mut self) {
        self.job = None;
    }
}

impl<J> Drop for Requeue<J> {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            self.background.defer(job);
        }
    }
}

impl<J> Background<J> {
    fn defer(&self, job: J) {
        self.lock_deferred().push(job);
        self.has_deferred.store(true, Ordering::SeqCst);
    }

    fn lock_deferred(&self) -> std::sync::MutexGuard<'_, Vec<J>> {
        // A push or a take cannot leave the list half-changed.
        self.deferred.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<J: Clone + Send + 'static> Background<J> {
    /// Counts one unit of work until the ticket is dropped.
    pub(crate) fn ticket(self: &Arc<Self>) -> Ticket<J> {
        self.running.fetch_add(1, Ordering::SeqCst);
        Ticket {
            background: Arc::clone(self),
        }
    }

    /// Runs `work` on the current tokio runtime, counted. Without a
    /// runtime, or if the runtime drops the task, the work is abandoned;
    /// use [`spawn_job`](Self::spawn_job) for work that must happen.
    pub(crate) fn spawn(self: &Arc<Self>, work: impl Future<Output = ()> + Send + 'static) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let ticket = self.ticket();
        runtime.spawn(async move {
            let _counted = ticket;
            work.await;
        });
    }

    /// Runs `run(job)` on the current tokio runtime, counted. If there is
    /// no runtime, or the task is dropped before it finishes (the runtime
    /// shut down), `job` is deferred until [`take_deferred`](Self::take_deferred).
    ///
    /// The job is polled once right here, before the caller goes on: what
    /// it sends first (a rollback's deletes, queued on the connections at
    /// their first poll) is then ahead of the caller's next request on each
    /// connection, so the manager's next attempt at a resource is never
    /// refused by its own leftover key.
    pub(crate) fn spawn_job<F, Fut>(self: &Arc<Self>, job: J, run: F)
    where
        F: FnOnce(J) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.defer(job);
            return;
        };
        let ticket = self.ticket();
        let work = self.requeued(job, run);
        let mut task = Box::pin(async move {
            let _counted = ticket;
            work.await;
        });
        let mut first_poll = Context::from_waker(futures::task::noop_waker_ref());
        if task.as_mut().poll(&mut first_poll).is_pending() {
            runtime.spawn(task);
        }
    }

    /// Runs `run(job)` on the current tokio runtime, uncounted (work that
    /// `settle()` need not wait for, such as retries against a node that is
    /// down); deferred like [`spawn_job`](Self::spawn_job)'s if it cannot
    /// finish.
    pub(crate) fn spawn_uncounted_job<F, Fut>(self: &Arc<Self>, job: J, run: F)
    where
        F: FnOnce(J) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.defer(job);
            return;
        };
        runtime.spawn(self.requeued(job, run));
    }

    /// `run(job)`, with `job` deferred if it is dropped unfinished.
    fn requeued<F, Fut>(
        self: &Arc<Self>,
        job: J,
        run: F,
    ) -> impl Future<Output = ()> + use<J, F, Fut>
    where
        F: FnOnce(J) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let requeue = Requeue {
            background: Arc::clone(self),
            job: Some(job.clone()),
        };
        async move {
            run(job).await;
            requeue.finished();
        }
    }

    /// Cleanup jobs that could not run, for the caller to run now.
    pub(crate) fn take_deferred(&self) -> Vec<J> {
        if !self.has_deferred.swap(false, Ordering::SeqCst) {
            return Vec::new();
        }
        std::mem::take(&mut *self.lock_deferred())
    }

    /// Until no counted work is running, or `limit` has passed; true when
    /// everything finished.
    pub(crate) async fn settle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Register before checking, so work ending in between is seen.
            idle.as_mut().enable();
            if self.running.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.running.load(Ordering::SeqCst) == 0;
            }
        }
    }

    #[cfg(test)]
    fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_dropped_by_a_runtime_shutdown_is_not_waited_for() {
        let background: Arc<Background<u32>> = Arc::default();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            background.spawn(std::future::pending());
            background.spawn_job(7, |_| std::future::pending());
        });
        assert_eq!(background.running(), 2);
        drop(runtime);
        assert_eq!(
            background.running(),
            0,
            "tickets are dropped with the tasks"
        );
        let next = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        assert!(next.block_on(background.settle(Duration::from_millis(10))));
        assert_eq!(background.take_deferred(), vec![7], "the job is kept");
        assert!(background.take_deferred().is_empty());
    }

    #[tokio::test]
    async fn settle_waits_for_work_and_gives_up_at_its_limit() {
        let background: Arc<Background<u32>> = Arc::default();
        background.spawn(tokio::time::sleep(Duration::from_millis(30)));
        let started = Instant::now();
        assert!(background.settle(Duration::from_secs(5)).await);
        assert!(started.elapsed() >= Duration::from_millis(25));

        let _stuck = background.ticket();
        let started = Instant::now();
        assert!(!background.settle(Duration::from_millis(50)).await);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn jobs_without_a_runtime_are_deferred() {
        let background: Arc<Background<u32>> = Arc::default();
        background.spawn_job(3, |_| async {});
        assert_eq!(background.running(), 0);
        assert_eq!(background.take_deferred(), vec![3]);
    }
}
