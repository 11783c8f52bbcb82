//! One Redis server: a lazily opened, shared, self-healing connection, and
//! requests on it.
//!
//! Every lock of a manager shares one multiplexed connection per node, so
//! commands to a node are pipelined in order on one TCP stream. A
//! connection is opened on first use in a background task (bounded by
//! `connect_timeout`) and replaced when it breaks, when it keeps timing
//! out, or when the runtime that drives it has shut down; a connect that
//! was cut off (its task cancelled, or never driven) is started again. So
//! a node that was down, restarted, or last used from a runtime that is
//! gone is used again once it answers.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockWriteGuard, Weak};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Either, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError};
use tokio::time::Instant;

use crate::error::{NodeError, NodeErrorKind};
use crate::guard::judge::{ClockSample, Quarantine};
use crate::guard::observe::DataSetKeys;
use crate::guard::observe::time_refused;
use crate::guard::observe::{
    facts_from_observation, failure as observe_failure, fsync_policy, micros_of, observe,
    read_clock,
};
use crate::guard::watch::{ClockReading, Judged, NodeWatch, Observed};
use crate::health::Reporter;
use crate::hot_wire::{HotWire, Target};
use crate::keys::Keys;
use crate::ops::{self, Answer, Op};
use crate::reply_error::{authentication_failure, is_connection_failure, redis_error_kind};
use crate::scripts;
use crate::telemetry;

/// After a failed connect, requests fail at once for this long before the
/// next connect is tried: a dead node costs nothing, a returning one waits
/// at most this long to be used again.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// Room in a connection's queue of requests to write (redis-rs' pipeline
/// buffer; its default is 50). A request must join the queue in the poll
/// that records it in its round's trail, never later: a SET that waited
/// for room (or for tokio's cooperative budget, which
/// [`Node::apply_on`] lifts) could join after the release that was sent
/// behind it, and leave its key on the node until it expires. The room
/// costs nothing until used. What waits in it is bounded by the requests
/// sent while the node is not reading: a request dropped at its round's
/// deadline is skipped when redis-rs takes it from the queue, and a
/// connection that keeps timing out is replaced (and its queue dropped)
/// after `TIMEOUTS_BEFORE_RECONNECT` misses.
const REQUEST_QUEUE_ROOM: usize = 1 << 24;

/// How long after the first `TIME` of a node never seen the second is
/// read, on connect: on a quiet machine a clock that runs 1.5 times as
/// fast shows within this (later ones, further out, on a loaded one: see
/// `rate_samples`); smaller rate errors show as samples spread (see
/// `guard`). Costs a manager's first lock this long, once.
const FIRST_SIGHT_SAMPLE_SPACING: Duration = Duration::from_millis(10);

/// The longest a connect spends reading a new node's clock for its rate
/// (and at most half its bound, `connect_timeout`); a node whose readings
/// could not measure it by then waits for a later reading (the guard's
/// next observation) to be counted.
const FIRST_SIGHT_SAMPLING: Duration = Duration::from_millis(400);

/// How long [`measure_rate`] keeps reading a node's clock for its rate
/// after its connect; past it, the guard's observations (one per clock
/// interval) do.
const RATE_FOLLOW_UP: Duration = Duration::from_secs(3);

/// Consecutive timeouts on one connection after which it is presumed dead
/// (e.g. a half-open TCP stream) and replaced on the next request.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 3;

/// A connect still unfinished this long after its own bounds (connect,
/// then script preload: `2 × connect_timeout`) is presumed stuck (its
/// runtime no longer runs it) and started again.
const STUCK_CONNECT_GRACE: Duration = Duration::from_millis(500);

/// An open connection to a node. Requests that must follow an earlier
/// one on the same stream (a release behind its SET) hold on to it, also
/// after the node has moved on to a newer connection.
pub(crate) struct Connection {
    conn: MultiplexedConnection,
    /// The lock requests' own connection, when the node has one (see
    /// `hot_wire`); everything else goes through `conn`.
    hot: Option<HotWire>,
    /// Tells connections apart, so a late verdict on an old connection
    /// never tears down its replacement.
    id: u64,
    /// Requests in a row on this connection that got no reply in time.
    timeouts: AtomicU32,
    /// Set when a request on it failed with a connection error.
    broken: AtomicBool,
    /// Cleared when the runtime that runs its driver drops its tasks.
    driven: Arc<AtomicBool>,
    canary: tokio::task::AbortHandle,
    /// The server it leads to (on a cluster member, the connection of a
    /// request may lead to another shard than the one now serving it).
    owner: Weak<Node>,
}

impl Connection {
    /// Whether requests sent on it can still reach the node.
    pub(crate) fn usable(&self) -> bool {
        !self.broken.load(Ordering::Relaxed)
            && self.driven.load(Ordering::Relaxed)
            && !self.hot.as_ref().is_some_and(HotWire::is_broken)
    }

    /// Whether it is the same connection as `other`.
    pub(crate) fn same_as(&self, other: &Connection) -> bool {
        self.id == other.id && Weak::ptr_eq(&self.owner, &other.owner)
    }

    /// The server it leads to, while its manager lives.
    pub(crate) fn owner(&self) -> Option<Arc<Node>> {
        self.owner.upgrade()
    }

