//! Keeping a lock alive: a background task that extends it every
//! `extend_every` (default TTL/3), retries failed extensions while validity
//! remains, stops at `max_hold`, and tells the holder when the lock is gone.
//!
//! The holder's view ([`Lease`]) turns "lost" into a future that resolves no
//! later than the end of the current validity, even if the watchdog itself
//! is stuck in a request, so work selected against it is cancelled in time.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::background::{Background, Ticket};
use crate::clock::Deadline;
use crate::config::Config;
use crate::engine::Claim;
use crate::error::{Error, LossReason, NotHeldReason, Result};
use crate::fencing::FencingToken;
use crate::held::Held;
use crate::keys::Keys;
use crate::kind::{Exclusive, Kind, Many, Read};
use crate::limits::check_interval;
use crate::lock::Lock;
use crate::manager::LockManager;
use crate::storage::Fence;
use crate::telemetry;

/// The resolution of tokio's timers.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// How often a wait for a lease's end looks at the clocks again: timers
/// do not count the time the host was suspended (see [`Deadline`]).
const SUSPEND_RECHECK: Duration = Duration::from_secs(1);

/// Shortest and longest pause between retries of a failed extension.
const MIN_RETRY_PAUSE: Duration = Duration::from_millis(10);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// What the watchdog publishes after every step.
#[derive(Debug, Clone)]
struct LeaseState {
    valid_until: Deadline,
    /// Start of the last successful acquisition or extension.
    extended_at: Instant,
    extensions: u64,
    /// Set once, when the lease ends: lost, or stopped by the holder.
    end: Option<LossReason>,
}

/// A read-only, cloneable view of a kept-alive lock: its identity, its
/// current validity, and a future that resolves when it is lost.
///
/// It vouches for the lock only while the watchdog keeps it: once the
/// [`KeepAlive`] is stopped, released or dropped, every clone reports it
/// ended ([`is_valid`](Self::is_valid) is `false`, [`lost`](Self::lost)
/// resolves with [`LossReason::Stopped`]), even before the release is done.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// let imported = manager
///     .lock("import").run(|lease| async move {
///         // The lease is what the work sees of the kept-alive lock.
///         assert!(lease.is_valid());
///         lease.token()
///     })
///     .await?;
/// assert!(imported.is_some());
/// # Ok(())
/// # }
/// ```
pub struct Lease<K: Kind = Exclusive> {
    keys: Arc<Keys>,
    token: Option<FencingToken>,
    state: watch::Receiver<LeaseState>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Kind> Clone for Lease<K> {
    fn clone(&self) -> Self {
        Self {
            keys: Arc::clone(&self.keys),
            token: self.token,
            state: self.state.clone(),
            kind: PhantomData,
        }
    }
}

impl<K: Kind> std::fmt::Debug for Lease<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.keys.label())
            .field("token", &self.token)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl Lease<Exclusive> {
    /// The resource the lock protects, named as [`Lock::resource`] names it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// assert_eq!(keep.lease().resource(), "import");
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn resource(&self) -> &str {
        self.keys.label()
    }

    /// What a write to [`FencedRedis`](crate::FencedRedis) under the lock
    /// carries; see [`Lock::fence`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// let lease = keep.lease();
    /// let fence = lease.fence()?; // pass it with each write, as with `Lock::fence`
    /// assert_eq!(Some(fence.token()), lease.token());
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence(&self) -> Result<Fence> {
        Fence::of(&self.keys, self.token, None)
    }

    /// The lock's fencing token (`None` with `Fencing::Off`); extensions keep it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock("import").await?;
    /// let token = lock.token();
    /// let keep = lock.keep_alive()?;
    /// assert_eq!(keep.lease().token(), token, "extensions keep the token");
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn token(&self) -> Option<FencingToken> {
        self.token
    }
}

impl Lease<Read> {
    /// The resource the read lock shares.
    pub fn resource(&self) -> &str {
        self.keys.label()
    }

    /// The writers' token the read lock was granted with; see
    /// [`Lock::writer_token`](crate::Lock::writer_token). Never for writes.
    pub fn writer_token(&self) -> Option<FencingToken> {
        self.token
    }
}

