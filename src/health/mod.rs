//! How available the lock service is, as this manager sees it:
//! [`LockManager::health`](crate::LockManager::health), its change feed,
//! and the [`CircuitBreaker`].
//!
//! Health is computed from what the manager already observes, with no
//! requests of its own: each node is *not asked* until a request to it is
//! answered (then *up*) or fails (a timeout, a refused connection, a
//! Redis error: then *failing*, until a request to it succeeds), and
//! *quarantined* while the node guard does not count it
//! ([`crate::guard`]). From that:
//!
//! - [`HealthState::Unknown`]: some node was never asked, and the nodes
//!   that were do not already make the service unavailable. A manager
//!   just built is here until its first request has been answered.
//! - [`HealthState::Healthy`]: every node is up.
//! - [`HealthState::Degraded`]: some node is failing or quarantined, but a
//!   quorum is up (the fencing counter node among them or not).
//! - [`HealthState::Unavailable`]: fewer than a quorum are up or not yet
//!   asked, or the circuit breaker is holding calls back.
//!
//! A node is seen to fail or recover only by traffic, so a manager that
//! sends nothing keeps its last picture (unknown before the first
//! request); the end of a quarantine window or of the breaker's
//! cool-down is published by a timer. It is cheap to call: no I/O, an
//! atomic load or two per node and one short lock.

mod breaker;

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::guard::judge::Quarantine;
use crate::quorum;
use crate::retry::Class;
use crate::telemetry;

use breaker::{Breaker, Verdict};
pub use breaker::{
    BreakerState, CircuitBreaker, DEFAULT_BREAKER_COOL_DOWN, DEFAULT_BREAKER_FAILURES,
};

/// The lock service's availability, as this manager sees it now.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::HealthState;
///
/// assert_eq!(manager.health().state, HealthState::Unknown); // nothing asked yet
/// manager.lock("probe").await?.release().await?;
/// # manager.settle().await;
/// let health = manager.health();
/// assert_eq!((health.state, health.nodes_up, health.quorum), (HealthState::Healthy, 3, 2));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Healthy, degraded or unavailable (see the [module docs](self)).
    pub state: HealthState,
    /// Each node, in configuration order.
    pub nodes: Vec<NodeHealth>,
    /// Nodes up (answered, and neither failing nor quarantined).
    pub nodes_up: usize,
    /// Nodes that must agree.
    pub quorum: usize,
    /// Acquisition attempts in a row that found the service unavailable
    /// (reset by any attempt that was decided, acquired or contended).
    pub consecutive_unavailable: u32,
    /// The circuit breaker.
    pub breaker: BreakerState,
}

/// One node in a [`Health`] report.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::health::NodeStatus;
///
/// cluster.kill(2)?;
/// manager.lock("probe").await?.release().await?;
/// # manager.settle().await;
/// let down: Vec<String> = manager
///     .health()
///     .nodes
///     .into_iter()
///     .filter(|node| node.status != NodeStatus::Up)
///     .map(|node| node.node) // host:port
///     .collect();
/// assert_eq!(down, [cluster.url(2)?.trim_start_matches("redis://")]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeHealth {
    /// `host:port`.
    pub node: String,
    /// Not asked yet, up, failing or quarantined.
    pub status: NodeStatus,
}

/// What the manager last saw of a node.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::health::NodeStatus;
///
/// assert!(manager.health().nodes.iter().all(|n| n.status == NodeStatus::NotAsked));
/// manager.lock("probe").await?.release().await?;
/// # manager.settle().await;
/// assert!(manager.health().nodes.iter().all(|n| n.status == NodeStatus::Up));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeStatus {
    /// No request to it has been answered or has failed yet.
    NotAsked,
    /// Its last request was answered.
    Up,
    /// Its last request failed: timeout, connection or Redis error.
    Failing,
    /// The node guard does not count it now.
    Quarantined,
}

/// The summary of a [`Health`].
///
/// ```
/// use quorumlock::HealthState;
///
/// // Ordered as the gauge is: unknown, then from best to worst.
/// assert!(HealthState::Unknown < HealthState::Healthy);
/// assert!(HealthState::Healthy < HealthState::Degraded);
/// assert!(HealthState::Degraded < HealthState::Unavailable);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum HealthState {
    /// Not known yet: some node was never asked (no request to it was
    /// answered or failed), and the nodes asked do not already make the
    /// service unavailable. A manager just built reports this until its
    /// first request is answered; it says nothing about the nodes.
    Unknown,
    /// Every node is up.
    Healthy,
    /// Some node is failing or quarantined; locks are still served.
    Degraded,
    /// Locks cannot be served now.
    Unavailable,
}

