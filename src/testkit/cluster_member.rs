//! [`ClusterMember`]: one quorum member that is a Redis Cluster of local
//! `redis-server` processes, created with `redis-cli --cluster create`.

use std::process::Command;
use std::time::{Duration, Instant};

use super::TestCluster;
use crate::error::{Error, Result};

/// How long a new cluster may take to agree that every slot is served.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// A Redis Cluster on loopback ports: `masters` shard masters, each with
/// `replicas_each` replicas, every node in its own directory with AOF
/// `appendfsync always` (as [`TestCluster`]'s nodes), a short
/// `cluster-node-timeout` (1 s) so failovers are quick, and ready once every
/// node says `cluster_state:ok` with all 16 384 slots served. All processes
/// are killed when it is dropped. Needs `redis-cli` (Debian's
/// `redis-server` package brings it). On two cores, start one at a time.
///
/// ```no_run
/// # fn main() -> quorumlock::Result<()> {
/// use quorumlock::testkit::ClusterMember;
///
/// let member = ClusterMember::start(3, 0)?;
/// assert_eq!(member.nodes().len(), 3);
/// let owner = member.master_of("quorumlock:{invoice:7}:lock")?;
/// println!("invoice:7 lives on {owner}");
/// # Ok(())
/// # }
/// ```
pub struct ClusterMember {
    nodes: TestCluster,
    masters: usize,
}

impl std::fmt::Debug for ClusterMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterMember")
            .field("masters", &self.masters)
            .field("nodes", &self.nodes.urls())
            .finish()
    }
}