impl Lease<Many> {
    /// Every resource the lock protects, sorted by name.
    pub fn resources(&self) -> impl ExactSizeIterator<Item = &str> {
        self.keys.resources.iter().map(|r| r.name())
    }

    /// The lock's one fencing token, valid for each of its resources.
    pub fn token(&self) -> Option<FencingToken> {
        self.token
    }

    /// What a write to [`FencedRedis`](crate::FencedRedis) of `resource`,
    /// one of the lock's, carries; see [`Lock::fence_for`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let keep = manager.lock_many(["from:1", "to:2"]).await?.keep_alive()?;
    /// let fence = keep.lease().fence_for("from:1")?;
    /// assert_eq!(fence.resource(), "from:1");
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence_for(&self, resource: &str) -> Result<Fence> {
        Fence::of(&self.keys, self.token, Some(resource))
    }
}

impl<K: Kind> Lease<K> {
    /// Waits for the next change of the lease (an extension, or its end);
    /// false once the watchdog is gone.
    pub(crate) async fn changed(&mut self) -> bool {
        self.state.changed().await.is_ok()
    }

    /// The end of the current validity (monotonic clock).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// let lease = keep.lease();
    /// assert!(tokio::time::Instant::now() < lease.valid_until());
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn valid_until(&self) -> Instant {
        self.state.borrow().valid_until.instant()
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
    /// let lock = manager.lock("import").ttl(Duration::from_secs(3)).await?;
    /// let acquired = lock.acquired_at();
    /// let keep = lock.keep_alive()?; // extends every second (TTL/3)
    /// let lease = keep.lease();
    /// tokio::time::timeout(Duration::from_secs(30), async {
    ///     while lease.extensions() == 0 {
    ///         tokio::time::sleep(Duration::from_millis(50)).await;
    ///     }
    /// })
    /// .await
    /// .expect("extended within 30 s");
    /// assert!(lease.last_extended() > acquired);
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn last_extended(&self) -> Instant {
        self.state.borrow().extended_at
    }

    /// Successful extensions so far.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let keep = manager.lock("import").ttl(Duration::from_secs(3)).await?.keep_alive()?;
    /// let lease = keep.lease();
    /// assert_eq!(lease.extensions(), 0);
    /// tokio::time::timeout(Duration::from_secs(30), async {
    ///     while lease.extensions() < 2 {
    ///         tokio::time::sleep(Duration::from_millis(50)).await;
    ///     }
    /// })
    /// .await
    /// .expect("two extensions within 30 s");
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn extensions(&self) -> u64 {
        self.state.borrow().extensions
    }

    /// Validity left now; zero once expired, lost, or the keep-alive was
    /// stopped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// assert!(keep.lease().remaining() > Duration::ZERO);
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn remaining(&self) -> Duration {
        if self.state.borrow().end.is_some() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Whether the lock may still be relied on now.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// let lease = keep.lease();
    /// assert!(lease.is_valid());
    /// keep.release().await?;
    /// assert!(!lease.is_valid(), "a released lease is no longer valid");
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_valid(&self) -> bool {
        !self.remaining().is_zero()
    }

    /// Resolves with [`Error::Lost`] when the lock is lost, when `max_hold`
    /// is reached, when the current validity runs out without a new
    /// extension, or when the holder stops keeping it alive
    /// ([`LossReason::Stopped`]), whichever comes first.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// let lease = keep.lease();
    /// // Run the work against the loss: if the lock goes, the work is dropped.
    /// let rows = tokio::select! {
    ///     rows = async { 42 } => rows,
    ///     lost = lease.lost() => return Err(lost),
    /// };
    /// assert_eq!(rows, 42);
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only watches; use it in `select!`.
    pub async fn lost(&self) -> Error {
        let mut state = self.state.clone();
        let mut watchdog_alive = true;
        loop {
            let (valid_until, end) = {
                let now = state.borrow_and_update();
                (now.valid_until, now.end.clone())
            };
            if let Some(reason) = end {
                return self.lost_because(reason);
            }
            // Timers may fire up to one tick late: aim one tick early, so
            // the loss is reported no later than the validity's end. Timers
            // stop while the host is suspended: look again every
            // `SUSPEND_RECHECK`, so a resume past the end is seen soon.
            let ends = valid_until.instant();
            let wake = (ends.checked_sub(TIMER_TICK).unwrap_or(ends))
                .min(Instant::now() + SUSPEND_RECHECK);
            tokio::select! {
                changed = state.changed(), if watchdog_alive => {
                    // A stopped watchdog extends no more; only expiry is left.
                    watchdog_alive = changed.is_ok();
                }
                _ = tokio::time::sleep_until(wake) => {
                    if state.borrow().valid_until.instant() <= Instant::now() + TIMER_TICK {
                        return self.lost_because(LossReason::Expired);
                    }
                }
            }
        }
    }

    fn lost_because(&self, reason: LossReason) -> Error {
        Error::Lost {
            resource: self.keys.label().to_owned(),
            reason,
        }
    }
}

/// What the holder tells the watchdog, once. Each order carries a ticket,
/// so `settle()` counts the watchdog's last work from the moment the holder
/// lets go until the lock is handed back or its release is under way.
struct Order {
    command: Command,
    _counted: Ticket<Claim>,
}

enum Command {
    /// Stop extending and send the lock back; if nobody waits for it any
    /// more, release it.
    HandBack(oneshot::Sender<Held>),
    /// The handle was dropped: release the lock.
    Release,
}

/// Extends a lock in the background until stopped, lost, or `max_hold`.
///
/// Get one with [`Lock::keep_alive`]. Watch for loss with
/// [`lost`](Self::lost) (e.g. in `tokio::select!` against the work), end it
/// with [`release`](Self::release) or [`stop`](Self::stop). Dropping it stops
/// the extensions and releases the lock in the background (counted by
/// [`LockManager::settle`]).
///
/// After a loss that the watchdog sees (`max_hold` reached, extensions
/// that failed, a takeover), the lease ends at once but the keys stay on
/// the nodes until this handle is dropped, stopped or released (the work
/// has stopped) or the validity ends: drop it as soon as the work it
/// protects has stopped, and not before. That is how work on other
/// threads is kept inside the lock: it checks the lease between steps,
/// and the handle is dropped only once it has returned.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// let keep = manager.lock("import").await?.keep_alive()?;
/// let lease = keep.lease();
/// let steps = tokio::task::spawn_blocking(move || {
///     let mut steps = 0;
///     // Each step starts only while the lock is valid; a loss stops the
///     // loop at its next check, and the keys wait for it.
///     while lease.is_valid() && steps < 3 {
///         steps += 1; // one bounded, fenced step of the work
///     }
///     steps
/// })
/// .await
/// .expect("no panic");
/// keep.release().await?; // only now may anyone else get the lock
/// assert_eq!(steps, 3);
/// # Ok(())
/// # }
/// ```
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// let keep = manager.lock("import").await?.keep_alive()?;
/// tokio::select! {
///     lost = keep.lost() => return Err(lost), // the work below is dropped
///     () = async { /* long work, under keep.lease() */ } => {}
/// }
/// keep.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "the lock is released when the handle is dropped: keep it while the work runs"]
pub struct KeepAlive<K: Kind = Exclusive> {
    lease: Lease<K>,
    /// The lease's publisher, shared with the watchdog: stopping ends the
    /// lease from here at once, even while an extension is in flight.
    state: Arc<watch::Sender<LeaseState>>,
    orders: Option<oneshot::Sender<Order>>,
    /// Counts the orders' work for `settle()`.
    background: Arc<Background<Claim>>,
}

impl<K: Kind> std::fmt::Debug for KeepAlive<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepAlive")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl<K: Kind> KeepAlive<K> {
    /// Starts the watchdog for `lock`.
    pub(crate) fn start(lock: Held) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let policy = Policy::for_lock(&lock)?;
        let (state_tx, state_rx) = watch::channel(LeaseState {
            valid_until: lock.deadline(),
            extended_at: lock.acquired_at(),
            extensions: 0,
            end: None,
        });
        let lease = Lease {
            keys: lock.keys(),
            token: lock.token(),
            state: state_rx,
            kind: PhantomData,
        };
        let background = lock.background();
        let (orders_tx, orders_rx) = oneshot::channel();
        let state = Arc::new(state_tx);
        runtime.spawn(watch_over(lock, policy, Arc::clone(&state), orders_rx));
        Ok(Self {
            lease,
            state,
            orders: Some(orders_tx),
            background,
        })
    }

