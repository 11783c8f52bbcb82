//! The waiter's decisions, free of I/O: how soon a quorum may be free
//! after a refused attempt, and when to try again and why.

use std::time::Duration;

use tokio::time::Instant;

/// How soon a quorum of nodes may let the waiter in, from what the nodes
/// that answered a queued attempt said (`Some(0)` where it is free or was
/// granted, `None` where the node cannot tell): the `quorum`-th smallest
/// known value, which more answers could only make sooner. With fewer
/// values than that (nodes failed or timed out before the round was
/// decided), the largest known one if some node is held (a guess, not a
/// bound, so that a waiter whose attempt met a slow node still sleeps
/// until the holder's keys expire instead of polling); `None` (poll) when
/// no node gave a value or none is held: then failures, not a holder, are
/// what stopped the attempt.
pub(crate) fn opens_in(per_node: &[Option<Duration>], quorum: usize) -> Option<Duration> {
    let mut known: Vec<Duration> = per_node.iter().flatten().copied().collect();
    known.sort_unstable();
    match quorum {
        0 => None,
        q if known.len() >= q => Some(known[q - 1]),
        _ => known.last().copied().filter(|largest| !largest.is_zero()),
    }
}

/// The longest a waiter's queue entry lives unless renewed: a waiter that
/// died without leaving (SIGKILL, a host lost) holds up those behind it
/// for at most this long, whatever TTL it asked for its lock.
pub(crate) const LONGEST_LEASE: Duration = Duration::from_secs(2);

/// The lease of a waiter for a lock of `ttl`: its queue entry's life
/// unless renewed (the waiter renews it every half lease while it waits).
/// Never longer than the TTL (a waiter for a short lock is as short-lived
/// as its holder would be), nor than [`LONGEST_LEASE`]. A live waiter
/// whose entry died anyway (a pause longer than the lease) is queued again
/// by its next attempt under the same ticket, so in the same place.
pub(crate) fn waiter_lease(ttl: Duration) -> Duration {
    ttl.min(LONGEST_LEASE)
}

/// Node `index`'s bit in a set of nodes. Nodes past the 63rd share the
/// last bit: a ring from one of them counts as from any, which costs at
/// most an attempt too many.
pub(crate) fn node_bit(index: usize) -> u64 {
    1 << index.min(63)
}

/// Every node (a notice may have been missed on any of them).
pub(crate) const EVERY_NODE: u64 = u64::MAX;

/// What the answers of a queued attempt tell its waiter: when lost, when
/// to try again; won or lost, where it stands in line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Refusals {
    /// How soon after the attempt began a quorum may be free (see
    /// [`opens_in`]; each node's bound counts from its answer).
    pub(crate) opens_in: Option<Duration>,
    /// The nodes that refused with a queued answer (see [`node_bit`]).
    pub(crate) refused_by: u64,
    /// The nodes whose answer said they left the waiter in their queue:
    /// those that refused with a queued answer, and those that granted
    /// while others waited there. A waiter that wins must leave them.
    pub(crate) in_line_on: u64,
}

impl Refusals {
    /// The nodes whose ring is worth another attempt at once: those that
    /// refused. A node that refused rings the waiter only once what kept
    /// it out there is gone (a release, a waiter ahead that left). A ring
    /// from a node that granted or did not answer in time is, as a rule,
    /// the echo of the waiter's own rollback there (the key is kept for
    /// it): news of nothing, and trying again on it would only meet the
    /// same refusals (`wait_loop` still lets the first such ring after
    /// news set off one attempt). Not only the counter node's ring when it
    /// refused: a hand-off's first ring most often comes from a faster
    /// node, and an attempt sent then still reaches the counter node behind
    /// the release, a round trip sooner (waiting for its ring cost the
    /// hot-key benchmark a tenth of its hand-offs). At least one of the
    /// nodes that refused must change before a quorum can grant: they were
    /// enough to keep one out. When no node refused with a queued answer
    /// (e.g. quorum fencing's second round lost), any ring counts.
    pub(crate) fn news_from(&self) -> u64 {
        if self.refused_by == 0 {
            EVERY_NODE
        } else {
            self.refused_by
        }
    }
}

