//! The pure decision core: vote tally, validity and drift, retry schedule.
//!
//! Nothing here does I/O, reads a clock or awaits: callers pass in what they
//! observed (votes, elapsed time, a random sample) and get a decision back.
//! That keeps the rules of the algorithm testable on their own, table by table.

use std::time::Duration;

/// Fixed part of the clock-drift allowance, added to `ttl × drift_factor`
/// (the Redlock reference adds 2 ms for the resolution of the server's expiry).
pub const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// Number of nodes that must agree among `total`: a strict majority.
///
/// ```
/// assert_eq!(quorumlock::internals::quorum(5), 3);
/// assert_eq!(quorumlock::internals::quorum(4), 3);
/// ```
pub fn quorum(total: usize) -> usize {
    total / 2 + 1
}

/// One node's answer to a request.
///
/// ```
/// use quorumlock::internals::quorum::{Decision, Tally, Vote};
///
/// let mut tally = Tally::new(3);
/// tally.record(0, Vote::Granted);
/// assert_eq!(tally.record(1, Vote::Granted), Decision::Won);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vote {
    /// The node did what was asked (set the key, deleted it, extended it).
    Granted,
    /// The node answered no: another value holds the key, or ours is gone.
    Refused,
    /// The node could not answer: connection error, timeout, Redis error.
    Failed,
}

/// Why an attempt was lost.
///
/// ```
/// use quorumlock::internals::quorum::{Decision, Loss, Tally, Vote};
///
/// let mut tally = Tally::new(3);
/// tally.record(0, Vote::Refused);
/// assert_eq!(tally.record(1, Vote::Failed), Decision::Lost(Loss::Refused));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Refusals were needed to lose: someone else holds the key (or, for
    /// release and extend, our value is no longer there).
    Refused,
    /// Failures alone rule out a quorum: the cluster is unhealthy, whatever
    /// the other nodes say.
    Unavailable,
}

/// The state of a fan-out after the votes recorded so far.
///
/// ```
/// use quorumlock::internals::quorum::{Decision, Tally, Vote};
///
/// let mut tally = Tally::new(5);
/// assert_eq!(tally.record(0, Vote::Granted), Decision::Pending);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Neither a quorum of grants nor a lost majority yet: keep waiting.
    Pending,
    /// A quorum granted.
    Won,
    /// A quorum can no longer be reached.
    Lost(Loss),
}

/// Running count of the votes of one fan-out over `total` nodes.
///
/// The outcome is decided as soon as it cannot change: `quorum` grants win
/// (once the preferred node, if one is set, has voted too: its answer
/// carries what the caller wants most, the counter node's token), and more
/// than `total - quorum` non-grants lose. Later votes do not change a
/// decided outcome, so the caller can stop waiting for stragglers.
///
/// ```
/// use quorumlock::internals::quorum::{Decision, Tally, Vote};
///
/// // Five nodes answer in any order; the outcome is known at the third grant.
/// let mut tally = Tally::new(5);
/// let votes = [Vote::Granted, Vote::Failed, Vote::Granted, Vote::Granted, Vote::Refused];
/// let decided_at = votes
///     .iter()
///     .enumerate()
///     .position(|(node, &vote)| tally.record(node, vote) != Decision::Pending);
/// assert_eq!(decided_at, Some(3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    total: usize,
    needed: usize,
    granted: usize,
    refused: usize,
    failed: usize,
    /// Index of the node whose vote a win waits for, and its vote once known.
    preferred: Option<(usize, Option<Vote>)>,
}

