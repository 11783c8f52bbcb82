//! [`LockManager`]: asks all nodes at once, decides by quorum, retries,
//! rolls back failed attempts, and extends and releases held locks.
//!
//! The rules come from [`crate::quorum`]; this module only moves requests.
//! (`LockManager::with_lock`, which keeps a lock alive around a closure,
//! lives with the watchdog in [`crate::watchdog`].)
//! Every request is bounded by `node_timeout`, and an attempt stops waiting
//! as soon as its outcome is decided, so no call waits on a straggler.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;
use tracing::Instrument;

use crate::background::Background;
use crate::config::{Config, LockManagerBuilder};
use crate::error::{Error, NodeError, NotHeldReason, Result};
use crate::fencing::{Fencing, FencingToken, quorum_token};
use crate::lock::{Keys, Lock};
use crate::node::Node;
use crate::ops::{Answer, Op};
use crate::quorum::{self, Decision, Loss, Tally, Vote};
use crate::telemetry;

/// Takes, extends and releases locks on a fixed set of Redis masters.
///
/// Cheap to clone: clones share the nodes' connections. Create it once per
/// process with [`LockManager::builder`].
#[derive(Clone)]
pub struct LockManager {
    core: Arc<Core>,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("nodes", &self.node_names().collect::<Vec<_>>())
            .field("ttl", &self.core.config.ttl)
            .finish_non_exhaustive()
    }
}

/// What a lock needs of its manager: the settings and the nodes.
pub(crate) struct Core {
    pub(crate) config: Config,
    nodes: Vec<Arc<Node>>,
    background: Arc<Background>,
}

/// A won acquisition or extension: when it started, until when it is
/// valid, and the fencing token it was issued (acquisition only).
pub(crate) struct Granted {
    pub(crate) started: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) token: Option<FencingToken>,
}

impl LockManager {
    /// Starts configuring a manager. At least one node URL is required.
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder::default()
    }

    pub(crate) fn from_config(config: Config) -> Self {
        let nodes = config
            .nodes
            .iter()
            .map(|spec| {
                Arc::new(Node::new(
                    spec.name.clone(),
                    spec.client.clone(),
                    config.connect_timeout,
                ))
            })
            .collect();
        Self {
            core: Arc::new(Core {
                config,
                nodes,
                background: Arc::default(),
            }),
        }
    }

    /// Acquires `resource` with the default TTL, making up to the configured
    /// number of attempts.
    pub async fn lock(&self, resource: &str) -> Result<Lock> {
        self.acquire(
            resource,
            self.core.config.ttl,
            self.core.config.retry_attempts,
        )
        .await
    }

    /// Acquires `resource` for `ttl`, making up to the configured number of
    /// attempts.
    pub async fn lock_with_ttl(&self, resource: &str, ttl: Duration) -> Result<Lock> {
        self.acquire(resource, ttl, self.core.config.retry_attempts)
            .await
    }

    /// One attempt at `resource` with the default TTL, no retry.
    pub async fn try_lock(&self, resource: &str) -> Result<Lock> {
        self.acquire(resource, self.core.config.ttl, 1).await
    }

    /// One attempt at `resource` for `ttl`, no retry.
    pub async fn try_lock_with_ttl(&self, resource: &str, ttl: Duration) -> Result<Lock> {
        self.acquire(resource, ttl, 1).await
    }

    /// Extends `lock` to `ttl` from now; same as [`Lock::extend`].
    pub async fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<()> {
        lock.extend(ttl).await
    }

    /// Releases `lock`; same as [`Lock::release`].
    pub async fn release(&self, lock: Lock) -> Result<()> {
        lock.release().await
    }

    /// Nodes that must agree: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.core.nodes.len())
    }

    /// `host:port` of each node, in configuration order.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.core.nodes.iter().map(|node| node.name())
    }

    /// Waits until the work this manager left running in the background
    /// has finished: releases completing on slow nodes, rollbacks of failed
    /// attempts, releases of dropped locks. Each is bounded by
    /// `node_timeout`. Call it before the process exits, so that a lock's
    /// last nodes are released too rather than left to expire.
    pub async fn settle(&self) {
        self.core.background.settle().await;
    }

    pub(crate) fn core(&self) -> &Core {
        &self.core
    }

    /// The default TTL used by [`lock`](Self::lock) and [`try_lock`](Self::try_lock).
    pub fn default_ttl(&self) -> Duration {
        self.core.config.ttl
    }

    async fn acquire(&self, resource: &str, ttl: Duration, attempts: u32) -> Result<Lock> {
        check_resource(resource)?;
        let ttl = self.core.checked_ttl(ttl)?;
        let keys = Arc::new(Keys::of(resource));
        let span = tracing::debug_span!(
            "acquire",
            resource,
            ttl_ms = ttl.as_millis() as u64,
            attempt = tracing::field::Empty,
            successes = tracing::field::Empty,
            failures = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty,
            validity_ms = tracing::field::Empty,
        );
        async {
            let first_attempt = Instant::now();
            let mut attempt = 1;
            loop {
                tracing::Span::current().record("attempt", attempt);
                let value = new_lock_value();
                let started = Instant::now();
                let result = self.core.acquire_once(resource, &keys, &value, ttl).await;
                telemetry::attempt_finished(started.elapsed(), result.as_ref().err());
                let failure = match result {
                    Ok(granted) => {
                        tracing::debug!(attempt, token = ?granted.token, "acquired");
                        telemetry::acquired(first_attempt.elapsed());
                        return Ok(Lock::new(
                            Arc::clone(&self.core),
                            resource.to_owned(),
                            keys,
                            value,
                            ttl,
                            granted,
                        ));
                    }
                    Err(failure) => failure,
                };
                // A late SET may still land on a node that timed out or said
                // no; remove ours everywhere. The value is unique to this
                // attempt, so this can never touch another attempt's key.
                self.core.rollback(Arc::clone(&keys), value);
                tracing::debug!(attempt, error = %failure, "attempt failed");
                if attempt >= attempts {
                    telemetry::acquire_failed(&failure);
                    return Err(with_attempts(failure, attempt));
                }
                attempt += 1;
                let config = &self.core.config;
                let pause =
                    quorum::retry_delay(config.retry_delay, config.retry_jitter, fastrand::f64());
                tokio::time::sleep(pause).await;
            }
        }
        .instrument(span)
        .await
    }
}