/// Why a waiter tried again.
///
/// ```
/// use quorumlock::wait::WakeCause;
///
/// // The `cause` label of `quorumlock_wait_wakeups_total`.
/// let labels: Vec<&str> = [WakeCause::Notification, WakeCause::Expiry, WakeCause::Poll]
///     .into_iter()
///     .map(WakeCause::label)
///     .collect();
/// assert_eq!(labels, ["notification", "expiry", "poll"]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WakeCause {
    /// A release on a node named it the first waiter in the queue (or its
    /// subscription was re-established, when a notice may have been lost).
    Notification,
    /// The time the nodes gave for the holder's keys to expire (or for
    /// the waiter ahead of it to be dropped from the queue) passed.
    Expiry,
    /// No bound was known (nodes failed, or a key has no expiry), or its
    /// queue entry was due for renewal: it tried again on a timer.
    Poll,
}

impl WakeCause {
    /// The label of the wake-up counter and the `woken_by` tracing field.
    ///
    /// ```
    /// use quorumlock::wait::WakeCause;
    ///
    /// assert_eq!(WakeCause::Notification.label(), "notification");
    /// ```
    pub fn label(self) -> &'static str {
        match self {
            WakeCause::Notification => "notification",
            WakeCause::Expiry => "expiry",
            WakeCause::Poll => "poll",
        }
    }
}

/// What a waiter does after a refused attempt: sleep until `at` unless a
/// notification comes first, then try again for `cause`, or give up if
/// `at` is the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Retry { at: Instant, cause: WakeCause },
    GiveUpAt(Instant),
}

/// The timers a waiter lives by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timers {
    /// Added to a known bound (which counts from the attempt's reply).
    pub(crate) margin: Duration,
    /// Longest sleep: the waiter's queue entry must be renewed before it
    /// dies.
    pub(crate) renew_every: Duration,
    /// The sleep when no bound is known.
    pub(crate) poll: Duration,
    /// The shortest sleep: nothing makes a waiter spin (a bound of zero
    /// from a node whose key vanished).
    pub(crate) shortest: Duration,
}