impl Tally {
    /// An empty tally over `total` nodes.
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Decision, Tally, Vote};
    ///
    /// let mut tally = Tally::new(5);
    /// tally.record(0, Vote::Granted);
    /// tally.record(1, Vote::Refused);
    /// assert_eq!(tally.record(2, Vote::Granted), Decision::Pending);
    /// assert_eq!(tally.record(3, Vote::Granted), Decision::Won, "three of five");
    /// ```
    pub fn new(total: usize) -> Self {
        Self {
            total,
            needed: quorum(total),
            granted: 0,
            refused: 0,
            failed: 0,
            preferred: None,
        }
    }

    /// An empty tally whose win waits for node `preferred`'s vote (a grant,
    /// a refusal or a failure, within the round's deadline), so that the
    /// caller learns what that node answered; its vote counts as any other.
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Decision, Tally, Vote};
    ///
    /// // Node 0 issues the tokens: a majority without it waits for its vote.
    /// let mut tally = Tally::preferring(5, 0);
    /// tally.record(1, Vote::Granted);
    /// tally.record(2, Vote::Granted);
    /// assert_eq!(tally.record(3, Vote::Granted), Decision::Pending);
    /// assert_eq!(tally.record(0, Vote::Failed), Decision::Won, "won without it");
    /// ```
    pub fn preferring(total: usize, preferred: usize) -> Self {
        Self {
            preferred: Some((preferred, None)),
            ..Self::new(total)
        }
    }

    /// Records node `node`'s vote and returns the decision after it. Votes
    /// beyond `total` are ignored (the decision is already final by then).
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Decision, Loss, Tally, Vote};
    ///
    /// let mut tally = Tally::new(3);
    /// tally.record(0, Vote::Failed);
    /// assert_eq!(tally.record(1, Vote::Failed), Decision::Lost(Loss::Unavailable));
    /// ```
    pub fn record(&mut self, node: usize, vote: Vote) -> Decision {
        if self.granted + self.refused + self.failed < self.total {
            match vote {
                Vote::Granted => self.granted += 1,
                Vote::Refused => self.refused += 1,
                Vote::Failed => self.failed += 1,
            }
            if let Some((index, seen)) = &mut self.preferred
                && *index == node
            {
                *seen = Some(vote);
            }
        }
        self.decision()
    }

    /// The decision for the votes recorded so far.
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Decision, Loss, Tally, Vote};
    ///
    /// let mut tally = Tally::new(3);
    /// assert_eq!(tally.decision(), Decision::Pending);
    /// tally.record(0, Vote::Refused);
    /// tally.record(1, Vote::Refused);
    /// assert_eq!(tally.decision(), Decision::Lost(Loss::Refused));
    /// ```
    pub fn decision(&self) -> Decision {
        let tolerated = self.total - self.needed;
        let preferred_voted = self.preferred.is_none_or(|(_, vote)| vote.is_some());
        if self.granted >= self.needed && preferred_voted {
            Decision::Won
        } else if self.failed > tolerated {
            Decision::Lost(Loss::Unavailable)
        } else if self.refused + self.failed > tolerated {
            Decision::Lost(Loss::Refused)
        } else {
            Decision::Pending
        }
    }

    /// Whether refusals alone rule out a quorum (more than `total − quorum`
    /// nodes said no). For release and extend this is the evidence that our
    /// value is gone; fewer refusals may only be nodes our SET never reached.
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Tally, Vote};
    ///
    /// let mut tally = Tally::new(5);
    /// tally.record(0, Vote::Refused);
    /// tally.record(1, Vote::Failed);
    /// tally.record(2, Vote::Failed);
    /// assert!(!tally.refusals_alone_lose(), "one refusal may be a node our SET never reached");
    /// tally.record(3, Vote::Refused);
    /// tally.record(4, Vote::Refused);
    /// assert!(tally.refusals_alone_lose());
    /// ```
    pub fn refusals_alone_lose(&self) -> bool {
        self.refused > self.total - self.needed
    }

    /// Nodes asked.
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Tally, Vote};
    ///
    /// let mut tally = Tally::new(5);
    /// for (node, vote) in [(0, Vote::Granted), (1, Vote::Granted), (2, Vote::Refused), (3, Vote::Failed)] {
    ///     tally.record(node, vote);
    /// }
    /// assert_eq!(tally.total(), 5);
    /// ```
    pub fn total(&self) -> usize {
        self.total
    }

    /// Grants needed to win.
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Tally, Vote};
    ///
    /// let mut tally = Tally::new(5);
    /// for (node, vote) in [(0, Vote::Granted), (1, Vote::Granted), (2, Vote::Refused), (3, Vote::Failed)] {
    ///     tally.record(node, vote);
    /// }
    /// assert_eq!(tally.needed(), 3);
    /// ```
    pub fn needed(&self) -> usize {
        self.needed
    }

    /// Grants so far.
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Tally, Vote};
    ///
    /// let mut tally = Tally::new(5);
    /// for (node, vote) in [(0, Vote::Granted), (1, Vote::Granted), (2, Vote::Refused), (3, Vote::Failed)] {
    ///     tally.record(node, vote);
    /// }
    /// assert_eq!(tally.granted(), 2);
    /// ```
    pub fn granted(&self) -> usize {
        self.granted
    }

    /// Refusals so far.
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Tally, Vote};
    ///
    /// let mut tally = Tally::new(5);
    /// for (node, vote) in [(0, Vote::Granted), (1, Vote::Granted), (2, Vote::Refused), (3, Vote::Failed)] {
    ///     tally.record(node, vote);
    /// }
    /// assert_eq!(tally.refused(), 1);
    /// ```
    pub fn refused(&self) -> usize {
        self.refused
    }

    /// Failures so far.
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Tally, Vote};
    ///
    /// let mut tally = Tally::new(5);
    /// for (node, vote) in [(0, Vote::Granted), (1, Vote::Granted), (2, Vote::Refused), (3, Vote::Failed)] {
    ///     tally.record(node, vote);
    /// }
    /// assert_eq!(tally.failed(), 1);
    /// ```
    pub fn failed(&self) -> usize {
        self.failed
    }

    /// Nodes that answered at all (granted or refused).
    ///
    /// ```
    /// use quorumlock::internals::quorum::{Tally, Vote};
    ///
    /// let mut tally = Tally::new(5);
    /// for (node, vote) in [(0, Vote::Granted), (1, Vote::Granted), (2, Vote::Refused), (3, Vote::Failed)] {
    ///     tally.record(node, vote);
    /// }
    /// assert_eq!(tally.answered(), 3);
    /// ```
    pub fn answered(&self) -> usize {
        self.granted + self.refused
    }
}

