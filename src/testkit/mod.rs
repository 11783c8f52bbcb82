//! A local cluster of real `redis-server` processes for tests, examples and
//! benchmarks (feature `testkit`).
//!
//! Each node runs on a free loopback port in its own temporary directory,
//! with AOF `appendfsync always`, so a restarted node keeps its data. All
//! processes are killed when the [`TestCluster`] is dropped, also when a
//! test panics. Set `QUORUMLOCK_NODES` (comma-separated Redis URLs) to use
//! running nodes instead, through [`local_or_env`].
//!
//! [`ClusterMember`] is one quorum member that is a Redis Cluster (several
//! shard masters, and replicas if asked for) of such processes.
//!
//! [`PostgresServer`] starts a throw-away PostgreSQL server the same way,
//! for the storage side of fencing, and [`FaultProxy`] puts a controllable
//! TCP proxy (latency, unresponsive, refused or dropped connections) in
//! front of a node.

mod certs;
mod clock;
mod cluster;
mod cluster_member;
mod cluster_moves;
mod postgres;
mod proxy;
mod server;

pub use certs::TestCertificates;
pub use clock::MISSING_CC;
pub use cluster::{ClusterOptions, Restart, TestCluster, TlsNodes};
pub use cluster_member::ClusterMember;
pub use postgres::{MISSING_POSTGRES, PostgresServer};
pub use proxy::{Delay, FaultProxy, Faults, FirstBytes};
pub use server::MISSING_REDIS_SERVER;

use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;

use nix::sys::signal::Signal;

use crate::error::{Error, Result};

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

/// Pretends that this host was just suspended for `period`: the boot
/// clock (`CLOCK_BOOTTIME`) moves on by `period`, the monotonic clock does
/// not, as after a real suspend and resume. Every lock of this process
/// sees it: its validity shrinks by `period`. Process-wide and permanent,
/// so a test that uses it belongs in a test binary of its own.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use std::time::Duration;
///
/// let lock = manager.lock("job").ttl(Duration::from_secs(30)).await?;
/// quorumlock::testkit::simulate_suspend(Duration::from_secs(60));
/// assert!(!lock.is_valid(), "the keys expired while the host slept");
/// # Ok(())
/// # }
/// ```
pub fn simulate_suspend(period: std::time::Duration) {
    crate::clock::simulated::suspend(period);
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

/// The last `lines` lines of a server's log, for error messages.
pub(crate) fn log_tail(log: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

/// A port the kernel just handed out on 127.0.0.1.
pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::Testkit(format!("cannot bind a loopback port: {e}")))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|e| Error::Testkit(format!("cannot read the bound port: {e}")))
}

/// Asks Linux to SIGKILL a child server if the process that started it
/// dies without dropping it (e.g. a test binary killed on timeout). It fires
/// when the *thread* that spawned the child exits, which for the testkit's
/// users is the test or main thread that owns the cluster.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls prctl,
    // which is async-signal-safe; it allocates nothing and takes no locks.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn die_with_parent(_command: &mut Command) {}
