//! [`Lock<K>`](Lock): a lock held on a quorum of nodes, typed by its
//! [kind](crate::kind), with its validity, extension and release.
//!
//! A lock is only as good as its validity: after [`Lock::valid_until`] the
//! holder must assume someone else may hold the resource. Dropping a lock
//! that was not released releases it in the background.

use std::marker::PhantomData;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;
use crate::fencing::FencingToken;
use crate::held::Held;
use crate::kind::{Exclusive, Kind, Many, Read};
use crate::storage::Fence;

/// A lock held on a quorum of nodes: exclusive ([`Lock`], the default),
/// a read lock ([`Lock<Read>`](crate::kind::Read)) or a lock on several
/// resources ([`Lock<Many>`](crate::kind::Many)). What the kinds share is
/// here; what differs (a resource or several, a fence or a writer's
/// token) exists only on the kind it makes sense for.
///
/// Release it with [`release`](Self::release) to learn whether it was
/// still held. If it is dropped unreleased, its keys are deleted in the
/// background (compare-and-delete, so never another holder's), counted by
/// [`LockManager::settle`](crate::LockManager::settle); dropped outside a
/// tokio runtime, or by a runtime shutting down, the delete runs on the
/// manager's next `settle()` or acquisition, or the keys expire after the
/// TTL, whichever comes first.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::Error;
///
/// let lock = manager.lock("invoice:7").await?;
/// // Work only while it is valid, and pass its fence with every write: a
/// // write that comes too late (a pause after this check) is refused by
/// // the storage once a newer holder has written.
/// if lock.is_valid() {
///     let _fence = lock.fence()?;
///     // ... write the invoice ...
/// }
/// match lock.release().await {
///     Ok(()) => {}
///     // The TTL ran out first: the work may not have been exclusive.
///     Err(Error::NotHeld { reason, .. }) => eprintln!("not held at release: {reason}"),
///     Err(other) => return Err(other),
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "a lock is released when dropped: keep it while the work runs"]
pub struct Lock<K: Kind = Exclusive> {
    held: Held,
    kind: PhantomData<fn() -> K>,
}

impl<K: Kind> std::fmt::Debug for Lock<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("kind", &std::any::type_name::<K>())
            .field("held", &self.held)
            .finish()
    }
}

impl<K: Kind> Lock<K> {
    pub(crate) fn new(held: Held) -> Self {
        Self {
            held,
            kind: PhantomData,
        }
    }