    /// A view of the lock for the work it protects.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// let lease = keep.lease(); // cheap; hand a clone to each task of the work
    /// let for_a_task = lease.clone();
    /// assert_eq!(for_a_task.token(), lease.token());
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lease(&self) -> Lease<K> {
        self.lease.clone()
    }

    /// See [`Lease::lost`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use std::time::Duration;
    ///
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// let still_held = tokio::time::timeout(Duration::from_millis(100), keep.lost()).await;
    /// assert!(still_held.is_err(), "not lost while the nodes are up");
    /// # keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only watches; use it in `select!`.
    pub async fn lost(&self) -> Error {
        self.lease.lost().await
    }

    /// Stops extending (after an extension in flight settles) and hands the
    /// lock back. [`Error::Lost`] if it was lost or released meanwhile.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// let lock = keep.stop().await?; // no more extensions; still held
    /// assert!(lock.is_valid());
    /// lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before the lock is handed back, the lock is
    /// released in the background (counted by [`LockManager::settle`]), as
    /// if the handle had been dropped.
    pub async fn stop(mut self) -> Result<Lock<K>> {
        let (reply, handed_back) = oneshot::channel();
        self.send(Command::HandBack(reply));
        handed_back.await.map(Lock::new).map_err(|_| {
            // The watchdog ended on its own; the lease says why.
            let reason = self
                .lease
                .state
                .borrow()
                .end
                .clone()
                .unwrap_or(LossReason::Expired);
            self.lease.lost_because(reason)
        })
    }

