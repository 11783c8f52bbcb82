//! Read-write locks: any number of readers, or one writer.
//!
//! [`LockManager::read`] takes a read lock; a write lock is an ordinary
//! exclusive lock ([`LockManager::write`] is [`lock`](LockManager::lock)
//! under another name). On each node:
//!
//! - A reader is granted only when no writer holds the resource (and no
//!   writer waits, see below). Each reader is its own entry, with its own
//!   expiry, in a sorted set at the resource's lock key; extension,
//!   release, keep-alive and loss work per reader, exactly as for a single
//!   lock, and entries that expired are removed by the next script that
//!   reads the set (the key itself expires with its last reader).
//! - A writer is granted only when the key is absent: no writer and no
//!   live reader. A plain `SET NX` fails on the readers' set, so
//!   [`lock`](LockManager::lock), multi-resource locks and write locks all
//!   exclude readers without a word of change.
//!
//! **Why a quorum of readers and a quorum of writers exclude each other.**
//! A reader holds its lock only while a majority of nodes (`N / 2 + 1`)
//! keep its entry, and a writer only while a majority keep its key. Two
//! majorities of the same `N` nodes share at least one node (together
//! they count more than `N`), and on that node the reader's entry and the
//! writer's key cannot both be live: whichever came second was refused.
//! So no writer overlaps a valid reader, under the same conditions as
//! Redlock's exclusion (persistence, clocks within `drift_factor`). Two
//! readers need no such argument: they may share.
//!
//! **Writers do not starve.** A writer that waits
//! ([`write_within`](LockManager::write_within), or any waiting exclusive
//! lock on the resource) is queued on the nodes, and while a live writer
//! is queued, every new reader is refused there, whether it waits or not
//! (a waiting reader is let in only if it is queued ahead of every waiting
//! writer). So the readers in place drain, and the writer goes next. A
//! writer that dies while waiting holds readers back for at most its queue
//! lease (one TTL): its entry is then dropped by the next script that
//! reads the queue. A writer that does not wait
//! ([`write`](LockManager::write), [`try_write`](LockManager::try_write))
//! is not queued and can be outpaced by a stream of readers: writers that
//! must not starve wait.
//!
//! **Tokens.** A writer's token, as any exclusive lock's, is strictly
//! larger than every earlier writer's. A reader's token is the fencing
//! counter as it stands: at least the token of every write lock granted
//! before it. In counter-node mode it is also below the token of every
//! write lock granted after it, so data that carries a token above the
//! read lock's was written after the read lock ended: a reader that
//! paused past its lock can tell (see `examples/read_write.rs`). Counters
//! also rise for write attempts that then failed, so data may carry a
//! smaller token than the read lock's without any write missing; compare
//! with "at most", not "equal". In quorum mode a failed writer may have
//! raised the counter on a minority of nodes only, and a later writer can
//! then get a token no larger than a reader's: there, a reader's token
//! orders it after earlier writers only. A reader's token is for
//! comparing, never for writing: a fenced store accepts tokens as high as
//! the last one it saw, so a write made under a read lock would pass.
//!
//! **Upgrading.** Clients from before read locks do not list their waiting
//! writers for readers to see, and their release and extension scripts
//! fail (with a Redis type error, never touching the readers) on a
//! read-locked key: upgrade every client of a resource before any of them
//! takes read locks on it.
//!
//! **No counting semaphores.** A semaphore with `k > 1` permits per node
//! does not carry over to a quorum: with 5 nodes and 3 permits each, five
//! clients can each be granted by a different majority (every node grants
//! three of them), so five hold a "3-permit" semaphore at once. Without a
//! design proven safe, none is offered; a read-write lock is the sharing
//! this crate can promise.

use std::future::Future;
use std::time::Duration;

use crate::error::Result;
use crate::keys::Keys;
use crate::lock::Lock;
use crate::manager::{LockManager, Tries};
use crate::watchdog::Lease;

impl LockManager {
    /// Acquires a read lock on `resource` with the default TTL, making up
    /// to the configured number of attempts: granted while no writer holds
    /// or waits for the resource, shared with any number of other readers.
    /// See [`crate::read_write`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let writer = manager.write("catalog").await?;
    /// let written_with = writer.token().expect("fencing is on by default");
    /// writer.release().await?;
    ///
    /// let first = manager.read("catalog").await?;
    /// let second = manager.read("catalog").await?; // readers share
    /// // No write attempt failed since: the reader's token is the writer's.
    /// assert_eq!(first.token(), Some(written_with));
    /// // No writer while they read.
    /// assert!(manager.try_write("catalog").await.is_err());
    /// first.release().await?;
    /// second.release().await?;
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
    /// let first = manager.read("catalog").await?;
    /// let second = manager.read("catalog").await?; // readers share
    /// assert!(matches!(manager.try_write("catalog").await, Err(Error::Contended { .. })));
    /// first.release().await?;
    /// second.release().await?;
    /// manager.try_write("catalog").await?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock`](Self::lock): a dropped call acquires nothing, and
    /// the reader entries its attempt in flight may have added are removed
    /// in the background (counted by [`settle`](Self::settle), bounded by
    /// `node_timeout`).
    pub async fn read(&self, resource: &str) -> Result<Lock> {
        let config = &self.core.config;
        self.acquire(Keys::shared(resource), config.ttl, Tries::Retrying)
            .await
    }

