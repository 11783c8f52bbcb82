//! Fencing tokens: numbers that strictly increase from one holder of a
//! resource to the next, so storage can reject writes from a holder whose
//! lock expired while it was paused.
//!
//! This module holds the token type, the modes that issue tokens, and the
//! pure token arithmetic; the storage-side check lives in [`crate::storage`].

use std::fmt;
use std::time::Duration;

/// A fencing token: compare it on every write to the protected storage and
/// accept `token >= highest seen`, reject lower ones.
///
/// Tokens increase from holder to holder, with gaps: counters also rise for
/// attempts that then fail, a lock on several resources moves each of
/// their counters up to its one token, and a token is never lower than the
/// issuing node's clock in microseconds since 1970 (so the first token of
/// a resource is about 1.8 × 10^15, not 1). Compare them; never count on
/// consecutive ones.
///
/// The clock is what makes a token impossible to repeat: a counter node
/// that loses increments (a crash without `appendfsync always`, a data set
/// wiped or replaced) comes back with a lower counter, but its clock has
/// moved past every token it issued before (tokens rise by one per
/// microsecond at most), so the next token is still higher. That holds
/// unless the node's clock was stepped back meanwhile by more than the
/// outage lasted; the node guard quarantines a node whose clock steps
/// ([`ClockCheck`](crate::ClockCheck)), and in quorum mode it needs the
/// nodes' clocks to agree within the time a node takes to come back.
///
/// ```
/// use quorumlock::FencingToken;
///
/// // Storage keeps the highest token it accepted and refuses lower ones.
/// let highest = FencingToken::new(41);
/// let stale = FencingToken::new(40);
/// let current = FencingToken::new(42);
/// assert!(stale < highest && current >= highest);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token, e.g. one read back from storage.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw number, e.g. to store next to the data it guards.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

/// How a [`LockManager`](crate::LockManager) issues fencing tokens.
///
/// Run the nodes with AOF `appendfsync always`: the lock keys need it. The
/// tokens do not depend on it: a node that comes back with a lower counter
/// (or none) still issues tokens above every earlier one, because a token
/// is never lower than the node's clock in microseconds (see
/// [`FencingToken`]; `tests/fencing.rs` wipes every node between two
/// holders). All clients of one resource must use the same mode.
///
/// ```
/// use quorumlock::{Fencing, LockManager};
///
/// let manager = LockManager::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .fencing(Fencing::CounterNode { node: 0 }) // the default
///     .build()?;
/// # let _ = manager;
/// # Ok::<(), quorumlock::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// No tokens: plain `SET NX PX`; [`Lock::token`](crate::Lock::token) is `None`.
    Off,
    /// One node (by index in the node list) increments the resource's
    /// counter in the same script as its `SET NX PX`, and the others report
    /// their copy of the counter beside theirs: one round trip, like a
    /// plain lock, while that node answers. When it does not (down,
    /// unreachable, quarantined, slower than `node_timeout`, or holding
    /// someone else's key), the lock is still granted by a majority of the
    /// others, with a token above every earlier one, stored on a majority
    /// of them in a second round trip; so is a token the counter node
    /// issued that another node's counter or clock says is not yet safe to
    /// count alone (after such a failover, for about a second). No single
    /// node stops new locks. The rule: [`counter_node_token`].
    CounterNode {
        /// Index of the counter node in the configured node list.
        node: usize,
    },
    /// Every node returns its counter with its grant; the client takes the
    /// highest plus one and stores it back on each node where the lock is
    /// still its own, and the token counts once a majority stored it. Two
    /// round trips; works while any majority is up.
    ///
    /// Why a later holder's token is larger: our token was stored on a
    /// majority while our keys were there. A later holder's quorum must
    /// include one node of that majority, and it could only set its key
    /// there after ours was gone, so after our token was stored; the
    /// counter it reads there is at least our token, and it adds one.
    Quorum,
}

/// Which counter issues a resource's fencing tokens:
/// [`LockManagerBuilder::fence_counters`](crate::LockManagerBuilder::fence_counters).
/// Every client of a resource must use the same setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FenceCounters {
    /// Each resource has its own counter: one key per resource locked with
    /// fencing in the last [`COUNTER_LIFE`] (an hour) on the counter node,
    /// and one kept for good per resource whose token was stored on the
    /// nodes (quorum mode, a lock without the counter node).
    #[default]
    PerResource,
    /// Resources with a hash tag share their tag's counter
    /// (`quorumlock:fence:{tag}`); a resource without one keeps its own.
    /// Name a service's per-entity resources under a few tags
    /// (`{orders}:1`, `{orders}:2`, …, or a tag per tenant on a Redis
    /// Cluster, where a tag is a slot) and the counters are as many as the
    /// tags. A resource's tokens still strictly increase: every token of
    /// the tag comes from one counter, which only goes up (or expires once
    /// the clock has passed it). A reader's token
    /// is then the latest writer's of the tag, at least the resource's.
    PerHashTag,
}

