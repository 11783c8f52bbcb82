//! How a lock is asked for: [`LockManager::lock`],
//! [`read`](LockManager::read) and [`lock_many`](LockManager::lock_many)
//! each return a [`Request`], with the manager's defaults; its options change them,
//! and awaiting it takes the lock.
//!
//! | Option | Default | |
//! |---|---|---|
//! | [`ttl`](Request::ttl) | the manager's [`ttl`](crate::LockManagerBuilder::ttl) | how long the keys live unless extended |
//! | [`wait`](Request::wait) | the manager's [`wait`](crate::LockManagerBuilder::wait) | how long to wait, queued, for a held resource |
//! | [`no_wait`](Request::no_wait) | | one attempt instead: [`Error::Contended`](crate::Error::Contended) if held |
//! | [`at_least`](Request::at_least) | | keep it from others until this long after acquiring, even when released earlier (exclusive and multi-resource locks) |
//! | [`run`](Request::run) | | run work under the lock, kept alive, then release |
//! | [`run_or_fallback`](Request::run_or_fallback) | | the same, or a fallback when the service is down |

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::fallback::Ran;
use crate::holding::check_description;
use crate::keys::Keys;
use crate::kind::{Exclusive, Kind, Many, Read, Unshared};
use crate::limits::check_wait;
use crate::lock::Lock;
use crate::manager::LockManager;
use crate::watchdog::{Lease, run_under};

impl LockManager {
    /// Asks for an exclusive lock on `resource`: await the [`Request`] to
    /// take it, waiting queued while it is held (up to the
    /// [`wait`](crate::LockManagerBuilder::wait) setting), or set its options
    /// first ([`ttl`](Request::ttl), [`wait`](Request::wait),
    /// [`no_wait`](Request::no_wait), [`run`](Request::run)). A write lock
    /// of a read-write lock is this lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock("invoice:7").await?;
    /// let fence = lock.fence()?; // pass it with every write to the storage
    /// // ... write the invoice, checked against `fence` ...
    /// # let _ = fence;
    /// lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Building the request does nothing; awaiting it is cancel-safe: see
    /// [`Request`].
    pub fn lock(&self, resource: &str) -> Request<'_, Exclusive> {
        Request::new(self, Keys::exclusive(resource))
    }

    /// Asks for a read lock on `resource`, shared with other readers while
    /// no writer holds it or waits for it: see [`crate::read_write`].
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
    /// // A writer is refused while they read.
    /// assert!(matches!(manager.lock("catalog").no_wait().await, Err(Error::Contended { .. })));
    /// first.release().await?;
    /// second.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Building the request does nothing; awaiting it is cancel-safe: see
    /// [`Request`].
    pub fn read(&self, resource: &str) -> Request<'_, Read> {
        Request::new(self, Keys::shared(resource))
    }

    /// Asks for an exclusive lock on every resource of `resources`, all or
    /// none, at most [`MAX_RESOURCES`](crate::MAX_RESOURCES): see
    /// [`crate::many`]. A name given twice, an empty name or an empty list
    /// is [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the request is awaited;
    /// so are names whose hash tags differ when a member is a Redis
    /// Cluster (`redis+cluster://`: one script sets all keys, and a
    /// script's keys must share a slot there), e.g. `account:1` and
    /// `account:2`, where `{bank}:account:1` and `{bank}:account:2` work.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let transfer = manager.lock_many(["account:1", "account:2"]).await?;
    /// let debit = transfer.fence_for("account:1")?;
    /// let credit = transfer.fence_for("account:2")?;
    /// // ... both writes, each checked against its fence ...
    /// # let _ = (debit, credit);
    /// transfer.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Building the request does nothing; awaiting it is cancel-safe: see
    /// [`Request`].
    pub fn lock_many<I>(&self, resources: I) -> Request<'_, Many>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let names: Vec<I::Item> = resources.into_iter().collect();
        let keys = Keys::exclusive_many(&names).and_then(|keys| self.core.fits_every_member(keys));
        Request::new(self, keys)
    }
}