impl ClusterMember {
    /// Starts the nodes and creates the cluster; at least three masters
    /// (what `redis-cli --cluster create` accepts).
    pub fn start(masters: usize, replicas_each: usize) -> Result<Self> {
        if masters < 3 {
            return Err(Error::Testkit(format!(
                "a Redis Cluster needs at least 3 masters; {masters} asked for"
            )));
        }
        let count = masters * (1 + replicas_each);
        let nodes = TestCluster::start_with_args(
            count,
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "1000",
                // A replica's first sync at once, not after 5 s.
                "--repl-diskless-sync-delay",
                "0",
                // `DEBUG SLEEP` from tests (a master stalled without a
                // signal); loopback connections only.
                "--enable-debug-command",
                "local",
            ],
        )?;
        let addresses: Vec<String> = (0..count)
            .map(|i| nodes.direct_url(i).map(|url| host_port(&url).to_owned()))
            .collect::<Result<_>>()?;
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .arg("--cluster-replicas")
            .arg(replicas_each.to_string())
            .arg("--cluster-yes")
            .output()
            .map_err(|e| Error::Testkit(format!("cannot run redis-cli: {e}")))?;
        if !created.status.success() {
            return Err(Error::Testkit(format!(
                "redis-cli --cluster create failed ({}): {}",
                created.status,
                String::from_utf8_lossy(&created.stdout)
            )));
        }
        let member = Self { nodes, masters };
        member.wait_until_ready()?;
        member.mark_masters(replicas_each)?;
        Ok(member)
    }

    /// Puts the node guard's mark, dated long ago, on each master, where
    /// clients look for it (a slot the master serves, see
    /// `DataSetKeys::in_slot`): as [`TestCluster`] marks its fresh nodes,
    /// so that clients count the new cluster at once; replicated to each
    /// master's `replicas` replicas before this returns.
    fn mark_masters(&self, replicas: usize) -> Result<()> {
        let seed = self.nodes.direct_url(0)?;
        let slots = query::<redis::Value>(&seed, redis::cmd("CLUSTER").arg("SLOTS"))?;
        let map = crate::slots::parse_cluster_slots(&slots, "127.0.0.1").map_err(Error::Testkit)?;
        for (first, _, address) in map.ranges() {
            if map.first_slot_of(address) != Some(*first) {
                continue;
            }
            let keys = crate::guard::observe::DataSetKeys::in_slot(*first);
            let master = format!("redis://{address}");
            // Signed by the master in its config epoch, as its own marks
            // are (see observe.lua).
            let myid = query::<String>(&master, redis::cmd("CLUSTER").arg("MYID"))?;
            let info = query::<String>(&master, redis::cmd("CLUSTER").arg("INFO"))?;
            let epoch = info
                .lines()
                .find_map(|line| line.trim().strip_prefix("cluster_my_epoch:"))
                .unwrap_or("?");
            let mark = format!("{} testkit@{myid}/{epoch} 0", uuid::Uuid::new_v4().simple());
            query::<redis::Value>(
                &master,
                redis::cmd("SET").arg(&keys.mark).arg(mark).arg("NX"),
            )?;
            if replicas > 0 {
                let acknowledged = query::<usize>(
                    &master,
                    redis::cmd("WAIT")
                        .arg(replicas)
                        .arg(READY_WITHIN.as_millis() as u64),
                )?;
                if acknowledged < replicas {
                    return Err(Error::Testkit(format!(
                        "{acknowledged} of {replicas} replicas of {address} took the mark"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Every node says `cluster_state:ok` and serves all slots, and every
    /// replica's link to its master is up, within [`READY_WITHIN`].
    fn wait_until_ready(&self) -> Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        for i in 0..self.nodes.len() {
            let url = self.nodes.direct_url(i)?;
            loop {
                let info = query::<String>(&url, redis::cmd("CLUSTER").arg("INFO"))?;
                let replication = query::<String>(&url, redis::cmd("INFO").arg("replication"))?;
                let synced = !replication.contains("role:slave")
                    || replication.contains("master_link_status:up");
                if info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && synced
                {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(Error::Testkit(format!(
                        "the cluster was not ready within {READY_WITHIN:?}: {url} says {info}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// The member's nodes (masters and replicas, in the order `redis-cli`
    /// was given them), to kill, pause or restart.
    pub fn nodes(&self) -> &TestCluster {
        &self.nodes
    }

    /// The member's URL for [`LockManagerBuilder::nodes`]:
    /// `redis+cluster://` and every node's address (the client learns the
    /// slot map from whichever answers).
    ///
    /// [`LockManagerBuilder::nodes`]: crate::LockManagerBuilder::nodes
    pub fn url(&self) -> Result<String> {
        let addresses: Vec<String> = (0..self.nodes.len())
            .map(|i| {
                self.nodes
                    .direct_url(i)
                    .map(|url| host_port(&url).to_owned())
            })
            .collect::<Result<_>>()?;
        Ok(format!("redis+cluster://{}", addresses.join(",")))
    }

    /// How many shard masters the member was created with.
    pub fn masters(&self) -> usize {
        self.masters
    }

    /// `redis://127.0.0.1:PORT` of the master serving `key`'s slot now (as
    /// node 0's `CLUSTER SLOTS` says, or the next node's if node 0 is down).
    pub fn master_of(&self, key: &str) -> Result<String> {
        let slot = i64::from(crate::keys::slot(key));
        let mut last = None;
        for i in 0..self.nodes.len() {
            let url = self.nodes.direct_url(i)?;
            match query::<Vec<redis::Value>>(&url, redis::cmd("CLUSTER").arg("SLOTS")) {
                Ok(ranges) => return owner_in(&ranges, slot),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Testkit("the member has no node".into())))
    }
}

/// `127.0.0.1:PORT` of a `redis://127.0.0.1:PORT` URL.
fn host_port(url: &str) -> &str {
    url.trim_start_matches("redis://")
}

/// The port of a `redis://127.0.0.1:PORT` URL (0 if it has none).
pub(super) fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

pub(super) fn query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> Result<T> {
    let client =
        redis::Client::open(url).map_err(|e| Error::Testkit(format!("bad URL {url}: {e}")))?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|e| Error::Testkit(format!("cannot reach {url}: {e}")))?;
    cmd.query(&mut conn)
        .map_err(|e| Error::Testkit(format!("{url}: {e}")))
}

/// The master of `slot` in a `CLUSTER SLOTS` reply: ranges of
/// `[start, end, [host, port, id, …], replicas…]`.
fn owner_in(ranges: &[redis::Value], slot: i64) -> Result<String> {
    use redis::Value;
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            continue;
        };
        if (*start..=*end).contains(&slot)
            && let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
                (master.first(), master.get(1))
        {
            return Ok(format!("redis://{}:{port}", String::from_utf8_lossy(host)));
        }
    }
    Err(Error::Testkit(format!("no master serves slot {slot}")))
}