    /// Stops extending and releases the lock; see [`Lock::release`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// keep.release().await?;
    /// manager.lock("import").no_wait().await?.release().await?; // free again
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// A drop at any await still releases the lock, in the background
    /// (counted by [`LockManager::settle`]).
    pub async fn release(self) -> Result<()> {
        self.stop().await?.release().await
    }

    fn send(&mut self, command: Command) {
        if let Some(orders) = self.orders.take() {
            end_lease(&self.state);
            let order = Order {
                command,
                _counted: self.background.ticket(),
            };
            // Err: the watchdog already ended on its own; the order (and
            // its ticket) is simply dropped.
            let _ = orders.send(order);
        }
    }
}

impl<K: Kind> Drop for KeepAlive<K> {
    fn drop(&mut self) {
        self.send(Command::Release);
    }
}

impl<K: Kind> Lock<K> {
    /// Keeps the lock alive in the background: extends it every
    /// `extend_every` (default TTL/3), retries failed extensions while
    /// validity remains, stops at `max_hold`, and signals loss through the
    /// returned handle. Needs a tokio runtime
    /// ([`Error::NoRuntime`](crate::Error::NoRuntime)). For work that runs
    /// under the lock and must stop when it is lost, prefer
    /// [`Request::run`](crate::Request::run), which does this for you.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let keep = manager.lock("import").await?.keep_alive()?;
    /// let token = keep.lease().token();
    /// // ... long work, fenced with `token`; `keep.lost()` resolves if the lock is lost ...
    /// # let _ = token;
    /// keep.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn keep_alive(self) -> Result<KeepAlive<K>> {
        KeepAlive::start(self.into_held())
    }
}

impl LockManager {
    /// Checks, before taking any lock, that a lock of `ttl` could be kept
    /// alive with these settings (`extend_every`, default TTL/3, plus one
    /// `node_timeout` must fit in the validity). [`Lock::keep_alive`] makes
    /// the same check.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .build()?;
    /// assert!(manager.check_keep_alive(Duration::from_secs(10)).is_ok());
    /// // 100 ms leaves no room for an extension of 50 ms (node_timeout) every 33 ms.
    /// assert!(manager.check_keep_alive(Duration::from_millis(100)).is_err());
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn check_keep_alive(&self, ttl: Duration) -> Result<()> {
        let core = self.core();
        extension_interval(&core.config, core.checked_ttl(ttl)?).map(drop)
    }
}

