//! When to try again after an attempt found the lock service unavailable.
//!
//! Two kinds of failure call for different answers. *Contention* (another
//! client holds the resource) is waited out: a waiting
//! [`Request`](crate::Request) is queued and woken by the release.
//! *Unavailability* (no quorum reachable, a quorum too slow; see
//! [`Error::is_unavailable`])
//! is retried on a [`Backoff`]: a few pauses that grow, always with
//! jitter, bounded in count and in time, after which the call gives up
//! with the last error, or at the end of the request's wait, whichever
//! comes first. A request that makes one attempt
//! ([`no_wait`](crate::Request::no_wait)) retries neither.
//!
//! An attempt counts as contended when refusals were needed to lose it,
//! also if some nodes failed beside them (someone holds the resource on
//! the nodes that answered). `TooSlow` counts as unavailable: a quorum
//! that answers too late to leave any validity is a service too slow to
//! lock with now, which a later attempt may not be.
//!
//! Everything here is pure: the caller passes in the clock and a random
//! sample.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;

/// Default pauses after unavailable attempts: 200 ms, 500 ms, 1 s.
pub const DEFAULT_UNAVAILABLE_STEPS: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_millis(500),
    Duration::from_millis(1000),
];
/// Default jitter of every backoff pause: ± 20 %.
pub const DEFAULT_BACKOFF_JITTER: f64 = 0.2;
/// Default bound on the time one call spends retrying unavailability,
/// from its first attempt.
pub const DEFAULT_BACKOFF_GIVE_UP_AFTER: Duration = Duration::from_secs(5);

/// How a call retries attempts that found the lock service unavailable.
///
/// Each pause is its nominal value times a random factor in
/// `[1 − jitter, 1 + jitter]`, so that clients which failed together do
/// not come back together. A retry is made only while the schedule has
/// pauses left *and* the pause ends within
/// [`give_up_after`](Self::give_up_after) of the first attempt of the
/// current run of unavailable attempts. A decided attempt (acquired, or
/// refused because the resource is held) ends the run, so a long wait
/// meets each outage with the whole schedule.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::Backoff;
///
/// // The default: 200 ms, 500 ms, 1 s, ± 20 %, within 5 s.
/// let steps = Backoff::default();
/// // Doubling from 50 ms up to 2 s, at most 6 retries, within 10 s.
/// let doubling = Backoff::exponential(Duration::from_millis(50), 6)
///     .cap(Duration::from_secs(2))
///     .give_up_after(Duration::from_secs(10));
/// # let _ = (steps, doubling);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    pauses: Pauses,
    jitter: f64,
    give_up_after: Duration,
}

#[derive(Debug, Clone, PartialEq)]
enum Pauses {
    Steps(Arc<[Duration]>),
    Exponential {
        first: Duration,
        cap: Duration,
        retries: u32,
    },
}

impl Default for Backoff {
    fn default() -> Self {
        Self::steps(DEFAULT_UNAVAILABLE_STEPS)
    }
}

impl Backoff {
    /// One retry after each pause, in order (e.g. 200 ms, 500 ms, 1 s:
    /// three retries); each pause must be more than zero. An empty list
    /// retries nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::{Backoff, LockManager};
    ///
    /// let manager = LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .unavailable_retry(Backoff::steps([Duration::from_millis(100), Duration::from_millis(400)]))
    ///     .build()?;
    /// # let _ = manager;
    /// // A zero pause would retry at once into the same outage: refused.
    /// let zero = LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .unavailable_retry(Backoff::steps([Duration::ZERO]))
    ///     .build();
    /// assert!(zero.is_err());
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn steps(pauses: impl IntoIterator<Item = Duration>) -> Self {
        Self {
            pauses: Pauses::Steps(pauses.into_iter().collect()),
            jitter: DEFAULT_BACKOFF_JITTER,
            give_up_after: DEFAULT_BACKOFF_GIVE_UP_AFTER,
        }
    }

    /// Up to `retries` retries, the first after `first` (more than zero),
    /// each pause twice the one before (before jitter); see
    /// [`cap`](Self::cap) for a longest pause.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::{Backoff, LockManager};
    ///
    /// // 50, 100, 200, 400, 400 ms (each ± 20 %).
    /// let backoff = Backoff::exponential(Duration::from_millis(50), 5).cap(Duration::from_millis(400));
    /// let manager = LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .unavailable_retry(backoff)
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn exponential(first: Duration, retries: u32) -> Self {
        Self {
            pauses: Pauses::Exponential {
                first,
                cap: crate::limits::MAX_TTL,
                retries,
            },
            jitter: DEFAULT_BACKOFF_JITTER,
            give_up_after: DEFAULT_BACKOFF_GIVE_UP_AFTER,
        }
    }

