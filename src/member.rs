//! One quorum member: a Redis server, or a Redis Cluster whose shard
//! masters each serve their slots.
//!
//! A cluster member routes each lock to the master that serves its
//! resource's slot (every key of a resource shares one hash tag) over that
//! master's own [`Node`], so connections, cancel safety, rollback order,
//! the node guard and the timeouts are those of a standalone server. The
//! slot map is read with `CLUSTER SLOTS` on first use and again after
//! any failure that can mean it changed: a redirection, a refused or
//! broken connection, a timeout, `CLUSTERDOWN` or `TRYAGAIN`, a shard
//! master the guard does not count (a master that died, was demoted or
//! restarted); at most once per [`REREAD_SPACING`]. A request is never
//! sent twice: a `MOVED` or `ASK` reply means the command did not run
//! there, and counts as the member failing this round, as the others do.
//!
//! A shard master with replicas counts a write (a grant, an extension, a
//! token) only once a replica acknowledged it: `WAIT 1` goes behind every
//! key-setting request, bounded by half the `node_timeout`. A master that stalled
//! (a pause, a long `DEBUG RELOAD` or script) and resumes after its
//! replica took over still serves what was queued to it, before it learns
//! it was replaced; no replica takes those writes, so they never count.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use redis::AsyncConnectionConfig;
use tokio::time::Instant;

use crate::connect::{ClusterSpec, NodeSpec};
use crate::error::{NodeError, NodeErrorKind};
use crate::guard::judge::Quarantine;
use crate::guard::observe::DataSetKeys;
use crate::guard::policy::Policy;
use crate::guard::watch::NodeWatch;
use crate::health::Reporter;
use crate::keys::Keys;
use crate::node::{Connection, Node, reported_error};
use crate::slots::{SlotMap, parse_cluster_slots, replicas_of_masters};

/// A failure within this long of the last reading of the slot map does
/// not read it again (replies to requests sent before that reading may
/// still carry `MOVED`, and a dead master fails every request until the
/// cluster promotes its replica).
const REREAD_SPACING: Duration = Duration::from_millis(100);

/// The bounds a member's requests run with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// A connect, and reading a cluster's slot map.
    pub(crate) connect: Duration,
    /// A request (`node_timeout`): half of it is how long a shard master's write
    /// waits for a replica's acknowledgement.
    pub(crate) node: Duration,
}

/// One quorum member. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Member {
    Server(Arc<Node>),
    Cluster(Arc<Shards>),
}

impl Member {
    /// The member `spec` names, unconnected.
    pub(crate) fn new(
        spec: &NodeSpec,
        timeouts: Timeouts,
        guard: &Arc<Policy>,
        reporter: Reporter,
    ) -> Self {
        let connect_timeout = timeouts.connect;
        match &spec.cluster {
            None => Self::Server(Arc::new(Node::new(
                spec.name.clone(),
                spec.client.clone(),
                spec.hot.clone(),
                connect_timeout,
                NodeWatch::new(spec.name.clone(), Arc::clone(guard)),
                reporter,
            ))),
            Some(cluster) => Self::Cluster(Arc::new(Shards {
                name: spec.name.clone(),
                spec: cluster.clone(),
                connect_timeout,
                // Half the node timeout: a WAIT that runs out must still
                // answer within the round (a late answer is a timeout,
                // and the connection's next requests wait behind it).
                replicated_within: (timeouts.node / 2).max(Duration::from_millis(1)),
                guard: Arc::clone(guard),
                reporter,
                map: RwLock::new(None),
                warned: Mutex::default(),
                timeouts_read: Arc::default(),
                servers: Mutex::default(),
                reading: Mutex::new(None),
            })),
        }
    }

