//! Node guards: the client enforces the rules Redlock's safety rests on.
//!
//! Redlock is safe only while (a) a node that lost data stays out of the
//! quorum for longer than the longest TTL, (b) node clocks run at rates
//! within `drift_factor` and never jump, (c) nodes never evict lock keys,
//! and (d) nodes are independent masters. Each [`LockManager`] watches
//! every node it uses and *quarantines* one that breaks a rule: its answers
//! count as failures (never as grants or refusals), no key is set or
//! extended on it, while rollbacks and releases are still sent to it.
//!
//! - **Observed on connect** (in the round trip that already loads the
//!   scripts): `INFO` gives `run_id`, uptime, `aof_enabled`, `maxmemory`,
//!   `maxmemory_policy` and `role`; `CONFIG GET appendfsync` gives the fsync
//!   policy. Where `CONFIG` is renamed or forbidden the node is assumed
//!   *not* to fsync every write; where `INFO` fails, restarts cannot be
//!   seen and the last settings verdict stands (run `quorumlock doctor`);
//!   a known node that cannot be observed on a reconnect is quarantined
//!   for the window. Quarantined nodes are observed again once per clock
//!   interval while the manager is used.
//! - **Restart quarantine**: a node that does not persist every write
//!   (`appendonly yes` + `appendfsync always`) and restarted since we last
//!   saw it (new `run_id`), or that we meet for the first time, is not
//!   counted until it has been up for the quarantine window (never counted
//!   from before the old process last answered: uptime follows the node's
//!   wall clock).
//! - **Clock guard**: every request that sets or extends a key carries a
//!   `TIME` in the same write; quarantined nodes, which get no such
//!   requests, are observed again once per
//!   [`clock_interval`](NodeGuard::clock_interval). Each sample is judged
//!   against earlier ones with bounds from the round trips
//!   ([`judge::clock_fault`]), before the answer it came with is counted,
//!   so a forward jump cannot grant a lock. A node whose clock runs outside
//!   `drift_factor` or jumped (steps up to 1 ms are waited out) is
//!   quarantined until a window after it last looked wrong.
//! - **Eviction and role**: a replica, or a node with a memory limit and a
//!   `maxmemory-policy` other than `noeviction`, is quarantined until it is
//!   reconfigured and reconnected — by default, not only in a strict mode:
//!   an evicted lock key is a lock granted twice, silently, and the fix is
//!   one line of configuration. A policy without a memory limit
//!   (`maxmemory 0`) cannot evict and is only warned about by the doctor.
//!
//! What it cannot see: a fault in the moment before its first sample (a
//! node met for the first time is counted at once; a rate error shows once
//! the samples lie a few round trips apart), settings changed with `CONFIG
//! SET` on a live connection, and a node whose disk lies about fsync.
//!
//! [`judge`] is the pure part, shared with `quorumlock doctor`.
//!
//! [`LockManager`]: crate::LockManager

mod health;
pub mod judge;
mod observe;
mod watch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub(crate) use health::Rules;
pub use judge::{ClockFault, ClockSample, NodeFacts, Quarantine, QuarantineReason};
pub use observe::facts_from_info;
pub(crate) use observe::{micros_of, observe};
pub(crate) use watch::NodeWatch;

/// The shortest and longest default clock sampling interval.
const CLOCK_INTERVAL_RANGE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(1));

/// Settings of the node guard; see the [module docs](self). The default is
/// on, with a quarantine window of the longest TTL the manager has used
/// (at least its default TTL) and a clock interval of a tenth of the
/// default TTL (between 10 ms and 1 s).
///
/// ```
/// use std::time::Duration;
/// use quorumlock::{LockManager, NodeGuard};
///
/// let manager = LockManager::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .node_guard(NodeGuard::default().quarantine_window(Duration::from_secs(60)))
///     .build()?;
/// # let _ = manager;
/// # Ok::<(), quorumlock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct NodeGuard {
    enabled: bool,
    window: Option<Duration>,
    clock_interval: Option<Duration>,
}

impl Default for NodeGuard {
    fn default() -> Self {
        Self {
            enabled: true,
            window: None,
            clock_interval: None,
        }
    }
}

impl NodeGuard {
    /// No guard: every node counts whatever it says of itself (and no
    /// `TIME` is sent), as in other Redlock clients. For tests of the guard
    /// itself, and for nodes that cannot be made to follow the rules.
    ///
    /// ```
    /// use quorumlock::{LockManager, NodeGuard};
    ///
    /// assert!(!NodeGuard::disabled().is_enabled());
    /// let manager = LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .node_guard(NodeGuard::disabled())
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    /// How long a node stays quarantined after an unsafe restart (counted
    /// from its start) or its last clock fault. It must cover the longest
    /// TTL any client of these nodes uses; the default covers the longest
    /// this manager has used, at least its default TTL. Zero trusts
    /// restarted nodes at once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::NodeGuard;
    ///
    /// // Clients of these nodes take locks of at most 2 minutes.
    /// let guard = NodeGuard::default().quarantine_window(Duration::from_secs(120));
    /// # let _ = guard;
    /// ```
    pub fn quarantine_window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// How often a quarantined node is observed again (settings and clock)
    /// while the manager is in use; the others have their clock read by
    /// every request that sets a key. Default: a tenth of the default TTL,
    /// between 10 ms and 1 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::NodeGuard;
    ///
    /// let guard = NodeGuard::default().clock_interval(Duration::from_millis(250));
    /// # let _ = guard;
    /// ```
    pub fn clock_interval(mut self, interval: Duration) -> Self {
        self.clock_interval = Some(interval);
        self
    }

    /// Whether it is on.
    ///
    /// ```
    /// use quorumlock::NodeGuard;
    ///
    /// assert!(NodeGuard::default().is_enabled());
    /// assert!(!NodeGuard::disabled().is_enabled());
    /// ```
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if self.clock_interval.is_some_and(|i| i.is_zero()) {
            return Err("the clock interval must be greater than zero; e.g. 100 ms".into());
        }
        Ok(())
    }
}

/// The guard as one manager runs it, shared by its nodes.
#[derive(Debug)]
pub(crate) struct Policy {
    pub(crate) enabled: bool,
    window: Option<Duration>,
    /// The longest TTL the manager has used, in ms (the default window).
    longest_ttl_ms: AtomicU64,
    drift_factor: f64,
    pub(crate) clock_interval: Duration,
}

impl Policy {
    pub(crate) fn new(guard: &NodeGuard, ttl: Duration, drift_factor: f64) -> Self {
        let (shortest, longest) = CLOCK_INTERVAL_RANGE;
        Self {
            enabled: guard.enabled,
            window: guard.window,
            longest_ttl_ms: AtomicU64::new(ttl.as_millis() as u64),
            drift_factor,
            clock_interval: guard
                .clock_interval
                .unwrap_or_else(|| (ttl / 10).clamp(shortest, longest)),
        }
    }

    /// Records a TTL the manager is about to use (the default window
    /// grows to cover it).
    pub(crate) fn note_ttl(&self, ttl: Duration) {
        self.longest_ttl_ms
            .fetch_max(ttl.as_millis() as u64, Ordering::Relaxed);
    }

    pub(crate) fn rules(&self) -> Rules {
        Rules {
            window: self.window.unwrap_or_else(|| {
                Duration::from_millis(self.longest_ttl_ms.load(Ordering::Relaxed))
            }),
            drift_factor: self.drift_factor,
            sample_every: self.clock_interval,
        }
    }
}
