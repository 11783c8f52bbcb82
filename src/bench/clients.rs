//! What a benchmark measures: one lock + release, through some client.

use std::future::Future;
use std::pin::Pin;

use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
use redis::aio::MultiplexedConnection;

use crate::{Error, LockManager};

/// A boxed lock + release operation; `Err` carries a short description.
pub type BoxedOp<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// Anything that can take and release a lock on a resource.
pub trait LockClient: Send + Sync {
    /// A name for tables and plots.
    fn name(&self) -> String;
    /// Takes the lock on `resource`, then releases it.
    fn lock_release<'a>(&'a self, resource: &'a str) -> BoxedOp<'a>;
}

/// quorumlock: `lock` (with the manager's retries) then `release`.
pub struct Quorumlock {
    /// Row label.
    pub label: String,
    /// The manager under test.
    pub manager: LockManager,
}

impl LockClient for Quorumlock {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn lock_release<'a>(&'a self, resource: &'a str) -> BoxedOp<'a> {
        Box::pin(async move {
            let lock = self.manager.lock(resource).await.map_err(short)?;
            lock.release().await.map_err(short)
        })
    }
}

/// The floor: `SET key v NX PX 10000` then `DEL key` through redis-rs on
/// every connection at once, waiting for every reply. With one connection
/// it is the cheapest possible lock on one node.
pub struct Floor {
    /// Row label.
    pub label: String,
    /// One multiplexed connection per node.
    pub connections: Vec<MultiplexedConnection>,
}

impl Floor {
    /// Connects to every URL.
    pub async fn connect(label: impl Into<String>, urls: &[String]) -> Result<Self, String> {
        let mut connections = Vec::new();
        for url in urls {
            let client = super::node_client(url)?;
            connections.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| format!("{url}: {e}"))?,
            );
        }
        Ok(Self {
            label: label.into(),
            connections,
        })
    }
}

impl LockClient for Floor {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn lock_release<'a>(&'a self, resource: &'a str) -> BoxedOp<'a> {
        Box::pin(async move {
            let sets = self.connections.iter().map(|conn| {
                let mut conn = conn.clone();
                async move {
                    redis::cmd("SET")
                        .arg(resource)
                        .arg("v")
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async::<Option<String>>(&mut conn)
                        .await
                }
            });
            for set in join_all(sets).await {
                set.map_err(|e| e.to_string())?;
            }
            let dels = self.connections.iter().map(|conn| {
                let mut conn = conn.clone();
                async move {
                    redis::cmd("DEL")
                        .arg(resource)
                        .query_async::<i64>(&mut conn)
                        .await
                }
            });
            for del in join_all(dels).await {
                del.map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    }
}

/// The quorum floor: the least a correct Redlock client does. `SET key
/// value NX PX 10000` goes to every node at once and the lock is held at
/// the quorum's grants; then the compare-and-delete every Redlock client
/// runs for unlock (`EVALSHA`, loaded once) goes to every node, done at a
/// quorum's replies. Each round's stragglers finish in one background
/// task. No fencing, no node guard, no rollback of a lost round, no
/// retries: the honest limit of a quorum lock on these nodes, which the
/// one-node floor is not (it skips the fan-out).
pub struct QuorumFloor {
    /// Row label.
    pub label: String,
    connections: Vec<MultiplexedConnection>,
    unlock_sha: String,
}

/// Compare-and-delete, as in the Redlock description.
pub(super) const UNLOCK: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

impl QuorumFloor {
    /// Connects to every URL and loads the unlock script on each.
    pub async fn connect(label: impl Into<String>, urls: &[String]) -> Result<Self, String> {
        let floor = Floor::connect(label, urls).await?;
        let mut unlock_sha = String::new();
        for connection in &floor.connections {
            unlock_sha = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(UNLOCK)
                .query_async(&mut connection.clone())
                .await
                .map_err(|e| format!("SCRIPT LOAD: {e}"))?;
        }
        Ok(Self {
            label: floor.label,
            connections: floor.connections,
            unlock_sha,
        })
    }

    /// Sends `cmd` to every node; returns once a quorum said yes (`Ok`) or
    /// can no longer (`Err`), leaving the rest to a background task.
    async fn quorum_round(
        &self,
        cmd: &redis::Cmd,
        yes: fn(&redis::Value) -> bool,
    ) -> Result<(), String> {
        let replies: FuturesUnordered<_> = self
            .connections
            .iter()
            .map(|connection| {
                let (mut connection, cmd) = (connection.clone(), cmd.clone());
                async move { cmd.query_async::<redis::Value>(&mut connection).await }
            })
            .collect();
        until_quorum(replies, |reply| matches!(reply, Ok(value) if yes(&value))).await
    }
}

/// Tallies `replies` until a quorum of them said yes (`Ok`) or can no
/// longer (`Err`), and leaves the rest to a background task.
pub(super) async fn until_quorum<F>(
    mut replies: FuturesUnordered<F>,
    yes: impl Fn(F::Output) -> bool,
) -> Result<(), String>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    let total = replies.len();
    let needed = crate::quorum::quorum(total);
    let (mut granted, mut other) = (0, 0);
    while let Some(reply) = replies.next().await {
        if yes(reply) {
            granted += 1;
        } else {
            other += 1;
        }
        if granted >= needed || other > total - needed {
            break;
        }
    }
    if !replies.is_empty() {
        tokio::spawn(async move { while replies.next().await.is_some() {} });
    }
    if granted >= needed {
        Ok(())
    } else {
        Err("no quorum".to_owned())
    }
}

impl LockClient for QuorumFloor {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn lock_release<'a>(&'a self, resource: &'a str) -> BoxedOp<'a> {
        Box::pin(async move {
            let value = fastrand::u64(..);
            let mut set = redis::cmd("SET");
            set.arg(resource).arg(value).arg("NX").arg("PX").arg(10_000);
            self.quorum_round(&set, |v| matches!(v, redis::Value::Okay))
                .await?;
            let mut unlock = redis::cmd("EVALSHA");
            unlock.arg(&self.unlock_sha).arg(1).arg(resource).arg(value);
            self.quorum_round(&unlock, |v| matches!(v, redis::Value::Int(1)))
                .await
        })
    }
}

/// The kind of an error: enough to count failures by kind.
fn short(error: Error) -> String {
    error.kind().to_owned()
}