    /// The value that marks this holder's keys on the nodes: random, then
    /// the holder's description if it gave one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let a = manager.lock("a").await?;
    /// let b = manager.lock("b").await?;
    /// assert_ne!(a.value(), b.value(), "each acquisition marks its keys with its own value");
    /// # a.release().await?;
    /// # b.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn value(&self) -> &str {
        self.held.value()
    }

    /// The description this lock was taken with
    /// ([`Request::holder`](crate::Request::holder)), stored with it on
    /// the nodes.
    pub fn holder(&self) -> Option<&str> {
        crate::holding::description_of(self.value())
    }

    /// The TTL of the last successful acquisition or extension.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let mut lock = manager.lock("job").ttl(Duration::from_secs(5)).await?;
    /// assert_eq!(lock.ttl(), Duration::from_secs(5));
    /// lock.extend(Duration::from_secs(20)).await?;
    /// assert_eq!(lock.ttl(), Duration::from_secs(20));
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn ttl(&self) -> Duration {
        self.held.ttl()
    }

    /// When the first request of the winning attempt was sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let before = tokio::time::Instant::now();
    /// let lock = manager.lock("job").await?;
    /// assert!(before <= lock.acquired_at());
    /// assert!(lock.acquired_at() < lock.valid_until());
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquired_at(&self) -> Instant {
        self.held.acquired_at()
    }

    /// Start of the last successful acquisition or extension.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let mut lock = manager.lock("job").await?;
    /// assert_eq!(lock.last_extended(), lock.acquired_at());
    /// lock.extend(Duration::from_secs(10)).await?;
    /// assert!(lock.last_extended() > lock.acquired_at());
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn last_extended(&self) -> Instant {
        self.held.last_extended()
    }

    /// The end of the validity (monotonic clock): the holder may rely on
    /// the lock strictly before this instant, and not after. A suspended
    /// host or VM does not advance the monotonic clock while the nodes'
    /// keys keep expiring, so the validity is also kept on the boot clock
    /// (Linux `CLOCK_BOOTTIME`, which counts suspend): after a resume this
    /// instant moves earlier by the time spent suspended, and
    /// [`is_valid`](Self::is_valid) turns false if the keys may have
    /// expired meanwhile.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock("job").await?;
    /// // Validity is the TTL less the round trip and the clock-drift allowance.
    /// assert!(lock.valid_until() < lock.acquired_at() + lock.ttl());
    /// // Do the work only while `Instant::now() < lock.valid_until()`.
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn valid_until(&self) -> Instant {
        self.held.valid_until()
    }

    /// Validity left now; zero once expired or lost.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let lock = manager.lock("job").await?;
    /// let left = lock.remaining();
    /// assert!(left > Duration::ZERO && left < lock.ttl());
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn remaining(&self) -> Duration {
        self.held.remaining()
    }

    /// Whether the lock may still be relied on now.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let lock = manager.lock("job").ttl(Duration::from_secs(1)).await?;
    /// assert!(lock.is_valid());
    /// tokio::time::sleep(lock.remaining()).await;
    /// assert!(!lock.is_valid(), "expired: another client may hold it now");
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_valid(&self) -> bool {
        self.held.is_valid()
    }

    /// Resets the lock to live at least `ttl` from now, on a quorum of
    /// nodes, with validity computed from this call's start as for an
    /// acquisition. A node never shortens the key (an extension that
    /// arrives late, after a longer one, must not cut it), so a shorter
    /// TTL lowers the validity, not the keys' expiry.
    ///
    /// Refused with [`Error::NotHeld`](crate::Error::NotHeld) once the
    /// validity has run out (the resource may already be someone else's)
    /// or when the nodes no longer hold our value. On other errors the
    /// lock keeps its current validity, or less: never more than the new
    /// TTL allows, since some nodes may have applied it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let mut lock = manager.lock("upload:9").ttl(Duration::from_secs(2)).await?;
    /// lock.extend(Duration::from_secs(30)).await?;
    /// assert!(lock.remaining() > Duration::from_secs(2));
    /// lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Before the first request goes out, the validity is lowered to what
    /// the new TTL guarantees (`ttl − drift` from now) if that is shorter,
    /// and it is raised only when a quorum confirmed the extension. So if
    /// the future is dropped at any await, the lock claims no more than the
    /// shorter of its old validity and the new TTL's, which every node that
    /// applied either TTL keeps; requests already sent still apply on their
    /// nodes, unsent ones are never sent.
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.held.extend(ttl).await
    }

    /// Deletes this lock's keys (compare-and-delete) on every node. Returns
    /// once a quorum has answered; the other nodes finish in the background,
    /// and a node that fails the delete, before the quorum answered or
    /// after, is tried again (up to 30 s, at most a second apart), so a
    /// node that comes back with the key (replayed from its AOF) loses it.
    ///
    /// `Ok` means a quorum deleted our keys while the lock was still valid.
    /// [`Error::NotHeld`](crate::Error::NotHeld) means it had expired or
    /// been lost before: the work done under it may not have been
    /// exclusive. Another holder's keys are never deleted.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock("report").await?;
    /// lock.release().await?;
    /// // Free again at once, for anyone.
    /// manager.lock("report").no_wait().await?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// The lock is consumed either way: if the future is dropped before the
    /// outcome is known, the lock is released in the background as if it
    /// had been dropped (counted by
    /// [`LockManager::settle`](crate::LockManager::settle)), and deletes
    /// already sent still run.
    ///
    /// Release consumes the lock, so a released lock cannot be used,
    /// extended or released again:
    ///
    /// ```compile_fail
    /// # async fn demo(mut lock: quorumlock::Lock) {
    /// lock.release().await.ok();
    /// lock.extend(std::time::Duration::from_secs(1)).await; // `lock` was moved
    /// # }
    /// ```
    pub async fn release(self) -> Result<()> {
        self.held.release().await
    }

    /// As [`release`](Self::release), but a lock taken
    /// [`at_least`](crate::Request::at_least) is freed at once too: for
    /// when the work it was taken for never started (the command could not
    /// be run, say), so that another host may do it this interval.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let lock = manager.lock("hourly").no_wait().at_least(Duration::from_secs(3300)).await?;
    /// // ... the job cannot start ...
    /// lock.release_at_once().await?;
    /// manager.lock("hourly").no_wait().await?.release().await?; // free for another host
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`release`](Self::release): a dropped call still releases,
    /// in the background, and at once too.
    pub async fn release_at_once(self) -> Result<()> {
        self.held.release_at_once().await
    }

    pub(crate) fn into_held(self) -> Held {
        self.held
    }
}