impl HealthState {
    /// `unknown`, `healthy`, `degraded` or `unavailable`.
    ///
    /// ```
    /// use quorumlock::HealthState;
    ///
    /// assert_eq!(HealthState::Degraded.label(), "degraded");
    /// ```
    pub fn label(self) -> &'static str {
        match self {
            HealthState::Unknown => "unknown",
            HealthState::Healthy => "healthy",
            HealthState::Degraded => "degraded",
            HealthState::Unavailable => "unavailable",
        }
    }

    /// The value of the `quorumlock_health_state` gauge: 0, 1 or 2; -1
    /// while unknown (below every alert threshold: a service that has not
    /// sent a request yet is no outage).
    ///
    /// ```
    /// use quorumlock::HealthState;
    ///
    /// assert_eq!(HealthState::Unknown.gauge(), -1.0);
    /// assert_eq!(HealthState::Healthy.gauge(), 0.0);
    /// assert_eq!(HealthState::Unavailable.gauge(), 2.0);
    /// ```
    pub fn gauge(self) -> f64 {
        match self {
            HealthState::Unknown => -1.0,
            HealthState::Healthy => 0.0,
            HealthState::Degraded => 1.0,
            HealthState::Unavailable => 2.0,
        }
    }
}

/// How many of a board's nodes are in each status that decides its state.
#[derive(Debug, Clone, Copy)]
struct Counts {
    total: usize,
    up: usize,
    not_asked: usize,
}

/// The state for `nodes`, and whether the breaker holds calls back. No
/// node is needed more than another: without the fencing counter node,
/// locks go on (with a second round trip).
fn state_of(nodes: Counts, held_back: bool) -> HealthState {
    let Counts {
        total,
        up,
        not_asked,
    } = nodes;
    if held_back || up + not_asked < quorum::quorum(total) {
        HealthState::Unavailable
    } else if not_asked > 0 {
        HealthState::Unknown
    } else if up < total {
        HealthState::Degraded
    } else {
        HealthState::Healthy
    }
}

/// What a manager knows of its nodes' availability, fed by the nodes'
/// requests and the acquisition attempts, published on change (and when a
/// quarantine window or the breaker's cool-down ends).
pub(crate) struct Board {
    names: Box<[String]>,
    /// Per node: [`NOT_ASKED`], [`ANSWERED`] or [`FAILING`], as its last
    /// request ended.
    heard: Box<[AtomicU8]>,
    /// Per node: [`COUNTED`], [`UNTIL_RECONFIGURED`], or quarantined until
    /// `epoch` plus this many milliseconds.
    quarantined_until: Box<[AtomicU64]>,
    epoch: Instant,
    attempts: Mutex<Attempts>,
    /// Whether `attempts` holds a breaker: without one, admitting an
    /// attempt takes no lock.
    has_breaker: bool,
    /// Set once its manager is gone: background work that outlives it
    /// (a connect, a drained request) no longer moves the process's
    /// gauges, which another manager may be reporting through.
    retired: AtomicBool,
    feed: watch::Sender<Health>,
    /// The timer that publishes the next change by time: when it fires,
    /// and its task.
    timer: Mutex<Option<(Instant, tokio::task::AbortHandle)>>,
}

const NOT_ASKED: u8 = 0;
const ANSWERED: u8 = 1;
const FAILING: u8 = 2;

const COUNTED: u64 = 0;
const UNTIL_RECONFIGURED: u64 = u64::MAX;

/// What the acquisition attempts said, kept together so that the count
/// and the breaker move as one.
struct Attempts {
    /// Unavailable attempts in a row.
    consecutive: u32,
    breaker: Option<Breaker>,
}