/// Clock-drift allowance for a lock of `ttl`: `ttl × drift_factor + 2 ms`.
///
/// ```
/// use std::time::Duration;
///
/// let drift = quorumlock::internals::drift(Duration::from_secs(10), 0.01);
/// assert_eq!(drift, Duration::from_millis(102)); // 1 % of 10 s, plus 2 ms
/// ```
pub fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor) + DRIFT_FLOOR
}

/// Time the holder may still rely on the lock: `ttl − elapsed − drift`,
/// where `elapsed` runs from just before the first request was sent.
/// Zero when nothing is left.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::quorum::validity;
///
/// let ms = Duration::from_millis;
/// assert_eq!(validity(ms(10_000), ms(5), ms(102)), ms(9_893));
/// assert_eq!(validity(ms(100), ms(150), ms(3)), Duration::ZERO, "too slow: nothing left");
/// ```
pub fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> Duration {
    ttl.saturating_sub(elapsed).saturating_sub(drift)
}

/// Whether a won quorum with this validity counts as acquired: it must be
/// positive and at least `min_validity`.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::quorum::is_usable;
///
/// assert!(is_usable(Duration::from_millis(1), Duration::ZERO));
/// assert!(!is_usable(Duration::ZERO, Duration::ZERO));
/// assert!(!is_usable(Duration::from_secs(1), Duration::from_secs(2)));
/// ```
pub fn is_usable(validity: Duration, min_validity: Duration) -> bool {
    !validity.is_zero() && validity >= min_validity
}

