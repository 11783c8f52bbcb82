//! The node guard's settings ([`NodeGuard`]) and the policy a manager
//! builds from them: the quarantine window and the clock interval in use.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

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
    trust_restarts: bool,
    clock_interval: Option<Duration>,
    clock_check: ClockCheck,
}

impl Default for NodeGuard {
    fn default() -> Self {
        Self {
            enabled: true,
            window: None,
            trust_restarts: false,
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

    /// How long a node stays quarantined at least after an unsafe restart
    /// (counted from its start), a lost data set or its last clock fault.
    /// It must cover the longest time any client of these nodes keeps a
    /// key (its longest TTL, or [`at_least`](crate::Request::at_least));
    /// the window in use is never shorter than the longest this manager
    /// has used (at least its default TTL), plus the longest
    /// `cluster-node-timeout` of its Redis Cluster members (read with
    /// their slot map: a master cut off from its cluster grants for up to
    /// that long after its replica took over), so set this only to cover
    /// other clients' longer ones.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::NodeGuard;
    ///
    /// // Other clients of these nodes take locks of up to 2 minutes.
    /// let guard = NodeGuard::default().quarantine_window(Duration::from_secs(120));
    /// # let _ = guard;
    /// ```
    pub fn quarantine_window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// Counts a node again at once after an unsafe restart, a lost data
    /// set or a clock fault: no quarantine window at all. **Unsafe** with
    /// real clients: such a node may have forgotten the locks it granted,
    /// and another client is then granted them again. For tests and
    /// benchmarks on nodes without persistence that nothing restarts;
    /// settings (eviction, replicas) and nodes that cannot be observed
    /// are still not counted.
    ///
    /// ```
    /// use quorumlock::NodeGuard;
    ///
    /// let guard = NodeGuard::default().trust_restarts();
    /// # let _ = guard;
    /// ```
    pub fn trust_restarts(mut self) -> Self {
        self.trust_restarts = true;
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
    /// The window set (a floor), if any.
    window: Option<Duration>,
    trust_restarts: bool,
    /// The longest a key of this manager lives, in ms: its longest TTL or
    /// `at_least` (the window is never shorter).
    longest_ttl_ms: AtomicU64,
    /// The longest `cluster-node-timeout` of its Redis Cluster members, in
    /// ms (0 without one): added to the longest TTL.
    cluster_node_timeout_ms: AtomicU64,
    /// The shortest window the manager's fencing allows (see
    /// [`Policy::with_window_of_at_least`]).
    shortest: Duration,
    drift_factor: f64,
    pub(crate) clock_interval: Duration,
    /// Which node each server process (`run_id`) was last observed behind,
    /// and when: a process met behind a second name is not counted there.
    processes: Mutex<HashMap<String, (String, Instant)>>,
}

impl Policy {
    pub(crate) fn new(guard: &NodeGuard, ttl: Duration, drift_factor: f64) -> Self {
        let (shortest, longest) = CLOCK_INTERVAL_RANGE;
        Self {
            enabled: guard.enabled,
            clock_check: guard.clock_check,
            window: guard.window,
            trust_restarts: guard.trust_restarts,
            longest_ttl_ms: AtomicU64::new(ttl.as_millis() as u64),
            cluster_node_timeout_ms: AtomicU64::new(0),
            shortest: Duration::ZERO,
            drift_factor,
            clock_interval: guard
                .clock_interval
                .unwrap_or_else(|| (ttl / 10).clamp(shortest, longest)),
            processes: Mutex::default(),
        }
    }

    /// This policy with a window of at least `shortest` (restarts trusted
    /// aside). Counter-node fencing asks for twice its failover margin: a
    /// token issued without the counter node is the margin above the
    /// clocks, and a node restarted without it must stay out until the
    /// counter node's clock is past that (see `counter_node_token`).
    pub(crate) fn with_window_of_at_least(mut self, shortest: Duration) -> Self {
        self.shortest = shortest;
        self
    }

    /// Node `node` was observed at `now` to run process `run_id` (having
    /// run `before`, if it was observed before): returns the other node
    /// that process was met behind first, if that node still shows it,
    /// and else notes it as `node`'s. A node not observed for two clock
    /// intervals (no longer used, e.g. an address a cluster no longer
    /// names) gives the process up: its verdicts, older than an interval,
    /// no longer cover any answer, so the two never count together.
    pub(crate) fn process_seen(
        &self,
        node: &str,
        run_id: &str,
        before: Option<&str>,
        now: Instant,
    ) -> Option<String> {
        let mut processes = self
            .processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(before) = before.filter(|&before| before != run_id)
            && processes
                .get(before)
                .is_some_and(|(owner, _)| owner == node)
        {
            processes.remove(before);
        }
        let given_up = now.checked_sub(self.clock_interval * 2);
        match processes.get(run_id) {
            Some((owner, seen))
                if owner != node && given_up.is_none_or(|given_up| *seen > given_up) =>
            {
                Some(owner.clone())
            }
            _ => {
                processes.insert(run_id.to_owned(), (node.to_owned(), now));
                None
            }
        }
    }

    /// Records how long a key the manager is about to set may live (a
    /// TTL, or an `at_least`): the window grows to cover it, so a node that
    /// may have lost the key is not counted while the key would still
    /// live.
    pub(crate) fn note_ttl(&self, ttl: Duration) {
        self.longest_ttl_ms.fetch_max(
            u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Records a Redis Cluster member's `cluster-node-timeout`: a master
    /// cut off from its cluster goes on granting for up to that long after
    /// its replica took over, so the window is the longest TTL plus it.
    pub(crate) fn note_cluster_node_timeout(&self, timeout: Duration) {
        self.cluster_node_timeout_ms.fetch_max(
            u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(crate) fn rules(&self) -> Rules {
        let longest = Duration::from_millis(self.longest_ttl_ms.load(Ordering::Relaxed))
            .saturating_add(Duration::from_millis(
                self.cluster_node_timeout_ms.load(Ordering::Relaxed),
            ));
        Rules {
            window: match self.window {
                _ if self.trust_restarts => Duration::ZERO,
                Some(window) => window.max(longest).max(self.shortest),
                None => longest.max(self.shortest),
            },
            drift_factor: self.drift_factor,
            sample_every: self.clock_interval,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window_of(guard: &NodeGuard, ttl: Duration) -> Duration {
        Policy::new(guard, ttl, 0.01).rules().window
    }

    #[test]
    fn a_process_counts_behind_the_first_name_it_was_met_behind() {
        // Clock interval: a second.
        let policy = Policy::new(&NodeGuard::default(), Duration::from_secs(10), 0.01);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(policy.process_seen("a:1", "p", None, at(0)), None);
        assert_eq!(
            policy.process_seen("a:1", "p", Some("p"), at(100)),
            None,
            "again"
        );
        assert_eq!(
            policy
                .process_seen("alias:1", "p", None, at(200))
                .as_deref(),
            Some("a:1"),
            "the same process behind another name"
        );
        // `a:1` restarts as process q: p is free, and q is a:1's.
        assert_eq!(policy.process_seen("a:1", "q", Some("p"), at(300)), None);
        assert_eq!(
            policy
                .process_seen("alias:1", "q", None, at(400))
                .as_deref(),
            Some("a:1")
        );
        assert_eq!(policy.process_seen("b:1", "p", None, at(500)), None);
        // `a:1` not observed for two intervals: the alias takes q over.
        assert_eq!(
            policy
                .process_seen("alias:1", "q", None, at(2_299))
                .as_deref(),
            Some("a:1")
        );
        assert_eq!(policy.process_seen("alias:1", "q", None, at(2_301)), None);
        assert_eq!(
            policy
                .process_seen("a:1", "q", Some("q"), at(2_400))
                .as_deref(),
            Some("alias:1")
        );
    }

    #[test]
    fn the_window_covers_every_key_the_manager_sets() {
        let s = Duration::from_secs;
        // Default: the longest TTL used, at least the default TTL.
        let policy = Policy::new(&NodeGuard::default(), s(10), 0.01);
        assert_eq!(policy.rules().window, s(10));
        policy.note_ttl(s(30));
        policy.note_ttl(s(5));
        assert_eq!(policy.rules().window, s(30));
        // A window set below a key's life is widened, not trusted.
        let short = NodeGuard::default().quarantine_window(s(2));
        assert_eq!(window_of(&short, s(10)), s(10));
        let policy = Policy::new(&short, s(10), 0.01);
        policy.note_ttl(s(3600));
        assert_eq!(policy.rules().window, s(3600), "an at_least of an hour");
        // A Redis Cluster member's node timeout is added to the longest key.
        let policy = Policy::new(&NodeGuard::default(), s(10), 0.01);
        policy.note_cluster_node_timeout(s(15));
        policy.note_cluster_node_timeout(s(1));
        assert_eq!(policy.rules().window, s(25));
        let set = Policy::new(&NodeGuard::default().quarantine_window(s(20)), s(10), 0.01);
        set.note_cluster_node_timeout(s(15));
        assert_eq!(
            set.rules().window,
            s(25),
            "a window set below TTL + node timeout"
        );
        // A longer one (other clients' TTLs) stays.
        let long = NodeGuard::default().quarantine_window(s(120));
        assert_eq!(window_of(&long, s(10)), s(120));
        // Only the named opt-out has none.
        assert_eq!(
            window_of(&NodeGuard::default().trust_restarts(), s(10)),
            Duration::ZERO
        );
        assert_eq!(
            window_of(
                &NodeGuard::default().quarantine_window(Duration::ZERO),
                s(10)
            ),
            s(10)
        );
        // Counter-node fencing's floor, over a TTL below it.
        let fenced = Policy::new(&NodeGuard::default(), Duration::from_millis(300), 0.01)
            .with_window_of_at_least(s(2));
        assert_eq!(fenced.rules().window, s(2));
        fenced.note_ttl(s(3));
        assert_eq!(fenced.rules().window, s(3));
        let trusting = Policy::new(&NodeGuard::default().trust_restarts(), s(1), 0.01)
            .with_window_of_at_least(s(2));
        assert_eq!(trusting.rules().window, Duration::ZERO);
    }
}