/// A lock asked for, not yet taken: set its options, then `.await` it
/// (or [`run`](Self::run) work under it). Nothing happens until then.
///
/// Awaited, it **waits**, as `tokio::sync::Mutex::lock` does: while the
/// resource is held it queues on the nodes, is woken by the release, and
/// is served in arrival order (see [`crate::wait`]), for up to the wait
/// ([`Error::WaitTimedOut`](crate::Error::WaitTimedOut) after that). While the lock service is
/// unavailable it retries on the manager's
/// [`unavailable_retry`](crate::LockManagerBuilder::unavailable_retry)
/// backoff within the wait, then returns the error
/// ([`Error::is_unavailable`](crate::Error::is_unavailable)). With [`no_wait`](Self::no_wait) it makes
/// one attempt.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use std::time::Duration;
/// use quorumlock::Error;
///
/// let lock = manager.lock("invoice:7").await?; // waits up to the default wait
/// // One attempt, no waiting: someone holds it.
/// let busy = manager.lock("invoice:7").no_wait().await;
/// assert!(matches!(busy, Err(Error::Contended { .. })));
/// // Wait up to 100 ms, and hold for a minute once taken.
/// let later = manager.lock("invoice:7").wait(Duration::from_millis(100)).ttl(Duration::from_secs(60));
/// assert!(matches!(later.await, Err(Error::WaitTimedOut { .. })));
/// lock.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// # Cancel safety
///
/// Dropping the future at any await (e.g. under `tokio::time::timeout`)
/// acquires nothing: the attempt in flight stops sending, and its keys
/// (and its place in the queue) are deleted in the background from every
/// node a request of it may have reached, within `node_timeout`.
/// [`LockManager::settle`] waits for that.
#[must_use = "a request does nothing until it is awaited"]
pub struct Request<'m, K: Kind = Exclusive> {
    manager: &'m LockManager,
    keys: Result<Keys>,
    ttl: Option<Duration>,
    wait: Wait,
    kind: PhantomData<fn() -> K>,
}

/// How a request waits for a held resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Up to the manager's `wait` setting.
    Configured,
    /// Up to this long.
    For(Duration),
    /// Not at all: one attempt.
    No,
}

impl<K: Kind> std::fmt::Debug for Request<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("kind", &std::any::type_name::<K>())
            .field("resource", &self.keys.as_ref().map(|keys| keys.label()))
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .finish()
    }
}

impl<'m, K: Kind> Request<'m, K> {
    pub(crate) fn new(manager: &'m LockManager, keys: Result<Keys>) -> Self {
        let counters = manager.core.config.fence_counters;
        Self {
            manager,
            keys: keys.map(|keys| keys.counted_by(counters)),
            ttl: None,
            wait: Wait::Configured,
            kind: PhantomData,
        }
    }

    /// How long the keys live unless extended (the manager's
    /// [`ttl`](crate::LockManagerBuilder::ttl) if not given). The lock is
    /// valid for a little less: the TTL less the time the attempt took
    /// and a clock-drift allowance.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let lock = manager.lock("nightly-report").ttl(Duration::from_secs(60)).await?;
    /// assert_eq!(lock.ttl(), Duration::from_secs(60));
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait, queued, while the resource is held (the manager's
    /// [`wait`](crate::LockManagerBuilder::wait) if not given); then
    /// [`Error::WaitTimedOut`](crate::Error::WaitTimedOut). A zero wait is
    /// [`no_wait`](Self::no_wait): one attempt, not queued.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let first = manager.lock("printer").await?;
    /// let releaser = tokio::spawn(async move {
    ///     tokio::time::sleep(Duration::from_millis(50)).await;
    ///     first.release().await
    /// });
    /// // Woken by the release, well within the second allowed.
    /// let second = manager.lock("printer").wait(Duration::from_secs(1)).await?;
    /// releaser.await.expect("no panic")?;
    /// # second.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Wait::For(wait);
        self
    }

