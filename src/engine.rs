//! The orchestration under the public types: what one attempt, extension
//! or release does across the nodes, and the background cleanup of
//! attempts and locks that were dropped or failed.
//!
//! The rules come from [`crate::quorum`], the fan-out from
//! [`crate::round`]; this module strings them together for one round (or
//! two, for quorum fencing). Every request is bounded by `node_timeout`,
//! and a round stops waiting as soon as its outcome is decided, so no call
//! waits on a straggler. Retrying, waiting and keeping alive are built on
//! it by [`crate::manager`], [`crate::wait`] and [`crate::watchdog`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::background::Background;
use crate::config::Config;
use crate::error::{Error, NodeError, NodeErrorKind, NotHeldReason, Result};
use crate::fencing::{
    COUNTER_FAILOVER_MARGIN, CounterGrants, CounterToken, Fencing, FencingToken, clock_ceiling,
    clock_floor, clock_lowest, counter_node_token, quorum_token,
};
use crate::guard::judge::{Quarantine, QuarantineReason};
use crate::guard::policy::Policy;
use crate::health::Board;
use crate::holding::described;
use crate::keys::{Access, Keys};
use crate::member::{Member, Timeouts};
use crate::node::Connection;
use crate::ops::{Counting, Op, Queued};
use crate::quorum::{self, Decision, Loss, Tally};
use crate::retry::{Class, Retries};
use crate::round::{Fanout, Late, Request, Round, Trail};
use crate::telemetry;
use crate::wait::notify::Hub;
use crate::wait::plan::Refusals;

/// Cleanup that failed on a node (down, in its reconnect backoff, timed
/// out) is tried again after these pauses, doubling, for this long: a node
/// that restarts with our key must not keep it for a whole TTL.
const CLEANUP_FIRST_PAUSE: Duration = Duration::from_millis(100);
const CLEANUP_LONGEST_PAUSE: Duration = Duration::from_secs(1);
const CLEANUP_RETRIES_FOR: Duration = Duration::from_secs(30);

/// What one acquisition attempt may have put on the nodes: its keys, the
/// value unique to it, and the connections its SETs went out on. Cleanup
/// (rollback, release) goes by it.
#[derive(Clone)]
pub(crate) struct Claim {
    pub(crate) keys: Arc<Keys>,
    pub(crate) value: Arc<str>,
    pub(crate) sent: Arc<Trail>,
    /// The waiter that won it, if it was taken by waiting: a waiter stays
    /// first in the queue of the nodes that granted it until its lock is
    /// released (so that an attempt that loses keeps its place), and the
    /// release takes it out of every queue the attempt reached.
    pub(crate) waiter: Option<u64>,
    /// For a lock taken `at_least` (see `Request::at_least`): until when a
    /// release keeps the key instead of deleting it.
    pub(crate) keep_until: Option<Instant>,
}

impl Claim {
    /// A fresh attempt at `keys` over `nodes` nodes, with a new value.
    pub(crate) fn new(keys: Arc<Keys>, nodes: usize) -> Self {
        let value = new_lock_value();
        let value = match &keys.holder {
            None => value,
            Some(description) => Arc::from(described(&value, description)),
        };
        Self {
            keys,
            value,
            sent: Trail::new(nodes),
            waiter: None,
            keep_until: None,
        }
    }

    /// How a release of this claim goes now: a delete, or (an `at_least`
    /// lock whose time is not up) a keep for the time left.
    pub(crate) fn release_op(&self) -> Op {
        let keep_ms = self
            .keep_until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
            // Whole milliseconds, rounded up: never shorter than asked.
            .map(|left| left.as_micros().div_ceil(1000) as u64);
        Op::Release {
            waiter: self.waiter,
            keep_ms,
        }
    }

    /// The connection node `index` must be cleaned up on (behind the
    /// request that may have set our key there), if it must be: a node
    /// that refused our acquire holds nothing of it, unless a waiter is to
    /// be dequeued there.
    pub(crate) fn cleanup_on(&self, index: usize) -> Option<&Arc<Connection>> {
        let sent = self.sent.sent_on(index)?;
        (self.waiter.is_some() || !self.sent.refused(index)).then_some(sent)
    }

    /// Whether any node needs cleaning up.
    pub(crate) fn needs_cleanup(&self) -> bool {
        (0..self.sent.len()).any(|index| self.cleanup_on(index).is_some())
    }
}

