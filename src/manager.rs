//! [`LockManager`]: the handle services hold, its health and `settle`,
//! and one attempt at a lock (a request with `no_wait`); what an attempt
//! does across the nodes is [`crate::engine`]'s. The requests that ask
//! for locks are [`crate::request`]'s, waiting is [`crate::wait`]'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::config::LockManagerBuilder;
use crate::engine::{Attempt, Claim, Core, with_attempts};
use crate::error::{Error, Result};
use crate::guard::judge::Quarantine;
use crate::health::Health;
use crate::held::Held;
use crate::keys::Keys;
use crate::quorum;
use crate::telemetry;

/// Room, beyond the work's own bounds, that `settle()` gives background
/// work to be scheduled on a busy machine.
const SETTLE_SLACK: Duration = Duration::from_secs(1);

/// The `resource` of the error [`LockManager::connect`] returns.
const CONNECT_LABEL: &str = "(connect)";

/// Takes, extends and releases locks on a fixed set of Redis masters.
///
/// Cheap to clone: clones share the nodes' connections. Create it once per
/// process with [`LockManager::builder`]. It may be used from several tokio
/// runtimes, also one after another: connections and connects left by a
/// runtime that shut down are replaced, and cleanup that runtime could not
/// finish runs on the next call to [`settle`](Self::settle) or to an
/// acquiring method.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// // One manager per process; clones share its connections.
/// let for_a_task = manager.clone();
/// let task = tokio::spawn(async move {
///     let lock = for_a_task.lock("job:1").await?;
///     lock.release().await
/// });
/// task.await.expect("task")?;
/// manager.settle().await; // before exit: background releases are done
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockManager {
    pub(crate) core: Arc<Core>,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("nodes", &self.node_names().collect::<Vec<_>>())
            .field("ttl", &self.core.config.ttl)
            .finish_non_exhaustive()
    }
}

impl LockManagerBuilder {
    /// Validates the settings and creates the manager. No network I/O:
    /// nodes that are down now are connected once they come up.
    ///
    /// ```
    /// use quorumlock::{Error, LockManager};
    ///
    /// // No I/O: the nodes are connected on first use.
    /// let manager = LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .build()?;
    /// assert_eq!(manager.quorum(), 2);
    ///
    /// // Bad settings are a typed error that names the setting.
    /// let empty = LockManager::builder().build();
    /// assert!(matches!(empty, Err(Error::InvalidConfig { setting: "nodes", .. })));
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn build(self) -> Result<LockManager> {
        let config = self.validate()?;
        Ok(LockManager {
            core: Arc::new(Core::new(config)),
        })
    }
}