    /// One attempt, not queued: the lock, or [`Error::Contended`](crate::Error::Contended) if the
    /// resource is held or waited for (or the error that made the attempt
    /// fail). Such an attempt never takes a resource ahead of queued
    /// waiters: the queue keeps the lock key (see [`crate::wait`]).
    ///
    /// Clients that try at the same moment may split the nodes' votes so
    /// that none gets a majority (each rolls back what it got). For one
    /// exclusive resource, an attempt refused by some nodes but not all
    /// rolls back at once and, apart from the others (at random, up to
    /// 20 ms), asks the nodes whether anyone holds the resource on any of
    /// them: if so, [`Contended`](crate::Error::Contended); if not, it
    /// tries again, up to four times, then
    /// [`Error::SplitVote`](crate::Error::SplitVote) (nobody holds it). So
    /// of hosts that fire together, one gets the lock and the others are
    /// told another holds it (measured: exactly one in every round of
    /// `tests/at_least.rs`).
    ///
    /// A `Contended` carries a retry-after hint, `free_in`: once the
    /// attempt is refused, the time left of the resource's keys is read on
    /// every node (`PTTL`, one more read
    /// within `node_timeout`, on the refusal path only). A hint: with
    /// several resources, keys of this attempt not rolled back yet may
    /// lengthen it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    /// use quorumlock::Error;
    ///
    /// let held = manager.lock("invoice:7").ttl(Duration::from_secs(10)).await?;
    /// match manager.lock("invoice:7").no_wait().await {
    ///     Err(Error::Contended { free_in: Some(left), .. }) => {
    ///         assert!(left <= Duration::from_secs(10)); // e.g. HTTP 409, Retry-After
    ///     }
    ///     other => panic!("expected Contended with a hint, got {other:?}"),
    /// }
    /// held.release().await?;
    /// manager.lock("invoice:7").no_wait().await?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn no_wait(mut self) -> Self {
        self.wait = Wait::No;
        self
    }

    /// Stores `description` (who holds it: a host, a pid, a label) with
    /// the lock on the nodes, for anyone to read with
    /// [`LockManager::holders`] or `quorumlock status`; at most
    /// [`MAX_HOLDER_LEN`](crate::MAX_HOLDER_LEN) bytes of printable text
    /// ([`Error::InvalidArgument`](crate::Error::InvalidArgument) when
    /// awaited otherwise). It rides in the lock's value, so it costs one
    /// longer argument per request and is gone with the lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.read("catalog").holder("indexer on host-b").await?;
    /// assert_eq!(lock.holder(), Some("indexer on host-b"));
    /// let holding = manager.holders("catalog").await?;
    /// assert_eq!(holding.holders[0].description.as_deref(), Some("indexer on host-b"));
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn holder(mut self, description: impl Into<String>) -> Self {
        let description = description.into();
        self.keys = self.keys.and_then(|mut keys| {
            check_description(&description)?;
            keys.holder = Some(description.into_boxed_str());
            Ok(keys)
        });
        self
    }

    /// Takes the lock, runs `work` while keeping it alive, then releases
    /// it (after any extension in flight settles) and returns what `work`
    /// returned.
    ///
    /// `work` gets a [`Lease`]: the lock's token, resources and validity.
    /// If the lock is lost (extensions cannot reach a quorum before the
    /// validity ends, the keys were taken over, or `max_hold` is reached),
    /// the future `work` returned is **dropped** at its next `.await` (at
    /// the latest when the validity ends, if it yields by then), and the
    /// call returns [`Error::Lost`](crate::Error::Lost). Code after an `.await` in `work` may
    /// therefore never run: keep each step's effect safe to stop, and check
    /// the token in storage. The keys stay on the nodes until `work` is
    /// dropped or the validity ends, so no other client gets the lock while
    /// the cancelled work can still run.
    ///
    /// # What a drop cannot stop
    ///
    /// Dropping a future stops only what that future polls. Work that
    /// blocks the thread (a synchronous loop, blocking I/O outside
    /// `spawn_blocking`) runs on until it yields; if it yields after the
    /// validity ended, the call returns [`Error::Lost`](crate::Error::Lost) although `work`
    /// finished (its value is dropped: another client may have held the
    /// lock meanwhile). Tasks it started with `tokio::spawn` or
    /// `spawn_blocking` are not stopped at all. Hand such work a clone of
    /// the [`Lease`] and have it check [`Lease::is_valid`] between steps
    /// (it turns `false` the moment the lock is lost, or its validity
    /// ends), or await [`Lease::lost`] in the spawned task; and fence every
    /// write, which holds whatever the work does.
    ///
    /// A panic in `work`, or dropping this future, releases the lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let total = manager
    ///     .lock("nightly-report")
    ///     .run(|lease| async move {
    ///         // Kept alive however long this takes; `lease.fence()` fences writes.
    ///         assert!(lease.token().is_some());
    ///         40 + 2
    ///     })
    ///     .await?;
    /// assert_eq!(total, 42);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any await leaves nothing behind: while
    /// acquiring, as for awaiting the request; while `work` runs, `work` is
    /// dropped with it and the lock is released in the background; while
    /// releasing, the release goes on in the background. Each is counted by
    /// [`LockManager::settle`] and bounded by `node_timeout` (two for a
    /// release behind an extension in flight).
    pub async fn run<F, Fut, T>(self, work: F) -> Result<T>
    where
        F: FnOnce(Lease<K>) -> Fut,
        Fut: Future<Output = T>,
    {
        self.check_keep_alive()?;
        run_under(self.acquire().await?, work).await
    }

    /// Runs `work` under the lock, as [`run`](Self::run) does; or, when
    /// the lock service is unavailable, runs `fallback` instead, and says
    /// which ran.
    ///
    /// The lock is taken as awaiting the request takes it. Then:
    /// - acquired: `work` runs; the result is [`Ran::Locked`], or
    ///   [`Error::Lost`](crate::Error::Lost) if the lock was lost meanwhile (the fallback does
    ///   not run then: `work` may have done part of its job);
    /// - the service was unavailable ([`Error::is_unavailable`](crate::Error::is_unavailable)), after the
    ///   `unavailable_retry` backoff: `fallback` runs, and the result is
    ///   [`Ran::Fallback`] with the cause; counted by the metric
    ///   `quorumlock_fallback_total`;
    /// - any other error (the resource stayed held:
    ///   [`Error::WaitTimedOut`](crate::Error::WaitTimedOut) or [`Error::Contended`](crate::Error::Contended); a bad argument)
    ///   is returned, and neither runs.
    ///
    /// The fallback gives none of the lock's exclusion: make it safe on
    /// its own (see the [module docs](crate::fallback)).
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
    ///     manager.lock("invoice:7").run_or_fallback(
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
    /// As for [`run`](Self::run) while acquiring or running `work`; while
    /// `fallback` runs, dropping the call drops the fallback's future, and
    /// nothing of the lock service is left behind.
    pub async fn run_or_fallback<W, WorkFut, F, FallbackFut, T>(
        self,
        work: W,
        fallback: F,
    ) -> Result<Ran<T>>
    where
        W: FnOnce(Lease<K>) -> WorkFut,
        WorkFut: Future<Output = T>,
        F: FnOnce() -> FallbackFut,
        FallbackFut: Future<Output = T>,
    {
        self.check_keep_alive()?;
        match self.acquire().await {
            Ok(lock) => run_under(lock, work).await.map(Ran::Locked),
            Err(cause) if cause.is_unavailable() => Ok(crate::fallback::run(fallback, cause).await),
            Err(other) => Err(other),
        }
    }

    /// Work under the lock is kept alive: settings that cannot do that are
    /// refused before anything is asked of the nodes.
    fn check_keep_alive(&self) -> Result<()> {
        let config = &self.manager.core.config;
        self.manager
            .check_keep_alive(self.ttl.unwrap_or(config.ttl))
    }

    async fn acquire(self) -> Result<Lock<K>> {
        let Request {
            manager,
            keys,
            ttl,
            wait,
            kind: _,
        } = self;
        if let Some(at_least) = keys.as_ref().ok().and_then(|keys| keys.at_least) {
            check_wait(at_least).map_err(|reason| Error::InvalidArgument {
                argument: "at_least",
                reason,
            })?;
            // The keys live that long: a node that may have lost them is
            // not counted for as long (the guard's window covers it).
            manager.core.note_key_life(at_least);
        }
        let config = &manager.core.config;
        let ttl = ttl.unwrap_or(config.ttl);
        let wait = match wait {
            Wait::No => Duration::ZERO,
            Wait::Configured => config.wait,
            Wait::For(wait) => wait,
        };
        // A wait with no time to wait is one attempt: queueing it would
        // leave an entry to clean up and hold back whoever is behind.
        let held = if wait.is_zero() {
            manager.attempt(keys, ttl).await
        } else {
            manager.wait_for(keys, ttl, wait).await
        }?;
        Ok(Lock::new(held))
    }
}

