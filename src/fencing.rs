//! Fencing tokens: numbers that strictly increase from one holder of a
//! resource to the next, so storage can reject writes from a holder whose
//! lock expired while it was paused.
//!
//! This module holds the token type, the modes that issue tokens, and the
//! pure token arithmetic; the storage-side check lives in [`crate::storage`].

use std::fmt;

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
    /// counter in the same script as its `SET NX PX`, and must be among the
    /// nodes that granted the lock. One round trip, like a plain lock; but
    /// while that node is down no lock on any resource can be taken.
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
    /// Each resource has its own counter, kept forever (it must outlive
    /// every lock on the resource): one key per resource ever locked with
    /// fencing, on every node that issues tokens.
    #[default]
    PerResource,
    /// Resources with a hash tag share their tag's counter
    /// (`quorumlock:fence:{tag}`); a resource without one keeps its own.
    /// Name a service's per-entity resources under a few tags
    /// (`{orders}:1`, `{orders}:2`, …, or a tag per tenant on a Redis
    /// Cluster, where a tag is a slot) and the counters are as many as the
    /// tags. A resource's tokens still strictly increase: every token of
    /// the tag comes from one counter, which only goes up. A reader's token
    /// is then the latest writer's of the tag, at least the resource's.
    PerHashTag,
}

impl Fencing {
    /// Round trips to the nodes an acquisition takes in this mode.
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
