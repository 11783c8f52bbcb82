//! [`Lock`]: a held lock, its validity on the local monotonic clock, and
//! its extension and release.
//!
//! A lock is only as good as its validity: after [`Lock::valid_until`] the
//! holder must assume someone else may hold the resource. Dropping a lock
//! that was not released releases it in the background.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::background::Background;
use crate::clock::Deadline;
use crate::config::Config;
use crate::engine::{Claim, Core, Granted, unavailable};
use crate::error::{Error, NotHeldReason, Result};
use crate::fencing::FencingToken;
use crate::keys::{Access, Keys};
use crate::quorum::{self, Decision, Loss};
use crate::storage::Fence;
use crate::telemetry;

/// A lock held on a quorum of nodes.
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
pub struct Lock {
    core: Arc<Core>,
    claim: Claim,
    token: Option<FencingToken>,
    ttl: Duration,
    acquired_at: Instant,
    /// Start of the last successful acquisition or extension.
    extended_at: Instant,
    /// Counts a suspended host (see [`Deadline`]).
    valid_until: Deadline,
    /// Set when the nodes told us the lock is gone.
    lost: bool,
    /// Set once a release has been sent, so `Drop` does not send another.
    released: bool,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("resource", &self.resource())
            .field("access", &self.access())
            .field("value", &self.claim.value)
            .field("token", &self.token)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

impl Lock {
    pub(crate) fn new(core: Arc<Core>, claim: Claim, ttl: Duration, granted: Granted) -> Self {
        Self {
            core,
            claim,
            token: granted.token,
            ttl,
            acquired_at: granted.started,
            extended_at: granted.started,
            valid_until: Deadline::new(granted.valid_until),
            lost: false,
            released: false,
        }
    }

    /// The resource this lock protects; for a lock on several resources,
    /// their names in sorted order as `[a, b]` (see
    /// [`resources`](Self::resources)). Errors name the lock the same way.
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
        self.claim.keys.label()
    }

    /// The keys this lock holds (shared with its lease).
    pub(crate) fn keys(&self) -> Arc<Keys> {
        Arc::clone(&self.claim.keys)
    }

    /// Every resource this lock protects, sorted by name (one for a lock
    /// taken on one resource).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock_many(&["to:2", "from:1"]).await?;
    /// assert_eq!(lock.resources().collect::<Vec<_>>(), ["from:1", "to:2"]);
    /// assert_eq!(lock.resource(), "[from:1, to:2]");
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn resources(&self) -> impl ExactSizeIterator<Item = &str> {
        self.claim.keys.resources.iter().map(|r| r.name())
    }

