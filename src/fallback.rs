//! Running the work anyway when the lock service is down:
//! [`Request::run_or_fallback`](crate::Request::run_or_fallback).
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

use crate::error::Error;
use crate::telemetry;

/// Which of the two ran in
/// [`run_or_fallback`](crate::Request::run_or_fallback), and what it
/// returned.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::Ran;
///
/// let ran = manager
///     .lock("stock:42")
///     .run_or_fallback(|_lease| async { "locked" }, || async { "fallback" })
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

/// Runs `fallback` because the lock could not be taken for `cause` (the
/// service was unavailable), and says so.
pub(crate) async fn run<F, Fut, T>(fallback: F, cause: Error) -> Ran<T>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    tracing::warn!(error = %cause, "lock service unavailable: running the fallback");
    telemetry::fallback_ran(&cause);
    let value = fallback().await;
    Ran::Fallback { value, cause }
}
