//! One Redis server: a lazily opened, shared, self-healing connection, and
//! requests on it bounded by a per-request timeout.
//!
//! Every lock of a manager shares one multiplexed connection per node, so
//! commands to a node are pipelined in order on one TCP stream. A connection
//! is opened on first use in a background task (bounded by `connect_timeout`),
//! dropped when it breaks or keeps timing out, and reopened on a later
//! request, so a node that was down, or restarted, is used again once it is up.

use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockWriteGuard, Weak};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError};
use tokio::time::Instant;

use crate::error::{NodeError, NodeErrorKind};
use crate::lock::Keys;
use crate::ops::{self, Answer, Op};
use crate::scripts;
use crate::telemetry;

/// After a failed connect, requests fail at once for this long before the
/// next connect is tried: a dead node costs nothing, a returning one waits
/// at most this long to be used again.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// Consecutive timeouts after which the connection is presumed dead (e.g. a
/// half-open TCP stream) and replaced on the next request.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 3;

type ConnectResult = Result<Connected, NodeErrorKind>;

#[derive(Clone)]
struct Connected {
    conn: MultiplexedConnection,
    /// Identifies this connection, so a late error on an old connection
    /// does not tear down its replacement.
    id: u64,
}

enum Link {
    /// No connection; the next request starts one.
    Idle,
    /// A connect is in flight; requests wait on it (within their timeout).
    Connecting(Shared<BoxFuture<'static, ConnectResult>>),
    Ready(Connected),
    /// The last connect failed; requests fail fast until the backoff ends.
    Failed {
        at: Instant,
        error: NodeErrorKind,
    },
}

/// A lock node. Cheap to share (`Arc<Node>`); all state is behind it.
pub(crate) struct Node {
    name: String,
    client: redis::Client,
    connect_timeout: Duration,
    /// Read on every request (shared), written only on state changes.
    link: RwLock<Link>,
    next_connection_id: AtomicU64,
    consecutive_timeouts: AtomicU32,
}

impl Node {
    pub(crate) fn new(name: String, client: redis::Client, connect_timeout: Duration) -> Self {
        Self {
            name,
            client,
            connect_timeout,
            link: RwLock::new(Link::Idle),
            next_connection_id: AtomicU64::new(0),
            consecutive_timeouts: AtomicU32::new(0),
        }
    }

    /// `host:port` of the node, safe to log.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Runs one lock operation on this node, without a bound of its own:
    /// the round that sends it bounds all its requests with one deadline
    /// and reports a miss through [`timed_out`](Self::timed_out).
    pub(crate) async fn apply(
        self: Arc<Self>,
        op: Op,
        keys: Arc<Keys>,
        value: Arc<str>,
    ) -> Result<Answer, NodeError> {
        let reply = self
            .exchange(move |mut conn| async move { ops::send(op, &keys, &value, &mut conn).await })
            .await?;
        ops::interpret(op, reply)
            .map_err(|what| self_error(&self, NodeErrorKind::UnexpectedReply(what)))
    }

    /// Runs `op` on the shared connection; waiting for the connection and
    /// the reply together take at most `timeout`.
    pub(crate) async fn request<T, F, Fut>(
        self: &Arc<Self>,
        timeout: Duration,
        op: F,
    ) -> Result<T, NodeError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        match tokio::time::timeout(timeout, self.exchange(op)).await {
            Ok(result) => result,
            Err(_) => Err(self.timed_out(timeout)),
        }
    }