    /// The member's name, safe to log: `host:port`, or
    /// `cluster(host:port,…)`.
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Server(node) => node.name(),
            Self::Cluster(shards) => &shards.name,
        }
    }

    /// Whether it is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// The guard's verdict on each of its servers now that it does not
    /// count (quarantines also end by time: this updates the health
    /// board), by server name.
    pub(crate) fn quarantines(&self) -> Vec<(String, Quarantine)> {
        let servers = match self {
            Self::Server(node) => vec![Arc::clone(node)],
            Self::Cluster(shards) => shards.masters(),
        };
        servers
            .iter()
            .filter_map(|node| Some((node.name().to_owned(), node.quarantine()?)))
            .collect()
    }

    /// The server that serves `keys` now, if known without I/O.
    pub(crate) fn ready_node_for(&self, keys: &Keys) -> Option<Arc<Node>> {
        match self {
            Self::Server(node) => Some(Arc::clone(node)),
            Self::Cluster(shards) => shards.owner(keys.slot()?),
        }
    }

    /// The server that serves `keys`: the server itself, or the shard
    /// master of their slot, reading the slot map first if it is not known
    /// (in its own task, bounded by `connect_timeout`).
    pub(crate) async fn node_for(&self, keys: &Keys) -> Result<Arc<Node>, NodeError> {
        match self {
            Self::Server(node) => Ok(Arc::clone(node)),
            Self::Cluster(shards) => shards.node_for(keys).await,
        }
    }

    /// Opens the member's connections now: the server's, or a cluster's
    /// slot map and the connection to each of its masters; an error names
    /// the first server that cannot serve (unreachable, or not counted by
    /// the guard).
    pub(crate) async fn connect(&self) -> Result<(), NodeError> {
        match self {
            Self::Server(node) => node.connect_ahead().await,
            Self::Cluster(shards) => {
                shards.read_map().await.map_err(|kind| shards.error(kind))?;
                let masters = shards.masters();
                if masters.is_empty() {
                    return Err(shards.error(NodeErrorKind::Redis(
                        "its slot map names no master (CLUSTERDOWN)".into(),
                    )));
                }
                let connected =
                    futures::future::join_all(masters.iter().map(|node| node.connect_ahead()))
                        .await;
                connected.into_iter().collect()
            }
        }
    }

    /// Whether a key set on `connection` in guard epoch `epoch` is still
    /// where it was put: the server serving it now is the one it was set
    /// on, and that server has not moved to a new epoch since.
    pub(crate) fn unchanged_since(&self, keys: &Keys, connection: &Connection, epoch: u64) -> bool {
        match self {
            Self::Server(node) => node.epoch() == epoch,
            Self::Cluster(_) => match (connection.owner(), self.ready_node_for(keys)) {
                (Some(owner), Some(now)) => Arc::ptr_eq(&owner, &now) && owner.epoch() == epoch,
                _ => false,
            },
        }
    }

    /// Records that a request (sent on `connection`, if it got one) had no
    /// reply within `limit`; see [`Node::timed_out`].
    pub(crate) fn timed_out(
        &self,
        connection: Option<&Arc<Connection>>,
        limit: Duration,
    ) -> NodeError {
        if let Some(owner) = connection.and_then(|c| c.owner()) {
            return owner.timed_out(connection, limit);
        }
        match self {
            Self::Server(node) => node.timed_out(None, limit),
            Self::Cluster(shards) => {
                shards.read_map_soon();
                shards.error(NodeErrorKind::Timeout(limit))
            }
        }
    }

    /// A request failed with `kind`: on a cluster, if that can mean the
    /// slot map changed, it is read again soon.
    pub(crate) fn failed(&self, kind: &NodeErrorKind) {
        if let Self::Cluster(shards) = self
            && map_may_have_changed(kind)
        {
            shards.read_map_soon();
        }
    }
}