    /// A request on it got its reply: the run of timeouts, if any, ends.
    fn answered(&self) {
        if self.timeouts.load(Ordering::Relaxed) != 0 {
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.canary.abort();
    }
}

/// Clears its flag when dropped, e.g. with the task that holds it.
struct ClearOnDrop(Arc<AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// Why a connect produced no connection.
#[derive(Clone)]
struct ConnectFailure {
    kind: NodeErrorKind,
    /// The connect task was cancelled or panicked before it finished (its
    /// runtime shut down): worth retrying at once from the current runtime.
    task_ended: bool,
}

type ConnectResult = Result<Arc<Connection>, ConnectFailure>;

enum Link {
    /// No connection; the next request starts one.
    Idle,
    /// A connect is in flight; requests wait on it (within their bound).
    Connecting {
        id: u64,
        since: Instant,
        pending: Shared<BoxFuture<'static, ConnectResult>>,
    },
    Ready(Arc<Connection>),
    /// The last connect failed; requests fail fast until the backoff ends.
    Failed {
        at: Instant,
        error: NodeErrorKind,
    },
}

/// What a request does about the link, decided under the lock.
enum Next {
    Use(Arc<Connection>),
    Wait(u64, Shared<BoxFuture<'static, ConnectResult>>),
    Fail(NodeErrorKind),
}

/// A lock node. Cheap to share (`Arc<Node>`); all state is behind it.
pub(crate) struct Node {
    name: String,
    client: redis::Client,
    /// How the hot-path wire reaches it; `None`: redis-rs carries the
    /// lock requests too.
    hot: Option<Target>,
    connect_timeout: Duration,
    /// Read on every request (shared), written only on state changes.
    link: RwLock<Link>,
    next_connection_id: AtomicU64,
    /// What the node guard knows of this node.
    watch: NodeWatch,
    /// Where the outcomes of its requests go (the manager's health).
    reporter: Reporter,
    /// Where the guard's mark of its data set lives (read only when
    /// observing, written when a cluster's slots move).
    data_set: RwLock<Arc<DataSetKeys>>,
    /// For a shard master of a Redis Cluster member: how long (ms) its
    /// writes wait for a replica's acknowledgement, which they need to
    /// count once it has replicas; 0 for a standalone server.
    replicated_within_ms: AtomicU64,
    /// Whether the member's slot map listed replicas of it.
    replicas_listed: AtomicBool,
}

impl Node {
    pub(crate) fn new(
        name: String,
        client: redis::Client,
        hot: Option<Target>,
        connect_timeout: Duration,
        watch: NodeWatch,
        reporter: Reporter,
    ) -> Self {
        Self {
            name,
            client,
            hot,
            connect_timeout,
            link: RwLock::new(Link::Idle),
            next_connection_id: AtomicU64::new(0),
            watch,
            reporter,
            data_set: RwLock::new(Arc::new(DataSetKeys::standalone())),
            replicated_within_ms: AtomicU64::new(0),
            replicas_listed: AtomicBool::new(false),
        }
    }

    /// Makes this server a shard master whose writes count only once a
    /// replica acknowledged them (waiting up to `within`) whenever it has
    /// replicas: the slot map listed some (`listed`), or the guard's last
    /// observation of it saw one connected. Either alone may lag (a node
    /// learns of a new replica by gossip; observations are spaced): a
    /// master either shows with replicas waits.
    pub(crate) fn require_replication(&self, within: Duration, listed: bool) {
        let ms = (within.as_millis() as u64).max(1);
        self.replicated_within_ms.store(ms, Ordering::Relaxed);
        self.replicas_listed.store(listed, Ordering::Relaxed);
    }

    /// How long (ms) a write here waits for a replica's acknowledgement,
    /// if it needs one.
    fn replication_wait_ms(&self) -> Option<u64> {
        let ms = self.replicated_within_ms.load(Ordering::Relaxed);
        let has_replicas = self.replicas_listed.load(Ordering::Relaxed)
            || self.watch.replicas().is_some_and(|count| count > 0);
        (ms > 0 && has_replicas).then_some(ms)
    }

    /// The redis-rs client that reaches this server.
    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    /// Where the guard's mark of this server's data set lives.
    pub(crate) fn data_set(&self) -> Arc<DataSetKeys> {
        Arc::clone(&self.data_set.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Moves the guard's mark to `keys` (a shard master that no longer
    /// serves the old one's slot): the guard then finds no mark where it
    /// looks, and judges the data set as one that lost it, which is the
    /// cautious reading.
    pub(crate) fn set_data_set(&self, keys: DataSetKeys) {
        *self.data_set.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys);
    }

    /// Why the guard does not count this node now, if it does not.
    pub(crate) fn quarantine(&self) -> Option<Quarantine> {
        let quarantine = self.watch.quarantine();
        self.reporter.quarantine(quarantine.as_ref());
        quarantine
    }

    /// The error that a quarantined node's vote becomes.
    pub(crate) fn quarantined(&self, quarantine: Quarantine) -> NodeError {
        self_error(self, NodeErrorKind::Quarantined(quarantine))
    }

    /// What the node's clock reads now at the least and at the most (µs
    /// since 1970), as far as the guard's readings tell.
    pub(crate) fn clock_now(&self, now: Instant) -> Option<(u64, u64)> {
        self.watch.clock_now(now)
    }

    /// The node's guard epoch: it moves on whenever the node may have lost
    /// keys (an unsafe restart, a clock fault), so a key set in an earlier
    /// epoch may be gone through no one's doing.
    pub(crate) fn epoch(&self) -> u64 {
        self.watch.epoch()
    }

    /// Observes a quarantined node again in the background (settings and
    /// clock, as on connect) once per clock interval, so that it is seen
    /// to recover although no key-setting request goes to it. Bounded by
    /// `connect_timeout`.
    pub(crate) fn observe_soon(self: &Arc<Self>) {
        let Some(observing) = self.watch.claim_observation() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let node = Arc::clone(self);
        let raise = observing.raise();
        runtime.spawn(async move {
            // As a request: a connection on which it times out again and
            // again is replaced.
            let name = node.name.clone();
            let data_set = node.data_set();
            let observed = node
                .request(node.connect_timeout, |conn| async move {
                    observe(&name, &conn, &data_set, raise).await
                })
                .await;
            match observed {
                Ok((observed, sample)) => {
                    node.watch
                        .on_observed(observing, &observed, Vec::from_iter(sample).as_slice());
                }
                Err(NodeError {
                    kind: NodeErrorKind::Timeout(_),
                    ..
                }) => node.watch.on_unobserved(observing, "observation timed out"),
                // No connection, or it broke (and is replaced): not
                // observed; the next connection is observed as it opens.
                Err(error) => node.watch.on_unobserved(observing, &error.to_string()),
            }
        });
    }

    /// `host:port` of the node, safe to log.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Sends one lock operation on `connection` and reads the answer.
    /// Unbounded: the round that sends it bounds all its requests with one
    /// deadline and reports a miss through [`timed_out`](Self::timed_out).
    ///
    /// With the guard on, an operation that sets keys carries a `TIME`
    /// (with [`ClockCheck::Sampled`], one per clock interval), judged
    /// before the answer counts; an answer to such an operation from a
    /// node that is quarantined by then (for this or any reason) is a
    /// failure.
    ///
    /// [`ClockCheck::Sampled`]: crate::ClockCheck::Sampled
    ///
    /// The command is built before the returned future is first polled,
    /// and the future holds no copy of `keys` or `value`: a round keeps one
    /// such future per node in flight.
    pub(crate) fn apply_on<'a>(
        &'a self,
        connection: &'a Arc<Connection>,
        op: Op,
        keys: &Keys,
        value: &str,
    ) -> impl Future<Output = Result<Answer, NodeError>> + Send + 'a {
        let sets_keys = op.sets_keys();
        let timed = sets_keys && self.watch.wants_time();
        let observing = sets_keys.then(|| self.watch.claim_observation()).flatten();
        let data_set = observing.is_some().then(|| self.data_set());
        let replicated = self.replication_wait_ms();
        let prepared = ops::prepare(
            op,
            keys,
            value,
            timed,
            observing
                .as_ref()
                .zip(data_set.as_deref())
                .map(|(o, d)| (o.raise(), d)),
            replicated,
        );
        async move {
            let sent = Instant::now();
            // Unconstrained: tokio's cooperative budget must not make the
            // first poll return before the request has joined the
            // connection's queue (see `REQUEST_QUEUE_ROOM`).
            let sent_on = match &connection.hot {
                Some(hot) => Either::Left(prepared.send_hot(hot)),
                None => Either::Right(prepared.send(connection.conn.clone())),
            };
            let reply = match tokio::task::unconstrained(sent_on).await {
                Ok(reply) => {
                    connection.answered();
                    reply
                }
                // The observation, if any, is dropped unjudged: the node
                // is not counted until another one succeeds.
                Err(err) => return Err(self.failed_on(connection, &err)),
            };
            if sets_keys {
                let observation = reply
                    .observation
                    .map(|(script, fsync)| self.observation_of(connection, script, fsync));
                let clock = match reply.time.as_ref() {
                    None => ClockReading::NotAsked,
                    Some(time) => match (micros_of(time), time) {
                        (Some(server_us), _) => ClockReading::Read(ClockSample {
                            server_us,
                            sent,
                            received: Instant::now(),
                        }),
                        (None, redis::Value::ServerError(error))
                            if time_refused(Some(error.code()), error.details().unwrap_or("")) =>
                        {
                            ClockReading::Refused
                        }
                        // Not read this time (a busy node): no reading.
                        (None, _) => ClockReading::NotAsked,
                    },
                };
                // An observation claimed and not sent with it (it cannot
                // be: every key-setting command is guarded) is dropped
                // unjudged, which is the cautious reading.
                let observed = observing.zip(observation.as_ref());
                let quarantine = match self.watch.judge_answer(sent, clock, observed) {
                    Judged::Now(quarantine) => quarantine,
                    // Rare (an observation in flight beside it): boxed, so
                    // that the common case stays small.
                    Judged::AwaitVerdict | Judged::Observe => {
                        let observe = || {
                            if let Some(node) = connection.owner() {
                                node.observe_soon();
                            }
                        };
                        Box::pin(self.watch.verdict_for(sent, observe)).await
                    }
                };
                // Quarantined by now, whatever it answered (yes, no, an
                // error): not counted.
                if let Some(quarantine) = quarantine {
                    return Err(self.quarantined(quarantine));
                }
            }
            let answer = reply
                .answer
                .map_err(|err| self.failed_on(connection, &err))?;
            let answer = ops::interpret(op, answer).map_err(|kind| self_error(self, kind))?;
            // A write no replica holds yet does not count (a refusal
            // wrote nothing, and stands), nor one sent without a wait
            // to a master this reply's observation found replicas of. A
            // release needs none: lost, the key expires.
            let acknowledged = match reply.replicated.as_ref() {
                Some(acks) => ops::replica_acknowledged(acks)
                    .map_err(|why| self_error(self, NodeErrorKind::Redis(why)))?,
                None => !sets_keys || self.replication_wait_ms().is_none(),
            };
            if matches!(
                answer,
                Answer::Yes | Answer::YesWith(_) | Answer::YesInLine(_) | Answer::Restored
            ) && !acknowledged
            {
                let waited = replicated.map_or(Duration::ZERO, Duration::from_millis);
                return Err(self_error(self, NodeErrorKind::Unreplicated(waited)));
            }
            self.reporter.answered();
            Ok(answer)
        }
    }

    /// The facts an observation sent with a request gave: the script's
    /// reply (an error reply is no observation) and `CONFIG GET`'s.
    fn observation_of(
        &self,
        connection: &Arc<Connection>,
        script: Option<redis::Value>,
        fsync: Option<redis::Value>,
    ) -> Observed {
        let script = script
            .unwrap_or(redis::Value::Nil)
            .extract_error()
            .map_err(|err| {
                if err.code() == Some("NOSCRIPT") {
                    self.reload_scripts(connection);
                }
                observe_failure(&err)
            });
        facts_from_observation(&self.name, script, fsync_policy(fsync.as_ref()))
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
        let deadline = Instant::now() + timeout;
        let connection = match tokio::time::timeout_at(deadline, self.connection()).await {
            Ok(connection) => connection?,
            Err(_) => return Err(self.timed_out(None, timeout)),
        };
        match tokio::time::timeout_at(deadline, self.exchange_on(&connection, op)).await {
            Ok(result) => result.inspect(|_| self.reporter.answered()),
            Err(_) => Err(self.timed_out(Some(&connection), timeout)),
        }
    }

    /// Runs `op` on `connection`, and keeps the connection's health up to
    /// date (the node's is reported by the callers, once they know whether
    /// the reply is a good one).
    async fn exchange_on<T, F, Fut>(
        &self,
        connection: &Arc<Connection>,
        op: F,
    ) -> Result<T, NodeError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        match op(connection.conn.clone()).await {
            Ok(value) => {
                connection.answered();
                Ok(value)
            }
            Err(err) => Err(self.failed_on(connection, &err)),
        }
    }

    /// The error for a request on `connection` that failed with `err`,
    /// after acting on it: a broken connection is replaced, a lost script
    /// cache reloaded.
    fn failed_on(&self, connection: &Connection, err: &RedisError) -> NodeError {
        if is_connection_failure(err) {
            connection.broken.store(true, Ordering::Relaxed);
            // Neither stream of a broken connection carries anything more:
            // a request still queued on the other must not reach the node
            // after the ones sent on its replacement.
            if let Some(hot) = &connection.hot {
                hot.give_up("the node's connection broke");
            }
            self.forget(connection.id);
        } else if err.code() == Some("READONLY") {
            // A master turned replica under a live connection (REPLICAOF):
            // its data set is being replaced; the next request observes it.
            self.watch.doubt();
        }
        self_error(self, redis_error_kind(err))
    }

    /// Records that a request sent on `connection` (if it got as far as a
    /// connection) had no reply within `limit`. After several in a row on
    /// one connection, that connection is replaced on next use.
    pub(crate) fn timed_out(
        &self,
        connection: Option<&Arc<Connection>>,
        limit: Duration,
    ) -> NodeError {
        if let Some(connection) = connection {
            let timeouts = connection.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
            if timeouts >= TIMEOUTS_BEFORE_RECONNECT {
                // What is queued on its hot-path stream is dropped: it must
                // not reach the node after requests on the replacement.
                // Cleanup still goes behind what went out (a late delete
                // of ours is harmless), and nothing else is sent on it (new
                // requests take the current connection). A request on
                // redis-rs' stream whose round gave up on it is never
                // written (redis-rs skips it).
                if let Some(hot) = &connection.hot {
                    hot.seal("replaced after requests in a row timed out");
                }
                self.forget(connection.id);
            }
        }
        self_error(self, NodeErrorKind::Timeout(limit))
    }

    /// Loads the scripts again on `connection`, in the background (see
    /// [`load_scripts`](Self::load_scripts)).
    fn reload_scripts(&self, connection: &Arc<Connection>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let connection = Arc::clone(connection);
        let limit = self.connect_timeout;
        runtime.spawn(async move { load_scripts(&connection, limit).await });
    }

    /// Loads the scripts again on `connection`, for a request that met a
    /// server which had lost them (`SCRIPT FLUSH`, or a restart that our
    /// preload met while it was loading); within `connect_timeout`.
    pub(crate) async fn load_scripts(&self, connection: &Connection) -> bool {
        load_scripts(connection, self.connect_timeout).await
    }

    /// Whether `connection` is the one new requests use.
    pub(crate) fn is_current(&self, connection: &Connection) -> bool {
        matches!(&*self.read_link(), Link::Ready(current) if current.id == connection.id)
    }

    /// The connection to use now, if one is open and usable: what
    /// [`connection`](Self::connection) returns at once, without a future.
    pub(crate) fn ready_connection(&self) -> Option<Arc<Connection>> {
        // A shared lock is enough.
        match &*self.read_link() {
            Link::Ready(connection) if connection.usable() => Some(Arc::clone(connection)),
            _ => None,
        }
    }

    /// The connection to use now, opening one if needed.
    pub(crate) async fn connection(self: &Arc<Self>) -> Result<Arc<Connection>, NodeError> {
        if let Some(connection) = self.ready_connection() {
            return Ok(connection);
        }
        // A connect cut off by its runtime's shutdown is retried once, at
        // once, from the runtime we run on.
        for _ in 0..2 {
            let (id, pending) = match self.next_step() {
                Next::Use(connection) => return Ok(connection),
                Next::Fail(kind) => return Err(self_error(self, kind)),
                Next::Wait(id, pending) => (id, pending),
            };
            match pending.await {
                Ok(connection) => return Ok(connection),
                Err(failure) if failure.task_ended => self.abandon_connect(id),
                Err(failure) => return Err(self_error(self, failure.kind)),
            }
        }
        Err(self_error(
            self,
            NodeErrorKind::Connect("the connect task was cancelled twice".into()),
        ))
    }

    /// Opens the connection now if none is open (within the connect's
    /// bounds: `connect_timeout` for the connect, another for the guard's
    /// first observation, and another for the node's clock rate, if that
    /// is still being measured), and says whether the guard counts the
    /// node.
    pub(crate) async fn connect_ahead(self: &Arc<Self>) -> Result<(), NodeError> {
        self.connection().await?;
        // A clock rate still being measured (a loaded machine: see
        // `measure_rate`) is waited for, up to another `connect_timeout`.
        let until = Instant::now() + self.connect_timeout;
        while self.watch.rate_pending() && Instant::now() < until {
            tokio::time::sleep(FIRST_SIGHT_SAMPLE_SPACING).await;
        }
        match self.quarantine() {
            Some(quarantine) => Err(self.quarantined(quarantine)),
            None => {
                self.reporter.answered();
                Ok(())
            }
        }
    }

    fn next_step(self: &Arc<Self>) -> Next {
        let mut link = self.write_link();
        match &*link {
            Link::Ready(connection) if connection.usable() => {
                return Next::Use(Arc::clone(connection));
            }
            Link::Connecting { id, since, pending }
                if since.elapsed() <= 2 * self.connect_timeout + STUCK_CONNECT_GRACE =>
            {
                return Next::Wait(*id, pending.clone());
            }
            Link::Failed { at, error } if at.elapsed() < RECONNECT_BACKOFF => {
                return Next::Fail(error.clone());
            }
            Link::Ready(_) => {
                tracing::debug!(node = %self.name, "connection no longer driven; reconnecting");
            }
            Link::Connecting { .. } => {
                tracing::debug!(node = %self.name, "connect stuck; starting another");
            }
            Link::Idle | Link::Failed { .. } => {}
        }
        match self.spawn_connect() {
            Ok((id, pending)) => {
                *link = Link::Connecting {
                    id,
                    since: Instant::now(),
                    pending: pending.clone(),
                };
                Next::Wait(id, pending)
            }
            Err(kind) => Next::Fail(kind),
        }
    }

    /// Starts a connect in its own task, so it completes (and is cached)
    /// even when the request that started it gives up first.
    #[allow(clippy::type_complexity)]
    fn spawn_connect(
        self: &Arc<Self>,
    ) -> Result<(u64, Shared<BoxFuture<'static, ConnectResult>>), NodeErrorKind> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| NodeErrorKind::Connect("no tokio runtime to connect from".into()))?;
        let client = self.client.clone();
        let connect_timeout = self.connect_timeout;
        // The reply bound is ours (per request); redis-rs must not add another.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None)
            .set_pipeline_buffer_size(REQUEST_QUEUE_ROOM);
        let id = self.next_connection_id.fetch_add(1, Ordering::Relaxed);
        let node: Weak<Self> = Arc::downgrade(self);
        let (name, guarded) = (self.name.clone(), self.watch.enabled());
        let hot_target = self.hot.clone();
        let task = runtime.spawn(async move {
            // Both connections, or none: the lock requests' own one, when
            // the node has one, opens beside redis-rs' within the bound.
            let both = async {
                let conn = async {
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map_err(|e| authentication_failure(&e).unwrap_or_else(|| e.to_string()))
                };
                let hot = async {
                    match &hot_target {
                        Some(target) => target.connect().await.map(Some),
                        None => Ok(None),
                    }
                };
                // Side by side: each may take the whole bound.
                futures::future::try_join(conn, hot).await
            };
            let result = match tokio::time::timeout(connect_timeout, both).await {
                Ok(Ok((conn, hot))) => {
                    // Best effort, within the same bound, in one round trip
                    // with the guard's observation; EVALSHA falls back.
                    let mut preload_conn = conn.clone();
                    let preload = preload(&mut preload_conn);
                    let watched = node.upgrade().filter(|_| guarded);
                    let first_sight = watched
                        .as_ref()
                        .is_some_and(|node| node.watch.first_sight());
                    let observing = watched
                        .as_ref()
                        .map(|node| (node.watch.observing_now(), node.data_set()));
                    let observe = async {
                        match &observing {
                            Some((observing, data_set)) => {
                                Some(observe(&name, &conn, data_set, observing.raise()).await)
                            }
                            None => None,
                        }
                    };
                    // With the guard on, both streams must reach the
                    // server it observes.
                    let same = async {
                        match &hot {
                            Some(hot) if observing.is_some() => same_server(&conn, hot).await,
                            _ => Ok(()),
                        }
                    };
                    // The sampling below leaves half the bound for the rest.
                    let sampling_ends = Instant::now() + connect_timeout / 2;
                    let setup = async {
                        let (_, observed, same) = futures::join!(preload, observe, same);
                        if let Err(apart) = same {
                            return Some(Err(apart));
                        }
                        let (facts, first) = match observed? {
                            Ok(observed) => observed,
                            Err(broke) => {
                                return Some(Err(authentication_failure(&broke)
                                    .unwrap_or_else(|| broke.to_string())));
                            }
                        };
                        // A node never seen: one clock sample tells nothing
                        // of its rate; later ones do, once they are far
                        // enough apart for their round trips.
                        let mut samples = Vec::from_iter(first);
                        if let (true, Some(node)) = (first_sight, &watched) {
                            let first = samples.first().copied();
                            let until = (Instant::now() + FIRST_SIGHT_SAMPLING).min(sampling_ends);
                            samples.extend(
                                first_sight_samples(&conn, first, until, &node.watch).await,
                            );
                        }
                        Some(Ok((facts, samples)))
                    };
                    let observed = tokio::time::timeout(connect_timeout, setup).await;
                    let owner = node.clone();
                    let node = node.upgrade();
                    let watch = node
                        .as_ref()
                        .map(|node| &node.watch)
                        .zip(observing.map(|(observing, _)| observing));
                    match (observed, watch) {
                        // A connection that broke while it was set up is
                        // no connection.
                        (Ok(Some(Err(broke))), _) => Err(NodeErrorKind::Connect(broke)),
                        (Ok(Some(Ok((facts, samples)))), Some((watch, observing))) => {
                            watch.on_observed(observing, &facts, &samples);
                            if watch.rate_pending() {
                                tokio::spawn(measure_rate(owner.clone(), conn.clone()));
                            }
                            Ok(open(conn, hot, id, owner))
                        }
                        // Opened, quarantined until an observation
                        // succeeds over redis-rs' stream; the streams were
                        // not found to reach one server, so the lock
                        // requests go on that one.
                        (Err(_), Some((watch, observing))) => {
                            watch.on_unobserved(observing, "observation on connect timed out");
                            Ok(open(conn, None, id, owner))
                        }
                        _ => Ok(open(conn, hot, id, owner)),
                    }
                }
                Ok(Err(err)) => Err(NodeErrorKind::Connect(err)),
                Err(_) => Err(NodeErrorKind::Connect(format!(
                    "no connection within {connect_timeout:?}"
                ))),
            };
            if let Some(node) = node.upgrade() {
                node.finish_connect(id, &result);
            }
            result.map_err(|kind| ConnectFailure {
                kind,
                task_ended: false,
            })
        });
        let pending = task
            .map(|joined| {
                joined.unwrap_or_else(|err| {
                    Err(ConnectFailure {
                        kind: NodeErrorKind::Connect(format!("connect task ended: {err}")),
                        task_ended: true,
                    })
                })
            })
            .boxed()
            .shared();
        Ok((id, pending))
    }

    fn finish_connect(&self, id: u64, result: &Result<Arc<Connection>, NodeErrorKind>) {
        let mut link = self.write_link();
        // A connect that was replaced as stuck no longer decides anything.
        if !matches!(&*link, Link::Connecting { id: current, .. } if *current == id) {
            return;
        }
        match result {
            // The node answered (or failed) a connect's requests: its
            // health is known from here, even if the request that started
            // the connect was decided without it.
            Ok(connection) => {
                tracing::debug!(node = %self.name, "connected");
                self.reporter.answered();
                *link = Link::Ready(Arc::clone(connection));
            }
            Err(error) => {
                tracing::debug!(node = %self.name, %error, "connect failed");
                self.reporter.failed();
                *link = Link::Failed {
                    at: Instant::now(),
                    error: error.clone(),
                };
            }
        }
    }

    /// Forgets connect `id` whose task ended without a verdict.
    fn abandon_connect(&self, id: u64) {
        let mut link = self.write_link();
        if matches!(&*link, Link::Connecting { id: current, .. } if *current == id) {
            tracing::debug!(node = %self.name, "connect task was cancelled; reconnecting");
            *link = Link::Idle;
        }
    }

    /// Drops connection `id` if it is still the current one; the next
    /// request reconnects. Requests holding it may still use it.
    fn forget(&self, id: u64) {
        let mut link = self.write_link();
        if matches!(&*link, Link::Ready(connection) if connection.id == id) {
            tracing::debug!(node = %self.name, "connection dropped; will reconnect");
            *link = Link::Idle;
        }
    }

    fn read_link(&self) -> std::sync::RwLockReadGuard<'_, Link> {
        self.link
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_link(&self) -> RwLockWriteGuard<'_, Link> {
        // The guarded state is always consistent between statements, so a
        // panic elsewhere while holding it leaves nothing half-done.
        self.link
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Wraps a fresh connection, with a canary task on the same runtime as
/// its redis-rs driver: when that runtime drops its tasks, the canary goes
/// too, and the connection is known to be dead before a request is lost
/// on it.
fn open(
    conn: MultiplexedConnection,
    hot: Option<HotWire>,
    id: u64,
    owner: Weak<Node>,
) -> Arc<Connection> {
    let driven = Arc::new(AtomicBool::new(true));
    let flag = ClearOnDrop(Arc::clone(&driven));
    let canary = tokio::spawn(async move {
        let _flag = flag;
        std::future::pending::<()>().await;
    })
    .abort_handle();
    Arc::new(Connection {
        conn,
        hot,
        id,
        timeouts: AtomicU32::new(0),
        broken: AtomicBool::new(false),
        driven,
        canary,
        owner,
    })
}

/// The clock readings that measure the rate of a node met for the first
/// time, after its observation's (`first`, if it read the clock; if not,
/// one is read now): see [`rate_samples`]. A node that refuses `TIME` for
/// good is told to `watch`, which then is blind to its clock (and says
/// so) rather than wait for it.
async fn first_sight_samples(
    conn: &MultiplexedConnection,
    first: Option<ClockSample>,
    until: Instant,
    watch: &NodeWatch,
) -> Vec<ClockSample> {
    let mut samples = Vec::new();
    let first = match first {
        Some(first) => first,
        None => match read_clock(conn).await {
            Ok(Some(first)) => {
                samples.push(first);
                first
            }
            Ok(None) => return samples,
            Err(()) => {
                watch.clock_refused();
                return samples;
            }
        },
    };
    samples.extend(rate_samples(conn, first, until, |a, b| watch.rate_measured(a, b)).await);
    samples
}

/// Clock readings of a node met for the first time, after `first`: one
/// [`FIRST_SIGHT_SAMPLE_SPACING`] later, and, while `measured` says that
/// neither `first` nor the reading before is far enough from the last for
/// their round trips to bound the clock's rate (a loaded machine, a slow
/// first round trip), more, each twice as far out, until `until` (then
/// [`measure_rate`] goes on in the background); the guard counts the node
/// once such a pair measures its rate (the same pairs: see
/// `Health::on_clock`). A reading that fails ends it: the node read its
/// clock for `first`, so it refuses nothing for good.
async fn rate_samples(
    conn: &MultiplexedConnection,
    first: ClockSample,
    until: Instant,
    measured: impl Fn(&ClockSample, &ClockSample) -> bool,
) -> Vec<ClockSample> {
    let mut samples: Vec<ClockSample> = Vec::new();
    read_clock_spreading(conn, FIRST_SIGHT_SAMPLE_SPACING, until, |sample| {
        let previous = samples.last().copied().unwrap_or(first);
        samples.push(sample);
        !(measured(&first, &sample) || measured(&previous, &sample))
    })
    .await;
    samples
}

/// Reads the clock of a node whose rate its connect could not measure
/// (a loaded machine), further and further apart, in the background,
/// until the guard counts it or [`RATE_FOLLOW_UP`] has passed; each
/// reading goes to the guard, which judges it as a request's. Without
/// this the node would wait for the guard's next observation (a clock
/// interval) to be counted.
async fn measure_rate(node: Weak<Node>, conn: MultiplexedConnection) {
    let until = Instant::now() + RATE_FOLLOW_UP;
    read_clock_spreading(&conn, 4 * FIRST_SIGHT_SAMPLE_SPACING, until, |sample| {
        node.upgrade()
            .is_some_and(|node| node.watch.on_rate_sample(sample))
    })
    .await;
}

/// Reads `conn`'s clock `spacing` from now, then twice as far apart each
/// time, handing each reading to `take`, until `take` has enough
/// (`false`), a reading fails, or the next would start after `until`.
/// A reading may run past `until` by half the pause before it (the
/// callers' own bounds leave that room): the last, the likeliest to
/// measure a rate, is not cut off at once.
async fn read_clock_spreading(
    conn: &MultiplexedConnection,
    mut spacing: Duration,
    until: Instant,
    mut take: impl FnMut(ClockSample) -> bool,
) {
    loop {
        tokio::time::sleep(spacing).await;
        let reading = tokio::time::timeout_at(until + spacing / 2, read_clock(conn)).await;
        let Ok(Ok(Some(sample))) = reading else {
            return;
        };
        spacing *= 2;
        if !take(sample) || Instant::now() + spacing > until {
            return;
        }
    }
}

/// Names the node in an error, counts it (metric `node_errors_total`),
/// and tells the manager's health what it says of the node.
fn self_error(node: &Node, kind: NodeErrorKind) -> NodeError {
    reported_error(&node.name, &node.reporter, kind)
}

/// Names `name` in an error, counts it (metric `node_errors_total`), and
/// tells `reporter` what it says of the node.
pub(crate) fn reported_error(name: &str, reporter: &Reporter, kind: NodeErrorKind) -> NodeError {
    match &kind {
        NodeErrorKind::Timeout(_)
        | NodeErrorKind::Connect(_)
        | NodeErrorKind::Redis(_)
        | NodeErrorKind::PermissionDenied(_)
        | NodeErrorKind::Redirected(_)
        | NodeErrorKind::Unreplicated(_) => {
            reporter.failed();
        }
        NodeErrorKind::Quarantined(quarantine) => reporter.quarantine(Some(quarantine)),
        // The node answered; what it said was no use to this request.
        NodeErrorKind::UnexpectedReply(_)
        | NodeErrorKind::InvalidCounter(_)
        | NodeErrorKind::KeyGone
        | NodeErrorKind::ScriptsMissing => reporter.answered(),
    }
    let error = NodeError {
        node: name.to_owned(),
        kind,
    };
    telemetry::node_error(&error);
    error
}

/// Whether both streams of a connection reach one server (by `run_id`):
/// a name with several addresses may lead them to different servers, and
/// the guard observes over redis-rs' stream the server that the lock
/// requests, on the hot-path stream, must reach. Refused `INFO` on both
/// says nothing (the guard, unable to observe, quarantines the node).
async fn same_server(conn: &MultiplexedConnection, hot: &HotWire) -> Result<(), String> {
    let mut info = redis::cmd("INFO");
    info.arg("server");
    let mut plain_conn = conn.clone();
    let (plain, fast) = futures::join!(
        redis::aio::ConnectionLike::req_packed_command(&mut plain_conn, &info),
        hot.send([&info])
    );
    let run_id = |reply: redis::Value| -> Option<String> {
        let text = redis::from_redis_value::<String>(reply).ok()?;
        crate::guard::observe::facts_from_info("", &text).run_id
    };
    // A stream that broke as it opened (the node went away) is an error
    // of its own; any other failure leaves its server unknown.
    let plain = match plain {
        Err(broke) if is_connection_failure(&broke) => Err(broke.to_string()),
        plain => Ok(plain.ok().and_then(run_id)),
    };
    let fast = match fast {
        Err(broke) if is_connection_failure(&broke) => Err(broke.to_string()),
        fast => Ok(fast
            .ok()
            .and_then(|replies| replies.into_iter().next())
            .and_then(run_id)),
    };
    same_run_id(plain, fast)
}

/// Whether the two streams' `run_id`s (each known, unknown, or the text
/// of the stream's failure) show one server.
fn same_run_id(
    plain: Result<Option<String>, String>,
    fast: Result<Option<String>, String>,
) -> Result<(), String> {
    match (plain, fast) {
        (Err(broke), _) | (_, Err(broke)) => Err(format!(
            "one of its two connections broke as it opened: {broke}"
        )),
        (Ok(Some(one)), Ok(Some(other))) if one != other => Err(format!(
            "its two connections reach different servers (run_id {one} and {other}): the \
             node's name leads to more than one server; name one server per node"
        )),
        // One server; or neither known (INFO refused by an ACL without
        // +info): the guard's observation judges the node.
        (Ok(Some(_)), Ok(Some(_))) | (Ok(None), Ok(None)) => Ok(()),
        // Only one said which server it reaches: not compared, so not
        // used, but not called a second server either.
        (Ok(_), Ok(_)) => Err(
            "one of its two connections did not say which server it reaches (INFO failed on \
             it), so they could not be compared; it is tried again"
                .to_owned(),
        ),
    }
}

/// Loads every script on `connection`'s server within `limit`; whether it
/// did. A stream that died idle is replaced: the lock requests may go on
/// the hot-path wire, and the next connection loads the scripts as it
/// opens.
async fn load_scripts(connection: &Connection, limit: Duration) -> bool {
    let mut conn = connection.conn.clone();
    match tokio::time::timeout(limit, preload(&mut conn)).await {
        Ok(Ok(())) => true,
        Ok(Err(error)) => {
            tracing::debug!(%error, "reloading scripts failed");
            if is_connection_failure(&error)
                && let Some(node) = connection.owner()
            {
                node.forget(connection.id);
            }
            false
        }
        Err(_) => {
            tracing::debug!("reloading scripts timed out");
            false
        }
    }
}

/// Loads every script on a fresh connection's node in one pipelined round
/// trip, so the first lock after a (re)connect does not pay NOSCRIPT round
/// trips. Best effort: EVALSHA falls back to loading anyway.
async fn preload(conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for source in scripts::SENT.iter() {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    pipe.query_async(conn).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_two_known_run_ids_can_show_two_servers() {
        let id = |s: &str| Ok(Some(s.to_owned()));
        assert_eq!(same_run_id(id("a"), id("a")), Ok(()));
        assert_eq!(same_run_id(Ok(None), Ok(None)), Ok(()));
        let two = same_run_id(id("a"), id("b")).unwrap_err();
        assert!(two.contains("different servers"), "{two}");
        // A node that died while its connection was half made: one stream
        // answered, the other broke. That is what is said.
        for (plain, fast) in [
            (id("a"), Err("connection reset".to_owned())),
            (Err("connection reset".to_owned()), id("a")),
        ] {
            let broke = same_run_id(plain, fast).unwrap_err();
            assert!(
                broke.contains("broke as it opened: connection reset")
                    && !broke.contains("different servers"),
                "{broke}"
            );
        }
        let unknown = same_run_id(id("a"), Ok(None)).unwrap_err();
        assert!(!unknown.contains("different servers"), "{unknown}");
    }
}