    /// Waits for the connection, then runs `op` on it. Unbounded.
    async fn exchange<T, F, Fut>(self: &Arc<Self>, op: F) -> Result<T, NodeError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let connected = self
            .connection()
            .await
            .map_err(|kind| self_error(self, kind))?;
        match op(connected.conn).await {
            Ok(value) => {
                if self.consecutive_timeouts.load(Ordering::Relaxed) != 0 {
                    self.consecutive_timeouts.store(0, Ordering::Relaxed);
                }
                Ok(value)
            }
            Err(err) => {
                if is_connection_failure(&err) {
                    self.forget_connection(Some(connected.id));
                }
                Err(self_error(self, NodeErrorKind::Redis(err.to_string())))
            }
        }
    }

    /// Records that a request got no reply within `limit`. After several in
    /// a row the connection is presumed dead and replaced on next use.
    pub(crate) fn timed_out(&self, limit: Duration) -> NodeError {
        let timeouts = self.consecutive_timeouts.fetch_add(1, Ordering::Relaxed) + 1;
        if timeouts >= TIMEOUTS_BEFORE_RECONNECT {
            self.consecutive_timeouts.store(0, Ordering::Relaxed);
            self.forget_connection(None);
        }
        self_error(self, NodeErrorKind::Timeout(limit))
    }

    /// The current connection, or the in-flight connect to wait on.
    async fn connection(self: &Arc<Self>) -> ConnectResult {
        // Fast path: the connection is up; a shared lock is enough.
        if let Link::Ready(connected) = &*self.link.read().unwrap_or_else(|p| p.into_inner()) {
            return Ok(connected.clone());
        }
        let waiting = {
            let mut link = self.lock_link();
            match &*link {
                Link::Ready(connected) => return Ok(connected.clone()),
                Link::Connecting(pending) => pending.clone(),
                Link::Failed { at, error } if at.elapsed() < RECONNECT_BACKOFF => {
                    return Err(error.clone());
                }
                Link::Idle | Link::Failed { .. } => {
                    let pending = self.spawn_connect();
                    *link = Link::Connecting(pending.clone());
                    pending
                }
            }
        };
        waiting.await
    }

    /// Starts a connect in its own task, so it completes (and is cached)
    /// even when the request that started it times out first.
    fn spawn_connect(self: &Arc<Self>) -> Shared<BoxFuture<'static, ConnectResult>> {
        let client = self.client.clone();
        let connect_timeout = self.connect_timeout;
        // The reply bound is ours (per request); redis-rs must not add another.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None);
        let id = self.next_connection_id.fetch_add(1, Ordering::Relaxed);
        let node: Weak<Self> = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let result = match tokio::time::timeout(
                connect_timeout,
                client.get_multiplexed_async_connection_with_config(&config),
            )
            .await
            {
                Ok(Ok(mut conn)) => {
                    // Best effort, within the same bound; EVALSHA falls back.
                    let _ =
                        tokio::time::timeout(connect_timeout, scripts::preload(&mut conn)).await;
                    Ok(Connected { conn, id })
                }
                Ok(Err(err)) => Err(NodeErrorKind::Connect(err.to_string())),
                Err(_) => Err(NodeErrorKind::Connect(format!(
                    "no connection within {connect_timeout:?}"
                ))),
            };
            if let Some(node) = node.upgrade() {
                node.finish_connect(&result);
            }
            result
        });
        task.map(|joined| {
            joined.unwrap_or_else(|err| {
                Err(NodeErrorKind::Connect(format!("connect task ended: {err}")))
            })
        })
        .boxed()
        .shared()
    }

    fn finish_connect(&self, result: &ConnectResult) {
        let mut link = self.lock_link();
        match result {
            Ok(connected) => {
                tracing::debug!(node = %self.name, "connected");
                self.consecutive_timeouts.store(0, Ordering::Relaxed);
                *link = Link::Ready(connected.clone());
            }
            Err(error) => {
                tracing::debug!(node = %self.name, %error, "connect failed");
                *link = Link::Failed {
                    at: Instant::now(),
                    error: error.clone(),
                };
            }
        }
    }

    /// Drops connection `id` (any ready one, with `None`) if it is still
    /// the current one; the next request reconnects.
    fn forget_connection(&self, id: Option<u64>) {
        let mut link = self.lock_link();
        if matches!(&*link, Link::Ready(connected) if id.is_none_or(|id| connected.id == id)) {
            tracing::debug!(node = %self.name, "connection dropped; will reconnect");
            *link = Link::Idle;
        }
    }

    fn lock_link(&self) -> RwLockWriteGuard<'_, Link> {
        // The guarded state is always consistent between statements, so a
        // panic elsewhere while holding it leaves nothing half-done.
        self.link
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Names the node in an error, and counts it (metric `node_errors_total`).
fn self_error(node: &Node, kind: NodeErrorKind) -> NodeError {
    let error = NodeError {
        node: node.name.clone(),
        kind,
    };
    telemetry::node_error(&error);
    error
}

/// Errors after which the connection cannot be trusted any more.
fn is_connection_failure(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error()
}