impl Lock<Exclusive> {
    /// The resource this lock protects. Errors name the lock the same way.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock("report:2026").await?;
    /// assert_eq!(lock.resource(), "report:2026");
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn resource(&self) -> &str {
        self.held.resource()
    }

    /// The fencing token of this acquisition, `None` when fencing is off
    /// ([`Fencing::Off`](crate::Fencing::Off)). Pass it with every write
    /// to the protected storage, which must reject tokens lower than the
    /// highest it has seen. Extending keeps it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let first = manager.lock("ledger").await?;
    /// let earlier = first.token().expect("fencing is on by default");
    /// first.release().await?;
    /// let next = manager.lock("ledger").await?;
    /// assert!(next.token().expect("fenced") > earlier, "each holder's token is above the last");
    /// # next.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn token(&self) -> Option<FencingToken> {
        self.held.token()
    }

    /// What a write to [`FencedRedis`](crate::FencedRedis) under this lock
    /// carries: its resource and token together. Refused
    /// ([`Error::InvalidArgument`](crate::Error::InvalidArgument)) only
    /// for a lock without a token (`Fencing::Off`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock("cart:9").await?;
    /// let fence = lock.fence()?;
    /// assert_eq!((fence.resource(), Some(fence.token())), ("cart:9", lock.token()));
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence(&self) -> Result<Fence> {
        self.held.fence()
    }
}

impl Lock<Read> {
    /// The resource this read lock shares.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let reader = manager.read("doc:1").await?;
    /// assert_eq!(reader.resource(), "doc:1");
    /// # reader.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn resource(&self) -> &str {
        self.held.resource()
    }

    /// The fencing counter as it stood when this read lock was granted: at
    /// least the token of every write lock granted before it, and below
    /// every later one's (see [`crate::read_write`]); before any writer
    /// (or where a node lost the counter with its data), the node's clock
    /// in microseconds, which no writer's token before reached. `None`
    /// when fencing is off. It is for
    /// comparing with the tokens of data read, **never for writes**
    /// (storage would accept it, being as high as the last writer's), so
    /// a read lock has no `fence()`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let writer = manager.lock("doc:1").await?;
    /// let written = writer.token().expect("fenced");
    /// writer.release().await?;
    /// let reader = manager.read("doc:1").await?;
    /// assert!(reader.writer_token().expect("fenced") >= written);
    /// # reader.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn writer_token(&self) -> Option<FencingToken> {
        self.held.token()
    }
}

impl Lock<Many> {
    /// Every resource this lock protects, sorted by name.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock_many(["to:2", "from:1"]).await?;
    /// assert_eq!(lock.resources().collect::<Vec<_>>(), ["from:1", "to:2"]);
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn resources(&self) -> impl ExactSizeIterator<Item = &str> {
        self.held.resources()
    }

    /// The one fencing token of this acquisition, valid for each resource:
    /// it is above every earlier token of each (every resource's counter
    /// moves up to it); `None` when fencing is off.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let one = manager.lock("to:2").await?;
    /// let earlier = one.token().expect("fenced");
    /// one.release().await?;
    /// let both = manager.lock_many(["from:1", "to:2"]).await?;
    /// assert!(both.token().expect("fenced") > earlier);
    /// # both.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn token(&self) -> Option<FencingToken> {
        self.held.token()
    }

    /// What a write to [`FencedRedis`](crate::FencedRedis) of `resource`,
    /// one of this lock's, carries. Refused
    /// ([`Error::InvalidArgument`](crate::Error::InvalidArgument)) for a
    /// resource this lock does not hold, and for a lock without a token.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock_many(["from:1", "to:2"]).await?;
    /// let fence = lock.fence_for("to:2")?;
    /// assert_eq!(fence.resource(), "to:2");
    /// assert!(lock.fence_for("elsewhere").is_err());
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence_for(&self, resource: &str) -> Result<Fence> {
        self.held.fence_for(resource)
    }
}