/// The margin of counter-node fencing's failover, between the nodes'
/// clocks (µs since 1970) and the tokens: a token the counter node issues
/// counts at once only if it is at most half this above the clock of every
/// other node that granted, and a token issued without the counter node is
/// at least this above the clock of every node that granted it. Any two
/// grants of one resource share a node, whose clock only moves forward, so
/// the second token is the higher, whatever the offset between the
/// counter node's clock and the others'. See [`counter_node_token`].
pub const COUNTER_FAILOVER_MARGIN: Duration = Duration::from_secs(1);

/// How long a fencing counter the counter node set to its own clock lives
/// after that write (`issue` in the scripts' `counter.lua`; every other
/// counter is kept for good). A resource locked once so costs the counter
/// node memory for this long, not forever. Safe because the counter node's
/// tokens never go below its clock, which has passed the counter by this
/// much when it expires, and because its answer counts only when it is at
/// most [`COUNTER_FAILOVER_MARGIN`] below the other granting nodes' clocks
/// ([`clock_lowest`]): a clock stepped back since cannot bring an expired
/// counter's token back unless those clocks are unread or went back too.
pub const COUNTER_LIFE: Duration = Duration::from_secs(3600);

// An expired counter is far below every clock `clock_lowest` reads: the
// rule's margin is a sliver of the counter's life.
const _: () = assert!(COUNTER_LIFE.as_secs() > 1000 * COUNTER_FAILOVER_MARGIN.as_secs());

/// [`CounterGrants::lowest`]: the highest of the other granting nodes'
/// clocks (µs since 1970, each the most it can read now) less
/// [`COUNTER_FAILOVER_MARGIN`]. A counter-node token that counted alone was
/// at most half the margin above the clock of every other granting node;
/// its counter expires [`COUNTER_LIFE`] later by the counter node's clock,
/// so an answer at or above this one came later than that token by more
/// than the margin and a half of the other node's time (counted alone, it
/// was not above that node's clock by more). A clock never read adds no
/// bound (`ceiling` is 0 then: nothing counts alone anyway).
///
/// ```
/// use quorumlock::internals::clock_lowest;
///
/// assert_eq!(clock_lowest([Some(5_000_000), Some(2_000_000)]), 4_000_000);
/// assert_eq!(clock_lowest([Some(5_000_000), None]), 4_000_000);
/// assert_eq!(clock_lowest([]), 0);
/// ```
pub fn clock_lowest(most_now: impl IntoIterator<Item = Option<u64>>) -> u64 {
    let margin = COUNTER_FAILOVER_MARGIN.as_micros() as u64;
    most_now
        .into_iter()
        .map(|most| most.unwrap_or(0).saturating_sub(margin))
        .max()
        .unwrap_or(0)
}

/// What the grants of a counter-node round give as the lock's token: see
/// [`counter_node_token`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterToken {
    /// This token, as the round gave it (one round trip).
    Use(FencingToken),
    /// This token, once a majority of the nodes other than the counter node
    /// stored it while the lock's entries were there (a second round trip).
    Store(FencingToken),
}

/// What a counter-node round's grants said, for [`counter_node_token`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterGrants {
    /// A writer (its token is new) or a reader (its token is the latest
    /// writer's).
    pub writer: bool,
    /// The counter node's answer, if it granted: a writer's new token, or a
    /// reader's view of the counter.
    pub counter_node: Option<u64>,
    /// The highest counter that another granting node reported (0 for none).
    pub others: u64,
    /// The highest the counter node's answer may be to count as it is:
    /// [`clock_ceiling`] of the other granting nodes' clocks. `None` when
    /// their clocks are not read (the node guard is off): then nothing
    /// counts alone, and every token is stored.
    pub ceiling: Option<u64>,
    /// The least a writer's token from the counter node may be to count at
    /// all: [`clock_lowest`] of the other granting nodes' clocks. A counter
    /// node whose clock is behind theirs by more than the margin (stepped
    /// back, perhaps) may issue a token below one of its own whose counter
    /// expired ([`COUNTER_LIFE`]); then the token is placed above their
    /// clocks, as without the counter node. (A reader's answer is the
    /// latest writer's token, however old: not checked.)
    pub lowest: u64,
}

