//! Locks on several resources at once: all of them or none.
//!
//! [`LockManager::lock_many`] (and its `try_`, TTL, waiting and scoped
//! variants) takes every resource in a list as one lock. On each node one
//! script checks that no resource is held (and, for a waiter, that no one
//! is queued ahead of it on any of them) and then sets every key, or sets
//! none: a node never grants part of the list. The quorum rule, validity,
//! rollback of failed attempts on every node, extension, release,
//! keep-alive and the loss signal are those of a single lock, since a
//! node's answer is still one yes or no.
//!
//! - **No lock-order deadlock.** The list is sorted and taken in one step,
//!   so two clients asking for `[a, b]` and `[b, a]` ask for the same thing;
//!   one wins, or both lose and retry after a random pause, as two clients
//!   of one resource do. A waiter ([`lock_many_within`](LockManager::lock_many_within))
//!   takes its turn resource by resource in the sorted order, with one
//!   ticket: it is queued up to the first resource it is blocked on (held,
//!   or another waiter ahead), reserving the free ones before it, and on
//!   none after it. So a holder of `a` that waits for a free `b` is never
//!   held back by a waiter for `[a, b]` (which cannot use `b` before `a`
//!   is released), and the waiter keeps its place on the resource it
//!   waits for, so a stream of lockers of one of its resources cannot
//!   starve it. Every wait points at a later resource in the order, an
//!   earlier ticket on the same resource, or a holder: waiters cannot
//!   block each other in a cycle, as long as holders that wait for more
//!   take them in the same order (as with any mutex): a holder of `b`
//!   that waits for `a` stays behind a waiter for `[a, b]` queued on `a`
//!   until one of the two waits times out.
//! - **Same keys as single locks.** A multi-resource lock on `[a, b]` and a
//!   [`lock`](LockManager::lock) (or read lock) on `a` exclude each other:
//!   both use `a`'s lock key.
//! - **One fencing token, valid for each resource.** The token is above
//!   every earlier token of every resource in the list (in counter-node
//!   mode the counter node raises each counter to one above the highest;
//!   in quorum mode the client takes one above the highest counter any
//!   resource has on a quorum, and stores it for each), so each resource's
//!   tokens still strictly increase from holder to holder, and storage
//!   checks it per resource as usual. Counters may jump (a resource's
//!   tokens follow the busiest resource it was locked with); only the
//!   order matters.
//!
//! At most [`MAX_RESOURCES`](crate::MAX_RESOURCES) resources per lock; a
//! name given twice, an empty name or an empty list is
//! [`Error::InvalidArgument`](crate::Error::InvalidArgument).

use std::future::Future;
use std::time::Duration;

use crate::error::Result;
use crate::keys::Keys;
use crate::lock::Lock;
use crate::manager::{LockManager, Tries};
use crate::watchdog::Lease;

impl LockManager {
    /// Acquires every one of `resources` as one lock, with the default TTL,
    /// making up to the configured number of attempts. The order of the
    /// list does not matter; see [`crate::many`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// // Moving money between two accounts: both or neither.
    /// let lock = manager.lock_many(&["account:7", "account:3"]).await?;
    /// assert_eq!(lock.resources().collect::<Vec<_>>(), ["account:3", "account:7"]);
    /// // Either account alone is taken now.
    /// assert!(manager.try_lock("account:3").await.is_err());
    /// lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use quorumlock::Error;
    ///
    /// // Both accounts or neither; the order of the list does not matter.
    /// let both = manager.lock_many(&["account:1", "account:2"]).await?;
    /// assert_eq!(both.resources().count(), 2);
    /// assert!(matches!(manager.try_lock("account:2").await, Err(Error::Contended { .. })));
    /// both.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock`](Self::lock): a dropped call acquires nothing, and
    /// whatever its attempt in flight set is deleted in the background
    /// (counted by [`settle`](Self::settle), bounded by `node_timeout`).
    pub async fn lock_many<S: AsRef<str>>(&self, resources: &[S]) -> Result<Lock> {
        let config = &self.core.config;
        self.acquire(Keys::exclusive_many(resources), config.ttl, Tries::Retrying)
            .await
    }

    /// As [`lock_many`](Self::lock_many), for `ttl`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let lock = manager.lock_many_with_ttl(&["account:1", "account:2"], Duration::from_secs(5)).await?;
    /// assert_eq!(lock.ttl(), Duration::from_secs(5));
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock`](Self::lock).
    pub async fn lock_many_with_ttl<S: AsRef<str>>(
        &self,
        resources: &[S],
        ttl: Duration,
    ) -> Result<Lock> {
        self.acquire(Keys::exclusive_many(resources), ttl, Tries::Retrying)
            .await
    }

    /// One attempt at every one of `resources`, with the default TTL, no
    /// retry.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use quorumlock::Error;
    ///
    /// let one = manager.lock("seat:12").await?;
    /// // All or none: one of the two is held, so neither is taken.
    /// assert!(matches!(manager.try_lock_many(&["seat:11", "seat:12"]).await, Err(Error::Contended { .. })));
    /// manager.try_lock("seat:11").await?.release().await?; // left free
    /// one.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock`](Self::lock).
    pub async fn try_lock_many<S: AsRef<str>>(&self, resources: &[S]) -> Result<Lock> {
        let ttl = self.core.config.ttl;
        self.acquire(Keys::exclusive_many(resources), ttl, Tries::Once)
            .await
    }

    /// Acquires every one of `resources` with the default TTL, waiting up
    /// to `wait` while any of them is held: queued on each resource, woken
    /// by releases, served in arrival order, as
    /// [`lock_within`](Self::lock_within) is for one resource.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let held = manager.lock("seat:2").await?;
    /// let waiting = tokio::spawn({
    ///     let manager = manager.clone();
    ///     async move { manager.lock_many_within(&["seat:1", "seat:2"], Duration::from_secs(10)).await }
    /// });
    /// tokio::time::sleep(Duration::from_millis(50)).await;
    /// held.release().await?; // the waiter gets both
    /// waiting.await.expect("no panic")?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock_within`](Self::lock_within): a dropped call acquires
    /// nothing, and its queue entries on every resource are removed in the
    /// background.
    pub async fn lock_many_within<S: AsRef<str>>(
        &self,
        resources: &[S],
        wait: Duration,
    ) -> Result<Lock> {
        let ttl = self.core.config.ttl;
        self.wait_for(Keys::exclusive_many(resources), ttl, wait)
            .await
    }

    /// As [`lock_many_within`](Self::lock_many_within), for `ttl`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let lock = manager
    ///     .lock_many_within_with_ttl(&["account:1", "account:2"], Duration::from_secs(5), Duration::from_secs(2))
    ///     .await?;
    /// assert_eq!(lock.resources().count(), 2);
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock_within`](Self::lock_within).
    pub async fn lock_many_within_with_ttl<S: AsRef<str>>(
        &self,
        resources: &[S],
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock> {
        self.wait_for(Keys::exclusive_many(resources), ttl, wait)
            .await
    }

    /// As [`with_lock`](Self::with_lock), holding every one of `resources`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let moved = manager
    ///     .with_lock_many(&["account:1", "account:2"], |lease| async move {
    ///         // One token, valid for both; `lease.fence_for("account:1")` fences writes.
    ///         lease.fence_for("account:1").is_ok()
    ///     })
    ///     .await?;
    /// assert!(moved);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`with_lock`](Self::with_lock).
    pub async fn with_lock_many<S, F, Fut, T>(&self, resources: &[S], work: F) -> Result<T>
    where
        S: AsRef<str>,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.with_acquired(self.lock_many(resources), work).await
    }
}
