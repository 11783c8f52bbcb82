//! [`TestCluster`]: N independent `redis-server` processes that a test can
//! kill, pause, resume and restart by index.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use tempfile::TempDir;

use super::certs::TestCertificates;
use super::proxy::FaultProxy;
use super::server::{Launch, RedisServer};
use crate::error::{Error, Result};

/// A local cluster of independent Redis masters on loopback.
///
/// Methods take `&self`, so one cluster can be shared (e.g. in an `Arc`)
/// between a test and a task that injects faults.
pub struct TestCluster {
    servers: Mutex<Vec<RedisServer>>,
    /// One per node when started with proxies, else empty.
    proxies: Vec<FaultProxy>,
    /// What clients should use: the proxies' URLs, or the nodes'.
    urls: Vec<String>,
    direct_urls: Vec<String>,
    tls_urls: Vec<String>,
    /// The certificate files the nodes read on every (re)start.
    _certificates: Option<Arc<TestCertificates>>,
    // Declared last: dropped after the servers are killed.
    _root: Root,
}

/// Where the nodes keep their data.
enum Root {
    /// Deleted with the cluster.
    Temporary(#[allow(dead_code)] TempDir),
    /// A directory the caller chose; kept.
    Kept,
}

/// How to start a [`TestCluster`]; the default is what
/// [`TestCluster::start`] does.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Port of the first node; the others follow it. Default: free ports.
    pub first_port: Option<u16>,
    /// Directory for the nodes' data (kept). Default: a temporary one.
    pub dir: Option<PathBuf>,
    /// Extra `redis-server` arguments for every node.
    pub extra_args: Vec<String>,
    /// Put a [`FaultProxy`] in front of every node.
    pub proxied: bool,
    /// Give every node a wall clock the test can speed up, slow down or
    /// step ([`TestCluster::set_clock_rate`], [`TestCluster::step_clock`]),
    /// through an `LD_PRELOAD` shim built with `cc`.
    pub fake_clocks: bool,
    /// Also serve TLS on a second port of every node, with these
    /// certificates ([`TestCluster::tls_urls`]); the plain port stays.
    pub tls: Option<TlsNodes>,
}

/// How [`TestCluster::restart_with`] brings a node back.
#[derive(Debug, Clone, Default)]
pub struct Restart {
    args: Vec<String>,
    wipe: bool,
    graceful: bool,
}

impl Restart {
    /// Back with its data (what [`TestCluster::restart`] does).
    pub fn keeping_data() -> Self {
        Self::default()
    }

    /// Back without its data.
    pub fn wiped() -> Self {
        Self {
            wipe: true,
            ..Self::default()
        }
    }

    /// Stopped with SIGTERM (a clean shutdown: it writes what it holds to
    /// disk first) rather than killed.
    pub fn graceful(mut self) -> Self {
        self.graceful = true;
        self
    }

    /// With these `redis-server` arguments too, from now on.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }
}

/// TLS for a [`TestCluster`]'s nodes.
#[derive(Debug, Clone)]
pub struct TlsNodes {
    /// The CA and certificates the nodes use.
    pub certificates: Arc<TestCertificates>,
    /// Mutual TLS: refuse clients without a certificate signed by the CA.
    pub require_client_cert: bool,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("urls", &self.urls)
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// Starts `n` nodes with AOF `appendfsync always` and waits until each
    /// answers PING. Fails with one clear error if `redis-server` is missing.
    pub fn start(n: usize) -> Result<Self> {
        Self::start_with_args(n, &[])
    }

    /// As [`start`](Self::start), with extra `redis-server` arguments for
    /// every node (e.g. `["--appendfsync", "everysec"]`); later arguments
    /// override the defaults.
    pub fn start_with_args(n: usize, extra_args: &[&str]) -> Result<Self> {
        Self::start_with(
            n,
            &ClusterOptions {
                extra_args: extra_args.iter().map(|&a| a.to_owned()).collect(),
                ..ClusterOptions::default()
            },
        )
    }

    /// As [`start`](Self::start), with a [`FaultProxy`] in front of every
    /// node: [`urls`](Self::urls) are the proxies', [`proxy`](Self::proxy)
    /// controls them, and [`direct_url`](Self::direct_url) bypasses them.
    pub fn start_proxied(n: usize) -> Result<Self> {
        Self::start_proxied_with_args(n, &[])
    }

