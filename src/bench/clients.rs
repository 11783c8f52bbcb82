//! What a benchmark measures: one lock + release, through some client.

use std::future::Future;
use std::pin::Pin;

use futures::future::join_all;
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
            let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
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

/// The kind of an error: enough to count failures by kind.
fn short(error: Error) -> String {
    error.kind().to_owned()
}