impl CounterGrants {
    /// The counter node's answer, if the token rule may use it at all: a
    /// writer's token below `lowest` is treated as absent (a reader's
    /// answer is the latest writer's token, however old).
    pub fn usable_answer(&self) -> Option<u64> {
        self.counter_node
            .filter(|&answer| !self.writer || answer >= self.lowest)
    }
}

/// [`CounterGrants::ceiling`]: the lowest of the other granting nodes'
/// clocks (µs since 1970, each the least it can read now) plus half
/// [`COUNTER_FAILOVER_MARGIN`]. A node whose clock was never read makes it
/// 0 (nothing counts alone); no other node at all (a single node, which
/// no grant can do without), no bound.
///
/// ```
/// use quorumlock::internals::clock_ceiling;
///
/// assert_eq!(clock_ceiling([Some(2_000_000), Some(1_000_000)]), 1_500_000);
/// assert_eq!(clock_ceiling([Some(2_000_000), None]), 0);
/// assert_eq!(clock_ceiling([]), u64::MAX);
/// ```
pub fn clock_ceiling(least_now: impl IntoIterator<Item = Option<u64>>) -> u64 {
    let half_margin = COUNTER_FAILOVER_MARGIN.as_micros() as u64 / 2;
    least_now
        .into_iter()
        .map(|least| least.map_or(0, |least| least.saturating_add(half_margin)))
        .min()
        .unwrap_or(u64::MAX)
}

/// The `clock_floor` of [`counter_node_token`]: the highest of the granting
/// nodes' clocks (µs since 1970, each the most it can read now) plus
/// [`COUNTER_FAILOVER_MARGIN`]; `None` when a node's clock was never read
/// (the one the next holder shares with an earlier one may be it) or there
/// is no node.
///
/// ```
/// use quorumlock::internals::clock_floor;
///
/// assert_eq!(clock_floor([Some(2_000_000), Some(1_000_000)]), Some(3_000_000));
/// assert_eq!(clock_floor([Some(2_000_000), None]), None);
/// ```
pub fn clock_floor(most_now: impl IntoIterator<Item = Option<u64>>) -> Option<u64> {
    let margin = COUNTER_FAILOVER_MARGIN.as_micros() as u64;
    let mut highest = None;
    for most in most_now {
        highest = Some(highest.unwrap_or(0).max(most?));
    }
    highest.map(|most: u64| most.saturating_add(margin))
}

