//! Settings of a [`LockManager`](crate::LockManager): the builder, the
//! defaults, and the validation that turns bad settings into a typed error
//! at `build()` time.
//!
//! `build()` (in [`crate::manager`], which this module must not depend on)
//! performs no network I/O; nodes are connected on first use.

use std::collections::HashSet;
use std::time::Duration;

use crate::address::{self, ServerKey};
use crate::connect::{Connect, NodeSpec, parse_node_url};
use crate::error::{Error, Result};
use crate::fencing::{FenceCounters, Fencing};
use crate::guard::policy::NodeGuard;
use crate::health::CircuitBreaker;
use crate::hot_wire::Wire;
use crate::limits::{check_interval, check_ttl, check_wait};
use crate::retry::Backoff;

/// Default lock time-to-live.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Default bound on each node's reply.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Default bound on establishing a connection to a node (in the background).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default clock-drift factor (fraction of the TTL), as in the reference.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// Default longest wait of a lock request for a held resource.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// Default longest time a kept-alive lock is held before it is released.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(3600);

/// A validated configuration.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) nodes: Vec<NodeSpec>,
    pub(crate) ttl: Duration,
    pub(crate) node_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) min_validity: Duration,
    pub(crate) fencing: Fencing,
    pub(crate) fence_counters: FenceCounters,
    pub(crate) extend_every: Option<Duration>,
    pub(crate) max_hold: Duration,
    pub(crate) node_guard: NodeGuard,
    pub(crate) wait: Duration,
    pub(crate) unavailable_retry: Backoff,
    pub(crate) circuit_breaker: Option<CircuitBreaker>,
}

impl Config {
    /// Checks a TTL given to a call or to the builder against these settings.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<(), String> {
        check_ttl(
            ttl,
            self.node_timeout * self.fencing.round_trips(),
            self.drift_factor,
            self.min_validity,
        )
    }
}

/// Builder for a [`LockManager`](crate::LockManager); see each method for its default and unit.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::LockManager;
///
/// let manager = LockManager::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .ttl(Duration::from_secs(30))
///     .node_timeout(Duration::from_millis(20))
///     .build()?;
/// # let _ = manager;
/// # Ok::<(), quorumlock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct LockManagerBuilder {
    nodes: Vec<String>,
    ttl: Duration,
    node_timeout: Duration,
    connect_timeout: Duration,
    drift_factor: f64,
    min_validity: Duration,
    fencing: Fencing,
    fence_counters: FenceCounters,
    extend_every: Option<Duration>,
    max_hold: Duration,
    node_guard: NodeGuard,
    wait: Duration,
    unavailable_retry: Backoff,
    circuit_breaker: Option<CircuitBreaker>,
    connect: Connect,
    /// Set by [`wire`](Self::wire); unset, `QUORUMLOCK_WIRE` or the default.
    wire: Option<Wire>,
}

impl Default for LockManagerBuilder {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            ttl: DEFAULT_TTL,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            min_validity: Duration::ZERO,
            fencing: Fencing::default(),
            fence_counters: FenceCounters::default(),
            extend_every: None,
            max_hold: DEFAULT_MAX_HOLD,
            node_guard: NodeGuard::default(),
            wait: DEFAULT_WAIT,
            unavailable_retry: Backoff::default(),
            circuit_breaker: None,
            connect: Connect::default(),
            wire: None,
        }
    }
}