    /// As [`read_within`](Self::read_within), for `ttl`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let reader = manager.read_within_with_ttl("catalog", Duration::from_secs(30), Duration::from_secs(5)).await?;
    /// assert_eq!(reader.ttl(), Duration::from_secs(30));
    /// # reader.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock_within`](Self::lock_within).
    pub async fn read_within_with_ttl(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock> {
        self.wait_for(Keys::shared(resource), ttl, wait).await
    }

    /// As [`read`](Self::read), for `ttl`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let a = manager.read_with_ttl("catalog", Duration::from_secs(30)).await?;
    /// let b = manager.read_with_ttl("catalog", Duration::from_secs(30)).await?; // readers share
    /// assert!(a.is_valid() && b.is_valid());
    /// # a.release().await?;
    /// # b.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`read`](Self::read).
    pub async fn read_with_ttl(&self, resource: &str, ttl: Duration) -> Result<Lock> {
        self.acquire(Keys::shared(resource), ttl, Tries::Retrying)
            .await
    }

    /// One attempt at a read lock on `resource`, with the default TTL, no
    /// retry.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use quorumlock::Error;
    ///
    /// let writer = manager.write("catalog").await?;
    /// assert!(matches!(manager.try_read("catalog").await, Err(Error::Contended { .. })));
    /// writer.release().await?;
    /// manager.try_read("catalog").await?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`read`](Self::read).
    pub async fn try_read(&self, resource: &str) -> Result<Lock> {
        let ttl = self.core.config.ttl;
        self.acquire(Keys::shared(resource), ttl, Tries::Once).await
    }

    /// Acquires a read lock on `resource` with the default TTL, waiting up
    /// to `wait` while a writer holds it or is queued ahead: queued, woken
    /// by releases (a writer's release wakes the readers queued behind it
    /// together), as [`lock_within`](Self::lock_within) is for a lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let writer = manager.write("catalog").await?;
    /// let reader = tokio::spawn({
    ///     let manager = manager.clone();
    ///     async move { manager.read_within("catalog", Duration::from_secs(10)).await }
    /// });
    /// tokio::time::sleep(Duration::from_millis(50)).await;
    /// writer.release().await?; // wakes the reader
    /// reader.await.expect("no panic")?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock_within`](Self::lock_within).
    pub async fn read_within(&self, resource: &str, wait: Duration) -> Result<Lock> {
        let ttl = self.core.config.ttl;
        self.wait_for(Keys::shared(resource), ttl, wait).await
    }

    /// As [`with_lock`](Self::with_lock), holding a read lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let version = manager
    ///     .with_read_lock("catalog", |_lease| async { "v1" })
    ///     .await?;
    /// assert_eq!(version, "v1");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`with_lock`](Self::with_lock).
    pub async fn with_read_lock<F, Fut, T>(&self, resource: &str, work: F) -> Result<T>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.with_acquired(self.read(resource), work).await
    }

    /// Acquires the write lock on `resource`: the same as
    /// [`lock`](Self::lock) (every exclusive lock is a write lock), named
    /// for code that also reads. Not queued, so a stream of readers can
    /// outpace it; use [`write_within`](Self::write_within) for a writer
    /// that must not starve.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use quorumlock::Error;
    ///
    /// let writer = manager.write("catalog").await?;
    /// assert!(matches!(manager.try_read("catalog").await, Err(Error::Contended { .. })));
    /// writer.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock`](Self::lock).
    pub async fn write(&self, resource: &str) -> Result<Lock> {
        self.lock(resource).await
    }

    /// One attempt at the write lock on `resource`: the same as
    /// [`try_lock`](Self::try_lock).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let reader = manager.read("catalog").await?;
    /// assert!(manager.try_write("catalog").await.is_err(), "a reader holds it");
    /// reader.release().await?;
    /// manager.try_write("catalog").await?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock`](Self::lock).
    pub async fn try_write(&self, resource: &str) -> Result<Lock> {
        self.try_lock(resource).await
    }

    /// Acquires the write lock on `resource`, waiting up to `wait`: the
    /// same as [`lock_within`](Self::lock_within). While it waits, no new
    /// reader is let in, so readers cannot starve it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let reader = manager.read("catalog").await?;
    /// let writer = tokio::spawn({
    ///     let manager = manager.clone();
    ///     async move { manager.write_within("catalog", Duration::from_secs(10)).await }
    /// });
    /// tokio::time::sleep(Duration::from_millis(50)).await;
    /// reader.release().await?; // the last reader's release wakes the writer
    /// writer.await.expect("no panic")?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`lock_within`](Self::lock_within).
    pub async fn write_within(&self, resource: &str, wait: Duration) -> Result<Lock> {
        self.lock_within(resource, wait).await
    }
}