/// A value unique to one acquisition attempt: a uuid v4 (122 random bits).
fn new_lock_value() -> Arc<str> {
    // Written on the stack, then copied once into the shared string.
    let mut text = [0; uuid::fmt::Simple::LENGTH];
    Arc::from(&*uuid::Uuid::new_v4().simple().encode_lower(&mut text))
}

/// What a lock needs of its manager: the settings, the nodes, and the
/// counter of background work.
pub(crate) struct Core {
    pub(crate) config: Config,
    /// The quorum's members (a server, or a Redis Cluster, each).
    pub(crate) nodes: Arc<[Member]>,
    pub(crate) background: Arc<Background<Claim>>,
    guard: Arc<Policy>,
    /// Release notifications for waiters.
    pub(crate) hub: Hub,
    /// What the nodes' requests and the attempts say of availability, and
    /// the circuit breaker.
    pub(crate) board: Arc<Board>,
}

impl Core {
    /// Sets up the nodes (unconnected), the guard, the health board and
    /// the release notices for `config`.
    pub(crate) fn new(config: Config) -> Self {
        let shortest_window = match config.fencing {
            Fencing::CounterNode { .. } => 2 * COUNTER_FAILOVER_MARGIN,
            Fencing::Off | Fencing::Quorum => Duration::ZERO,
        };
        let guard = Arc::new(
            Policy::new(&config.node_guard, config.ttl, config.drift_factor)
                .with_window_of_at_least(shortest_window),
        );
        let board = Board::new(
            config.nodes.iter().map(|spec| spec.name.clone()).collect(),
            config.circuit_breaker,
        );
        let nodes = config
            .nodes
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let timeouts = Timeouts {
                    connect: config.connect_timeout,
                    node: config.node_timeout,
                };
                Member::new(spec, timeouts, &guard, board.reporter(i))
            })
            .collect();
        let hub = Hub::new(
            config
                .nodes
                .iter()
                .map(|spec| {
                    let servers = match &spec.cluster {
                        Some(cluster) => cluster.seeds.clone(),
                        None => vec![spec.client.clone()],
                    };
                    (spec.name.clone(), servers)
                })
                .collect(),
            config.node_timeout,
            config.connect_timeout,
        );
        Self {
            config,
            nodes,
            background: Arc::default(),
            guard,
            hub,
            board,
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        self.board.retire();
    }
}

/// A won acquisition or extension: when it started, until when it is
/// valid, and the fencing token it was issued (acquisition only).
pub(crate) struct Granted {
    pub(crate) started: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) token: Option<FencingToken>,
}

/// One acquisition attempt in flight: if it is dropped before it hands its
/// claim to a [`Lock`] (failed, or cancelled at any await), whatever it may
/// have set is removed in the background.
pub(crate) struct Attempt {
    core: Arc<Core>,
    claim: Option<Claim>,
}

impl Attempt {
    /// Armed before the attempt's first request: a drop from then on
    /// rolls back.
    pub(crate) fn new(core: &Arc<Core>, claim: &Claim) -> Self {
        Self {
            core: Arc::clone(core),
            claim: Some(claim.clone()),
        }
    }

    /// The claim, now owned by a lock.
    pub(crate) fn won(mut self) -> Claim {
        self.claim.take().expect("an attempt is won once")
    }

    /// Rolls the attempt back now, within `node_timeout`: once this
    /// returns, no key of it is left where the nodes answered (the rest
    /// is retried in the background). Dropped halfway, it rolls back in
    /// the background as a drop does.
    pub(crate) async fn roll_back(mut self) {
        let Some(claim) = self.claim.as_ref() else {
            return;
        };
        claim.sent.close();
        let reached: Vec<usize> = (0..self.core.nodes.len())
            .filter(|&i| claim.cleanup_on(i).is_some())
            .collect();
        let failed = self.core.delete_on(claim, &reached).await;
        if let Some(claim) = self.claim.take()
            && !failed.is_empty()
        {
            self.core.keep_cleaning(claim, failed);
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            // No request of the attempt goes out any more; then remove
            // ours wherever one may have gone. The value is unique to this
            // attempt, so this can never touch another attempt's key.
            claim.sent.close();
            self.core.clean_up(claim);
        }
    }
}

