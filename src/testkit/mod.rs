//! A local cluster of real `redis-server` processes for tests, examples and
//! benchmarks (feature `testkit`).
//!
//! Each node runs on a free loopback port in its own temporary directory,
//! with AOF `appendfsync always`, so a restarted node keeps its data. All
//! processes are killed when the [`TestCluster`] is dropped, also when a
//! test panics. Set `QUORUMLOCK_NODES` (comma-separated Redis URLs) to use
//! running nodes instead, through [`local_or_env`].

mod cluster;
mod server;

pub use cluster::TestCluster;
pub use server::MISSING_REDIS_SERVER;

use crate::error::Result;

/// Environment variable naming external nodes, comma-separated URLs.
pub const NODES_ENV: &str = "QUORUMLOCK_NODES";

/// The node URLs in `QUORUMLOCK_NODES`, if it is set and not empty.
pub fn nodes_from_env() -> Option<Vec<String>> {
    let raw = std::env::var(NODES_ENV).ok()?;
    let urls: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    (!urls.is_empty()).then_some(urls)
}

/// Nodes to run against: the external ones, or a local cluster that lives
/// as long as this value.
pub struct NodeSet {
    /// URLs of the nodes.
    pub urls: Vec<String>,
    /// The local cluster, when one was started.
    pub cluster: Option<TestCluster>,
}

/// `QUORUMLOCK_NODES` when set, otherwise a fresh local cluster of `n` nodes.
pub fn local_or_env(n: usize) -> Result<NodeSet> {
    if let Some(urls) = nodes_from_env() {
        return Ok(NodeSet {
            urls,
            cluster: None,
        });
    }
    let cluster = TestCluster::start(n)?;
    Ok(NodeSet {
        urls: cluster.urls(),
        cluster: Some(cluster),
    })
}