impl Core {
    /// Validates a TTL argument and rounds it down to whole milliseconds, the
    /// resolution Redis stores, so local validity never exceeds the keys'.
    pub(crate) fn checked_ttl(&self, ttl: Duration) -> Result<Duration> {
        self.config
            .check_ttl(ttl)
            .map_err(|reason| Error::InvalidArgument {
                argument: "ttl",
                reason,
            })?;
        Ok(Duration::from_millis(ttl.as_millis() as u64))
    }

    /// One acquisition attempt in the configured fencing mode.
    async fn acquire_once(
        &self,
        resource: &str,
        keys: &Arc<Keys>,
        value: &Arc<str>,
        ttl: Duration,
    ) -> Result<Granted> {
        let ttl_ms = ttl.as_millis() as u64;
        let started = Instant::now();
        match self.config.fencing {
            Fencing::Off => {
                let round = self
                    .round(Tally::new(self.nodes.len()), keys, value, |_| Op::Acquire {
                        ttl_ms,
                    })
                    .await;
                self.judge(resource, ttl, started, round, None)
            }
            Fencing::CounterNode { node: counter } => {
                let tally = Tally::with_required(self.nodes.len(), counter);
                let round = self
                    .round(tally, keys, value, |i| {
                        if i == counter {
                            Op::AcquireCounted { ttl_ms }
                        } else {
                            Op::Acquire { ttl_ms }
                        }
                    })
                    .await;
                let token = round.number_from(counter).map(FencingToken::new);
                self.judge(resource, ttl, started, round, token)
            }
            Fencing::Quorum => {
                let first = self
                    .round(Tally::new(self.nodes.len()), keys, value, |_| {
                        Op::AcquireReadCounter { ttl_ms }
                    })
                    .await;
                let token = quorum_token(first.numbers.iter().map(|&(_, n)| n));
                // Fail early if the first round alone was lost or too slow.
                self.judge(resource, ttl, started, first, None)?;
                let second = self
                    .round(Tally::new(self.nodes.len()), keys, value, |_| {
                        Op::StoreToken { token: token.get() }
                    })
                    .await;
                // Validity counts both round trips, from the first's start.
                self.judge(resource, ttl, started, second, Some(token))
            }
        }
    }