/// Whether a request that failed with `kind` on a cluster's shard master
/// may have met a change of the slot map: redirected, a master gone (no
/// connection, no answer), a cluster between maps, a write no replica
/// acknowledged, or a master the guard does not count (it may be a master
/// no longer: a replica answers the guard's observation with `MOVED`). A
/// refusal by the data itself (a permission, a bad counter, a key gone)
/// is not.
fn map_may_have_changed(kind: &NodeErrorKind) -> bool {
    match kind {
        NodeErrorKind::Redirected(_)
        | NodeErrorKind::Connect(_)
        | NodeErrorKind::Timeout(_)
        | NodeErrorKind::Quarantined(_)
        // A master demoted while it waited, or a replica lost.
        | NodeErrorKind::Unreplicated(_) => true,
        NodeErrorKind::Redis(message) => ["CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING"]
            .iter()
            .any(|code| message.contains(code)),
        _ => false,
    }
}

type Reading = Shared<BoxFuture<'static, Result<(), NodeErrorKind>>>;

/// A member that is a Redis Cluster: its slot map and its shard masters.
pub(crate) struct Shards {
    name: String,
    spec: ClusterSpec,
    connect_timeout: Duration,
    /// How long a shard master's write waits for a replica (`WAIT`).
    replicated_within: Duration,
    /// Masters already warned of (fewer than two replicas): once each,
    /// not at every reading of the map (a failing shard rereads it up to
    /// ten times a second).
    warned: Mutex<HashSet<String>>,
    /// Masters whose `cluster-node-timeout` was read, or is being read.
    timeouts_read: Arc<Mutex<HashSet<String>>>,
    guard: Arc<Policy>,
    reporter: Reporter,
    /// Which master serves which slots; `None` until first read.
    map: RwLock<Option<Arc<SlotMap<Arc<Node>>>>>,
    /// Every server met as a master, by `host:port`: kept across readings
    /// of the map, so that connections and the guard's memory stay.
    servers: Mutex<HashMap<String, Arc<Node>>>,
    /// The reading of the map in flight (one at a time), or when the last
    /// one ended.
    reading: Mutex<Option<(Instant, Option<Reading>)>>,
}