/// The token rule of [`Fencing::CounterNode`]. `clock_floor` gives, when
/// the counter node did not grant, the highest of the granting nodes'
/// clocks (at most what they can read now) plus [`COUNTER_FAILOVER_MARGIN`].
///
/// - The counter node granted, its token is above every counter the other
///   granting nodes reported and not above `ceiling`: that token, in one
///   round trip.
/// - The counter node granted otherwise: one above the highest of its token
///   and the reported counters, stored (on the counter node too).
/// - It did not grant, or a writer's token from it is below `lowest` (its
///   clock is behind another granting node's by more than the margin, and
///   its own expired counters may be above it): above every counter
///   reported and at least `clock_floor`, stored.
///
/// Why tokens rise in grant order: of two consecutive holders, the second's
/// grants share a node with the first's (two majorities meet; the one
/// issued without the counter node, by a majority of the others, meets any
/// other majority outside the counter node). A stored token is on that
/// shared node before the second holder's entry, so the second reads it
/// and goes above it. A token the counter node issued and that counted at
/// once is above the counters it was checked against (so above every
/// stored one before it), and at most half the margin above the shared
/// node's clock then; a later token without the counter node is a whole
/// margin above that node's clock later, which has not gone back by as
/// much (the assumption: `docs/guarantees.md`). Two tokens from the counter
/// node follow its counter, which a stored token raises too (a stored
/// counter never expires), or its clock once the counter expired
/// ([`COUNTER_LIFE`]), which has passed it unless it went back: then its
/// answer is below `lowest`.
///
/// A reader takes the latest writer's token, not a new one: the counter
/// node's counter (raised to its clock), when it is at least every
/// reported counter and not
/// above `ceiling`; else the highest of them, stored (a reported counter
/// may be a failed attempt's, stored on a minority only: stored on a
/// majority, later writers go above it); without the counter node, that
/// or `clock_floor`, whichever is higher, stored.
///
/// ```
/// use quorumlock::internals::{CounterGrants, CounterToken, FencingToken, counter_node_token};
///
/// let grants = |counter_node, others| CounterGrants {
///     writer: true,
///     counter_node,
///     others,
///     ceiling: Some(50),
///     lowest: 5,
/// };
/// let t = FencingToken::new;
/// // The healthy path: the counter node's token, as it is.
/// assert_eq!(counter_node_token(grants(Some(10), 7), || 99), CounterToken::Use(t(10)));
/// // Another node holds a higher token (one issued without the counter node).
/// assert_eq!(counter_node_token(grants(Some(10), 12), || 99), CounterToken::Store(t(13)));
/// // The counter node's clock runs ahead of the others' by more than half the margin.
/// assert_eq!(counter_node_token(grants(Some(60), 12), || 99), CounterToken::Store(t(61)));
/// // The counter node did not grant: above the clocks' floor.
/// assert_eq!(counter_node_token(grants(None, 12), || 99), CounterToken::Store(t(99)));
/// // Its clock is far behind another granting node's: as if it had not.
/// assert_eq!(counter_node_token(grants(Some(4), 0), || 99), CounterToken::Store(t(99)));
/// ```
pub fn counter_node_token(
    grants: CounterGrants,
    clock_floor: impl FnOnce() -> u64,
) -> CounterToken {
    let counter_node = grants.usable_answer();
    let CounterGrants {
        writer,
        others,
        ceiling,
        ..
    } = grants;
    let below_ceiling = |token: u64| ceiling.is_some_and(|ceiling| token <= ceiling);
    let token = FencingToken;
    match (writer, counter_node) {
        (true, Some(issued)) if issued > others && below_ceiling(issued) => {
            CounterToken::Use(token(issued))
        }
        (true, Some(issued)) => CounterToken::Store(token(issued.max(others).saturating_add(1))),
        (true, None) => CounterToken::Store(token(others.saturating_add(1).max(clock_floor()))),
        (false, Some(counter)) if counter >= others && below_ceiling(counter) => {
            CounterToken::Use(token(counter))
        }
        (false, Some(counter)) => CounterToken::Store(token(counter.max(others))),
        (false, None) => CounterToken::Store(token(others.max(clock_floor()))),
    }
}

impl Fencing {
    /// Round trips to the nodes an acquisition takes in this mode, as the
    /// TTL must allow for (a counter-node lock takes a second only when the
    /// counter node did not answer or its token cannot count alone: a TTL
    /// shorter than two `node_timeout`s may then be too short, and the
    /// attempt fails as `TooSlow`).
    pub(crate) fn round_trips(self) -> u32 {
        match self {
            Self::Off | Self::CounterNode { .. } => 1,
            Self::Quorum => 2,
        }
    }
}

impl Default for Fencing {
    /// Counter node 0.
    fn default() -> Self {
        Self::CounterNode { node: 0 }
    }
}