/// Runs `work` under `lock`, kept alive, then releases it: what
/// [`Request::run`](crate::Request::run) does once the lock is taken.
pub(crate) async fn run_under<K, F, Fut, T>(lock: Lock<K>, work: F) -> Result<T>
where
    K: Kind,
    F: FnOnce(Lease<K>) -> Fut,
    Fut: Future<Output = T>,
{
    let keep = lock.keep_alive()?;
    let outcome = {
        let work = std::pin::pin!(work(keep.lease()));
        tokio::select! {
            biased;
            lost = keep.lost() => Err(lost),
            value = work => Ok(value),
        }
    };
    match outcome {
        // The work finished, but past the lock's end: it blocked the
        // thread (the loss could not cancel it meanwhile), so another
        // client may have held the lock while it ran.
        Ok(_) if !keep.lease.is_valid() => Err(keep.lost().await),
        Ok(value) => {
            let resource = keep.lease.keys.label().to_owned();
            if let Err(error) = keep.release().await {
                tracing::warn!(%resource, %error, "work finished but the release failed");
            }
            Ok(value)
        }
        // Dropping `keep` releases whatever is left of the lock.
        Err(lost) => Err(lost),
    }
}

/// When and how the watchdog extends one lock.
#[derive(Debug, Clone, Copy)]
struct Policy {
    ttl: Duration,
    every: Duration,
    node_timeout: Duration,
    hold_until: Option<Instant>,
    max_hold: Duration,
}

impl Policy {
    fn for_lock(lock: &Held) -> Result<Self> {
        let config = lock.config();
        let ttl = lock.ttl();
        let every = extension_interval(config, ttl)?;
        Ok(Self {
            ttl,
            every,
            node_timeout: config.node_timeout,
            hold_until: lock.acquired_at().checked_add(config.max_hold),
            max_hold: config.max_hold,
        })
    }
}

/// How often a lock of `ttl` is extended under `config`, if that can work.
fn extension_interval(config: &Config, ttl: Duration) -> Result<Duration> {
    let every = config.extend_every.unwrap_or(ttl / 3);
    check_interval(every, ttl, config.node_timeout, config.drift_factor).map_err(|reason| {
        Error::InvalidArgument {
            argument: "extend_every",
            reason,
        }
    })?;
    Ok(every)
}

/// The watchdog task: extends until the holder gives an order, the lock
/// is lost, or `max_hold` is reached.
async fn watch_over(
    mut lock: Held,
    policy: Policy,
    state: Arc<watch::Sender<LeaseState>>,
    mut orders: oneshot::Receiver<Order>,
) {
    loop {
        let due = next_extension(state.borrow().extended_at, policy.every, policy.hold_until);
        tokio::select! {
            biased;
            order = &mut orders => return obey(lock, &state, order),
            _ = tokio::time::sleep_until(due) => {}
        }
        if policy
            .hold_until
            .is_some_and(|limit| Instant::now() >= limit)
        {
            let reason = LossReason::MaxHoldReached(policy.max_hold);
            return give_up(lock, &state, reason, orders).await;
        }
        match extend_while_valid(&mut lock, &policy, &mut orders).await {
            Extended::Yes => state.send_modify(|s| {
                s.valid_until = lock.deadline();
                s.extended_at = lock.last_extended();
                s.extensions += 1;
            }),
            Extended::Stopped(order) => return obey(lock, &state, order),
            Extended::No(reason) => return give_up(lock, &state, reason, orders).await,
        }
    }
}

enum Extended {
    Yes,
    /// The holder gave an order between retries.
    Stopped(Result<Order, oneshot::error::RecvError>),
    No(LossReason),
}