    /// The longest pause (before jitter): longer ones, of an
    /// [`exponential`](Self::exponential) schedule or of
    /// [`steps`](Self::steps), are cut to it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::Backoff;
    ///
    /// // 100, 200, 300, 300 ms (each ± 20 %).
    /// let backoff = Backoff::exponential(Duration::from_millis(100), 4).cap(Duration::from_millis(300));
    /// # let _ = backoff;
    /// ```
    pub fn cap(mut self, longest: Duration) -> Self {
        match &mut self.pauses {
            Pauses::Steps(steps) => {
                *steps = steps.iter().map(|step| (*step).min(longest)).collect()
            }
            Pauses::Exponential { cap, .. } => *cap = longest,
        }
        self
    }

    /// No retry: an unavailable attempt ends the call.
    ///
    /// ```
    /// use quorumlock::{Backoff, LockManager};
    ///
    /// // Fail fast: the caller has its own fallback.
    /// let manager = LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .unavailable_retry(Backoff::none())
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn none() -> Self {
        Self::steps([])
    }

    /// The random spread of each pause, as a fraction of it (default 0.2:
    /// ± 20 %). Must be in `(0, 1]`: the spread is what keeps clients that
    /// failed together from retrying together.
    ///
    /// ```
    /// use quorumlock::{Backoff, LockManager};
    ///
    /// let builder = || LockManager::builder().node("redis://127.0.0.1:7001");
    /// builder().unavailable_retry(Backoff::default().jitter(0.5)).build()?;
    /// // No spread would make clients that failed together retry together.
    /// assert!(builder().unavailable_retry(Backoff::default().jitter(0.0)).build().is_err());
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }

    /// Longest time, from the first attempt of a run of unavailable ones,
    /// within which a retry may still start (default 5 s); a pause that
    /// would end later is not taken. At most a year.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::{Backoff, LockManager};
    ///
    /// let manager = LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .unavailable_retry(Backoff::default().give_up_after(Duration::from_secs(2)))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn give_up_after(mut self, limit: Duration) -> Self {
        self.give_up_after = limit;
        self
    }

    /// Checks the settings (for `build()`).
    pub(crate) fn check(&self) -> Result<(), String> {
        if !(self.jitter > 0.0 && self.jitter <= 1.0) {
            return Err(format!(
                "jitter is {}; use a fraction in (0, 1], e.g. 0.2 for ± 20 %",
                self.jitter
            ));
        }
        if self.give_up_after > crate::limits::MAX_TTL {
            return Err(format!(
                "give_up_after is {:?}; at most a year is accepted",
                self.give_up_after
            ));
        }
        let shortest = match &self.pauses {
            Pauses::Steps(steps) => steps.iter().copied().min(),
            Pauses::Exponential { first, .. } => Some(*first),
        };
        if shortest.is_some_and(|pause| pause.is_zero()) {
            return Err(
                "a pause is zero; retries without a pause would hammer nodes that are down, \
                 use at least a few milliseconds"
                    .into(),
            );
        }
        let longest = match &self.pauses {
            Pauses::Steps(steps) => steps.iter().copied().max(),
            Pauses::Exponential { first, cap, .. } => {
                if first > cap {
                    return Err(format!(
                        "the first pause ({first:?}) exceeds the cap ({cap:?}); make the cap at \
                         least the first pause"
                    ));
                }
                Some(*cap)
            }
        };
        match longest {
            Some(longest) if longest > crate::limits::MAX_TTL => Err(format!(
                "a pause of {longest:?} is longer than a year; use seconds, not milliseconds?"
            )),
            _ => Ok(()),
        }
    }

    /// The nominal pause before retry number `retry` (0 for the first), or
    /// `None` when the schedule has no such retry.
    fn nominal(&self, retry: u32) -> Option<Duration> {
        match &self.pauses {
            Pauses::Steps(steps) => steps.get(retry as usize).copied(),
            Pauses::Exponential {
                first,
                cap,
                retries,
            } => (retry < *retries).then(|| {
                let doubled = first.saturating_mul(1u32 << retry.min(31));
                doubled.min(*cap)
            }),
        }
    }

    /// The pause before retry `retry` with the random `unit` in `[0, 1]`
    /// spread over `± jitter`.
    fn pause(&self, retry: u32, unit: f64) -> Option<Duration> {
        let nominal = self.nominal(retry)?;
        let factor = 1.0 + self.jitter * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
        Some(nominal.mul_f64(factor.max(0.0)))
    }
}

