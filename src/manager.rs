//! [`LockManager`]: asks all nodes at once, decides by quorum, retries,
//! rolls back failed attempts, and extends and releases held locks.
//!
//! The rules come from [`crate::quorum`]; this module only moves requests.
//! Every request is bounded by `node_timeout`, and an attempt stops waiting
//! as soon as its outcome is decided, so no call waits on a straggler.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;
use tracing::Instrument;

use crate::config::{Config, LockManagerBuilder};
use crate::error::{Error, NodeError, NotHeldReason, Result};
use crate::lock::{Lock, lock_key};
use crate::node::{Node, Op};
use crate::quorum::{self, Decision, Loss, Tally, Vote};

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
}

/// A won acquisition or extension: when it started and until when it is valid.
pub(crate) struct Granted {
    pub(crate) started: Instant,
    pub(crate) valid_until: Instant,
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
            core: Arc::new(Core { config, nodes }),
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

    /// The default TTL used by [`lock`](Self::lock) and [`try_lock`](Self::try_lock).
    pub fn default_ttl(&self) -> Duration {
        self.core.config.ttl
    }

    async fn acquire(&self, resource: &str, ttl: Duration, attempts: u32) -> Result<Lock> {
        check_resource(resource)?;
        let ttl = self.core.checked_ttl(ttl)?;
        let key: Arc<str> = lock_key(resource).into();
        let span = tracing::debug_span!("acquire", resource, ttl_ms = ttl.as_millis() as u64);
        async {
            let mut attempt = 1;
            loop {
                let value = new_lock_value();
                let op = Op::Acquire {
                    ttl_ms: ttl.as_millis() as u64,
                };
                let failure = match self.core.timed_round(op, resource, &key, &value, ttl).await {
                    Ok(granted) => {
                        tracing::debug!(attempt, "acquired");
                        return Ok(Lock::new(
                            Arc::clone(&self.core),
                            resource.to_owned(),
                            key,
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
                self.core.rollback(Arc::clone(&key), value);
                tracing::debug!(attempt, error = %failure, "attempt failed");
                if attempt >= attempts {
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

    /// One round of a TTL-setting operation (acquire or extend) on all
    /// nodes, judged by quorum and by the validity left from its start.
    async fn timed_round(
        &self,
        op: Op,
        resource: &str,
        key: &Arc<str>,
        value: &Arc<str>,
        ttl: Duration,
    ) -> Result<Granted> {
        let started = Instant::now();
        let (tally, errors, _stragglers) = self.round(op, key, value).await;
        tracing::debug!(
            ?op,
            resource,
            granted = tally.granted(),
            refused = tally.refused(),
            failed = tally.failed(),
            "round decided"
        );
        self.judge(resource, ttl, started, tally, errors)
    }

    /// Sends `op` to every node at once; returns once the tally is decided.
    async fn round(
        &self,
        op: Op,
        key: &Arc<str>,
        value: &Arc<str>,
    ) -> (
        Tally,
        Vec<NodeError>,
        FuturesUnordered<impl Future<Output = Result<bool, NodeError>> + Send + 'static>,
    ) {
        let timeout = self.config.node_timeout;
        fan_out(&self.nodes, |node| {
            Arc::clone(node).apply(op, Arc::clone(key), Arc::clone(value), timeout)
        })
        .await
    }

    /// Turns a decided tally into a grant or the error that explains it.
    fn judge(
        &self,
        resource: &str,
        ttl: Duration,
        started: Instant,
        tally: Tally,
        errors: Vec<NodeError>,
    ) -> Result<Granted> {
        let decided = Instant::now();
        let elapsed = decided - started;
        let drift = quorum::drift(ttl, self.config.drift_factor);
        let validity = quorum::validity(ttl, elapsed, drift);
        match tally.decision() {
            Decision::Won if quorum::is_usable(validity, self.config.min_validity) => Ok(Granted {
                started,
                valid_until: decided + validity,
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
        key: &Arc<str>,
        value: &Arc<str>,
        ttl: Duration,
    ) -> Result<Granted> {
        let op = Op::Extend {
            ttl_ms: ttl.as_millis() as u64,
        };
        match self.timed_round(op, resource, key, value, ttl).await {
            // Refusals on extend mean our value is gone from those nodes.
            Err(Error::Contended { .. }) => Err(Error::NotHeld {
                resource: resource.to_owned(),
                reason: NotHeldReason::Lost,
            }),
            other => other,
        }
    }

    /// Compare-and-deletes `value`'s key on all nodes and returns once the
    /// outcome is decided; the remaining nodes finish in the background.
    pub(crate) async fn release(&self, key: Arc<str>, value: Arc<str>) -> (Tally, Vec<NodeError>) {
        let (tally, errors, stragglers) = self.round(Op::Release, &key, &value).await;
        finish_in_background(stragglers);
        (tally, errors)
    }

    /// Fire-and-forget release (failed attempts, dropped locks).
    pub(crate) fn rollback(self: &Arc<Self>, key: Arc<str>, value: Arc<str>) {
        let core = Arc::clone(self);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                core.release(key, value).await;
            });
        }
    }
}

/// Sends one request per node at once and records the answers as they
/// arrive, until the tally is decided. Returns the tally, the errors seen,
/// and the requests still in flight.
async fn fan_out<F, Fut>(
    nodes: &[Arc<Node>],
    request: F,
) -> (Tally, Vec<NodeError>, FuturesUnordered<Fut>)
where
    F: FnMut(&Arc<Node>) -> Fut,
    Fut: Future<Output = Result<bool, NodeError>>,
{
    let mut pending: FuturesUnordered<Fut> = nodes.iter().map(request).collect();
    let mut tally = Tally::new(nodes.len());
    let mut errors = Vec::new();
    while let Some(answer) = pending.next().await {
        let vote = match answer {
            Ok(true) => Vote::Granted,
            Ok(false) => Vote::Refused,
            Err(error) => {
                tracing::debug!(node = %error.node, %error, "node request failed");
                errors.push(error);
                Vote::Failed
            }
        };
        if tally.record(vote) != Decision::Pending {
            break;
        }
    }
    (tally, errors, pending)
}

/// Lets requests that were still in flight when the outcome was decided
/// run to completion (each is bounded by `node_timeout`).
fn finish_in_background<Fut>(mut stragglers: FuturesUnordered<Fut>)
where
    Fut: Future + Send + 'static,
    Fut::Output: Send,
{
    if stragglers.is_empty() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move { while stragglers.next().await.is_some() {} });
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