/// What a retrying call does after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// The resource is held: wait it out as the call does.
    Contended,
    /// The service was unavailable: retry after this pause.
    RetryAfter(Duration),
    /// End the call with the attempt's error.
    GiveUp,
}

impl Core {
    /// Classes an attempt's `failure` (started at `attempt_started`, over
    /// at `ended`) for a retrying call: contention ends a run of
    /// unavailability; unavailability is retried on the backoff, unless
    /// the backoff is used up, the pause would end past `deadline`, or the
    /// breaker (perhaps opened by this very attempt) would refuse the
    /// retry: then the call ends with the attempt's own error rather than
    /// sleeping first.
    pub(crate) fn after_failure(
        &self,
        retries: &mut Retries<'_>,
        failure: &Error,
        attempt_started: Instant,
        ended: Instant,
        deadline: Option<Instant>,
    ) -> AfterFailure {
        match Class::of(failure) {
            Class::Final => AfterFailure::GiveUp,
            Class::Contended => {
                retries.reset();
                AfterFailure::Contended
            }
            Class::Unavailable if self.board.refusal().is_err() => AfterFailure::GiveUp,
            Class::Unavailable => match retries
                .next_pause(attempt_started, ended, fastrand::f64())
                .filter(|&pause| deadline.is_none_or(|deadline| ended + pause < deadline))
            {
                Some(pause) => {
                    telemetry::unavailable_retry();
                    AfterFailure::RetryAfter(pause)
                }
                None => AfterFailure::GiveUp,
            },
        }
    }

    /// `keys`, if every member can take them in one script: always on
    /// standalone servers; on a member that is a Redis Cluster only when
    /// they share a slot.
    pub(crate) fn fits_every_member(&self, keys: Keys) -> Result<Keys> {
        if keys.slot().is_none() && self.nodes.iter().any(Member::is_cluster) {
            return Err(Error::InvalidArgument {
                argument: "resources",
                reason: format!(
                    "{} hash to different Redis Cluster slots, and a member here is a Redis \
                     Cluster, where one script can only set keys of one slot; give the names \
                     one hash tag, e.g. {{bank}}:account:1 and {{bank}}:account:2",
                    keys.label()
                ),
            });
        }
        Ok(keys)
    }

    /// Validates a TTL argument and rounds it down to whole milliseconds, the
    /// resolution Redis stores, so local validity never exceeds the keys'.
    pub(crate) fn checked_ttl(&self, ttl: Duration) -> Result<Duration> {
        self.config
            .check_ttl(ttl)
            .map_err(|reason| Error::InvalidArgument {
                argument: "ttl",
                reason,
            })?;
        self.note_key_life(ttl);
        Ok(Duration::from_millis(ttl.as_millis() as u64))
    }

    /// Notes that a key may live `life` (a TTL, an `at_least`): the
    /// guard's quarantine window covers every key life we use.
    pub(crate) fn note_key_life(&self, life: Duration) {
        self.guard.note_ttl(life);
    }

    /// Node `index`'s request of `op` for `claim`, recorded in `trail`
    /// (and, for an extension that may set the key again, in the claim's).
    fn request(&self, index: usize, op: Op, claim: &Claim, trail: &Arc<Trail>) -> Request {
        let repair = matches!(op, Op::Extend { repair: true, .. });
        Request {
            member: self.nodes[index].clone(),
            index,
            op,
            keys: Arc::clone(&claim.keys),
            value: Arc::clone(&claim.value),
            trail: Arc::clone(trail),
            also_record_in: repair.then(|| Arc::clone(&claim.sent)),
        }
    }