/// The token for a quorum-mode acquisition: one more than the highest
/// counter reported by the nodes that granted it (1 when there is none).
/// Saturates at `u64::MAX`; the nodes never report a counter that high
/// (their script refuses counters above `u64::MAX − 1` with
/// [`Error::InvalidCounter`](crate::Error::InvalidCounter)), so the token
/// is always larger than every counter read.
///
/// ```
/// let token = quorumlock::internals::quorum_token([7, 9, 8]);
/// assert_eq!(token.get(), 10);
/// assert_eq!(quorumlock::internals::quorum_token([]).get(), 1);
/// ```
pub fn quorum_token(counters: impl IntoIterator<Item = u64>) -> FencingToken {
    let highest = counters.into_iter().max().unwrap_or(0);
    FencingToken(highest.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quorum_token_is_one_above_the_highest_counter() {
        let table: &[(&[u64], u64)] = &[(&[], 1), (&[0, 0, 0], 1), (&[3, 7, 5], 8), (&[9], 10)];
        for (counters, expected) in table {
            assert_eq!(quorum_token(counters.iter().copied()).get(), *expected);
        }
    }

    #[test]
    fn counter_node_tokens_count_alone_only_when_nothing_says_otherwise() {
        let (use_, store) = (
            |t| CounterToken::Use(FencingToken(t)),
            |t| CounterToken::Store(FencingToken(t)),
        );
        // (writer, counter node's answer, others' highest, ceiling) → plan,
        // with the clocks' floor at 1 000.
        let table = [
            // Writers.
            (true, Some(10), 0, Some(50), use_(10)),
            (true, Some(10), 9, Some(50), use_(10)),
            (true, Some(10), 10, Some(50), store(11)),
            (true, Some(10), 12, Some(50), store(13)),
            (true, Some(60), 12, Some(50), store(61)),
            (true, Some(60), 12, None, store(61)),
            (true, Some(10), 0, None, store(11)),
            (true, None, 0, Some(50), store(1_000)),
            (true, None, 2_000, Some(50), store(2_001)),
            // Readers: the counter as it stands, unless another node shows
            // more (perhaps a failed attempt's, on a minority: stored).
            (false, Some(10), 10, Some(50), use_(10)),
            (false, Some(10), 12, Some(50), store(12)),
            (false, Some(60), 12, Some(50), store(60)),
            (false, None, 12, Some(50), store(1_000)),
            (false, None, 2_000, Some(50), store(2_000)),
            // A writer's token below `lowest` (8 here): as if the counter
            // node had not granted (its clock is behind; its counter may
            // have expired). A reader's answer is the latest writer's
            // token, however old.
            (true, Some(7), 0, Some(50), store(1_000)),
            (true, Some(7), 2_000, Some(50), store(2_001)),
            (false, Some(7), 0, Some(50), use_(7)),
            (true, Some(8), 0, Some(50), use_(8)),
            (false, Some(8), 0, Some(50), use_(8)),
        ];
        for (writer, counter_node, others, ceiling, expected) in table {
            let grants = CounterGrants {
                writer,
                counter_node,
                others,
                ceiling,
                lowest: 8,
            };
            assert_eq!(counter_node_token(grants, || 1_000), expected, "{grants:?}");
        }
    }

    #[test]
    fn the_clock_floor_is_read_only_without_the_counter_nodes_grant() {
        let grants = CounterGrants {
            writer: true,
            counter_node: Some(5),
            others: 0,
            ceiling: Some(u64::MAX),
            lowest: 0,
        };
        let plan = counter_node_token(grants, || panic!("not needed with the counter node"));
        assert_eq!(plan, CounterToken::Use(FencingToken(5)));
    }

    #[test]
    fn the_scripts_expire_counters_as_the_rule_assumes() {
        let script = include_str!("scripts/counter.lua");
        let life = format!("local COUNTER_LIFE_MS = {}\n", COUNTER_LIFE.as_millis());
        assert!(script.contains(&life), "counter.lua lacks {life:?}");
    }

    #[test]
    fn tokens_order_and_print_as_numbers() {
        assert!(FencingToken::new(2) > FencingToken::new(1));
        assert_eq!(FencingToken::new(42).to_string(), "42");
        assert_eq!(u64::from(FencingToken::new(7)), 7);
    }

    proptest! {
        #[test]
        fn quorum_token_exceeds_every_counter(counters in prop::collection::vec(0u64..1 << 53, 0..9)) {
            let token = quorum_token(counters.iter().copied());
            prop_assert!(counters.iter().all(|&c| token.get() > c));
        }

        /// The intersection argument, on the arithmetic alone: holders take
        /// turns; each reads the counters of a random majority, takes
        /// max + 1 and stores it on another random majority. Every token is
        /// larger than all earlier ones.
        #[test]
        fn majorities_make_tokens_strictly_increase(
            nodes in 1usize..8,
            picks in prop::collection::vec((any::<u64>(), any::<u64>()), 1..40),
        ) {
            let needed = crate::quorum::quorum(nodes);
            let mut counters = vec![0u64; nodes];
            let mut last = 0u64;
            for (read_seed, write_seed) in picks {
                let read = majority(nodes, needed, read_seed);
                let token = quorum_token(read.iter().map(|&i| counters[i]));
                prop_assert!(token.get() > last, "token {} after {}", token, last);
                for i in majority(nodes, needed, write_seed) {
                    counters[i] = counters[i].max(token.get());
                }
                last = token.get();
            }
        }
    }

    /// `needed` distinct node indexes out of `nodes`, chosen by `seed`.
    fn majority(nodes: usize, needed: usize, seed: u64) -> Vec<usize> {
        let mut indexes: Vec<usize> = (0..nodes).collect();
        let mut rng = fastrand::Rng::with_seed(seed);
        rng.shuffle(&mut indexes);
        indexes.truncate(needed);
        indexes
    }
}