impl<K: Unshared> Request<'_, K> {
    /// Keeps the lock from anyone else until `at_least` after the
    /// acquisition started, even when it is released or dropped earlier, or
    /// its holder dies: the keys are set to live that long (its validity
    /// still counts from the TTL, which keep-alive extends as usual), and a
    /// release before then leaves them, with their value, and wakes no one. So a job that many hosts start on the
    /// same schedule runs at most once per interval (ShedLock's
    /// `lockAtLeastFor`): each host asks with [`no_wait`](Self::no_wait)
    /// and an `at_least` a little under the interval. On a lock of several
    /// resources, every one of them stays taken. As with any expiry,
    /// the time is the nodes': a node whose clock runs fast by `drift`
    /// frees the key that much early. At most a year. The manager's node
    /// guard then does not count a node that may have lost the keys (a
    /// restart, a flush, a clock fault) for at least this long, for all of
    /// its locks: give long `at_least` jobs a manager of their own when the
    /// others must recover sooner.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    /// use quorumlock::Error;
    ///
    /// // Run by whichever host gets there first, at most once a minute.
    /// let ran = manager
    ///     .lock("nightly-report")
    ///     .no_wait()
    ///     .at_least(Duration::from_secs(55))
    ///     .run(|_lease| async { /* the job, here done at once */ })
    ///     .await;
    /// assert!(ran.is_ok());
    /// // Released, but kept: another host's run is refused until then.
    /// let again = manager.lock("nightly-report").no_wait().await;
    /// assert!(matches!(again, Err(Error::Contended { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn at_least(mut self, at_least: Duration) -> Self {
        if let Ok(keys) = &mut self.keys {
            keys.at_least = Some(at_least);
        }
        self
    }
}

impl<'m, K: Kind> IntoFuture for Request<'m, K> {
    type Output = Result<Lock<K>>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<Lock<K>>> + Send + 'm>>;

    /// Takes the lock; see [`Request`], and its `# Cancel safety`.
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}