/// Pause before the next attempt: `base ± jitter`, never negative.
///
/// `unit` is a uniform random sample in `[0, 1)`; it maps linearly onto
/// `[base − jitter, base + jitter)`, so contending clients spread out
/// instead of retrying in lock step.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::quorum::retry_delay;
///
/// let ms = Duration::from_millis;
/// assert_eq!(retry_delay(ms(200), ms(100), 0.0), ms(100));
/// assert_eq!(retry_delay(ms(200), ms(100), 0.5), ms(200));
/// ```
pub fn retry_delay(base: Duration, jitter: Duration, unit: f64) -> Duration {
    let unit = unit.clamp(0.0, 1.0);
    let span = jitter.mul_f64(2.0 * unit);
    (base + span).saturating_sub(jitter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::{Lost, Pending, Won};
    use Vote::{Failed, Granted, Refused};

    /// The read-write lock's exclusion rests on this (see
    /// [`crate::read_write`]): every two sets of at least `quorum(n)` of `n`
    /// nodes, a reader's grants and a writer's, share a node. Checked for
    /// every pair of subsets, for n up to 9.
    #[test]
    fn any_two_quorums_share_a_node() {
        for n in 1..=9usize {
            let quorums: Vec<u32> = (0u32..1 << n)
                .filter(|set| set.count_ones() as usize >= quorum(n))
                .collect();
            for &readers in &quorums {
                for &writers in &quorums {
                    assert_ne!(
                        readers & writers,
                        0,
                        "n = {n}: grants {readers:#b} and {writers:#b} share no node"
                    );
                }
            }
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        let table = [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)];
        for (total, expected) in table {
            assert_eq!(quorum(total), expected, "total {total}");
        }
    }

    #[test]
    fn tally_decides_as_soon_as_the_outcome_is_fixed() {
        // (nodes, votes in arrival order, decision after each vote)
        let table: &[(usize, &[Vote], &[Decision])] = &[
            (5, &[Granted, Granted, Granted], &[Pending, Pending, Won]),
            (
                5,
                &[Refused, Granted, Refused, Refused],
                &[Pending, Pending, Pending, Lost(Loss::Refused)],
            ),
            (
                5,
                &[Failed, Failed, Failed],
                &[Pending, Pending, Lost(Loss::Unavailable)],
            ),
            // One refusal among the losses: contention played a part.
            (
                5,
                &[Failed, Refused, Failed],
                &[Pending, Pending, Lost(Loss::Refused)],
            ),
            // Two nodes down do not stop a five-node quorum.
            (
                5,
                &[Failed, Failed, Granted, Granted, Granted],
                &[Pending, Pending, Pending, Pending, Won],
            ),
            (1, &[Granted], &[Won]),
            (1, &[Refused], &[Lost(Loss::Refused)]),
            (1, &[Failed], &[Lost(Loss::Unavailable)]),
            // Even N: 4 nodes need 3, tolerate 1.
            (4, &[Refused, Refused], &[Pending, Lost(Loss::Refused)]),
            (
                4,
                &[Granted, Granted, Failed, Granted],
                &[Pending, Pending, Pending, Won],
            ),
            (
                3,
                &[Granted, Failed, Refused],
                &[Pending, Pending, Lost(Loss::Refused)],
            ),
        ];
        for (nodes, votes, decisions) in table {
            let mut tally = Tally::new(*nodes);
            for (i, (vote, expected)) in votes.iter().zip(decisions.iter()).enumerate() {
                assert_eq!(
                    tally.record(i, *vote),
                    *expected,
                    "{nodes} nodes, votes {votes:?}, after vote {i}"
                );
            }
        }
    }

    #[test]
    fn a_decided_tally_stays_decided() {
        let mut tally = Tally::new(3);
        tally.record(0, Granted);
        assert_eq!(tally.record(1, Granted), Won);
        assert_eq!(tally.record(2, Refused), Won);
        // Votes past the node count are ignored.
        assert_eq!(tally.record(2, Refused), Won);
        assert_eq!(tally.refused(), 1);
        assert_eq!(tally.answered(), 3);
    }

    #[test]
    fn a_win_waits_for_the_preferred_nodes_vote() {
        // (nodes, preferred index, (node, vote) in arrival order, decisions)
        type Case = (usize, usize, &'static [(usize, Vote)], &'static [Decision]);
        let table: &[Case] = &[
            // A quorum without the preferred node waits for its vote...
            (
                5,
                0,
                &[(1, Granted), (2, Granted), (3, Granted), (0, Granted)],
                &[Pending, Pending, Pending, Won],
            ),
            // ...and wins without it when it refuses or fails.
            (
                5,
                0,
                &[(1, Granted), (2, Granted), (3, Granted), (0, Refused)],
                &[Pending, Pending, Pending, Won],
            ),
            (
                5,
                0,
                &[(1, Granted), (0, Failed), (2, Granted), (3, Granted)],
                &[Pending, Pending, Pending, Won],
            ),
            // Its failure alone decides nothing.
            (5, 2, &[(2, Failed)], &[Pending]),
            // With it, a quorum wins at once.
            (
                5,
                0,
                &[(0, Granted), (1, Granted), (2, Granted)],
                &[Pending, Pending, Won],
            ),
            // The preferred node granting is not enough alone.
            (
                5,
                4,
                &[(4, Granted), (0, Refused), (1, Refused), (2, Refused)],
                &[Pending, Pending, Pending, Lost(Loss::Refused)],
            ),
            // A cluster-wide outage is reported as such.
            (
                5,
                0,
                &[(1, Failed), (2, Failed), (3, Failed)],
                &[Pending, Pending, Lost(Loss::Unavailable)],
            ),
        ];
        for (nodes, preferred, votes, decisions) in table {
            let mut tally = Tally::preferring(*nodes, *preferred);
            for ((node, vote), expected) in votes.iter().zip(decisions.iter()) {
                assert_eq!(
                    tally.record(*node, *vote),
                    *expected,
                    "{nodes} nodes, preferred {preferred}, votes {votes:?}"
                );
            }
        }
    }

    #[test]
    fn refusals_alone_lose_only_past_the_tolerated_count() {
        let mut tally = Tally::new(5);
        tally.record(0, Refused);
        tally.record(1, Failed);
        assert_eq!(tally.record(2, Refused), Lost(Loss::Refused));
        assert!(
            !tally.refusals_alone_lose(),
            "two refusals of five: not proof"
        );
        tally.record(3, Refused);
        assert!(tally.refusals_alone_lose());
    }

    #[test]
    fn drift_is_proportional_plus_floor() {
        let table = [
            (ms(10_000), 0.01, ms(102)),
            (ms(10_000), 0.0, ms(2)),
            (ms(1_000), 0.05, ms(52)),
        ];
        for (ttl, factor, expected) in table {
            assert_eq!(drift(ttl, factor), expected, "ttl {ttl:?} factor {factor}");
        }
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift_and_saturates() {
        let table = [
            (ms(10_000), ms(5), ms(102), ms(9_893)),
            (ms(10_000), ms(9_898), ms(102), ms(0)),
            (ms(10_000), ms(9_899), ms(102), ms(0)),
            (ms(10_000), ms(20_000), ms(102), ms(0)),
            (ms(100), ms(0), ms(3), ms(97)),
        ];
        for (ttl, elapsed, drift, expected) in table {
            assert_eq!(validity(ttl, elapsed, drift), expected);
        }
    }

    #[test]
    fn usable_needs_positive_validity_above_the_minimum() {
        assert!(!is_usable(ms(0), ms(0)));
        assert!(is_usable(ms(1), ms(0)));
        assert!(!is_usable(ms(99), ms(100)));
        assert!(is_usable(ms(100), ms(100)));
    }

    #[test]
    fn retry_delay_spans_base_plus_minus_jitter() {
        let table = [
            (ms(200), ms(100), 0.0, ms(100)),
            (ms(200), ms(100), 0.5, ms(200)),
            (ms(200), ms(100), 0.75, ms(250)),
            (ms(200), ms(0), 0.3, ms(200)),
            // Jitter larger than the base never goes negative.
            (ms(10), ms(50), 0.0, ms(0)),
            // Out-of-range samples are clamped, not trusted.
            (ms(200), ms(100), 7.0, ms(300)),
            (ms(200), ms(100), -1.0, ms(100)),
        ];
        for (base, jitter, unit, expected) in table {
            assert_eq!(retry_delay(base, jitter, unit), expected, "unit {unit}");
        }
    }
}