    /// Sends `op_for(node index)` to every node at once and tallies the
    /// answers until `tally` is decided.
    async fn round(
        &self,
        tally: Tally,
        keys: &Arc<Keys>,
        value: &Arc<str>,
        op_for: impl Fn(usize) -> Op,
    ) -> Round<impl Future<Output = (usize, NodeAnswer)> + Send + 'static> {
        // Requests still in flight once the round is decided are dropped by
        // acquire and extend. A command already written still runs on its
        // node, ahead of any later release on the same connection; one still
        // waiting for its connection is never sent. Sending it later could
        // land a SET after our own release (both wait on the same connect),
        // leaving a lock nobody holds until its TTL. Release lets its
        // stragglers finish in the background, where a silent node is also
        // noticed.
        // One deadline for the whole round: every request starts now with
        // the same bound, and one timer is cheaper than one per node.
        let deadline = Instant::now() + self.config.node_timeout;
        let requests = self.nodes.iter().enumerate().map(|(i, node)| {
            let answer = Arc::clone(node).apply(op_for(i), Arc::clone(keys), Arc::clone(value));
            async move { (i, answer.await) }
        });
        let round = Round::collect(
            tally,
            requests.collect(),
            (deadline, self.config.node_timeout),
            &self.nodes,
        )
        .await;
        tracing::debug!(
            granted = round.tally.granted(),
            refused = round.tally.refused(),
            failed = round.tally.failed(),
            "round decided"
        );
        round
    }

    /// Turns a decided tally into a grant or the error that explains it.
    fn judge<F>(
        &self,
        resource: &str,
        ttl: Duration,
        started: Instant,
        round: Round<F>,
        token: Option<FencingToken>,
    ) -> Result<Granted> {
        let Round { tally, errors, .. } = round;
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
            }),
            Decision::Lost(Loss::RequiredFailed) => {
                let counter = self.counter_node_name();
                match errors
                    .into_iter()
                    .find(|e| Some(e.node.as_str()) == counter)
                {
                    Some(error) => Err(Error::CounterNodeUnavailable {
                        resource: resource.to_owned(),
                        error,
                    }),
                    None => Err(unavailable(resource, &tally, Vec::new())),
                }
            }
            // Every node answered or failed without a decision cannot happen
            // (see `Tally::decision`); count it as unavailable all the same.
            Decision::Lost(Loss::Unavailable) | Decision::Pending => {
                Err(unavailable(resource, &tally, errors))
            }
        }
    }

    /// Extends `value`'s key on all nodes to `ttl` from now.
    pub(crate) async fn extend(
        &self,
        resource: &str,
        keys: &Arc<Keys>,
        value: &Arc<str>,
        ttl: Duration,
    ) -> Result<Granted> {
        let ttl_ms = ttl.as_millis() as u64;
        let started = Instant::now();
        let round = self
            .round(Tally::new(self.nodes.len()), keys, value, |_| Op::Extend {
                ttl_ms,
            })
            .await;
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
        self.judge(resource, ttl, started, round, None)
    }

    /// Compare-and-deletes `value`'s key on all nodes and returns once the
    /// outcome is decided; the remaining nodes finish in the background.
    pub(crate) async fn release(
        &self,
        keys: Arc<Keys>,
        value: Arc<str>,
    ) -> (Tally, Vec<NodeError>) {
        let mut round = self
            .round(Tally::new(self.nodes.len()), &keys, &value, |_| Op::Release)
            .await;
        round.finish_in_background(&self.nodes, self.config.node_timeout, &self.background);
        (round.tally, round.errors)
    }

    fn counter_node_name(&self) -> Option<&str> {
        match self.config.fencing {
            Fencing::CounterNode { node } => self.nodes.get(node).map(|n| n.name()),
            Fencing::Off | Fencing::Quorum => None,
        }
    }

    /// Fire-and-forget release (failed attempts, dropped locks).
    pub(crate) fn rollback(self: &Arc<Self>, keys: Arc<Keys>, value: Arc<str>) {
        let core = Arc::clone(self);
        self.background.spawn(async move {
            core.release(keys, value).await;
        });
    }
}

type NodeAnswer = std::result::Result<Answer, NodeError>;

/// The decided outcome of one round, with the requests still in flight.
struct Round<F> {
    tally: Tally,
    errors: Vec<NodeError>,
    /// Numbers (tokens or counters) that granting nodes sent, by node index.
    numbers: Vec<(usize, u64)>,
    stragglers: FuturesUnordered<F>,
    /// Which nodes have answered, or been counted as timed out.
    answered: Vec<bool>,
    /// When the round's requests stop being waited for.
    deadline: Instant,
}

