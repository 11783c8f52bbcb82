//! The circuit breaker's rules, free of I/O: when acquisitions stop going
//! to the nodes, and how one probe decides whether they start again.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;
use crate::retry::Class;

/// Default consecutive unavailable attempts that open the breaker.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
/// Default time an open breaker fails calls before it lets a probe out.
pub const DEFAULT_BREAKER_COOL_DOWN: Duration = Duration::from_secs(10);

/// Settings of the circuit breaker (off unless given to
/// [`LockManagerBuilder::circuit_breaker`](crate::LockManagerBuilder::circuit_breaker)).
///
/// After [`failures`](Self::failures) acquisition attempts in a row found
/// the lock service unavailable (see [`Error::is_unavailable`]; contended
/// attempts never count, and any decided attempt resets the count), the
/// breaker *opens*: for [`cool_down`](Self::cool_down) every acquiring
/// call fails at once with [`Error::CircuitOpen`], without network I/O.
/// Then the next call is let through as the one *probe*: if its attempt
/// is decided (acquired, or refused because the resource is held), the
/// breaker closes; if it is unavailable again, the breaker opens for
/// another cool-down. While the probe is out, other calls fail fast too.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::CircuitBreaker;
///
/// // 5 in a row, 10 s cool-down:
/// let default = CircuitBreaker::default();
/// let eager = CircuitBreaker::default().failures(3).cool_down(Duration::from_secs(2));
/// # let _ = (default, eager);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    failures: u32,
    cool_down: Duration,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self {
            failures: DEFAULT_BREAKER_FAILURES,
            cool_down: DEFAULT_BREAKER_COOL_DOWN,
        }
    }
}

impl CircuitBreaker {
    /// Consecutive unavailable attempts that open it (default 5, at least 1).
    ///
    /// ```
    /// use quorumlock::{CircuitBreaker, LockManager};
    ///
    /// let manager = LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .circuit_breaker(CircuitBreaker::default().failures(3))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn failures(mut self, failures: u32) -> Self {
        self.failures = failures;
        self
    }

    /// How long it stays open before a probe (default 10 s; more than zero,
    /// at most a year).
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::{CircuitBreaker, LockManager};
    ///
    /// let manager = LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .circuit_breaker(CircuitBreaker::default().cool_down(Duration::from_secs(2)))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn cool_down(mut self, cool_down: Duration) -> Self {
        self.cool_down = cool_down;
        self
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if self.failures == 0 {
            return Err("failures is 0; the breaker needs at least one failure to open".into());
        }
        if self.cool_down.is_zero() || self.cool_down > crate::limits::MAX_TTL {
            return Err(format!(
                "cool_down is {:?}; use more than zero and at most a year",
                self.cool_down
            ));
        }
        Ok(())
    }
}

/// Where the breaker stands.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::health::BreakerState;
///
/// // No breaker was configured for this manager.
/// assert_eq!(manager.health().breaker, BreakerState::Off);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakerState {
    /// No breaker is configured.
    Off,
    /// Calls go to the nodes.
    Closed,
    /// Calls fail at once until `until`, then one probes.
    Open {
        /// End of the cool-down (monotonic clock).
        until: Instant,
    },
    /// One call is probing the nodes; the others fail at once.
    Probing,
    /// The cool-down is over: the next call probes.
    ProbeDue,
}

impl BreakerState {
    /// Whether calls are held back now (open, or a probe is out).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// // The breaker is off unless configured: it never holds calls back then.
    /// let health = manager.health();
    /// assert!(!health.breaker.holds_calls_back(tokio::time::Instant::now()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn holds_calls_back(&self, now: Instant) -> bool {
        match self {
            BreakerState::Open { until } => now < *until,
            BreakerState::Probing => true,
            BreakerState::Off | BreakerState::Closed | BreakerState::ProbeDue => false,
        }
    }
}

/// What the breaker lets an acquisition attempt do.
#[derive(Debug, Clone)]
pub(crate) enum Verdict {
    /// Go to the nodes.
    Pass,
    /// Go to the nodes as probe number `.0`: its outcome decides.
    Probe(u64),
    /// Fail with this error, without I/O.
    Refuse(Error),
}

/// The breaker's state machine.
#[derive(Debug)]
pub(crate) struct Breaker {
    settings: CircuitBreaker,
    state: BreakerState,
    /// The count of unavailable attempts that opened it, for the error.
    opened_after: u32,
    /// The probe out now: its number, and when it was let through.
    probe: Option<(u64, Instant)>,
    probes: u64,
}

impl Breaker {
    pub(crate) fn new(settings: CircuitBreaker) -> Self {
        Self {
            settings,
            state: BreakerState::Closed,
            opened_after: 0,
            probe: None,
            probes: 0,
        }
    }

    /// Where it stands at `now` (an `Open` whose cool-down is over shows as
    /// `ProbeDue`).
    pub(crate) fn state(&self, now: Instant) -> BreakerState {
        match self.state {
            BreakerState::Open { until } if until <= now => BreakerState::ProbeDue,
            state => state,
        }
    }