    fn fanout(&self) -> Fanout<'_, Claim> {
        Fanout {
            nodes: &self.nodes,
            background: &self.background,
            timeout: self.config.node_timeout,
        }
    }

    /// A round that sends `op_for(node index)` for `claim` to every node,
    /// recording where each request went in `trail`.
    async fn round(
        &self,
        tally: Tally,
        claim: &Claim,
        trail: &Arc<Trail>,
        op_for: impl Fn(usize) -> Op,
    ) -> Round {
        self.fanout()
            .run(tally, trail, Late::cancel(), |i, _| {
                Some(self.request(i, op_for(i), claim, trail).send())
            })
            .await
    }

    /// One acquisition attempt in the configured fencing mode, queued
    /// behind earlier waiters when `queued` (see [`crate::wait`]). The SETs
    /// go out in the round recorded in `claim.sent`. Also returns, for a
    /// queued attempt that lost, what its refusals said: how soon a quorum
    /// of the nodes that answered may be free, and which nodes refused
    /// (see `Round::refusals`).
    pub(crate) async fn acquire_once(
        &self,
        claim: &Claim,
        ttl: Duration,
        queued: Option<Queued>,
    ) -> (Result<Granted>, Refusals) {
        let keys = &claim.keys;
        // An `at_least` lock's keys live that long from the start even if
        // the holder dies; its validity still counts from `ttl` alone.
        let ttl_ms = keys
            .at_least
            .map_or(ttl, |at_least| at_least.max(ttl))
            .as_millis() as u64;
        // Readers issue no token: they are given the counter as it stands,
        // the latest write lock's (or a write attempt's that then failed).
        let shared = keys.access == Access::Shared;
        let started = Instant::now();
        let total = self.nodes.len();
        let op = |counting: Counting| match (queued, counting) {
            (Some(queued), counting) => queued.op(ttl_ms, counting),
            (None, Counting::Off) => Op::Acquire { ttl_ms },
            (None, Counting::Increment) => Op::AcquireCounted { ttl_ms },
            (None, Counting::Read) => Op::AcquireReadCounter { ttl_ms },
            (None, Counting::Peek) => Op::AcquirePeek { ttl_ms },
        };
        let quorum = quorum::quorum(total);
        match self.config.fencing {
            Fencing::Off => {
                let round = self
                    .round(Tally::new(total), claim, &claim.sent, |_| op(Counting::Off))
                    .await;
                let refusals = refusals_of(queued, &round, quorum);
                (self.judge(keys, ttl, started, round, None), refusals)
            }
            Fencing::CounterNode { node: counter } => {
                // A majority without the counter node waits for its vote
                // (within `node_timeout`), not for its grant.
                let tally = Tally::preferring(total, counter);
                let round = self
                    .round(tally, claim, &claim.sent, |i| {
                        op(match (i == counter, shared) {
                            (false, _) => Counting::Peek,
                            (true, false) => Counting::Increment,
                            (true, true) => Counting::Read,
                        })
                    })
                    .await;
                let refusals = refusals_of(queued, &round, quorum);
                if round.tally.decision() != Decision::Won {
                    return (self.judge(keys, ttl, started, round, None), refusals);
                }
                let granted = round.number_from(counter);
                let plan = match self.counter_token(keys, &round, counter, !shared) {
                    Ok(plan) => plan,
                    Err(unread) => return (Err(self.clock_unread(keys, round, unread)), refusals),
                };
                match plan {
                    CounterToken::Use(token) => {
                        (self.judge(keys, ttl, started, round, Some(token)), refusals)
                    }
                    CounterToken::Store(token) => {
                        telemetry::token_second_round(granted.is_none());
                        // The counter node takes it too where it granted
                        // (its counter only rises), else it is not asked.
                        let skip = granted.is_none().then_some(counter);
                        let stored = self.store_token(claim, token, skip).await;
                        // Validity counts both round trips, from the first's start.
                        (
                            self.judge_stored(keys, ttl, started, stored, token),
                            refusals,
                        )
                    }
                }
            }
            Fencing::Quorum => {
                let first = self
                    .round(Tally::new(total), claim, &claim.sent, |_| {
                        op(Counting::Read)
                    })
                    .await;
                let refusals = refusals_of(queued, &first, quorum);
                let counters = first.numbers.iter().map(|&(_, n)| n);
                if shared {
                    // Every write lock stored its token on a majority, which
                    // shares a node with this quorum of grants.
                    let token = FencingToken::new(counters.max().unwrap_or(0));
                    return (self.judge(keys, ttl, started, first, Some(token)), refusals);
                }
                // The scripts refuse counters above 2^64 − 2, so this adds one.
                let token = quorum_token(counters);
                // Fail early if the first round alone was lost or too slow.
                if let Err(failure) = self.judge(keys, ttl, started, first, None) {
                    return (Err(failure), refusals);
                }
                let second = self.store_token(claim, token, None).await;
                // Validity counts both round trips, from the first's start.
                let granted = self.judge_stored(keys, ttl, started, second, token);
                // Where the first round left the waiter in line, it leaves.
                let in_line = Refusals {
                    in_line_on: refusals.in_line_on,
                    ..Refusals::default()
                };
                (granted, in_line)
            }
        }
    }

    /// A token's second round: `token` stored on every node but `skip` (the
    /// counter node when it did not grant: it holds no entry of ours) where
    /// `claim`'s entries still are; decided once a majority of all the
    /// nodes stored it. It sets no key: its trail is only for timeout
    /// accounting.
    async fn store_token(&self, claim: &Claim, token: FencingToken, skip: Option<usize>) -> Round {
        let total = self.nodes.len();
        let trail = Trail::new(total);
        let op = Op::StoreToken { token: token.get() };
        self.fanout()
            .run(Tally::new(total), &trail, Late::cancel(), |i, _| {
                (Some(i) != skip).then(|| self.request(i, op, claim, &trail).send())
            })
            .await
    }

    /// [`counter_node_token`] for a won counter-node `round`, fed the
    /// other granting nodes' clocks ([`clock_ceiling`], [`clock_floor`]);
    /// with the guard off, which reads none, nothing counts alone and our
    /// own clock stands in for theirs. Fails (with the node, if any) when
    /// the counter node did not grant and a granting node's clock was
    /// never read: no token can then be placed above the counter node's.
    fn counter_token(
        &self,
        keys: &Keys,
        round: &Round,
        counter: usize,
        writer: bool,
    ) -> std::result::Result<CounterToken, Option<usize>> {
        let clocks = self.clocks_of_others(keys, round, counter);
        let grants = CounterGrants {
            writer,
            counter_node: round.number_from(counter),
            others: round
                .numbers
                .iter()
                .filter(|&&(i, _)| i != counter)
                .map(|&(_, n)| n)
                .max()
                .unwrap_or(0),
            ceiling: clocks.as_ref().map(|clocks| {
                clock_ceiling(
                    clocks
                        .iter()
                        .map(|(_, clock)| clock.map(|(least, _)| least)),
                )
            }),
            lowest: clocks.as_ref().map_or(0, |clocks| {
                clock_lowest(clocks.iter().map(|(_, clock)| clock.map(|(_, most)| most)))
            }),
        };
        let floor = match &clocks {
            Some(clocks) => {
                clock_floor(clocks.iter().map(|(_, clock)| clock.map(|(_, most)| most)))
            }
            None => {
                Some(micros_since_1970().saturating_add(COUNTER_FAILOVER_MARGIN.as_micros() as u64))
            }
        };
        if let (None, None) = (grants.usable_answer(), floor) {
            let unread = clocks
                .into_iter()
                .flatten()
                .find_map(|(i, clock)| clock.is_none().then_some(i));
            return Err(unread);
        }
        Ok(counter_node_token(grants, || floor.unwrap_or(0)))
    }

    /// The clocks, now, of the nodes other than the counter node that
    /// granted in `round` (each the least and the most it can read, by the
    /// guard's latest reading; `None` where it has none), by node index;
    /// `None` when the guard reads no clocks.
    fn clocks_of_others(
        &self,
        keys: &Keys,
        round: &Round,
        counter: usize,
    ) -> Option<Vec<(usize, Option<ClockNow>)>> {
        if !self.guard.enabled {
            return None;
        }
        let now = Instant::now();
        Some(
            round
                .numbers
                .iter()
                .filter(|&&(i, _)| i != counter)
                .map(|&(i, _)| (i, self.clock_now(keys, i, now)))
                .collect(),
        )
    }

    /// A won round without the counter node in which a granting node's
    /// clock was never read (a Redis Cluster member whose shard changed
    /// owner since): no token can be placed above the counter node's, so
    /// the attempt fails as unavailable, naming the node.
    fn clock_unread(&self, keys: &Keys, round: Round, index: Option<usize>) -> Error {
        let Round {
            tally, mut errors, ..
        } = round;
        if let Some(index) = index {
            errors.push(NodeError {
                node: self.nodes[index].name().to_owned(),
                kind: NodeErrorKind::Quarantined(Quarantine {
                    reason: QuarantineReason::Unobserved {
                        why: "its clock was never read, and a fencing token issued without the \
                              counter node is taken above the nodes' clocks"
                            .to_owned(),
                    },
                    remaining: None,
                }),
            });
        }
        unavailable(keys.label(), &tally, errors)
    }

    /// What node `index`'s clock (the server that serves `keys` there)
    /// reads at `now` at the least and at the most, by the guard's latest
    /// reading of it.
    fn clock_now(&self, keys: &Keys, index: usize, now: Instant) -> Option<(u64, u64)> {
        self.nodes[index].ready_node_for(keys)?.clock_now(now)
    }

    /// As [`judge`](Self::judge), for a token's second round: a loss there
    /// is never contention (the first round won; what failed is the store:
    /// nodes down, or our key gone, or the counter node, not asked), so it
    /// is reported as unavailability, unless a counter could not be used.
    fn judge_stored(
        &self,
        keys: &Keys,
        ttl: Duration,
        started: Instant,
        round: Round,
        token: FencingToken,
    ) -> Result<Granted> {
        let bad_counter = round
            .errors
            .iter()
            .any(|error| matches!(error.kind, NodeErrorKind::InvalidCounter(_)));
        if let (Decision::Lost(_), false) = (round.tally.decision(), bad_counter) {
            return Err(unavailable(keys.label(), &round.tally, round.errors));
        }
        self.judge(keys, ttl, started, round, Some(token))
    }

    /// Turns a decided tally into a grant or the error that explains it.
    fn judge(
        &self,
        keys: &Keys,
        ttl: Duration,
        started: Instant,
        round: Round,
        token: Option<FencingToken>,
    ) -> Result<Granted> {
        let Round { tally, errors, .. } = round;
        let resource = keys.label();
        let decided = Instant::now();
        let elapsed = decided - started;
        let drift = quorum::drift(ttl, self.config.drift_factor);
        let validity = quorum::validity(ttl, elapsed, drift);
        // Fields of the enclosing `acquire` or `extend` span.
        tracing::Span::current()
            .record("successes", tally.granted())
            .record("failures", tally.refused() + tally.failed())
            .record("elapsed_ms", elapsed.as_secs_f64() * 1e3)
            .record("validity_ms", validity.as_millis() as u64);
        let bad_counter = errors.iter().find_map(|error| match &error.kind {
            NodeErrorKind::InvalidCounter(problem) => Some((error.node.clone(), problem.clone())),
            _ => None,
        });
        if let Some((node, problem)) = bad_counter {
            let (key, problem) = keys.bad_counter(&problem);
            if tally.decision() != Decision::Won {
                return Err(Error::InvalidCounter {
                    resource: resource.to_owned(),
                    node,
                    key,
                    problem,
                });
            }
            // A quorum of other nodes issued the token; the operator must
            // still hear of it.
            tracing::warn!(
                resource,
                node,
                key,
                problem,
                "unusable fencing counter on one node"
            );
        }
        match tally.decision() {
            Decision::Won if quorum::is_usable(validity, self.config.min_validity) => Ok(Granted {
                started,
                valid_until: decided + validity,
                token,
            }),
            Decision::Won => Err(Error::TooSlow {
                resource: resource.to_owned(),
                elapsed,
                ttl,
            }),
            Decision::Lost(Loss::Refused) => Err(Error::Contended {
                resource: resource.to_owned(),
                attempts: 1,
                refused: tally.refused(),
                total: tally.total(),
                free_in: None,
            }),
            // Every node answered or failed without a decision cannot happen
            // (see `Tally::decision`); count it as unavailable all the same.
            Decision::Lost(Loss::Unavailable) | Decision::Pending => {
                Err(unavailable(resource, &tally, errors))
            }
        }
    }

    /// Extends `claim`'s key on all nodes to `ttl` from now; the lock is
    /// valid until `valid_until`.
    pub(crate) async fn extend(
        &self,
        claim: &Claim,
        ttl: Duration,
        valid_until: Instant,
    ) -> Result<Granted> {
        let ttl_ms = ttl.as_millis() as u64;
        let started = Instant::now();
        // A key is put back only by a round that is decided (its deadline
        // is `node_timeout` away) while the lock is still valid: then no
        // one else can have held a quorum in between.
        let may_repair = started + self.config.node_timeout <= valid_until;
        let trail = Trail::new(self.nodes.len());
        let round = self
            .round(Tally::new(self.nodes.len()), claim, &trail, |i| {
                Op::Extend {
                    ttl_ms,
                    repair: may_repair && self.may_have_lost(claim, i),
                }
            })
            .await;
        let resource = claim.keys.label();
        if round.tally.decision() == Decision::Lost(Loss::Refused) {
            return Err(if round.tally.refusals_alone_lose() {
                // Our value is gone from too many nodes: the lock is lost.
                Error::NotHeld {
                    resource: resource.to_owned(),
                    reason: NotHeldReason::Lost,
                }
            } else {
                // A few refusals (nodes our SET never reached) plus
                // failures: the cluster is what stops us; worth a retry.
                unavailable(resource, &round.tally, round.errors)
            });
        }
        self.judge(&claim.keys, ttl, started, round, None)
    }

    /// Whether node `index` may lack `claim`'s key through no one's doing:
    /// our SET never went out there, or the node may have lost keys since
    /// (an unsafe restart or a clock fault moved its guard epoch on). An
    /// extension may then set the key again there (see `extend.lua` for
    /// why that is safe while the lock is valid); a key missing for any
    /// other reason is a refusal, as before.
    fn may_have_lost(&self, claim: &Claim, index: usize) -> bool {
        match (claim.sent.sent_on(index), claim.sent.epoch_of(index)) {
            (Some(connection), Some(epoch)) => {
                !self.nodes[index].unchanged_since(&claim.keys, connection, epoch)
            }
            _ => true,
        }
    }

    /// Compare-and-deletes `claim`'s key on every node its SETs may have
    /// reached (the others cannot hold it and count as refusals) and
    /// returns once the outcome is decided; the remaining nodes finish in
    /// the background, and those that fail there are retried as
    /// [`keep_cleaning`](Self::keep_cleaning) does (the caller retries the
    /// failures it was told of). Each delete goes out behind the SET it
    /// undoes.
    pub(crate) async fn release(self: &Arc<Self>, claim: &Claim) -> (Tally, Vec<NodeError>) {
        let trail = Trail::new(self.nodes.len());
        let (core, late_claim) = (Arc::clone(self), claim.clone());
        let late = Late::Send {
            retry: move |failed| core.keep_cleaning(late_claim, failed),
        };
        let round = self
            .fanout()
            .run(Tally::new(self.nodes.len()), &trail, late, |i, _| {
                let set_on = claim.cleanup_on(i)?;
                let request = self.request(i, claim.release_op(), claim, &trail);
                Some(request.send_after(Some(Arc::clone(set_on)), claim.sent.also_sent_on(i)))
            })
            .await;
        (round.tally, round.errors)
    }

    /// Removes `claim`'s keys in the background (failed or dropped
    /// attempts, dropped locks), counted for `settle()`; if no runtime can
    /// run it now, on the next runtime that settles or acquires. Nodes on
    /// which the first try fails are tried again, uncounted, for up to
    /// `CLEANUP_RETRIES_FOR`.
    pub(crate) fn clean_up(self: &Arc<Self>, claim: Claim) {
        if !claim.needs_cleanup() {
            return;
        }
        let core = Arc::clone(self);
        self.background.spawn_job(claim, move |claim| async move {
            let reached: Vec<usize> = (0..core.nodes.len())
                .filter(|&i| claim.cleanup_on(i).is_some())
                .collect();
            let failed = core.delete_on(&claim, &reached).await;
            if !failed.is_empty() {
                core.keep_cleaning(claim, failed);
            }
        });
    }

    /// Tries the delete again on the nodes that failed, with growing
    /// pauses, until each answered or `CLEANUP_RETRIES_FOR` has passed;
    /// uncounted, and deferred whole if its runtime drops it.
    fn keep_cleaning(self: &Arc<Self>, claim: Claim, mut failed: Vec<usize>) {
        let core = Arc::clone(self);
        self.background
            .spawn_uncounted_job(claim, move |claim| async move {
                let give_up = Instant::now() + CLEANUP_RETRIES_FOR;
                let mut pause = CLEANUP_FIRST_PAUSE;
                while !failed.is_empty() && Instant::now() + pause < give_up {
                    tokio::time::sleep(pause).await;
                    failed = core.delete_on(&claim, &failed).await;
                    pause = (pause * 2).min(CLEANUP_LONGEST_PAUSE);
                }
            });
    }

    /// Compare-and-deletes `claim`'s key on `nodes`, each behind the SET it
    /// undoes, waiting for every answer within `node_timeout`; returns the
    /// nodes that failed or did not answer.
    async fn delete_on(&self, claim: &Claim, nodes: &[usize]) -> Vec<usize> {
        let timeout = self.config.node_timeout;
        let deadline = Instant::now() + timeout;
        let trail = Trail::new(self.nodes.len());
        let deletes = nodes.iter().map(|&i| {
            let delete = self
                .request(i, claim.release_op(), claim, &trail)
                .send_after(claim.cleanup_on(i).cloned(), claim.sent.also_sent_on(i));
            async move { (i, tokio::time::timeout_at(deadline, delete).await) }
        });
        let outcomes = futures::future::join_all(deletes).await;
        outcomes
            .into_iter()
            .filter_map(|(i, outcome)| match outcome {
                Ok(Some(Ok(_))) => None,
                Ok(Some(Err(error))) => {
                    tracing::debug!(node = %error.node, %error, "cleanup failed");
                    Some(i)
                }
                Ok(None) => Some(i),
                Err(_) => {
                    self.nodes[i].timed_out(trail.sent_on(i), timeout);
                    Some(i)
                }
            })
            .collect()
    }

    /// Starts the cleanup that an earlier runtime could not finish.
    pub(crate) fn run_deferred(self: &Arc<Self>) {
        for claim in self.background.take_deferred() {
            self.clean_up(claim);
        }
    }
}