impl LockManager {
    /// Starts configuring a manager. At least one node URL is required.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::LockManager;
    ///
    /// let manager = LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .ttl(Duration::from_secs(30))
    ///     .build()?;
    /// assert_eq!(manager.quorum(), 1);
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder::default()
    }

    /// Nodes that must agree: `N / 2 + 1`.
    ///
    /// ```
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes((1..=5).map(|i| format!("redis://127.0.0.1:700{i}")))
    ///     .build()?;
    /// assert_eq!(manager.quorum(), 3);
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.core.nodes.len())
    }

    /// `host:port` of each node, in configuration order.
    ///
    /// ```
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://:secret@127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .build()?;
    /// let names: Vec<&str> = manager.node_names().collect();
    /// assert_eq!(names, ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]); // no passwords
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.core.nodes.iter().map(|node| node.name())
    }

    /// The nodes the node guard does not count toward a quorum now, by
    /// `host:port`, with why and for how long (see [`crate::guard`]). What
    /// a node says of itself is learnt on connect and from the requests
    /// that set keys, so this reflects the traffic so far.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// manager.lock("probe").await?.release().await?;
    /// // Nodes that persist every write (the testkit's do) are counted at once.
    /// assert!(manager.quarantined_nodes().is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn quarantined_nodes(&self) -> Vec<(String, Quarantine)> {
        self.core
            .nodes
            .iter()
            .flat_map(|node| node.quarantines())
            .collect()
    }

    /// The lock service's availability as this manager sees it:
    /// healthy, degraded (some node failing or quarantined, a quorum up),
    /// unavailable (no quorum up, or the circuit breaker holding calls
    /// back) or unknown (some node not asked yet:
    /// a manager just built), with each node's status, the count of
    /// unavailable attempts in a row and the breaker's state. Computed from
    /// the traffic so far, without I/O; see [`crate::health`].
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
    /// assert_eq!(manager.health().state, HealthState::Healthy);
    ///
    /// cluster.kill(2)?;
    /// manager.lock("probe").await?.release().await?; // two of three still serve
    /// # manager.settle().await;
    /// let health = manager.health();
    /// assert_eq!((health.state, health.nodes_up), (HealthState::Degraded, 2));
    /// # Ok(())
    /// # }
    /// ```
    pub fn health(&self) -> Health {
        // Quarantines also end by time: look at each node now.
        for node in self.core.nodes.iter() {
            node.quarantines();
        }
        self.core.board.snapshot()
    }

    /// A feed of [`health`](Self::health) that is updated whenever the
    /// picture changes (a node fails or recovers, is quarantined or let
    /// back, an attempt finds the service unavailable, the breaker moves).
    /// Await `changed()` on it to be told; the metrics
    /// `quorumlock_health_state`, `quorumlock_nodes_up`,
    /// `quorumlock_consecutive_unavailable` and `quorumlock_breaker_open`
    /// follow the same changes, and so do the ends of quarantine windows
    /// and of the breaker's cool-down, by a timer.
    ///
    /// Do not hold a `borrow()` of the receiver across an `.await` (or
    /// while this manager is used on the same thread): the feed is updated
    /// from inside requests, also other tasks', and a held borrow blocks
    /// them.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use quorumlock::HealthState;
    ///
    /// let mut changes = manager.health_changes();
    /// cluster.kill(2)?; // not node 0: it issues the fencing tokens
    /// manager.lock("probe").await?.release().await?; // a request meets the dead node
    /// # manager.settle().await;
    /// assert!(changes.has_changed().expect("the manager lives"));
    /// assert_eq!(changes.borrow_and_update().state, HealthState::Degraded);
    /// # Ok(())
    /// # }
    /// ```
    pub fn health_changes(&self) -> tokio::sync::watch::Receiver<Health> {
        self.core.board.subscribe()
    }

    /// Connects to every node now, rather than on the first request:
    /// call it at startup (after a deploy, before taking traffic), so that
    /// the first lock's `node_timeout` is not spent connecting. Every node
    /// is connected at once; a cluster member reads its slot map and
    /// connects to each of its masters. The node guard observes each node
    /// as it connects, so a node it does not count (a fresh or restarted
    /// one inside its quarantine window) is found here too.
    ///
    /// Returns the [`health`](Self::health) after connecting when a quorum
    /// of nodes can serve; otherwise [`Error::QuorumUnavailable`] (its
    /// `resource` is `(connect)`) with what failed on each node, e.g. "not
    /// counted … started 1s ago with an empty data set". Connections that
    /// opened stay open either way, and a later request retries the others.
    ///
    /// Bounded: each connect takes at most `connect_timeout`, the guard's
    /// first look at the node another, and waiting for the node's clock
    /// rate to be measured (a loaded machine) another; reading a cluster's
    /// slot map asks its nodes one after another, each within
    /// `connect_timeout`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// use quorumlock::{HealthState, LockManager};
    ///
    /// let manager = LockManager::builder().nodes(cluster.urls()).build()?;
    /// let health = manager.connect().await?; // before serving requests
    /// assert_eq!(health.state, HealthState::Healthy);
    /// manager.lock("job").no_wait().await?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping it leaves the connects it started running in their own
    /// tasks (bounded as above); they are kept for the next request.
    /// Nothing is written to the nodes but what the guard's first look at
    /// each writes (the mark of its data set and the number beside it) and
    /// the scripts it loads.
    pub async fn connect(&self) -> Result<Health> {
        let nodes = &self.core.nodes;
        let connected =
            futures::future::join_all(nodes.iter().map(|member| member.connect())).await;
        let errors: Vec<_> = connected
            .into_iter()
            .filter_map(|result| result.err())
            .collect();
        let (total, needed) = (nodes.len(), self.quorum());
        if total - errors.len() >= needed {
            return Ok(self.health());
        }
        Err(Error::QuorumUnavailable {
            resource: CONNECT_LABEL.to_owned(),
            failed: errors.len(),
            answered: total - errors.len(),
            needed,
            total,
            errors,
        })
    }

    /// Waits until the work this manager left running in the background
    /// has finished: releases completing on slow nodes, rollbacks of failed
    /// or dropped attempts, releases of dropped locks and of dropped
    /// keep-alives, and cleanup that a runtime which shut down could not
    /// finish (run now, on this runtime). Call it before the process
    /// exits, so that a lock's last nodes are released too rather than
    /// left to expire.
    ///
    /// Bounded: each piece of background work is bounded by `node_timeout`
    /// (a dropped keep-alive by two), and `settle` itself gives up after
    /// `2 × node_timeout + 1 s`. Returns `true` when everything finished,
    /// `false` when it gave up (work stuck on a runtime that is no longer
    /// driven, or new work kept arriving).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock("job").await?;
    /// drop(lock); // released in the background
    /// assert!(manager.settle().await, "background work finished within its bound");
    /// manager.lock("job").no_wait().await?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping it changes nothing: it only waits.
    pub async fn settle(&self) -> bool {
        self.core.run_deferred();
        let limit = 2 * self.core.config.node_timeout + SETTLE_SLACK;
        self.core.background.settle(limit).await
    }

    pub(crate) fn core(&self) -> &Core {
        &self.core
    }

    /// One attempt at `keys` (with the error that made them invalid, if
    /// any) for `ttl`, not queued.
    pub(crate) async fn attempt(&self, keys: Result<Keys>, ttl: Duration) -> Result<Held> {
        let keys = Arc::new(keys?);
        let ttl = self.core.checked_ttl(ttl)?;
        self.core.run_deferred();
        let span = tracing::debug_span!(
            "acquire",
            resource = %keys.label(),
            access = ?keys.access,
            ttl_ms = ttl.as_millis() as u64,
            successes = tracing::field::Empty,
            failures = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty,
            validity_ms = tracing::field::Empty,
        );
        async {
            let mut attempts = 0;
            loop {
                attempts += 1;
                let admission = self
                    .core
                    .board
                    .admit()
                    .inspect_err(telemetry::acquire_failed)?;
                let claim = Claim::new(Arc::clone(&keys), self.core.nodes.len());
                let guard = Attempt::new(&self.core, &claim);
                let started = Instant::now();
                let (result, _) = self.core.acquire_once(&claim, ttl, None).await;
                admission.finish(&result);
                telemetry::attempt_finished(started.elapsed(), result.as_ref().err());
                let failure = match result {
                    Ok(granted) => {
                        tracing::debug!(token = ?granted.token, "acquired");
                        telemetry::acquired(started.elapsed());
                        return Ok(Held::new(Arc::clone(&self.core), guard.won(), ttl, granted));
                    }
                    Err(failure) => failure,
                };
                tracing::debug!(error = %failure, "attempt failed");
                // Refused by some nodes but not all: perhaps only by
                // others trying at the same moment, each rolling back what
                // it got. Rolled back first (our keys must not stand in
                // anyone's way, ours included); then, apart from those
                // others (at random), the nodes say whether anyone holds
                // it: on any node, since a holder may be on fewer than a
                // quorum of those that answer (a reader whose other nodes
                // restarted empty).
                let split = matches!(&failure, Error::Contended { refused, total, .. }
                    if refused < total && keys.simple().is_some());
                if !split {
                    // A late SET may still land on a node that timed out
                    // or said no: the guard removes ours everywhere one
                    // may have gone, in the background (a rollback in the
                    // foreground here sent the full release to nodes whose
                    // refusal had not come yet). With several resources,
                    // keys of ours not rolled back yet may lengthen the
                    // hint read next.
                    drop(guard);
                    let failure = self.with_free_in(failure, &keys).await;
                    telemetry::acquire_failed(&failure);
                    return Err(with_attempts(failure, attempts));
                }
                guard.roll_back().await;
                let apart = SPLIT_VOTE_PAUSE.mul_f64(fastrand::f64()) + started.elapsed();
                tokio::time::sleep(apart).await;
                // Live waiters keep the lock for the first of them (a plain
                // attempt is refused while they wait): taken, not split.
                let held = match self.holders(keys.label()).await {
                    Ok(holding) => !holding.seen.is_empty() || !holding.free || holding.waiters > 0,
                    // Too few nodes answered to tell: that is the failure,
                    // not contention.
                    Err(unreadable) => {
                        telemetry::acquire_failed(&unreadable);
                        return Err(unreadable);
                    }
                };
                if held {
                    let failure = self.with_free_in(failure, &keys).await;
                    telemetry::acquire_failed(&failure);
                    return Err(with_attempts(failure, attempts));
                }
                if attempts >= SPLIT_VOTE_ATTEMPTS {
                    let split = Error::SplitVote {
                        resource: keys.label().to_owned(),
                        attempts,
                    };
                    telemetry::acquire_failed(&split);
                    return Err(split);
                }
            }
        }
        .instrument(span)
        .await
    }

    /// `failure` with a retry-after hint if it is [`Error::Contended`]:
    /// one more read of every node (see `free_in`).
    async fn with_free_in(&self, failure: Error, keys: &Keys) -> Error {
        match failure {
            Error::Contended {
                resource,
                attempts,
                refused,
                total,
                ..
            } => Error::Contended {
                free_in: self.free_in(keys).await,
                resource,
                attempts,
                refused,
                total,
            },
            other => other,
        }
    }
}

/// How many times a single attempt (`no_wait`) tries when the nodes'
/// votes split between clients trying at the same moment (nobody holds the
/// resource after it), before [`Error::SplitVote`].
const SPLIT_VOTE_ATTEMPTS: u32 = 4;

/// Up to this long (at random, plus the attempt's own duration) between
/// such tries: contenders that fired together try apart.
const SPLIT_VOTE_PAUSE: Duration = Duration::from_millis(20);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_shareable_across_tasks() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<LockManager>();
        assert_send_sync::<crate::Lock>();
        assert_send_sync::<crate::Lock<crate::kind::Read>>();
        assert_send_sync::<crate::Lock<crate::kind::Many>>();
        assert_send_sync::<crate::Error>();
    }
}