impl LockManagerBuilder {
    /// The Redis masters, as `redis://[:password@]host:port[/db]` URLs. They
    /// must be independent servers: a quorum of one process is no quorum.
    /// `build()` refuses two URLs that name one server: same port and the
    /// same host as far as it resolves without the network (any loopback
    /// address or `localhost` is one host; names in `/etc/hosts` count as
    /// their addresses; other names compare as written, ignoring case).
    /// Replaces any nodes given before. Required; no default.
    ///
    /// A member may be a Redis Cluster, named by some of its nodes:
    /// `redis+cluster://[user:password@]host:port,host:port` (TLS:
    /// `rediss+cluster://`). Each resource then lives on the shard master
    /// of its slot; see the guide `docs/scaling-out.md` for what that
    /// changes (a lock on several resources needs names with one hash tag,
    /// a failover costs a quarantine, node settings).
    ///
    /// ```
    /// use quorumlock::{Error, LockManager};
    ///
    /// let manager = LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .build()?;
    /// assert_eq!(manager.quorum(), 2);
    ///
    /// // Two URLs for one server would let one process count twice: refused.
    /// let twice = LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://localhost:7001", "redis://127.0.0.1:7002"])
    ///     .build();
    /// assert!(matches!(twice, Err(Error::InvalidConfig { setting: "nodes", .. })));
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn nodes<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.nodes = urls.into_iter().map(Into::into).collect();
        self
    }

    /// Adds one node URL.
    ///
    /// ```
    /// let manager = quorumlock::LockManager::builder()
    ///     .node("redis://127.0.0.1:7001")
    ///     .node("redis://127.0.0.1:7002")
    ///     .node("redis://127.0.0.1:7003")
    ///     .build()?;
    /// assert_eq!(manager.node_names().count(), 3);
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn node(mut self, url: impl Into<String>) -> Self {
        self.nodes.push(url.into());
        self
    }

    /// Default time-to-live of a lock (default 10 s). Must exceed the
    /// drift allowance plus `node_timeout` for each round trip an
    /// acquisition takes: two with quorum fencing, else one (a counter-node
    /// lock takes a second when the counter node does not answer: keep the
    /// TTL well above two `node_timeout`s).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .ttl(Duration::from_secs(30))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Bound on each node's reply, including waiting for its connection
    /// (default 50 ms). Keep it small against the TTL: an attempt never waits
    /// longer than this for any node.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .node_timeout(Duration::from_millis(20)) // nodes in one data centre
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Bound on establishing one connection (default 1 s). Connecting runs in
    /// the background; requests wait for it at most `node_timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .connect_timeout(Duration::from_millis(500))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Fraction of the TTL set aside for clock-rate differences between the
    /// client and the nodes (default 0.01, in `[0, 1)`); 2 ms are added on top.
    ///
    /// ```
    /// let builder = || quorumlock::LockManager::builder().node("redis://127.0.0.1:7001");
    /// builder().drift_factor(0.02).build()?;
    /// assert!(builder().drift_factor(1.5).build().is_err(), "a fraction below 1");
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// Smallest validity that counts as acquired (default 0: any positive
    /// validity). A quorum reached later than `ttl − drift − min_validity`
    /// is treated as a failed attempt.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     // An acquisition that leaves less than 2 s to work with counts as failed.
    ///     .min_validity(Duration::from_secs(2))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn min_validity(mut self, min: Duration) -> Self {
        self.min_validity = min;
        self
    }

    /// How fencing tokens are issued (default: counter node 0, with a
    /// second round trip when that node does not answer, so that no single
    /// node stops new locks). See [`Fencing`] for the modes and their cost. Either token mode needs
    /// node data that survives restarts: AOF `appendfsync always` on every
    /// node (a delayed restart is not enough for the counters). Every
    /// client of a resource must use the same mode.
    ///
    /// ```
    /// use quorumlock::Fencing;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     // Tokens from a majority, with no single counter node.
    ///     .fencing(Fencing::Quorum)
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// Which counter issues each resource's tokens (default: one per
    /// resource, which the counter node keeps an hour after its last
    /// token; see [`FenceCounters::PerResource`]). With [`FenceCounters::PerHashTag`],
    /// resources with a hash tag share their tag's counter, so a service
    /// that locks one resource per entity keeps as many counters as tags,
    /// not as entities. Every client of a resource must use the same
    /// setting. Why a resource's tokens still never go back, and how to
    /// switch a running service over: `docs/recipes.md`.
    ///
    /// ```
    /// use quorumlock::FenceCounters;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     // `{orders}:1`, `{orders}:2`, … share one counter.
    ///     .fence_counters(FenceCounters::PerHashTag)
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn fence_counters(mut self, counters: FenceCounters) -> Self {
        self.fence_counters = counters;
        self
    }

    /// How often a kept-alive lock is extended (default: a third of its
    /// TTL). Must leave room for an extension, `node_timeout` long, before
    /// the validity ends.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .ttl(Duration::from_secs(30))
    ///     .extend_every(Duration::from_secs(5))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn extend_every(mut self, every: Duration) -> Self {
        self.extend_every = Some(every);
        self
    }

    /// Longest time a kept-alive lock is held (default 1 hour): then the
    /// watchdog stops extending, tells the holder, and releases the lock,
    /// so a stuck process cannot hold a resource forever. `Duration::MAX`
    /// removes the bound.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     // A kept-alive lock is given up after 10 minutes, whatever the work does.
    ///     .max_hold(Duration::from_secs(600))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// The node guard (default: on): nodes that restarted without
    /// persisting every write, whose clocks run off or jump, that may evict
    /// keys, or that are replicas are not counted toward a quorum for a
    /// while. See [`crate::guard`] for the rules and [`NodeGuard`] for its
    /// settings; `NodeGuard::disabled()` turns it off.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::NodeGuard;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .node_guard(NodeGuard::default().quarantine_window(Duration::from_secs(60)))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn node_guard(mut self, guard: NodeGuard) -> Self {
        self.node_guard = guard;
        self
    }

    /// Longest time a lock [`Request`](crate::Request) waits for a held
    /// resource unless it says otherwise ([`Request::wait`](crate::Request::wait),
    /// [`no_wait`](crate::Request::no_wait)); default 30 s, at most a year;
    /// zero makes every request one attempt, as `no_wait` does. Waiters are woken by the
    /// release, not by polling; see [`crate::wait`].
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .wait(Duration::from_secs(5)) // what `manager.lock(..).await` waits at most
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// How acquiring calls retry attempts that found the lock service
    /// unavailable: no quorum reachable, the counter node down, a quorum
    /// too slow (default: [`Backoff::default`], pauses of 200 ms, 500 ms
    /// and 1 s, ± 20 %, within 5 s). [`Backoff::none`] fails at once.
    /// Applies to every awaited request (`lock`, `read`, `lock_many`),
    /// not to `.no_wait()` ones (one attempt each); see [`crate::retry`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::Backoff;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .unavailable_retry(Backoff::steps([Duration::from_millis(100), Duration::from_millis(300)]))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn unavailable_retry(mut self, backoff: Backoff) -> Self {
        self.unavailable_retry = backoff;
        self
    }

    /// Turns on the circuit breaker (default: off): after
    /// `failures` acquisition attempts in a row found the lock service
    /// unavailable, acquiring calls fail at once with
    /// [`Error::CircuitOpen`] for the cool-down, without network I/O, and
    /// then one call probes. `CircuitBreaker::default()` opens after 5 and
    /// cools down for 10 s. See [`CircuitBreaker`] and [`crate::health`].
    ///
    /// ```
    /// use quorumlock::CircuitBreaker;
    ///
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .circuit_breaker(CircuitBreaker::default())
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.circuit_breaker = Some(breaker);
        self
    }

    /// What carries the lock requests to the nodes (default:
    /// [`Wire::Narrow`], quorumlock's own RESP2 connection, beside the
    /// redis-rs connection that carries everything else).
    /// [`Wire::RedisRs`] sends them through redis-rs too. Unset, the
    /// `QUORUMLOCK_WIRE` environment variable (`narrow` or `redis-rs`)
    /// chooses, so that an operator can switch without a rebuild.
    ///
    /// Both keep the guarantees the lock relies on: a request is sent
    /// once, requests reach a node in the order they were made, and a
    /// connection that breaks fails every request in flight on it.
    ///
    /// ```
    /// use quorumlock::{LockManager, Wire};
    ///
    /// let manager = LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .wire(Wire::RedisRs)
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn wire(mut self, wire: Wire) -> Self {
        self.wire = Some(wire);
        self
    }

    /// Whether connections to the nodes set `TCP_NODELAY` (default: on).
    /// With it on, a request goes out as soon as it is written, not when
    /// the previous one's reply has come back or 40 ms have passed; a lock
    /// is a few small requests, each waited for, so that is what it wants
    /// on loopback and on a LAN alike (docs/performance.md, "Socket
    /// options", has the measurements). Every connection the manager
    /// opens to a node (lock requests, observation, waiting) uses it.
    ///
    /// ```
    /// let manager = quorumlock::LockManager::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .tcp_nodelay(false)
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn tcp_nodelay(mut self, nodelay: bool) -> Self {
        self.connect.nodelay = nodelay;
        self
    }

    /// TLS settings for `rediss://` node URLs (feature `tls`): a private
    /// CA, a client certificate for mutual TLS. Without them a `rediss://`
    /// URL trusts the system's roots. See [`Tls`](crate::Tls).
    ///
    /// ```
    /// use quorumlock::{LockManager, Tls};
    ///
    /// # let certificates = quorumlock::testkit::TestCertificates::generate()?;
    /// # let ca_pem = certificates.ca_pem();
    /// let manager = LockManager::builder()
    ///     .nodes(["rediss://127.0.0.1:7001", "rediss://127.0.0.1:7002", "rediss://127.0.0.1:7003"])
    ///     .tls(Tls::new().ca_pem(ca_pem))
    ///     .build()?;
    /// # let _ = manager;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: crate::tls::Tls) -> Self {
        self.connect.tls = Some(tls);
        self
    }

    /// The validated settings, or the typed error naming the bad one.
    pub(crate) fn validate(mut self) -> Result<Config> {
        let invalid =
            |setting: &'static str, reason: String| Error::InvalidConfig { setting, reason };
        self.connect = self.connect.unshared();
        self.connect.wire = match self.wire {
            Some(wire) => wire,
            None => Wire::from_env()
                .map_err(|reason| invalid("wire", reason))?
                .unwrap_or_default(),
        };

        if self.nodes.is_empty() {
            return Err(invalid(
                "nodes",
                "no nodes given; pass the URLs of your Redis masters, e.g. redis://127.0.0.1:7001"
                    .into(),
            ));
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.connect.tls {
            tls.check().map_err(|reason| invalid("tls", reason))?;
        }
        let mut specs: Vec<NodeSpec> = Vec::with_capacity(self.nodes.len());
        let hosts = address::system_hosts();
        let mut seen: Vec<(String, HashSet<ServerKey>)> = Vec::new();
        for url in &self.nodes {
            let spec =
                parse_node_url(url, &self.connect).map_err(|reason| invalid("nodes", reason))?;
            // Same server = same address, whatever the database number or
            // the spelling of the host (see `address`): it would count
            // twice towards the quorum.
            let clients = match &spec.cluster {
                Some(cluster) => cluster.seeds.as_slice(),
                None => std::slice::from_ref(&spec.client),
            };
            let keys: HashSet<ServerKey> = clients
                .iter()
                .flat_map(|client| {
                    address::server_keys(client.get_connection_info().addr(), &hosts)
                })
                .collect();
            if let Some((first, _)) = seen.iter().find(|(_, other)| !other.is_disjoint(&keys)) {
                return Err(invalid(
                    "nodes",
                    format!(
                        "node {} is listed twice (also as {first}); each node must be a separate \
                         Redis server",
                        spec.name
                    ),
                ));
            }
            seen.push((spec.name.clone(), keys));
            specs.push(spec);
        }
        if specs.len().is_multiple_of(2) {
            tracing::warn!(
                nodes = specs.len(),
                "an even number of nodes tolerates no more failures than one node fewer; \
                 prefer an odd number"
            );
        }

        if !(0.0..1.0).contains(&self.drift_factor) {
            return Err(invalid(
                "drift_factor",
                format!(
                    "{} is outside [0, 1); the default is {DEFAULT_DRIFT_FACTOR}",
                    self.drift_factor
                ),
            ));
        }
        if self.node_timeout.is_zero() {
            return Err(invalid(
                "node_timeout",
                "must be greater than zero; try 5–50 ms".into(),
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid(
                "connect_timeout",
                "must be greater than zero; the default is 1 s".into(),
            ));
        }
        check_ttl(
            self.ttl,
            self.node_timeout * self.fencing.round_trips(),
            self.drift_factor,
            self.min_validity,
        )
        .map_err(|reason| invalid("ttl", reason))?;
        if let Some(every) = self.extend_every {
            check_interval(every, self.ttl, self.node_timeout, self.drift_factor)
                .map_err(|reason| invalid("extend_every", reason))?;
        }
        if self.max_hold.is_zero() {
            return Err(invalid(
                "max_hold",
                "must be greater than zero; Duration::MAX removes the bound".into(),
            ));
        }
        if let Fencing::CounterNode { node } = self.fencing
            && specs.get(node).is_some_and(|spec| spec.cluster.is_some())
        {
            tracing::warn!(
                node,
                member = %specs[node].name,
                "the fencing counter node is a Redis Cluster member: each of its tokens waits \
                 for a replica's acknowledgement, and a failover of its shard sends tokens \
                 through the other nodes (a second round trip) until the promoted master \
                 counts; a standalone counter node avoids both"
            );
        }
        if let Fencing::CounterNode { node } = self.fencing
            && node >= specs.len()
        {
            return Err(invalid(
                "fencing",
                format!(
                    "counter node index {node} is out of range: there are {} nodes (indexes 0 to {})",
                    specs.len(),
                    specs.len() - 1
                ),
            ));
        }

        self.node_guard
            .check()
            .map_err(|reason| invalid("node_guard", reason))?;
        check_wait(self.wait).map_err(|reason| invalid("wait", reason))?;
        self.unavailable_retry
            .check()
            .map_err(|reason| invalid("unavailable_retry", reason))?;
        if let Some(breaker) = &self.circuit_breaker {
            breaker
                .check()
                .map_err(|reason| invalid("circuit_breaker", reason))?;
        }

        Ok(Config {
            nodes: specs,
            ttl: self.ttl,
            node_timeout: self.node_timeout,
            connect_timeout: self.connect_timeout,
            drift_factor: self.drift_factor,
            min_validity: self.min_validity,
            fencing: self.fencing,
            fence_counters: self.fence_counters,
            extend_every: self.extend_every,
            max_hold: self.max_hold,
            node_guard: self.node_guard,
            wait: self.wait,
            unavailable_retry: self.unavailable_retry,
            circuit_breaker: self.circuit_breaker,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn five() -> LockManagerBuilder {
        LockManagerBuilder::default()
            .nodes((1..=5).map(|i| format!("redis://127.0.0.1:{}", 7000 + i)))
    }

    fn rejected(builder: LockManagerBuilder) -> (&'static str, String) {
        match builder.validate() {
            Err(Error::InvalidConfig { setting, reason }) => (setting, reason),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let config = five().validate().expect("defaults must validate");
        assert_eq!(config.ttl, DEFAULT_TTL);
        assert_eq!(config.nodes.len(), 5);
        assert_eq!(config.nodes[0].name, "127.0.0.1:7001");
    }

    #[test]
    fn bad_settings_name_the_setting() {
        let table: Vec<(&str, LockManagerBuilder, &str, &str)> = vec![
            (
                "no nodes",
                LockManagerBuilder::default(),
                "nodes",
                "no nodes",
            ),
            (
                "unparsable url",
                LockManagerBuilder::default().node("http://not-redis"),
                "nodes",
                "cannot parse",
            ),
            (
                "garbage url",
                LockManagerBuilder::default().node("::::"),
                "nodes",
                "cannot parse",
            ),
            (
                "duplicate url",
                five().node("redis://127.0.0.1:7003"),
                "nodes",
                "listed twice",
            ),
            (
                "same server, other db",
                five().node("redis://127.0.0.1:7003/2"),
                "nodes",
                "listed twice",
            ),
            (
                "localhost is 127.0.0.1",
                five().node("redis://localhost:7002"),
                "nodes",
                "listed twice",
            ),
            (
                "an IPv6 loopback is the same server",
                five().node("redis://[::1]:7004"),
                "nodes",
                "listed twice",
            ),
            (
                "quorum fencing needs two round trips in the ttl",
                five()
                    .fencing(Fencing::Quorum)
                    .node_timeout(ms(50))
                    .ttl(ms(102)),
                "ttl",
                "2 round trips",
            ),
            ("zero ttl", five().ttl(ms(0)), "ttl", "greater than zero"),
            (
                "huge ttl",
                five().ttl(Duration::from_secs(u64::MAX / 4)),
                "ttl",
                "maximum",
            ),
            (
                "ttl not above timeout + drift",
                five().ttl(ms(52)).node_timeout(ms(50)),
                "ttl",
                "leaves no validity",
            ),
            (
                "node_timeout >= ttl",
                five().ttl(ms(100)).node_timeout(ms(100)),
                "ttl",
                "not longer than the acquisition's round trips",
            ),
            (
                "zero node_timeout",
                five().node_timeout(ms(0)),
                "node_timeout",
                "greater than zero",
            ),
            (
                "zero connect_timeout",
                five().connect_timeout(ms(0)),
                "connect_timeout",
                "greater than zero",
            ),
            (
                "negative drift",
                five().drift_factor(-0.1),
                "drift_factor",
                "outside [0, 1)",
            ),
            (
                "drift of one",
                five().drift_factor(1.0),
                "drift_factor",
                "outside [0, 1)",
            ),
            (
                "NaN drift",
                five().drift_factor(f64::NAN),
                "drift_factor",
                "outside [0, 1)",
            ),
            (
                "counter node out of range",
                five().fencing(Fencing::CounterNode { node: 5 }),
                "fencing",
                "out of range",
            ),
            (
                "extend_every too long",
                five().extend_every(Duration::from_secs(10)),
                "extend_every",
                "too long",
            ),
            (
                "zero max_hold",
                five().max_hold(ms(0)),
                "max_hold",
                "greater than zero",
            ),
            (
                "min_validity eats the ttl",
                five().ttl(ms(1_000)).min_validity(ms(990)),
                "ttl",
                "min_validity",
            ),
        ];
        for (case, builder, setting, fragment) in table {
            let (got_setting, reason) = rejected(builder);
            assert_eq!(got_setting, setting, "{case}");
            assert!(reason.contains(fragment), "{case}: {reason}");
        }
    }

    #[test]
    fn even_node_count_is_accepted() {
        let config = LockManagerBuilder::default()
            .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"])
            .validate()
            .expect("two nodes are allowed, with a warning");
        assert_eq!(config.nodes.len(), 2);
    }

    #[test]
    fn password_never_appears_in_node_names() {
        let config = LockManagerBuilder::default()
            .node("redis://:s3cret@127.0.0.1:7001")
            .validate()
            .expect("valid");
        assert_eq!(config.nodes[0].name, "127.0.0.1:7001");
    }
}