/// What a lost attempt's refusals tell its waiter, if it waits (`queued`).
fn refusals_of(queued: Option<Queued>, round: &Round, quorum: usize) -> Refusals {
    queued.map_or_else(Refusals::default, |_| round.refusals(quorum))
}

/// What a node's clock reads now at the least and at the most (µs since
/// 1970).
type ClockNow = (u64, u64);

/// Our wall clock in µs since 1970: only where the guard reads no node's
/// clock (see [`Core::clocks_of_others`]).
fn micros_since_1970() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

pub(crate) fn unavailable(resource: &str, tally: &Tally, errors: Vec<NodeError>) -> Error {
    Error::QuorumUnavailable {
        resource: resource.to_owned(),
        failed: tally.failed(),
        answered: tally.answered(),
        needed: tally.needed(),
        total: tally.total(),
        errors,
    }
}

/// The error of a call that the breaker refused before attempt
/// `attempts + 1`: if its last attempt found the resource held, that
/// (the breaker, opened by other calls, says nothing of this resource, and
/// a fallback must not run for a held resource); else the breaker's.
pub(crate) fn refused_by_breaker(open: Error, last: Option<Error>, attempts: u32) -> Error {
    match last {
        Some(held @ (Error::Contended { .. } | Error::WaitTimedOut { .. })) => {
            with_attempts(held, attempts)
        }
        _ => open,
    }
}