    /// When the state may change by itself: the end of the cool-down.
    pub(crate) fn next_change(&self) -> Option<Instant> {
        match self.state {
            BreakerState::Open { until } => Some(until),
            BreakerState::Off
            | BreakerState::Closed
            | BreakerState::Probing
            | BreakerState::ProbeDue => None,
        }
    }

    /// The error a call starting at `now` would be refused with, if any,
    /// without letting a probe out.
    pub(crate) fn refusal(&self, now: Instant) -> Option<Error> {
        match self.state {
            BreakerState::Off | BreakerState::Closed | BreakerState::ProbeDue => None,
            BreakerState::Open { until } if now < until => Some(Error::CircuitOpen {
                failures: self.opened_after,
                retry_in: until - now,
                probing: false,
            }),
            BreakerState::Open { .. } => None,
            BreakerState::Probing if self.probe_overdue(now) => None,
            BreakerState::Probing => Some(Error::CircuitOpen {
                failures: self.opened_after,
                retry_in: Duration::ZERO,
                probing: true,
            }),
        }
    }

    /// An acquisition attempt wants to start at `now`.
    pub(crate) fn admit(&mut self, now: Instant) -> Verdict {
        if let Some(error) = self.refusal(now) {
            return Verdict::Refuse(error);
        }
        match self.state {
            BreakerState::Off | BreakerState::Closed => Verdict::Pass,
            // The cool-down is over, or the probe out was never finished
            // (its future parked, neither polled nor dropped): this call
            // probes.
            BreakerState::Open { .. } | BreakerState::Probing | BreakerState::ProbeDue => {
                self.probes += 1;
                self.state = BreakerState::Probing;
                self.probe = Some((self.probes, now));
                Verdict::Probe(self.probes)
            }
        }
    }

    /// A probe has one cool-down to finish; then the next call probes.
    fn probe_overdue(&self, now: Instant) -> bool {
        self.probe
            .is_some_and(|(_, since)| now >= since + self.settings.cool_down)
    }

    /// An attempt admitted earlier (as probe `probe`, if it was one) ended
    /// at `now`: decided (`None`), or failed as `class`; `consecutive` is
    /// the count of unavailable attempts in a row, this one included.
    pub(crate) fn record(
        &mut self,
        probe: Option<u64>,
        failure: Option<Class>,
        consecutive: u32,
        now: Instant,
    ) {
        let unavailable = failure == Some(Class::Unavailable);
        let current_probe = probe.is_some() && probe == self.probe.map(|(id, _)| id);
        match self.state {
            BreakerState::Probing if current_probe && unavailable => self.open(consecutive, now),
            // The nodes answered (a grant, a refusal, even a corrupt counter).
            BreakerState::Probing if current_probe => {
                self.state = BreakerState::Closed;
                self.probe = None;
            }
            BreakerState::Closed
                if probe.is_none() && unavailable && consecutive >= self.settings.failures =>
            {
                self.open(consecutive, now);
            }
            // Attempts let in before it opened, and probes replaced by a
            // newer one, do not move it: only the current probe decides.
            _ => {}
        }
    }

    /// Probe `probe` was dropped before its outcome: if it is still the
    /// current one, the next call probes.
    pub(crate) fn probe_abandoned(&mut self, probe: u64, now: Instant) {
        if self.state == BreakerState::Probing && self.probe.map(|(id, _)| id) == Some(probe) {
            self.state = BreakerState::Open { until: now };
            self.probe = None;
        }
    }