impl Board {
    pub(crate) fn new(names: Vec<String>, breaker: Option<CircuitBreaker>) -> Arc<Self> {
        let (feed, _) = watch::channel(Health {
            state: HealthState::Unknown,
            nodes: Vec::new(),
            nodes_up: 0,
            quorum: 0,
            consecutive_unavailable: 0,
            breaker: BreakerState::Off,
        });
        let board = Arc::new(Self {
            heard: names.iter().map(|_| AtomicU8::new(NOT_ASKED)).collect(),
            quarantined_until: names.iter().map(|_| AtomicU64::new(COUNTED)).collect(),
            epoch: Instant::now(),
            names: names.into(),
            has_breaker: breaker.is_some(),
            retired: AtomicBool::new(false),
            attempts: Mutex::new(Attempts {
                consecutive: 0,
                breaker: breaker.map(Breaker::new),
            }),
            feed,
            timer: Mutex::new(None),
        });
        // The first picture, without touching the gauges: they are the
        // process's, and another manager may be reporting through them.
        board.feed.send_replace(board.snapshot());
        board
    }

    /// Its manager is gone: the gauges are no longer its to move.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    /// The handle node `index` reports its requests' outcomes through.
    pub(crate) fn reporter(self: &Arc<Self>, index: usize) -> Reporter {
        Reporter(Some((Arc::clone(self), index)))
    }

    /// The picture now.
    pub(crate) fn snapshot(&self) -> Health {
        let now = Instant::now();
        let (consecutive, breaker) = {
            let attempts = lock(&self.attempts);
            let breaker = attempts
                .breaker
                .as_ref()
                .map_or(BreakerState::Off, |b| b.state(now));
            (attempts.consecutive, breaker)
        };
        let nodes: Vec<NodeHealth> = (0..self.names.len())
            .map(|i| NodeHealth {
                node: self.names[i].clone(),
                status: self.status_of(i, now),
            })
            .collect();
        let count = |status| nodes.iter().filter(|n| n.status == status).count();
        let nodes_up = count(NodeStatus::Up);
        let counts = Counts {
            total: nodes.len(),
            up: nodes_up,
            not_asked: count(NodeStatus::NotAsked),
        };
        Health {
            state: state_of(counts, breaker.holds_calls_back(now)),
            quorum: quorum::quorum(nodes.len()),
            nodes,
            nodes_up,
            consecutive_unavailable: consecutive,
            breaker,
        }
    }