impl<F: Future<Output = (usize, NodeAnswer)>> Round<F> {
    /// Records the answers as they arrive, until `tally` is decided or the
    /// deadline passes; nodes silent by then count as failed (timed out).
    async fn collect(
        mut tally: Tally,
        mut pending: FuturesUnordered<F>,
        (deadline, timeout): (Instant, Duration),
        nodes: &[Arc<Node>],
    ) -> Self {
        let mut errors = Vec::new();
        let mut numbers = Vec::new();
        let mut answered = vec![false; nodes.len()];
        let expired = tokio::time::sleep_until(deadline);
        tokio::pin!(expired);
        loop {
            let (node, answer) = tokio::select! {
                biased;
                next = pending.next() => match next {
                    Some(next) => next,
                    None => break,
                },
                () = &mut expired => {
                    for (i, node) in nodes.iter().enumerate() {
                        if !answered[i] {
                            answered[i] = true;
                            let error = node.timed_out(timeout);
                            tracing::debug!(node = %error.node, %error, "node request failed");
                            errors.push(error);
                            tally.record(i, Vote::Failed);
                        }
                    }
                    break;
                }
            };
            answered[node] = true;
            let vote = match answer {
                Ok(Answer::Yes) => Vote::Granted,
                Ok(Answer::YesWith(number)) => {
                    numbers.push((node, number));
                    Vote::Granted
                }
                Ok(Answer::No) => Vote::Refused,
                Err(error) => {
                    tracing::debug!(node = %error.node, %error, "node request failed");
                    errors.push(error);
                    Vote::Failed
                }
            };
            if tally.record(node, vote) != Decision::Pending {
                break;
            }
        }
        Self {
            tally,
            errors,
            numbers,
            stragglers: pending,
            answered,
            deadline,
        }
    }
}

impl<F> Round<F>
where
    F: Future<Output = (usize, NodeAnswer)> + Send + 'static,
{
    /// Lets the requests still in flight complete in the background, until
    /// the deadline; nodes silent by then are told they timed out, so a
    /// connection that only ever straggles is eventually replaced.
    fn finish_in_background(
        &mut self,
        nodes: &[Arc<Node>],
        timeout: Duration,
        background: &Arc<Background>,
    ) {
        let mut stragglers = std::mem::take(&mut self.stragglers);
        if stragglers.is_empty() {
            return;
        }
        let mut silent: Vec<(usize, Arc<Node>)> = nodes
            .iter()
            .enumerate()
            .filter(|&(i, _)| !self.answered[i])
            .map(|(i, node)| (i, Arc::clone(node)))
            .collect();
        let deadline = self.deadline;
        background.spawn(async move {
            let drain = async {
                while let Some((node, _)) = stragglers.next().await {
                    silent.retain(|&(i, _)| i != node);
                }
            };
            let _ = tokio::time::timeout_at(deadline, drain).await;
            for (_, node) in silent {
                node.timed_out(timeout);
            }
        });
    }
}

impl<F> Round<F> {
    /// The number sent by node `index` with its grant, if it granted.
    fn number_from(&self, index: usize) -> Option<u64> {
        self.numbers
            .iter()
            .find(|&&(node, _)| node == index)
            .map(|&(_, number)| number)
    }
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

fn with_attempts(error: Error, attempts: u32) -> Error {
    match error {
        Error::Contended {
            resource,
            refused,
            total,
            ..
        } => Error::Contended {
            resource,
            attempts,
            refused,
            total,
        },
        other => other,
    }
}

fn check_resource(resource: &str) -> Result<()> {
    if resource.is_empty() {
        return Err(Error::InvalidArgument {
            argument: "resource",
            reason: "the resource name is empty; name what the lock protects, e.g. \"order:123\""
                .into(),
        });
    }
    Ok(())
}

/// A value unique to one acquisition attempt: a uuid v4 (122 random bits).
fn new_lock_value() -> Arc<str> {
    uuid::Uuid::new_v4().simple().to_string().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_shareable_across_tasks() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<LockManager>();
        assert_send_sync::<Lock>();
        assert_send_sync::<Error>();
    }

    #[test]
    fn lock_values_are_unique() {
        let values: std::collections::HashSet<_> = (0..1000).map(|_| new_lock_value()).collect();
        assert_eq!(values.len(), 1000);
    }
}