/// What an attempt's failure calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Someone else holds the resource: wait it out.
    Contended,
    /// The lock service could not decide: retry on the backoff.
    Unavailable,
    /// Retrying cannot help (a corrupt counter, a bad argument).
    Final,
}

impl Class {
    pub(crate) fn of(error: &Error) -> Self {
        match error {
            Error::Contended { .. } | Error::SplitVote { .. } | Error::WaitTimedOut { .. } => {
                Class::Contended
            }
            // An open breaker is unavailability the call must not retry:
            // it fails fast until the cool-down ends.
            Error::CircuitOpen { .. } => Class::Final,
            error if error.is_unavailable() => Class::Unavailable,
            _ => Class::Final,
        }
    }
}

/// One call's retries of unavailability. The schedule counts a *run* of
/// unavailable attempts, from the first one's start: an attempt that is
/// decided (acquired, or refused because the resource is held) ends the
/// run, and the next outage starts the schedule afresh. So a long wait is
/// not given up on the first short outage after `give_up_after`.
#[derive(Debug)]
pub(crate) struct Retries<'a> {
    backoff: &'a Backoff,
    /// The current run: when its first attempt started, retries made in it.
    run: Option<(Instant, u32)>,
}

impl<'a> Retries<'a> {
    pub(crate) fn new(backoff: &'a Backoff) -> Self {
        Self { backoff, run: None }
    }

    /// An attempt was decided: the run of unavailability (if any) is over.
    pub(crate) fn reset(&mut self) {
        self.run = None;
    }