    /// [`start_proxied`](Self::start_proxied) with extra `redis-server`
    /// arguments, as in [`start_with_args`](Self::start_with_args).
    pub fn start_proxied_with_args(n: usize, extra_args: &[&str]) -> Result<Self> {
        Self::start_with(
            n,
            &ClusterOptions {
                extra_args: extra_args.iter().map(|&a| a.to_owned()).collect(),
                proxied: true,
                ..ClusterOptions::default()
            },
        )
    }

    /// Starts `n` nodes as `options` say.
    pub fn start_with(n: usize, options: &ClusterOptions) -> Result<Self> {
        if n == 0 {
            return Err(Error::Testkit(
                "a cluster needs at least one node".to_owned(),
            ));
        }
        let (root, base) = match &options.dir {
            Some(dir) => (Root::Kept, dir.clone()),
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("quorumlock-cluster-")
                    .tempdir()
                    .map_err(|e| {
                        Error::Testkit(format!("cannot create a temporary directory: {e}"))
                    })?;
                let path = temp.path().to_path_buf();
                (Root::Temporary(temp), path)
            }
        };
        let launch = Launch {
            extra_args: options.extra_args.clone(),
            fake_clock: options.fake_clocks,
            tls: options
                .tls
                .as_ref()
                .map(|tls| tls.certificates.server_args(tls.require_client_cert)),
        };
        let mut servers = Vec::with_capacity(n);
        for i in 0..n {
            let dir = base.join(format!("node-{i}"));
            servers.push(match options.first_port {
                Some(first) => {
                    let port = u16::try_from(usize::from(first) + i).map_err(|_| {
                        Error::Testkit(format!("port {first} + {i} is out of range"))
                    })?;
                    RedisServer::start_on(port, dir, &launch)?
                }
                None => RedisServer::start(dir, &launch)?,
            });
        }
        let proxied = options.proxied;
        let direct_urls: Vec<String> = servers
            .iter()
            .map(|server| format!("redis://127.0.0.1:{}", server.port()))
            .collect();
        let tls_urls: Vec<String> = servers
            .iter()
            .filter_map(|server| server.tls_port())
            .map(|port| format!("rediss://127.0.0.1:{port}"))
            .collect();
        let mut proxies = Vec::new();
        if proxied {
            for server in &servers {
                proxies.push(FaultProxy::start(SocketAddr::from((
                    Ipv4Addr::LOCALHOST,
                    server.port(),
                )))?);
            }
        }
        let urls = if proxied {
            proxies.iter().map(FaultProxy::url).collect()
        } else {
            direct_urls.clone()
        };
        Ok(Self {
            servers: Mutex::new(servers),
            proxies,
            urls,
            direct_urls,
            tls_urls,
            _certificates: options
                .tls
                .as_ref()
                .map(|tls| Arc::clone(&tls.certificates)),
            _root: root,
        })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Always false: a cluster has at least one node.
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// `redis://127.0.0.1:PORT` of every node, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.urls.clone()
    }

    /// URL of node `i` (its proxy's, when proxied).
    pub fn url(&self, i: usize) -> Result<String> {
        self.check_index(i)?;
        Ok(self.urls[i].clone())
    }

    /// `rediss://127.0.0.1:PORT` of every node's TLS port (clusters with
    /// [`ClusterOptions::tls`] only).
    pub fn tls_urls(&self) -> Result<Vec<String>> {
        if self.tls_urls.is_empty() {
            return Err(Error::Testkit(
                "this cluster serves no TLS; start it with ClusterOptions::tls".to_owned(),
            ));
        }
        Ok(self.tls_urls.clone())
    }

    /// URL of node `i` itself, bypassing any proxy.
    pub fn direct_url(&self, i: usize) -> Result<String> {
        self.check_index(i)?;
        Ok(self.direct_urls[i].clone())
    }

    /// The fault proxy in front of node `i` (clusters from
    /// [`start_proxied`](Self::start_proxied) only).
    pub fn proxy(&self, i: usize) -> Result<&FaultProxy> {
        self.check_index(i)?;
        self.proxies.get(i).ok_or_else(|| {
            Error::Testkit("this cluster has no proxies; start it with start_proxied".to_owned())
        })
    }

    /// SIGKILL node `i` (no shutdown, no final fsync: a crash).
    pub fn kill(&self, i: usize) -> Result<()> {
        self.with_server(i, |server| {
            server.stop();
            Ok(())
        })
    }

    /// SIGSTOP node `i`: connections stay open, nothing is answered.
    pub fn pause(&self, i: usize) -> Result<()> {
        self.with_server(i, RedisServer::pause)
    }

    /// SIGCONT node `i` after [`pause`](Self::pause).
    pub fn resume(&self, i: usize) -> Result<()> {
        self.with_server(i, RedisServer::resume)
    }

    /// Kills node `i` if it runs, then starts it again on the same port with
    /// the same data directory (its AOF is replayed), and waits until it
    /// answers.
    pub fn restart(&self, i: usize) -> Result<()> {
        self.with_server(i, |server| {
            server.stop();
            server.launch()
        })
    }

    /// Kills node `i` if it runs (SIGKILL: a crash; SIGTERM for a
    /// [`graceful`](Restart::graceful) restart), then starts it again as
    /// `how` says: with more `redis-server` arguments from now on (after the
    /// others, so they override them; e.g. persistence changed across the
    /// restart), and without its data if [`wiped`](Restart::wiped) (a lost
    /// disk, or another machine behind the same address).
    ///
    /// ```no_run
    /// # fn main() -> quorumlock::Result<()> {
    /// use quorumlock::testkit::{Restart, TestCluster};
    ///
    /// let cluster = TestCluster::start_with_args(3, &["--appendonly", "no"])?;
    /// // Back empty, now persisting every write.
    /// cluster.restart_with(0, &Restart::wiped().args(&["--appendonly", "yes"]))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn restart_with(&self, i: usize, how: &Restart) -> Result<()> {
        self.with_server(i, |server| {
            if how.graceful {
                server.shutdown();
            } else {
                server.stop();
            }
            if how.wipe {
                server.wipe()?;
            }
            server.add_args(&how.args);
            server.launch()
        })
    }

    /// From now on node `i`'s wall clock runs at `rate` × real time (1.0 is
    /// normal; it stays continuous). The cluster must have been started with
    /// [`ClusterOptions::fake_clocks`]. Survives restarts of the node.
    pub fn set_clock_rate(&self, i: usize, rate: f64) -> Result<()> {
        self.with_server(i, |server| server.clock()?.set_rate(rate))
    }

    /// Moves node `i`'s wall clock by `by` at once, forward or back, as a
    /// clock step (e.g. by NTP) would. Needs [`ClusterOptions::fake_clocks`].
    pub fn step_clock(&self, i: usize, by: std::time::Duration, forward: bool) -> Result<()> {
        self.with_server(i, |server| server.clock()?.step(by, forward))
    }

    /// Whether node `i` has a live process (paused counts as running).
    pub fn is_running(&self, i: usize) -> Result<bool> {
        self.with_server(i, |server| Ok(server.is_running()))
    }

    /// Stops every node gracefully (SIGTERM, so each flushes and exits
    /// cleanly; SIGKILL after 5 s), then drops the cluster.
    pub fn shutdown(self) {
        for server in self.lock_servers().iter_mut() {
            server.shutdown();
        }
    }

    /// The first node whose process ended on its own (it crashed, or was
    /// shut down from outside), and how; `None` while all that were
    /// started run. Reaps it.
    pub fn ended(&self) -> Option<(usize, std::process::ExitStatus)> {
        self.lock_servers()
            .iter_mut()
            .enumerate()
            .find_map(|(i, server)| server.ended().map(|status| (i, status)))
    }

    /// Whether node `i` is paused.
    pub fn is_paused(&self, i: usize) -> Result<bool> {
        self.with_server(i, |server| Ok(server.is_paused()))
    }

    fn with_server<T>(&self, i: usize, f: impl FnOnce(&mut RedisServer) -> Result<T>) -> Result<T> {
        self.check_index(i)?;
        let mut servers = self.lock_servers();
        f(&mut servers[i])
    }

    fn check_index(&self, i: usize) -> Result<()> {
        if i >= self.urls.len() {
            return Err(Error::Testkit(format!(
                "node index {i} is out of range: the cluster has {} nodes",
                self.urls.len()
            )));
        }
        Ok(())
    }

    fn lock_servers(&self) -> MutexGuard<'_, Vec<RedisServer>> {
        // A panic while holding the guard leaves each server in a known
        // state (running or not), so the poisoned value is still usable.
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }
}