/// When to try again after an attempt that began at `started` and ended
/// at `now` found the lock may be free `opens_in` after it began.
pub(crate) fn next_step(
    started: Instant,
    now: Instant,
    deadline: Instant,
    opens_in: Option<Duration>,
    timers: Timers,
) -> Step {
    let (at, cause) = match opens_in {
        Some(bound) if bound + timers.margin <= timers.renew_every => (
            (started + bound + timers.margin).max(now + timers.shortest),
            WakeCause::Expiry,
        ),
        // A renewal shorter than the shortest pause (a TTL under 20 ms)
        // does not make it spin either.
        Some(_) => (
            now + timers.renew_every.max(timers.shortest),
            WakeCause::Poll,
        ),
        None => (
            now + timers.poll.min(timers.renew_every).max(timers.shortest),
            WakeCause::Poll,
        ),
    };
    if at >= deadline {
        Step::GiveUpAt(deadline)
    } else {
        Step::Retry { at, cause }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_quorum_is_free_at_its_slowest_member() {
        type Case<'a> = (&'a [Option<Duration>], usize, Option<Duration>);
        let table: [Case<'_>; 9] = [
            // Five answers: the third smallest.
            (
                &[
                    Some(ms(900)),
                    Some(ms(10)),
                    Some(ms(500)),
                    Some(ms(0)),
                    Some(ms(700)),
                ],
                3,
                Some(ms(500)),
            ),
            // A round decided after three refusals: the largest of them
            // (an upper bound of what five answers would give).
            (
                &[Some(ms(300)), Some(ms(100)), Some(ms(200))],
                3,
                Some(ms(300)),
            ),
            // Unknown values (no expiry) do not count.
            (
                &[Some(ms(300)), None, Some(ms(200)), Some(ms(50))],
                3,
                Some(ms(300)),
            ),
            // Too few values: the largest, as a guess.
            (&[Some(ms(300)), None, None, Some(ms(50))], 3, Some(ms(300))),
            (&[None, None], 3, None),
            // Grants from the few nodes up: nothing to wait for but nodes.
            (&[Some(ms(0)), Some(ms(0)), None], 3, None),
            (&[], 3, None),
            (&[Some(ms(0))], 1, Some(ms(0))),
            (&[Some(ms(5))], 0, None),
        ];
        for (per_node, quorum, expected) in table {
            assert_eq!(
                opens_in(per_node, quorum),
                expected,
                "{per_node:?} q={quorum}"
            );
        }
    }

    #[test]
    fn news_comes_from_the_nodes_that_refused() {
        let bits = |nodes: &[usize]| nodes.iter().fold(0, |all, &i| all | node_bit(i));
        let refusals = |refused: &[usize]| Refusals {
            opens_in: None,
            refused_by: bits(refused),
            in_line_on: bits(refused),
        };
        assert_eq!(refusals(&[0, 1, 2]).news_from(), bits(&[0, 1, 2]));
        assert_eq!(refusals(&[3]).news_from(), bits(&[3]));
        assert_eq!(refusals(&[]).news_from(), EVERY_NODE);
        // Nodes past the 63rd share a bit.
        assert_eq!(node_bit(63), node_bit(200));
    }

    #[test]
    fn steps_follow_the_bound_the_renewal_and_the_deadline() {
        let now = Instant::now();
        let timers = Timers {
            margin: ms(2),
            renew_every: ms(5_000),
            poll: ms(200),
            shortest: ms(10),
        };
        let far = now + ms(60_000);
        assert_eq!(
            next_step(now, now, far, Some(ms(300)), timers),
            Step::Retry {
                at: now + ms(302),
                cause: WakeCause::Expiry
            }
        );
        // A bound beyond the renewal: renew (poll) first.
        assert_eq!(
            next_step(now, now, far, Some(ms(9_000)), timers),
            Step::Retry {
                at: now + ms(5_000),
                cause: WakeCause::Poll
            }
        );
        assert_eq!(
            next_step(now, now, far, None, timers),
            Step::Retry {
                at: now + ms(200),
                cause: WakeCause::Poll
            }
        );
        // The deadline comes first: sleep until it, then give up (unless
        // a notification comes sooner).
        let soon = now + ms(100);
        assert_eq!(
            next_step(now, now, soon, Some(ms(300)), timers),
            Step::GiveUpAt(soon)
        );
        assert_eq!(next_step(now, now, now, None, timers), Step::GiveUpAt(now));
        // The bound counts from the attempt's start; the shortest pause
        // from its end.
        let began = now - ms(40);
        assert_eq!(
            next_step(began, now, far, Some(ms(300)), timers),
            Step::Retry {
                at: now + ms(262),
                cause: WakeCause::Expiry
            }
        );
        assert_eq!(
            next_step(began, now, far, Some(ms(30)), timers),
            Step::Retry {
                at: now + ms(10),
                cause: WakeCause::Expiry
            }
        );
        // A zero bound does not make it spin.
        assert_eq!(
            next_step(now, now, far, Some(ms(0)), timers),
            Step::Retry {
                at: now + ms(10),
                cause: WakeCause::Expiry
            }
        );
        // A short renewal caps the poll too.
        let short = Timers {
            renew_every: ms(50),
            ..timers
        };
        assert_eq!(
            next_step(now, now, far, None, short),
            Step::Retry {
                at: now + ms(50),
                cause: WakeCause::Poll
            }
        );
        // A renewal under the shortest pause (a lock of a few ms) waits
        // the shortest pause, whether a bound is known or not.
        let tiny = Timers {
            renew_every: ms(4),
            ..timers
        };
        for bound in [None, Some(ms(300))] {
            assert_eq!(
                next_step(now, now, far, bound, tiny),
                Step::Retry {
                    at: now + ms(10),
                    cause: WakeCause::Poll
                },
                "{bound:?}"
            );
        }
    }
}