pub(crate) fn with_attempts(error: Error, attempts: u32) -> Error {
    match error {
        Error::Contended {
            resource,
            refused,
            total,
            free_in,
            ..
        } => Error::Contended {
            resource,
            attempts,
            refused,
            total,
            free_in,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_that_found_its_resource_held_does_not_end_as_unavailable() {
        let open = Error::CircuitOpen {
            failures: 5,
            retry_in: Duration::from_secs(1),
            probing: false,
        };
        let held = Error::Contended {
            resource: "r".into(),
            attempts: 1,
            refused: 3,
            total: 5,
            free_in: None,
        };
        let unavailable = Error::TooSlow {
            resource: "r".into(),
            elapsed: Duration::ZERO,
            ttl: Duration::ZERO,
        };
        assert!(matches!(
            refused_by_breaker(open.clone(), Some(held), 2),
            Error::Contended { attempts: 2, .. }
        ));
        assert!(matches!(
            refused_by_breaker(open.clone(), Some(unavailable), 2),
            Error::CircuitOpen { .. }
        ));
        assert!(matches!(
            refused_by_breaker(open, None, 0),
            Error::CircuitOpen { .. }
        ));
    }

    #[test]
    fn lock_values_are_unique() {
        let values: std::collections::HashSet<_> = (0..1000).map(|_| new_lock_value()).collect();
        assert_eq!(values.len(), 1000);
    }
}