    fn open(&mut self, consecutive: u32, now: Instant) {
        self.opened_after = consecutive;
        self.probe = None;
        self.state = BreakerState::Open {
            until: now + self.settings.cool_down,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(failures: u32, cool_down_ms: u64) -> Breaker {
        Breaker::new(
            CircuitBreaker::default()
                .failures(failures)
                .cool_down(Duration::from_millis(cool_down_ms)),
        )
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The number of the probe `verdict` lets out.
    fn probe(verdict: Verdict) -> Option<u64> {
        match verdict {
            Verdict::Probe(id) => Some(id),
            other => panic!("expected a probe, got {other:?}"),
        }
    }

    const UNAVAILABLE: Option<Class> = Some(Class::Unavailable);
    const CONTENDED: Option<Class> = Some(Class::Contended);

    #[test]
    fn opens_after_k_in_a_row_and_refuses_until_the_cool_down_ends() {
        let t0 = Instant::now();
        let mut b = breaker(3, 1000);
        for consecutive in 1..3 {
            assert!(matches!(b.admit(t0), Verdict::Pass));
            b.record(None, UNAVAILABLE, consecutive, t0);
            assert_eq!(b.state(t0), BreakerState::Closed);
        }
        b.record(None, UNAVAILABLE, 3, t0);
        assert_eq!(
            b.state(t0),
            BreakerState::Open {
                until: t0 + ms(1000)
            }
        );
        match b.admit(t0 + ms(400)) {
            Verdict::Refuse(Error::CircuitOpen {
                failures,
                retry_in,
                probing,
            }) => {
                assert_eq!((failures, retry_in, probing), (3, ms(600), false));
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn one_probe_after_the_cool_down_decides() {
        let t0 = Instant::now();
        let mut b = breaker(1, 100);
        b.record(None, UNAVAILABLE, 1, t0);
        assert_eq!(b.state(t0 + ms(100)), BreakerState::ProbeDue);
        let first = probe(b.admit(t0 + ms(100)));
        // Everyone else is refused while the probe is out.
        assert!(matches!(
            b.admit(t0 + ms(101)),
            Verdict::Refuse(Error::CircuitOpen { probing: true, .. })
        ));
        // Unavailable again: open for another cool-down.
        b.record(first, UNAVAILABLE, 2, t0 + ms(150));
        assert_eq!(
            b.state(t0),
            BreakerState::Open {
                until: t0 + ms(250)
            }
        );
        let second = probe(b.admit(t0 + ms(250)));
        // Decided: closed.
        b.record(second, None, 0, t0 + ms(260));
        assert_eq!(b.state(t0), BreakerState::Closed);
        assert!(matches!(b.admit(t0 + ms(261)), Verdict::Pass));
    }

    #[test]
    fn contention_never_opens_it_and_a_contended_probe_closes_it() {
        let t0 = Instant::now();
        let mut b = breaker(2, 100);
        for _ in 0..10 {
            b.record(None, CONTENDED, 0, t0);
        }
        assert_eq!(b.state(t0), BreakerState::Closed);
        b.record(None, UNAVAILABLE, 2, t0);
        let probe = probe(b.admit(t0 + ms(100)));
        b.record(probe, CONTENDED, 0, t0 + ms(100));
        assert_eq!(b.state(t0), BreakerState::Closed);
    }

    #[test]
    fn late_outcomes_do_not_move_an_open_breaker_and_a_dropped_probe_is_replaced() {
        let t0 = Instant::now();
        let mut b = breaker(1, 100);
        b.record(None, UNAVAILABLE, 1, t0);
        // An attempt let in before it opened ends now: no change.
        b.record(None, None, 0, t0 + ms(10));
        b.record(None, UNAVAILABLE, 7, t0 + ms(20));
        assert_eq!(
            b.state(t0),
            BreakerState::Open {
                until: t0 + ms(100)
            }
        );
        let dropped = probe(b.admit(t0 + ms(100))).unwrap();
        b.probe_abandoned(dropped, t0 + ms(120));
        assert!(matches!(b.admit(t0 + ms(120)), Verdict::Probe(_)));
    }

    #[test]
    fn a_probe_that_never_finishes_is_replaced_after_a_cool_down() {
        let t0 = Instant::now();
        let mut b = breaker(1, 100);
        b.record(None, UNAVAILABLE, 1, t0);
        let parked = probe(b.admit(t0 + ms(100)));
        assert!(b.refusal(t0 + ms(150)).is_some());
        assert!(b.refusal(t0 + ms(200)).is_none());
        let replacement = probe(b.admit(t0 + ms(200)));
        assert!(matches!(b.admit(t0 + ms(201)), Verdict::Refuse(_)));
        // The parked probe's late outcome, or its drop, moves nothing: the
        // replacement decides.
        b.record(parked, None, 0, t0 + ms(210));
        b.probe_abandoned(parked.unwrap(), t0 + ms(211));
        assert_eq!(b.state(t0 + ms(212)), BreakerState::Probing);
        b.record(replacement, UNAVAILABLE, 3, t0 + ms(220));
        assert_eq!(
            b.state(t0 + ms(220)),
            BreakerState::Open {
                until: t0 + ms(320)
            }
        );
    }

    #[test]
    fn only_unavailable_attempts_open_it() {
        let t0 = Instant::now();
        let mut b = breaker(1, 100);
        // A corrupt counter, however many in a row, says nothing about
        // availability.
        b.record(None, Some(Class::Final), 5, t0);
        assert_eq!(b.state(t0), BreakerState::Closed);
        b.record(None, UNAVAILABLE, 1, t0);
        assert_eq!(b.next_change(), Some(t0 + ms(100)));
        // Peeking lets no probe out.
        assert!(b.refusal(t0 + ms(100)).is_none());
        assert_eq!(
            b.state(t0),
            BreakerState::Open {
                until: t0 + ms(100)
            }
        );
    }

    #[test]
    fn bad_settings_are_explained() {
        assert!(CircuitBreaker::default().check().is_ok());
        assert!(CircuitBreaker::default().failures(0).check().is_err());
        assert!(
            CircuitBreaker::default()
                .cool_down(Duration::ZERO)
                .check()
                .is_err()
        );
    }
}