impl Shards {
    /// The master serving `slot`, if the map is known and names one.
    fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.as_ref()?.owner(slot).cloned()
    }

    /// The masters of the map as last read.
    fn masters(&self) -> Vec<Arc<Node>> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let mut masters: Vec<Arc<Node>> = Vec::new();
        for (_, _, node) in map.iter().flat_map(|map| map.ranges()) {
            if !masters.iter().any(|known| Arc::ptr_eq(known, node)) {
                masters.push(Arc::clone(node));
            }
        }
        masters
    }

    fn error(&self, kind: NodeErrorKind) -> NodeError {
        reported_error(&self.name, &self.reporter, kind)
    }

    async fn node_for(self: &Arc<Self>, keys: &Keys) -> Result<Arc<Node>, NodeError> {
        let slot = keys.slot().ok_or_else(|| {
            self.error(NodeErrorKind::Redis(format!(
                "the resources of {} live in different slots; on a member that is a Redis \
                 Cluster a lock on several resources needs names that share a hash tag, \
                 e.g. {{order:7}}:items and {{order:7}}:payment",
                keys.label()
            )))
        })?;
        if let Some(node) = self.owner(slot) {
            return Ok(node);
        }
        self.read_map().await.map_err(|kind| self.error(kind))?;
        self.owner(slot).ok_or_else(|| {
            self.error(NodeErrorKind::Redis(format!(
                "no master of the cluster serves slot {slot} (CLUSTERDOWN)"
            )))
        })
    }

    /// Reads the map again in the background, unless it was read a moment
    /// ago or a reading is under way.
    fn read_map_soon(self: &Arc<Self>) {
        let recent = matches!(
            &*self.reading.lock().unwrap_or_else(|p| p.into_inner()),
            Some((at, None)) if at.elapsed() < REREAD_SPACING
        );
        if !recent {
            drop(self.read_map());
        }
    }

    /// The reading of the map under way, or a new one, in its own task:
    /// it completes even when every request waiting for it gave up. One
    /// that outlived its bound (its runtime no longer runs it) is replaced.
    pub(crate) fn read_map(self: &Arc<Self>) -> Reading {
        let mut reading = self.reading.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((since, Some(pending))) = &*reading
            && since.elapsed() <= 2 * self.connect_timeout
        {
            return pending.clone();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return futures::future::ready(Err(NodeErrorKind::Connect(
                "no tokio runtime to read the cluster's slot map from".into(),
            )))
            .boxed()
            .shared();
        };
        let shards: Weak<Self> = Arc::downgrade(self);
        let task = runtime.spawn(async move {
            let Some(this) = shards.upgrade() else {
                return Err(NodeErrorKind::Connect("the manager is gone".into()));
            };
            let result = this.learn().await;
            *this.reading.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), None));
            result
        });
        let pending = task
            .map(|joined| {
                joined.unwrap_or_else(|err| {
                    Err(NodeErrorKind::Connect(format!(
                        "reading the slot map ended: {err}"
                    )))
                })
            })
            .boxed()
            .shared();
        *reading = Some((Instant::now(), Some(pending.clone())));
        pending
    }

    /// Asks the masters it knows, then the URL's nodes, for the slot map,
    /// each within `connect_timeout`, and installs the first answer.
    async fn learn(&self) -> Result<(), NodeErrorKind> {
        let masters = self.masters();
        let known: Vec<String> = {
            let servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
            servers
                .iter()
                .filter(|(_, node)| masters.iter().any(|m| Arc::ptr_eq(m, node)))
                .map(|(address, _)| address.clone())
                .collect()
        };
        let mut asked: Vec<redis::Client> = known
            .iter()
            .filter_map(|address| self.spec.client_for(address).ok())
            .collect();
        asked.extend(self.spec.seeds.iter().cloned());
        let mut last = NodeErrorKind::Connect("the URL names no node".into());
        for client in asked {
            match tokio::time::timeout(self.connect_timeout, slot_map_of(&client)).await {
                Ok(Ok((map, replicas, node_timeout))) if map.served() > 0 => {
                    // A cut-off master grants for up to its node timeout
                    // after its replica took over: the window covers it.
                    if let Some(node_timeout) = node_timeout {
                        self.guard.note_cluster_node_timeout(node_timeout);
                    }
                    self.install(map, &replicas);
                    self.note_node_timeouts();
                    return Ok(());
                }
                Ok(Ok(_)) => {
                    last = NodeErrorKind::Redis(format!(
                        "{} serves no slot (a node not yet in a cluster?)",
                        client.get_connection_info().addr()
                    ));
                }
                Ok(Err(kind)) => last = kind,
                Err(_) => {
                    last = NodeErrorKind::Timeout(self.connect_timeout);
                }
            }
        }
        tracing::debug!(member = %self.name, error = %last, "cannot read the slot map");
        Err(last)
    }

    /// Reads the own `cluster-node-timeout` of each master not read yet,
    /// in the background (each bounded by `connect_timeout`; one that
    /// fails is read again with the next map): a master cut off from the
    /// rest grants for up to its own, whatever the node that answered
    /// `CLUSTER SLOTS` says of itself.
    fn note_node_timeouts(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let servers: Vec<(String, Arc<Node>)> = self
            .servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(address, node)| (address.clone(), Arc::clone(node)))
            .collect();
        for (address, node) in servers {
            let unread = self
                .timeouts_read
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(address.clone());
            if !unread {
                continue;
            }
            let (guard, limit) = (Arc::clone(&self.guard), self.connect_timeout);
            let read_already = Arc::clone(&self.timeouts_read);
            let client = node.client().clone();
            runtime.spawn(async move {
                let read = async {
                    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                    redis::cmd("CONFIG")
                        .arg("GET")
                        .arg("cluster-node-timeout")
                        .query_async::<redis::Value>(&mut conn)
                        .await
                        .ok()
                };
                let ms = match tokio::time::timeout(limit, read).await {
                    Ok(Some(reply)) => crate::guard::observe::config_value(Some(&reply))
                        .and_then(|ms| ms.parse().ok()),
                    _ => None,
                };
                match ms {
                    Some(ms) => guard.note_cluster_node_timeout(Duration::from_millis(ms)),
                    None => {
                        read_already
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&address);
                    }
                }
            });
        }
    }

    /// Makes `map` the current one, with a [`Node`] per master (the one
    /// already known at that address, or a new one), each keeping the
    /// guard's mark in a slot it serves, and counting its writes once a
    /// replica acknowledged them where it has `replicas`.
    fn install(&self, map: SlotMap<String>, replicas: &HashMap<String, usize>) {
        let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        let mut ranges = Vec::new();
        for (first, last, address) in map.ranges() {
            let node = match servers.get(address) {
                Some(node) => Arc::clone(node),
                None => match self.spec.master_at(address) {
                    Ok((client, hot)) => {
                        let name = shard_name(&self.name, address);
                        let node = Arc::new(Node::new(
                            name.clone(),
                            client,
                            hot,
                            self.connect_timeout,
                            NodeWatch::new(name, Arc::clone(&self.guard)),
                            self.reporter.clone(),
                        ));
                        servers.insert(address.clone(), Arc::clone(&node));
                        node
                    }
                    Err(reason) => {
                        tracing::warn!(member = %self.name, %address, %reason, "unusable master");
                        continue;
                    }
                },
            };
            let count = replicas.get(address).copied().unwrap_or(0);
            node.require_replication(self.replicated_within, count > 0);
            let first_sight = self
                .warned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(address.clone());
            if first_sight && count < 2 {
                tracing::warn!(
                    member = %self.name,
                    %address,
                    replicas = count,
                    "a shard master with fewer than two replicas: with one, a dead or paused \
                     replica leaves its locks unavailable (no write is acknowledged); with \
                     none, a master that dies takes its locks with it until it is back"
                );
            }
            ranges.push((*first, *last, node));
        }
        drop(servers);
        for (first, _, address) in map.ranges() {
            let Some((_, _, node)) = ranges.iter().find(|(f, _, _)| f == first) else {
                continue;
            };
            let mark_slot = node.data_set().slot();
            if mark_slot.is_none_or(|slot| map.owner(slot) != Some(address)) {
                let first_slot = map.first_slot_of(address).unwrap_or(*first);
                node.set_data_set(DataSetKeys::in_slot(first_slot));
            }
        }
        tracing::debug!(member = %self.name, ranges = ranges.len(), "slot map read");
        *self.map.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(SlotMap::new(ranges)));
    }
}

