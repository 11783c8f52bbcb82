//! [`FaultProxy`]: a TCP proxy in front of one node whose faults a test
//! switches at run time: added latency per direction (fixed + random
//! jitter), unresponsive (reads, never forwards or answers), refusing new
//! connections, dropping established ones, and back to healthy. It can
//! also send some new connections to another server, chosen by their
//! first bytes: one name that leads to two servers.
//!
//! It runs on its own thread and runtime, so it keeps working however busy
//! or blocked the test's runtime is. Byte order is kept in each direction,
//! as TCP would: delayed or held data is late, never lost or reordered.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::error::{Error, Result};

/// Added latency for one direction: `fixed` plus a uniform random `0..jitter`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delay {
    /// Always added.
    pub fixed: Duration,
    /// Up to this much more, drawn per chunk of data.
    pub jitter: Duration,
}

impl Delay {
    /// `fixed` with no jitter.
    pub const fn fixed(fixed: Duration) -> Self {
        Self {
            fixed,
            jitter: Duration::ZERO,
        }
    }

    fn sample(self) -> Duration {
        self.fixed + self.jitter.mul_f64(fastrand::f64())
    }
}

/// The faults in force; the default is healthy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Latency on bytes from the client to the node.
    pub to_node: Delay,
    /// Latency on bytes from the node to the client.
    pub to_client: Delay,
    /// Hold all data in both directions (the connection stays open).
    pub unresponsive: bool,
    /// Reset new connections as soon as they are accepted.
    pub refuse_new: bool,
}

struct Shared {
    faults: watch::Sender<Faults>,
    /// Bumped to close every established connection.
    generation: watch::Sender<u64>,
    /// Connections accepted so far (refused ones included).
    accepted: AtomicU64,
    /// Where a new connection whose first bytes the test picks goes
    /// instead of the upstream.
    detour: std::sync::Mutex<Option<(FirstBytes, SocketAddr)>>,
}

/// Picks connections by their first bytes (see [`FaultProxy::set_detour`]).
pub type FirstBytes = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// A fault-injecting TCP proxy on a free loopback port.
pub struct FaultProxy {
    listen: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    upstream: SocketAddr,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("listen", &self.listen)
            .field("upstream", &self.upstream)
            .field("faults", &self.faults())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a healthy proxy to `upstream` (a loopback address).
    pub fn start(upstream: SocketAddr) -> Result<Self> {
        let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| Error::Testkit(format!("proxy cannot bind a loopback port: {e}")))?;
        let listen = std_listener
            .local_addr()
            .map_err(|e| Error::Testkit(format!("proxy address: {e}")))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| Error::Testkit(format!("proxy socket: {e}")))?;
        let shared = Arc::new(Shared {
            faults: watch::Sender::new(Faults::default()),
            generation: watch::Sender::new(0),
            accepted: AtomicU64::new(0),
            detour: std::sync::Mutex::new(None),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Testkit(format!("proxy runtime: {e}")))?;
        let (shutdown, stopped) = oneshot::channel();
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", listen.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = stopped => {}
                        _ = serve(listener, upstream, serving) => {}
                    }
                });
            })
            .map_err(|e| Error::Testkit(format!("proxy thread: {e}")))?;
        Ok(Self {
            listen,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
            upstream,
        })
    }

    /// `redis://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.listen)
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        *self.shared.faults.borrow()
    }

    /// Replaces the faults in force; applies to data already in flight.
    pub fn set_faults(&self, faults: Faults) {
        self.shared.faults.send_replace(faults);
    }

    /// Delays data in both directions by `delay`.
    pub fn set_latency(&self, delay: Delay) {
        self.shared.faults.send_modify(|f| {
            f.to_node = delay;
            f.to_client = delay;
        });
    }

    /// Delays data on its way to the node only (requests).
    pub fn set_latency_to_node(&self, delay: Delay) {
        self.shared.faults.send_modify(|f| f.to_node = delay);
    }

    /// Delays data on its way to the client only (replies).
    pub fn set_latency_to_client(&self, delay: Delay) {
        self.shared.faults.send_modify(|f| f.to_client = delay);
    }

    /// Holds all data (true) or lets it flow again (false).
    pub fn set_unresponsive(&self, unresponsive: bool) {
        self.shared
            .faults
            .send_modify(|f| f.unresponsive = unresponsive);
    }

    /// Resets new connections (true) or accepts them again (false).
    pub fn set_refuse_new(&self, refuse: bool) {
        self.shared.faults.send_modify(|f| f.refuse_new = refuse);
    }

    /// Closes every established connection (both sides see it end).
    pub fn drop_connections(&self) {
        self.shared.generation.send_modify(|g| *g += 1);
    }

    /// Connections accepted so far, refused ones included: a client that
    /// replaces its connection shows up as one more.
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Removes every fault.
    pub fn heal(&self) {
        self.set_faults(Faults::default());
    }

    /// Sends every new connection whose first bytes (its first read, up
    /// to 16 KiB) `pick` chooses to `other` instead of the upstream, as a
    /// name that resolves to two servers could; `None` ends it. Those
    /// first bytes skip the latency in force.
    pub fn set_detour(&self, detour: Option<(FirstBytes, SocketAddr)>) {
        *self.shared.detour.lock().unwrap_or_else(|e| e.into_inner()) = detour;
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        if shared.faults.borrow().refuse_new {
            // Linger 0: the close is a reset, like a refused connection.
            let _ = client.set_zero_linger();
            drop(client);
            continue;
        }
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let detour = shared
                .detour
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let mut client = client;
            let (to, first) = match detour {
                None => (upstream, Vec::new()),
                Some((pick, other)) => {
                    let mut first = vec![0u8; 16 * 1024];
                    let Ok(n) = client.read(&mut first).await else {
                        return;
                    };
                    first.truncate(n);
                    (if pick(&first) { other } else { upstream }, first)
                }
            };
            let Ok(mut node) = TcpStream::connect(to).await else {
                return;
            };
            if node.write_all(&first).await.is_err() {
                return;
            }
            relay(client, node, &shared).await;
        });
    }
}