    /// A feed of the picture, updated whenever it changes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Health> {
        self.feed.subscribe()
    }

    /// The error the breaker would refuse a call with now, without letting
    /// a probe out.
    pub(crate) fn refusal(&self) -> Result<()> {
        let attempts = lock(&self.attempts);
        match attempts
            .breaker
            .as_ref()
            .and_then(|b| b.refusal(Instant::now()))
        {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Asks the breaker (if any) whether an acquisition attempt may go to
    /// the nodes; the answer must be told how the attempt ended.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Admission> {
        let verdict = match self.has_breaker {
            false => Verdict::Pass,
            true => lock(&self.attempts)
                .breaker
                .as_mut()
                .map_or(Verdict::Pass, |b| b.admit(Instant::now())),
        };
        let probe = match verdict {
            Verdict::Pass => None,
            Verdict::Probe(id) => {
                tracing::info!("circuit breaker: cool-down over, probing the nodes");
                self.publish();
                Some(id)
            }
            Verdict::Refuse(error) => {
                telemetry::breaker_refused();
                return Err(error);
            }
        };
        Ok(Admission {
            board: Arc::clone(self),
            probe,
            finished: false,
        })
    }

    fn status_of(&self, i: usize, now: Instant) -> NodeStatus {
        let until = self.quarantined_until[i].load(Ordering::Relaxed);
        let quarantined = match until {
            COUNTED => false,
            UNTIL_RECONFIGURED => true,
            ms => now < self.epoch + Duration::from_millis(ms),
        };
        if quarantined {
            NodeStatus::Quarantined
        } else {
            match self.heard[i].load(Ordering::Relaxed) {
                NOT_ASKED => NodeStatus::NotAsked,
                FAILING => NodeStatus::Failing,
                _ => NodeStatus::Up,
            }
        }
    }

    /// Records how node `i`'s last request ended ([`ANSWERED`] or
    /// [`FAILING`]), publishing if that changed its status.
    fn set_heard(self: &Arc<Self>, i: usize, heard: u8) {
        let Some(slot) = self.heard.get(i) else {
            return;
        };
        // The common case (no change) is one load, no write.
        if slot.load(Ordering::Relaxed) != heard && slot.swap(heard, Ordering::Relaxed) != heard {
            self.publish();
        }
    }

    /// Records node `i`'s quarantine as the guard sees it now.
    fn set_quarantine(self: &Arc<Self>, i: usize, quarantine: Option<&Quarantine>) {
        let Some(slot) = self.quarantined_until.get(i) else {
            return;
        };
        let value = match quarantine {
            None => COUNTED,
            Some(Quarantine {
                remaining: None, ..
            }) => UNTIL_RECONFIGURED,
            Some(Quarantine {
                remaining: Some(left),
                ..
            }) => {
                let until = Instant::now().saturating_duration_since(self.epoch) + *left;
                u64::try_from(until.as_millis())
                    .unwrap_or(UNTIL_RECONFIGURED - 1)
                    .clamp(1, UNTIL_RECONFIGURED - 1)
            }
        };
        let old = slot.load(Ordering::Relaxed);
        // The same window seen again a moment later reads a millisecond or
        // two off: not a change.
        let same_window = |a: u64, b: u64| {
            a == b
                || (![a, b]
                    .iter()
                    .any(|v| matches!(*v, COUNTED | UNTIL_RECONFIGURED))
                    && a.abs_diff(b) <= 10)
        };
        if !same_window(old, value) && slot.swap(value, Ordering::Relaxed) != value {
            self.publish();
        }
    }

    fn finished(self: &Arc<Self>, probe: Option<u64>, failure: Option<Class>) {
        let now = Instant::now();
        let mut attempts = lock(&self.attempts);
        let before = attempts.consecutive;
        attempts.consecutive = match failure {
            Some(Class::Unavailable) => before.saturating_add(1),
            // A corrupt counter says nothing about availability.
            Some(Class::Final) => before,
            None | Some(Class::Contended) => 0,
        };
        let consecutive = attempts.consecutive;
        let mut moved = false;
        if let Some(breaker) = &mut attempts.breaker {
            let was = breaker.state(now);
            breaker.record(probe, failure, consecutive, now);
            let is = breaker.state(now);
            if was != is {
                moved = true;
                announce_breaker(is, consecutive);
            }
        }
        // A probe that closed the breaker starts the count afresh.
        if moved && attempts.breaker.as_ref().map(|b| b.state(now)) == Some(BreakerState::Closed) {
            attempts.consecutive = 0;
        }
        let changed = moved || attempts.consecutive != before;
        drop(attempts);
        // The common case (a decided attempt after decided ones) changes
        // nothing and takes no other lock.
        if changed {
            self.publish();
        }
    }

    fn probe_abandoned(self: &Arc<Self>, probe: u64) {
        if let Some(breaker) = &mut lock(&self.attempts).breaker {
            breaker.probe_abandoned(probe, Instant::now());
        }
        self.publish();
    }

    /// Sends the picture to the feed (and the gauges) if it changed, and
    /// sets a timer for the next change that time alone makes.
    fn publish(self: &Arc<Self>) {
        // Taken under the feed's lock, so that of two racing updates the
        // later picture is the one that stays.
        self.feed.send_if_modified(|current| {
            let health = self.snapshot();
            if *current == health {
                return false;
            }
            if current.state != health.state {
                tracing::info!(
                    from = current.state.label(),
                    to = health.state.label(),
                    nodes_up = health.nodes_up,
                    "lock service health changed"
                );
            }
            if !self.retired.load(Ordering::Relaxed) {
                telemetry::health_changed(telemetry::HealthGauges {
                    state: health.state.gauge(),
                    nodes_up: health.nodes_up,
                    consecutive_unavailable: health.consecutive_unavailable,
                    breaker_open: health.breaker.holds_calls_back(Instant::now()),
                });
            }
            *current = health;
            true
        });
        if let Some(at) = self.next_change() {
            self.publish_at(at);
        }
    }

    /// The earliest future moment at which the picture changes by itself:
    /// a quarantine window or the breaker's cool-down ends.
    fn next_change(&self) -> Option<Instant> {
        let now = Instant::now();
        let windows =
            self.quarantined_until
                .iter()
                .filter_map(|slot| match slot.load(Ordering::Relaxed) {
                    COUNTED | UNTIL_RECONFIGURED => None,
                    ms => Some(self.epoch + Duration::from_millis(ms)),
                });
        let breaker = lock(&self.attempts)
            .breaker
            .as_ref()
            .and_then(Breaker::next_change);
        windows.chain(breaker).filter(|&at| at > now).min()
    }

    /// Publishes again at `at` (unless a timer fires sooner), on the
    /// runtime we run on; without one, the next request publishes.
    fn publish_at(self: &Arc<Self>, at: Instant) {
        let mut timer = lock(&self.timer);
        // A timer that fires no later stands, unless its task is gone (its
        // runtime shut down before it ran).
        if let Some((pending, task)) = &*timer {
            if *pending <= at && !task.is_finished() {
                return;
            }
            task.abort();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            *timer = None;
            return;
        };
        let board = Arc::downgrade(self);
        let task = runtime.spawn(async move {
            // A millisecond late, so that `now < until` has turned.
            tokio::time::sleep_until(at + Duration::from_millis(1)).await;
            if let Some(board) = board.upgrade() {
                lock(&board.timer).take_if(|(pending, _)| *pending == at);
                board.publish();
            }
        });
        *timer = Some((at, task.abort_handle()));
    }
}