/// How errors, logs and metrics name the shard master at `address` of
/// the member named `member`: `cluster(…)/host:port`.
fn shard_name(member: &str, address: &str) -> String {
    format!("{member}/{address}")
}

/// `CLUSTER SLOTS` of the node `client` leads to, on a connection of its
/// own (rare: on first use and after failures): the map, the replicas of
/// each master, and its `cluster-node-timeout` (`None` where `CONFIG GET`
/// is refused).
async fn slot_map_of(
    client: &redis::Client,
) -> Result<(SlotMap<String>, HashMap<String, usize>, Option<Duration>), NodeErrorKind> {
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| NodeErrorKind::Connect(e.to_string()))?;
    let mut timeout_conn = conn.clone();
    let slots = async move {
        redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async::<redis::Value>(&mut conn)
            .await
    };
    let node_timeout = async move {
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("cluster-node-timeout")
            .query_async::<redis::Value>(&mut timeout_conn)
            .await
            .ok()
    };
    let (reply, node_timeout) = futures::join!(slots, node_timeout);
    let reply = reply.map_err(|e| crate::reply_error::redis_error_kind(&e))?;
    let host = match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, _) => host.clone(),
        redis::ConnectionAddr::TcpTls { host, .. } => host.clone(),
        other => other.to_string(),
    };
    let map = parse_cluster_slots(&reply, &host).map_err(NodeErrorKind::UnexpectedReply)?;
    let replicas = replicas_of_masters(&reply, &host).map_err(NodeErrorKind::UnexpectedReply)?;
    let node_timeout = crate::guard::observe::config_value(node_timeout.as_ref())
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis);
    Ok((map, replicas, node_timeout))
}