/// Moves bytes both ways until both sides have closed or the connections
/// are dropped by the test. A side that closes has what it sent before
/// delivered first (then the other side sees the close), as over TCP.
async fn relay(client: TcpStream, node: TcpStream, shared: &Shared) {
    let _ = client.set_nodelay(true);
    let _ = node.set_nodelay(true);
    let mut generation = shared.generation.subscribe();
    generation.borrow_and_update();
    let (client_read, client_write) = client.into_split();
    let (node_read, node_write) = node.into_split();
    let to_node = pump(client_read, node_write, shared, |f| f.to_node);
    let to_client = pump(node_read, client_write, shared, |f| f.to_client);
    tokio::select! {
        _ = async { tokio::join!(to_node, to_client) } => {}
        _ = generation.changed() => {}
    }
}

/// Copies one direction: a reader stamps each chunk with its delivery time,
/// a writer delivers chunks in order once due and while responsive.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
    delay: fn(&Faults) -> Delay,
) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let faults = shared.faults.subscribe();
    let read = {
        let faults = faults.clone();
        async move {
            let mut buffer = vec![0u8; 16 * 1024];
            loop {
                match from.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let at = Instant::now() + delay(&faults.borrow()).sample();
                        if chunks.send((at, buffer[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    };
    let write = async move {
        let mut faults = faults;
        while let Some((at, chunk)) = due.recv().await {
            // Timers tick in milliseconds: sleeping until "now" would add
            // up to a millisecond per chunk, so only sleep when delayed.
            if at > Instant::now() {
                tokio::time::sleep_until(at).await;
            }
            while faults.borrow_and_update().unresponsive {
                if faults.changed().await.is_err() {
                    return;
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        // The sender closed and all it sent is delivered: pass the close on.
        let _ = to.shutdown().await;
    };
    // The writer decides when this direction ends: after the reader stops
    // (dropping its sender) it still delivers what is queued.
    tokio::select! {
        _ = write => {}
        _ = async { read.await; std::future::pending::<()>().await } => {}
    }
}