/// Extends once, retrying failures while an attempt can still finish
/// within the current validity.
async fn extend_while_valid(
    lock: &mut Held,
    policy: &Policy,
    orders: &mut oneshot::Receiver<Order>,
) -> Extended {
    loop {
        match lock.extend(policy.ttl).await {
            Ok(()) => return Extended::Yes,
            Err(Error::NotHeld { reason, .. }) => {
                return Extended::No(match reason {
                    NotHeldReason::Expired => LossReason::Expired,
                    _ => LossReason::TakenOver,
                });
            }
            Err(error) => {
                tracing::debug!(resource = lock.resource(), %error, "extension failed; retrying");
                let pause = retry_pause(policy.every);
                if !can_retry(
                    Instant::now() + pause,
                    lock.valid_until(),
                    policy.node_timeout,
                ) {
                    return Extended::No(LossReason::ExtendFailed(Box::new(error)));
                }
                tokio::select! {
                    biased;
                    order = &mut *orders => return Extended::Stopped(order),
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// Ends the lease because the holder stopped keeping the lock alive,
/// unless it already ended (lost): the lease vouches for the lock only
/// while the watchdog keeps it, so no clone may tell work to go on under a
/// lock that is handed back or being released.
fn end_lease(state: &watch::Sender<LeaseState>) {
    state.send_modify(|s| {
        s.end.get_or_insert(LossReason::Stopped);
    });
}

/// Carries out the holder's order: hand the lock back, or release it (in
/// the background, counted) when the holder dropped the handle or stopped
/// waiting for the lock. The holder ended the lease when it gave the order
/// (see `KeepAlive::send`); an order that never came ends it here.
fn obey(
    lock: Held,
    state: &watch::Sender<LeaseState>,
    order: Result<Order, oneshot::error::RecvError>,
) {
    match order {
        Ok(Order {
            command: Command::HandBack(reply),
            _counted,
        }) => {
            if let Err(unclaimed) = reply.send(lock) {
                drop(unclaimed);
            }
        }
        Ok(Order {
            command: Command::Release,
            ..
        }) => drop(lock),
        Err(_) => {
            end_lease(state);
            drop(lock);
        }
    }
}

/// Ends the lease without the holder asking (`max_hold`, extensions that
/// failed, a takeover): tells the holder, so that its work stops, but
/// leaves the keys in place until the holder lets go of the handle (its
/// work has stopped) or the validity ends. Deleting them at once would let
/// another client in while the work, told to stop, may still be running.
async fn give_up(
    lock: Held,
    state: &watch::Sender<LeaseState>,
    reason: LossReason,
    orders: oneshot::Receiver<Order>,
) {
    tracing::warn!(resource = lock.resource(), %reason, "lock lost");
    telemetry::lost(&reason);
    state.send_modify(|s| s.end = Some(reason));
    // An order now is the holder letting go: its work has stopped. The
    // lock is released, not handed back (`stop` reports the loss).
    let _let_go = tokio::select! {
        order = orders => order.ok(),
        () = tokio::time::sleep_until(lock.valid_until()) => None,
    };
    drop(lock);
}

/// When the next extension is due: `every` after the last one started,
/// but not after the hold limit.
fn next_extension(extended_at: Instant, every: Duration, hold_until: Option<Instant>) -> Instant {
    let due = extended_at + every;
    hold_until.map_or(due, |limit| due.min(limit))
}

/// Pause before retrying a failed extension: a tenth of the interval,
/// within 10–250 ms, so several retries fit before validity runs out.
fn retry_pause(every: Duration) -> Duration {
    (every / 10).clamp(MIN_RETRY_PAUSE, MAX_RETRY_PAUSE)
}

/// Whether an extension started at `start` could still finish (bounded by
/// `node_timeout`) before the validity ends; later ones are pointless.
fn can_retry(start: Instant, valid_until: Instant, node_timeout: Duration) -> bool {
    start + node_timeout < valid_until
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn extensions_are_due_every_interval_but_not_past_the_hold_limit() {
        let t0 = Instant::now();
        assert_eq!(next_extension(t0, ms(300), None), t0 + ms(300));
        assert_eq!(
            next_extension(t0, ms(300), Some(t0 + ms(1000))),
            t0 + ms(300)
        );
        assert_eq!(
            next_extension(t0, ms(300), Some(t0 + ms(100))),
            t0 + ms(100)
        );
    }

    #[test]
    fn retry_pause_is_a_tenth_of_the_interval_within_bounds() {
        let table = [(ms(3_333), ms(250)), (ms(1_000), ms(100)), (ms(50), ms(10))];
        for (every, pause) in table {
            assert_eq!(retry_pause(every), pause, "every {every:?}");
        }
    }

    #[test]
    fn retries_stop_when_they_could_not_finish_in_time() {
        let t0 = Instant::now();
        assert!(can_retry(t0, t0 + ms(100), ms(50)));
        assert!(!can_retry(t0, t0 + ms(50), ms(50)));
        assert!(!can_retry(t0 + ms(80), t0 + ms(100), ms(50)));
    }
}