fn announce_breaker(state: BreakerState, consecutive: u32) {
    match state {
        BreakerState::Open { .. } => tracing::warn!(
            consecutive,
            "circuit breaker open: acquisitions fail fast until the cool-down ends"
        ),
        BreakerState::Closed => tracing::info!("circuit breaker closed: the probe was decided"),
        BreakerState::Off | BreakerState::Probing | BreakerState::ProbeDue => {}
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update leaves the state consistent: a panic elsewhere while
    // holding it leaves nothing half-done.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An acquisition attempt the breaker let through. Its outcome must be
/// given to [`finish`](Self::finish); dropped without one (the attempt
/// was cancelled), a probe hands its turn to the next call.
pub(crate) struct Admission {
    board: Arc<Board>,
    /// The probe's number, if it is the probe.
    probe: Option<u64>,
    finished: bool,
}

impl Admission {
    /// The attempt was decided (`Ok`) or failed with `error`.
    pub(crate) fn finish<T>(mut self, outcome: &Result<T, Error>) {
        self.finished = true;
        let failure = outcome.as_ref().err().map(Class::of);
        self.board.finished(self.probe, failure);
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let (false, Some(probe)) = (self.finished, self.probe) {
            self.board.probe_abandoned(probe);
        }
    }
}

/// How one node tells the board what became of its requests (nothing,
/// for a node that is no lock node).
#[derive(Clone)]
pub(crate) struct Reporter(Option<(Arc<Board>, usize)>);

impl Reporter {
    /// For a node whose outcomes nobody follows (fenced storage).
    pub(crate) fn none() -> Self {
        Self(None)
    }

    pub(crate) fn answered(&self) {
        if let Some((board, i)) = &self.0 {
            board.set_heard(*i, ANSWERED);
        }
    }

    pub(crate) fn failed(&self) {
        if let Some((board, i)) = &self.0 {
            board.set_heard(*i, FAILING);
        }
    }

    /// The guard's view of the node now (`None`: counted).
    pub(crate) fn quarantine(&self, quarantine: Option<&Quarantine>) {
        if let Some((board, i)) = &self.0 {
            board.set_quarantine(*i, quarantine);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HealthState::*;

    #[test]
    fn state_follows_nodes_up_and_the_breaker() {
        // (total, up, not asked, held back) → state
        let table = [
            (5, 5, 0, false, Healthy),
            (5, 4, 0, false, Degraded),
            (5, 3, 0, false, Degraded),
            (5, 2, 0, false, Unavailable),
            (5, 5, 0, true, Unavailable),
            (3, 2, 0, false, Degraded),
            (1, 1, 0, false, Healthy),
            (1, 0, 0, false, Unavailable),
            (4, 2, 0, false, Unavailable),
            // Not asked yet: unknown, unless what is known already decides.
            (5, 0, 5, false, Unknown),
            (5, 3, 2, false, Unknown),
            (5, 1, 2, false, Unknown),
            (5, 0, 2, false, Unavailable),
            (5, 0, 5, true, Unavailable),
        ];
        for (total, up, not_asked, held, expected) in table {
            let counts = Counts {
                total,
                up,
                not_asked,
            };
            assert_eq!(
                state_of(counts, held),
                expected,
                "{up}/{total} up, {not_asked} not asked, held back {held}"
            );
        }
    }

    #[tokio::test]
    async fn the_feed_sees_each_change_once() {
        let names = (1..=3).map(|i| format!("n{i}")).collect();
        let board = Board::new(names, None);
        let mut feed = board.subscribe();
        assert_eq!(feed.borrow_and_update().state, Unknown);
        let nodes: Vec<_> = (0..3).map(|i| board.reporter(i)).collect();
        nodes[1].answered();
        nodes[2].answered();
        assert_eq!(feed.borrow_and_update().state, Unknown, "node 0 not asked");
        nodes[0].failed();
        assert!(feed.has_changed().unwrap());
        assert_eq!(feed.borrow_and_update().state, Degraded);
        // The same outcome again changes nothing.
        nodes[0].failed();
        assert!(!feed.has_changed().unwrap());
        let settings = Quarantine {
            reason: crate::guard::QuarantineReason::Replica {
                role: "slave".into(),
            },
            remaining: None,
        };
        nodes[1].quarantine(Some(&settings));
        assert_eq!(feed.borrow_and_update().state, Unavailable);
        nodes[0].answered();
        nodes[1].quarantine(None);
        let health = feed.borrow_and_update().clone();
        assert_eq!((health.state, health.nodes_up), (Healthy, 3));
    }

    #[tokio::test]
    async fn the_end_of_a_quarantine_window_is_published_without_traffic() {
        let board = Board::new(vec!["n1".into(), "n2".into(), "n3".into()], None);
        for i in 0..3 {
            board.reporter(i).answered();
        }
        let mut feed = board.subscribe();
        let restart = Quarantine {
            reason: crate::guard::QuarantineReason::Restarted {
                cause: "restarted with appendfsync everysec".into(),
            },
            remaining: Some(std::time::Duration::from_millis(30)),
        };
        board.reporter(0).quarantine(Some(&restart));
        assert_eq!(feed.borrow_and_update().state, Degraded);
        tokio::time::timeout(std::time::Duration::from_secs(5), feed.changed())
            .await
            .expect("the window's end was published")
            .expect("the board lives");
        assert_eq!(feed.borrow_and_update().state, Healthy);
    }

    #[tokio::test]
    async fn the_end_of_a_cool_down_is_published_without_traffic() {
        let breaker = CircuitBreaker::default()
            .failures(1)
            .cool_down(std::time::Duration::from_millis(30));
        let board = Board::new(vec!["n".into()], Some(breaker));
        board.reporter(0).answered();
        let mut feed = board.subscribe();
        let unavailable: Result<()> = Err(Error::TooSlow {
            resource: "r".into(),
            elapsed: std::time::Duration::ZERO,
            ttl: std::time::Duration::ZERO,
        });
        board.admit().expect("closed").finish(&unavailable);
        assert_eq!(feed.borrow_and_update().state, Unavailable);
        tokio::time::timeout(std::time::Duration::from_secs(5), feed.changed())
            .await
            .expect("the cool-down's end was published")
            .expect("the board lives");
        let health = feed.borrow_and_update().clone();
        assert_eq!(
            (health.state, health.breaker),
            (Healthy, BreakerState::ProbeDue)
        );
    }

    #[tokio::test]
    async fn a_dropped_probe_hands_the_turn_on() {
        let board = Board::new(
            vec!["n".into()],
            Some(
                CircuitBreaker::default()
                    .failures(1)
                    .cool_down(std::time::Duration::from_millis(1)),
            ),
        );
        board.reporter(0).answered();
        let unavailable: Result<()> = Err(Error::TooSlow {
            resource: "r".into(),
            elapsed: std::time::Duration::ZERO,
            ttl: std::time::Duration::ZERO,
        });
        board.admit().expect("closed").finish(&unavailable);
        assert_eq!(board.snapshot().state, Unavailable);
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let probe = board.admit().expect("cool-down over");
        assert!(board.admit().is_err(), "a second probe was let out");
        drop(probe);
        let again = board.admit().expect("the next call probes");
        again.finish(&Ok::<(), Error>(()));
        assert_eq!(board.snapshot().breaker, BreakerState::Closed);
        assert_eq!(board.snapshot().state, Healthy);
    }
}