    /// After an unavailable attempt that started at `attempt_started` and
    /// ended at `now`: the pause before the next retry, or `None` when the
    /// schedule is used up (in count, or because the pause would end past
    /// `give_up_after` from the run's first attempt).
    pub(crate) fn next_pause(
        &mut self,
        attempt_started: Instant,
        now: Instant,
        unit: f64,
    ) -> Option<Duration> {
        let (started, made) = self.run.get_or_insert((attempt_started, 0));
        let pause = self.backoff.pause(*made, unit)?;
        let limit = started.checked_add(self.backoff.give_up_after)?;
        if now + pause > limit {
            return None;
        }
        *made += 1;
        Some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn steps_are_taken_in_order_then_stop() {
        let backoff = Backoff::default();
        let nominal: Vec<_> = (0..4).map(|r| backoff.pause(r, 0.5)).collect();
        assert_eq!(
            nominal,
            [Some(ms(200)), Some(ms(500)), Some(ms(1000)), None]
        );
    }

    #[test]
    fn exponential_doubles_up_to_the_cap_and_counts_retries() {
        let backoff = Backoff::exponential(ms(50), 5).cap(ms(300));
        let nominal: Vec<_> = (0..6).map(|r| backoff.pause(r, 0.5)).collect();
        assert_eq!(
            nominal,
            [
                Some(ms(50)),
                Some(ms(100)),
                Some(ms(200)),
                Some(ms(300)),
                Some(ms(300)),
                None
            ]
        );
        // Far retries neither overflow nor exceed the cap.
        let long = Backoff::exponential(ms(1), u32::MAX).cap(ms(10));
        assert_eq!(long.pause(200, 0.5), Some(ms(10)));
    }

    #[test]
    fn jitter_spreads_each_pause_both_ways() {
        let backoff = Backoff::steps([ms(1000)]).jitter(0.2);
        assert_eq!(backoff.pause(0, 0.0), Some(ms(800)));
        assert_eq!(backoff.pause(0, 1.0), Some(ms(1200)));
        // Out-of-range samples are clamped, not trusted.
        assert_eq!(backoff.pause(0, 9.0), Some(ms(1200)));
    }

    #[test]
    fn the_time_bound_stops_retries_that_would_end_too_late() {
        let backoff = Backoff::steps([ms(200), ms(500), ms(1000)]).give_up_after(ms(1000));
        let start = Instant::now();
        let mut retries = Retries::new(&backoff);
        assert_eq!(
            retries.next_pause(start, start + ms(50), 0.5),
            Some(ms(200))
        );
        let second = start + ms(250);
        assert_eq!(
            retries.next_pause(second, start + ms(300), 0.5),
            Some(ms(500))
        );
        // 850 ms + 1 s would end past the 1 s bound from the run's start.
        let third = start + ms(800);
        assert_eq!(retries.next_pause(third, start + ms(850), 0.5), None);
    }

    #[test]
    fn a_decided_attempt_starts_the_schedule_afresh() {
        let backoff = Backoff::steps([ms(200), ms(500)]).give_up_after(ms(1000));
        let start = Instant::now();
        let mut retries = Retries::new(&backoff);
        assert_eq!(retries.next_pause(start, start, 0.5), Some(ms(200)));
        assert_eq!(retries.next_pause(start, start, 0.5), Some(ms(500)));
        assert_eq!(retries.next_pause(start, start, 0.5), None);
        // Contended for a minute, then a new outage: the full schedule again.
        retries.reset();
        let later = start + Duration::from_secs(60);
        assert_eq!(retries.next_pause(later, later, 0.5), Some(ms(200)));
    }

    #[test]
    fn bad_settings_are_explained() {
        let zero = Backoff::default().jitter(0.0).check().unwrap_err();
        assert!(zero.contains("(0, 1]"), "{zero}");
        assert!(Backoff::default().jitter(1.5).check().is_err());
        assert!(Backoff::default().jitter(f64::NAN).check().is_err());
        let inverted = Backoff::exponential(ms(500), 3)
            .cap(ms(100))
            .check()
            .unwrap_err();
        assert!(inverted.contains("cap"), "{inverted}");
        let huge = Backoff::steps([Duration::from_secs(400 * 24 * 3600)]);
        assert!(huge.check().is_err());
        assert!(Backoff::none().check().is_ok());
        assert!(Backoff::steps([ms(100), ms(0)]).check().is_err());
        assert!(Backoff::exponential(ms(0), 3).cap(ms(10)).check().is_err());
        assert!(Backoff::default().check().is_ok());
    }

    #[test]
    fn failures_are_classed_by_what_they_call_for() {
        let contended = Error::Contended {
            resource: "r".into(),
            attempts: 1,
            refused: 3,
            total: 5,
            free_in: None,
        };
        let unavailable = Error::QuorumUnavailable {
            resource: "r".into(),
            failed: 3,
            answered: 2,
            needed: 3,
            total: 5,
            errors: vec![],
        };
        let slow = Error::TooSlow {
            resource: "r".into(),
            elapsed: ms(10),
            ttl: ms(10),
        };
        let counter = Error::InvalidCounter {
            resource: "r".into(),
            node: "n".into(),
            key: "k".into(),
            problem: "p".into(),
        };
        assert_eq!(Class::of(&contended), Class::Contended);
        assert_eq!(Class::of(&unavailable), Class::Unavailable);
        assert_eq!(Class::of(&slow), Class::Unavailable);
        assert_eq!(Class::of(&counter), Class::Final);
    }

    proptest! {
        #[test]
        fn pauses_stay_within_jitter_of_the_nominal(
            first in 1u64..5_000, cap_extra in 0u64..5_000, retry in 0u32..40,
            jitter in 0.01f64..=1.0, unit in 0.0f64..=1.0,
        ) {
            let backoff = Backoff::exponential(ms(first), 40).cap(ms(first + cap_extra)).jitter(jitter);
            let nominal = backoff.nominal(retry).unwrap();
            let pause = backoff.pause(retry, unit).unwrap();
            prop_assert!(nominal <= ms(first + cap_extra));
            prop_assert!(pause >= nominal.mul_f64(1.0 - jitter) - Duration::from_nanos(1));
            prop_assert!(pause <= nominal.mul_f64(1.0 + jitter) + Duration::from_nanos(1));
        }

        #[test]
        fn no_retry_starts_past_the_time_bound(
            steps in proptest::collection::vec(1u64..2_000, 0..10),
            limit in 0u64..5_000, gaps in proptest::collection::vec(0u64..500, 10),
            unit in 0.0f64..=1.0,
        ) {
            let backoff = Backoff::steps(steps.iter().map(|&s| ms(s))).give_up_after(ms(limit));
            let start = Instant::now();
            let mut retries = Retries::new(&backoff);
            let (mut now, mut made) = (start, 0);
            for gap in gaps {
                let attempt_started = now;
                now += ms(gap);
                match retries.next_pause(attempt_started, now, unit) {
                    Some(pause) => {
                        now += pause;
                        made += 1;
                        prop_assert!(now <= start + ms(limit));
                    }
                    None => break,
                }
            }
            prop_assert!(made <= steps.len());
        }
    }
}