    /// Whether this is a read lock ([`Access::Shared`]) or an exclusive one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use quorumlock::Access;
    ///
    /// let reader = manager.read("doc:1").await?;
    /// assert_eq!(reader.access(), Access::Shared);
    /// let writer = manager.lock("doc:2").await?;
    /// assert_eq!(writer.access(), Access::Exclusive);
    /// # reader.release().await?;
    /// # writer.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn access(&self) -> Access {
        self.claim.keys.access
    }

    /// The random value that marks this holder's keys on the nodes.
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
        &self.claim.value
    }

    /// The fencing token of this acquisition, `None` when fencing is off.
    /// Pass it with every write to the protected storage, which must reject
    /// tokens lower than the highest it has seen. Extending keeps it.
    ///
    /// A lock on several resources has one token, valid for each of them:
    /// it is above every earlier token of each (every resource's counter
    /// moves up to it). A read lock's token is the counter as it stands,
    /// at least every earlier write lock's (see [`crate::read_write`]): it
    /// is for comparing with the tokens of data read, **never for writes**
    /// (storage would accept it, being as high as the last writer's).
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
        self.token
    }

    /// What a write to [`FencedRedis`](crate::FencedRedis) under this lock
    /// carries: its resource and token together. Refused
    /// ([`Error::InvalidArgument`]) for a lock without a token
    /// (`Fencing::Off`), for a read lock (its token cannot fence a write),
    /// and for a lock on several resources (use
    /// [`fence_for`](Self::fence_for)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock("cart:9").await?;
    /// let fence = lock.fence()?;
    /// assert_eq!((fence.resource(), Some(fence.token())), ("cart:9", lock.token()));
    ///
    /// // A read lock's token cannot fence a write.
    /// let reader = manager.read("cart:10").await?;
    /// assert!(reader.fence().is_err());
    /// # lock.release().await?;
    /// # reader.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence(&self) -> Result<Fence> {
        Fence::of(&self.claim.keys, self.token, None)
    }

    /// As [`fence`](Self::fence), for `resource`, one of the resources of
    /// a lock on several.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock_many(&["from:1", "to:2"]).await?;
    /// assert!(lock.fence().is_err(), "two resources: name the one written");
    /// let fence = lock.fence_for("to:2")?;
    /// assert_eq!(fence.resource(), "to:2");
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence_for(&self, resource: &str) -> Result<Fence> {
        Fence::of(&self.claim.keys, self.token, Some(resource))
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
    /// let mut lock = manager.lock_with_ttl("job", Duration::from_secs(5)).await?;
    /// assert_eq!(lock.ttl(), Duration::from_secs(5));
    /// lock.extend(Duration::from_secs(20)).await?;
    /// assert_eq!(lock.ttl(), Duration::from_secs(20));
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn ttl(&self) -> Duration {
        self.ttl
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
        self.acquired_at
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
        self.extended_at
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
        if self.lost {
            self.acquired_at
        } else {
            self.valid_until.instant()
        }
    }

    /// The end of the validity, on both clocks (see [`Deadline`]).
    pub(crate) fn deadline(&self) -> Deadline {
        if self.lost {
            Deadline::new(self.acquired_at)
        } else {
            self.valid_until
        }
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
        self.valid_until().saturating_duration_since(Instant::now())
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
    /// let lock = manager.lock_with_ttl("job", Duration::from_secs(1)).await?;
    /// assert!(lock.is_valid());
    /// tokio::time::sleep(lock.remaining()).await;
    /// assert!(!lock.is_valid(), "expired: another client may hold it now");
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_valid(&self) -> bool {
        !self.remaining().is_zero()
    }

    /// Resets the lock to live at least `ttl` from now, on a quorum of
    /// nodes, with validity computed from this call's start as for an
    /// acquisition. A node never shortens the key (an extension that
    /// arrives late, after a longer one, must not cut it), so a shorter
    /// TTL lowers the validity, not the keys' expiry.
    ///
    /// Refused with [`Error::NotHeld`] once the validity has run out (the
    /// resource may already be someone else's) or when the nodes no longer
    /// hold our value. On other errors the lock keeps its current validity,
    /// or less: never more than the new TTL allows, since some nodes may
    /// have applied it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let mut lock = manager.lock_with_ttl("upload:9", Duration::from_secs(2)).await?;
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
        let ttl = self.core.checked_ttl(ttl)?;
        if !self.is_valid() {
            return Err(self.not_held());
        }
        // A node that applies the new TTL keeps our key at least this long;
        // with a shorter TTL that can be sooner than the current validity.
        let drift = quorum::drift(ttl, self.core.config.drift_factor);
        let floor = Instant::now() + quorum::validity(ttl, Duration::ZERO, drift);
        self.valid_until = self.valid_until.min(Deadline::new(floor));
        let span = tracing::debug_span!(
            "extend",
            resource = %self.resource(),
            ttl_ms = ttl.as_millis() as u64,
            successes = tracing::field::Empty,
            failures = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty,
            validity_ms = tracing::field::Empty,
        );
        let result = self
            .core
            .extend(&self.claim, ttl, self.valid_until.instant())
            .instrument(span)
            .await;
        match &result {
            Ok(_) => telemetry::extended(),
            Err(_) => telemetry::extend_failed(),
        }
        match result {
            Ok(granted) => {
                self.valid_until = Deadline::new(granted.valid_until);
                self.extended_at = granted.started;
                self.ttl = ttl;
                Ok(())
            }
            Err(error) => {
                if matches!(error, Error::NotHeld { .. }) {
                    self.lost = true;
                }
                Err(error)
            }
        }
    }

    pub(crate) fn config(&self) -> &Config {
        &self.core.config
    }

    /// The manager's counter of background work.
    pub(crate) fn background(&self) -> Arc<Background<Claim>> {
        Arc::clone(&self.core.background)
    }

    /// Deletes this lock's keys (compare-and-delete) on every node. Returns
    /// once a quorum has answered; the other nodes finish in the background.
    ///
    /// `Ok` means a quorum deleted our keys while the lock was still valid.
    /// [`Error::NotHeld`] means it had expired or been lost before: the work
    /// done under it may not have been exclusive. Another holder's keys are
    /// never deleted.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock("report").await?;
    /// lock.release().await?;
    /// // Free again at once, for anyone.
    /// manager.try_lock("report").await?.release().await?;
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
    pub async fn release(mut self) -> Result<()> {
        let expired = !self.is_valid();
        let started = Instant::now();
        let span = tracing::debug_span!("release", resource = %self.resource());
        let (tally, errors) = self
            .core
            .release(&self.claim)
            .instrument(span.clone())
            .await;
        span.in_scope(|| {
            tracing::debug!(
                successes = tally.granted(),
                failures = tally.refused() + tally.failed(),
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "release decided"
            )
        });
        self.released = true;
        if tally.failed() > 0 {
            // Nodes that failed to answer may still hold our key: keep
            // deleting there in the background.
            self.core.clean_up(self.claim.clone());
        }
        match tally.decision() {
            Decision::Won if !expired => Ok(()),
            Decision::Won => Err(self.not_held_after(expired)),
            // Our value is gone from too many nodes.
            Decision::Lost(Loss::Refused) if tally.refusals_alone_lose() => {
                Err(self.not_held_after(expired))
            }
            // A few refusals (nodes our SET never reached) plus failures.
            Decision::Lost(Loss::Refused) => Err(unavailable(self.resource(), &tally, errors)),
            // Release asks no node in particular, so `RequiredFailed` cannot
            // occur; like `Pending`, it would mean the cluster did not answer.
            Decision::Lost(Loss::Unavailable | Loss::RequiredFailed) | Decision::Pending => {
                Err(unavailable(self.resource(), &tally, errors))
            }
        }
    }

    fn not_held(&self) -> Error {
        self.not_held_after(true)
    }

    fn not_held_after(&self, expired: bool) -> Error {
        let reason = if expired && !self.lost {
            NotHeldReason::Expired
        } else {
            NotHeldReason::Lost
        };
        Error::NotHeld {
            resource: self.resource().to_owned(),
            reason,
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !self.released {
            tracing::debug!(resource = %self.resource(), "lock dropped unreleased; releasing in the background");
            self.core.clean_up(self.claim.clone());
        }
    }
}
