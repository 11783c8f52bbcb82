//! The node guard's settings ([`NodeGuard`]) and the policy a manager
//! builds from them: the quarantine window and the clock interval in use.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::health::Rules;

/// The shortest and longest default clock sampling interval.
const CLOCK_INTERVAL_RANGE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(1));

/// Settings of the node guard; see the [module docs](crate::guard). The default is
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
    clock_check: ClockCheck,
}

impl Default for NodeGuard {
    fn default() -> Self {
        Self {
            enabled: true,
            window: None,
            clock_interval: None,
            clock_check: ClockCheck::EveryRequest,
        }
    }
}

/// How often the clock guard reads the clock of a node it counts; see
/// [`NodeGuard::clock_check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClockCheck {
    /// With every request that sets or extends a key, in the same write
    /// (the default): an answer counts only if the clock read in its own
    /// round trip shows no fault, so a step made before that reading
    /// cannot grant a lock.
    #[default]
    EveryRequest,
    /// With one key-setting request per
    /// [`clock_interval`](NodeGuard::clock_interval) and node. A fault is
    /// seen at the first sample after it, so for up to a clock interval
    /// (plus a round trip; two intervals and the node timeout when the
    /// request that took a sample failed) after a step, grants from that
    /// node still count: keys it expired early may be granted twice. Keep
    /// the interval well below the shortest TTL in use. It saves a
    /// command, its reply and its bookkeeping per node and request: a
    /// quarter to a third of the client's CPU per lock and a tenth of the
    /// servers' (docs/performance.md). Restarts, eviction and role are
    /// guarded as with [`EveryRequest`](Self::EveryRequest).
    Sampled,
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
    /// every request that sets a key (or, with [`ClockCheck::Sampled`], by
    /// one such request per interval). Default: a tenth of the default
    /// TTL, between 10 ms and 1 s.
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

    /// How often the clock of a node that counts is read:
    /// [`ClockCheck::EveryRequest`] (the default) or, trading the gap it
    /// describes for throughput, [`ClockCheck::Sampled`].
    ///
    /// ```
    /// use quorumlock::{ClockCheck, NodeGuard};
    ///
    /// let guard = NodeGuard::default().clock_check(ClockCheck::Sampled);
    /// # let _ = guard;
    /// ```
    pub fn clock_check(mut self, check: ClockCheck) -> Self {
        self.clock_check = check;
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
    pub(crate) clock_check: ClockCheck,
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
            clock_check: guard.clock_check,
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
