//! Running the work anyway when the lock service is down:
//! [`LockManager::with_lock_or_fallback`].
//!
//! The fallback runs only when acquiring failed because the service could
//! not decide ([`Error::is_unavailable`]: no quorum, counter node down, a
//! quorum too slow, the circuit breaker open), after the
//! [`Backoff`](crate::Backoff) retries, never when the resource is merely
//! held by someone else, and never once `work` has started. The fallback is
//! no second lock: it must bring its own exclusion, such as a database
//! transaction that locks the row it changes (`SELECT … FOR UPDATE`). What
//! that gives, and what it does not, is in docs/guide.md ("When Redis
//! is down").

use std::future::Future;

use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::manager::LockManager;
use crate::telemetry;
use crate::watchdog::Lease;

/// Which of the two ran in
/// [`with_lock_or_fallback`](LockManager::with_lock_or_fallback), and what
/// it returned.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::Ran;
///
/// let ran = manager
///     .with_lock_or_fallback("stock:42", |_lease| async { "locked" }, || async { "fallback" })
///     .await?;
/// match ran {
///     Ran::Locked(value) => assert_eq!(value, "locked"),
///     Ran::Fallback { value, cause } => println!("{value}: the lock service was down ({cause})"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use]
pub enum Ran<T> {
    /// The lock was acquired and kept alive while `work` ran.
    Locked(T),
    /// The lock service was unavailable: `fallback` ran instead, and
    /// `cause` is the acquisition's error.
    Fallback {
        /// What the fallback returned.
        value: T,
        /// Why the lock could not be taken.
        cause: Error,
    },
}

impl<T> Ran<T> {
    /// What ran returned, whichever it was.
    ///
    /// ```
    /// use quorumlock::Ran;
    ///
    /// let ran: Ran<u32> = Ran::Locked(3);
    /// assert_eq!(ran.into_value(), 3);
    /// ```
    pub fn into_value(self) -> T {
        match self {
            Ran::Locked(value) | Ran::Fallback { value, .. } => value,
        }
    }

    /// Whether the fallback ran.
    ///
    /// ```
    /// use quorumlock::{Error, Ran};
    ///
    /// let ran = Ran::Fallback {
    ///     value: 3,
    ///     cause: Error::NoRuntime,
    /// };
    /// assert!(ran.is_fallback());
    /// ```
    pub fn is_fallback(&self) -> bool {
        matches!(self, Ran::Fallback { .. })
    }
}

impl LockManager {
    /// Runs `work` under the lock on `resource`, kept alive, as
    /// [`with_lock`](Self::with_lock) does; or, when the lock service is
    /// unavailable, runs `fallback` instead, and says which ran.
    ///
    /// The lock is taken as [`lock`](Self::lock) takes it: a held resource
    /// is tried again per the `retry` setting, unavailability per the
    /// `unavailable_retry` backoff. Then:
    /// - acquired: `work` runs; the result is [`Ran::Locked`], or
    ///   [`Error::Lost`] if the lock was lost meanwhile (the fallback does
    ///   not run then: `work` may have done part of its job);
    /// - the service was unavailable ([`Error::is_unavailable`]):
    ///   `fallback` runs, and the result is [`Ran::Fallback`] with the
    ///   cause; counted by the metric `quorumlock_fallback_total`;
    /// - any other error (the resource is held: [`Error::Contended`]; a
    ///   bad argument) is returned, and neither runs.
    ///
    /// The fallback gives none of the lock's exclusion: make it safe on
    /// its own (see the [module docs](crate::fallback) and docs/guide.md).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// use quorumlock::{Backoff, LockManager, Ran};
    ///
    /// let manager = LockManager::builder()
    ///     .nodes(cluster.urls())
    /// #   .node_timeout(std::time::Duration::from_millis(500))
    ///     .unavailable_retry(Backoff::none())
    ///     .build()?;
    /// let sell = || {
    ///     manager.with_lock_or_fallback(
    ///         "invoice:7",
    ///         |lease| async move { format!("locked, token {:?}", lease.token()) },
    ///         || async { "fallback: row lock in the database".to_owned() },
    ///     )
    /// };
    /// assert!(matches!(sell().await?, Ran::Locked(_)));
    ///
    /// // The lock service goes away: the fallback runs, and says why.
    /// for node in 0..3 {
    ///     cluster.kill(node)?;
    /// }
    /// match sell().await? {
    ///     Ran::Fallback { value, cause } => {
    ///         assert!(cause.is_unavailable());
    ///         assert_eq!(value, "fallback: row lock in the database");
    ///     }
    ///     Ran::Locked(_) => unreachable!("no node is up"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`with_lock`](Self::with_lock) while acquiring or running
    /// `work`; while `fallback` runs, dropping the call drops the
    /// fallback's future, and nothing of the lock service is left behind.
    pub async fn with_lock_or_fallback<W, WorkFut, F, FallbackFut, T>(
        &self,
        resource: &str,
        work: W,
        fallback: F,
    ) -> Result<Ran<T>>
    where
        W: FnOnce(Lease) -> WorkFut,
        WorkFut: Future<Output = T>,
        F: FnOnce() -> FallbackFut,
        FallbackFut: Future<Output = T>,
    {
        self.with_acquired_or_fallback(self.lock(resource), work, fallback)
            .await
    }

    /// As [`with_lock_or_fallback`](Self::with_lock_or_fallback), but a
    /// held resource is waited for as [`lock_within`](Self::lock_within)
    /// waits, up to `wait` ([`Error::WaitTimedOut`] after it, and neither
    /// runs).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let ran = manager
    ///     .with_lock_within_or_fallback(
    ///         "stock:42",
    ///         Duration::from_secs(5),
    ///         |lease| async move { lease.token().map(|t| t.get()) },
    ///         || async { None },
    ///     )
    ///     .await?;
    /// assert!(!ran.is_fallback() && ran.into_value().is_some());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`with_lock_or_fallback`](Self::with_lock_or_fallback), and
    /// while waiting as for [`lock_within`](Self::lock_within).
    pub async fn with_lock_within_or_fallback<W, WorkFut, F, FallbackFut, T>(
        &self,
        resource: &str,
        wait: std::time::Duration,
        work: W,
        fallback: F,
    ) -> Result<Ran<T>>
    where
        W: FnOnce(Lease) -> WorkFut,
        WorkFut: Future<Output = T>,
        F: FnOnce() -> FallbackFut,
        FallbackFut: Future<Output = T>,
    {
        self.with_acquired_or_fallback(self.lock_within(resource, wait), work, fallback)
            .await
    }

    async fn with_acquired_or_fallback<W, WorkFut, F, FallbackFut, T>(
        &self,
        acquiring: impl Future<Output = Result<Lock>>,
        work: W,
        fallback: F,
    ) -> Result<Ran<T>>
    where
        W: FnOnce(Lease) -> WorkFut,
        WorkFut: Future<Output = T>,
        F: FnOnce() -> FallbackFut,
        FallbackFut: Future<Output = T>,
    {
        match acquiring.await {
            Ok(lock) => self
                .with_acquired(std::future::ready(Ok(lock)), work)
                .await
                .map(Ran::Locked),
            Err(cause) if cause.is_unavailable() => {
                tracing::warn!(error = %cause, "lock service unavailable: running the fallback");
                telemetry::fallback_ran(&cause);
                let value = fallback().await;
                Ok(Ran::Fallback { value, cause })
            }
            Err(other) => Err(other),
        }
    }
}
