//! The hot-path wire: a narrow RESP2 connection per node for the lock
//! requests (`SET … NX PX`, `EVALSHA` of the lock scripts, `TIME`), beside
//! the redis-rs connection that keeps everything else (connect-time
//! observation, script loading, pub/sub, `FencedRedis`).
//!
//! What it promises, and why a lock needs it:
//! - requests join the connection in the order [`HotWire::send`] is
//!   called, and their bytes go out in that order: a rollback sent after
//!   its `SET` reaches the node after it;
//! - a request is written once, never again: a key-setting request of a
//!   round that was decided or dropped must not go out later;
//! - when the connection breaks, or the runtime that drives it shuts down,
//!   every request in flight fails at once (the node's reconnect handling
//!   replaces the connection);
//! - when its node replaces it after requests in a row timed out, the
//!   requests not yet handed to the socket are dropped ([`HotWire::seal`]):
//!   the writer writes only under a gate that sealing takes, so none of
//!   them is written after requests on the replacement, whatever thread
//!   the writer runs on. Only cleanup is sent on it afterwards, behind
//!   what went out before (a late delete of ours is harmless: a lock value
//!   is unique to its attempt). Bytes the kernel took before can still
//!   arrive late, as with any TCP client; the cleanup behind them is what
//!   keeps them from leaving a key of ours after its release;
//! - writes are batched: requests made while the previous batch is being
//!   written go out together in one write.
//!
//! Replies are read by [`crate::resp`].

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};

use redis::{Cmd, RedisError, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};
use tokio::task::AbortHandle;

use crate::resp;

/// Which connection carries a manager's lock requests; see
/// [`LockManagerBuilder::wire`](crate::LockManagerBuilder::wire).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wire {
    /// quorumlock's own narrow RESP2 connection (plain TCP or TLS, with
    /// `AUTH`): the lock requests cost less client CPU and fewer
    /// allocations than through redis-rs. A node reached through a Unix
    /// socket, or by TLS that skips hostname checks (`#insecure`), keeps
    /// redis-rs.
    #[default]
    Narrow,
    /// redis-rs' multiplexed connection, as for everything else.
    RedisRs,
}

impl Wire {
    /// The wire named by `QUORUMLOCK_WIRE` (`narrow` or `redis-rs`), if
    /// set: lets an operator (or CI) choose without a rebuild.
    pub(crate) fn from_env() -> Result<Option<Self>, String> {
        Self::named(std::env::var_os("QUORUMLOCK_WIRE").as_deref())
    }

    /// The wire `QUORUMLOCK_WIRE` names when it is set to `value`.
    fn named(value: Option<&std::ffi::OsStr>) -> Result<Option<Self>, String> {
        let Some(value) = value else {
            return Ok(None);
        };
        match value.to_str() {
            Some("narrow") => Ok(Some(Wire::Narrow)),
            Some("redis-rs") => Ok(Some(Wire::RedisRs)),
            _ => Err(format!(
                "QUORUMLOCK_WIRE={value:?} names no wire; use `narrow` or `redis-rs`"
            )),
        }
    }
}

/// Where and how the hot-path wire reaches a node.
#[derive(Clone)]
pub(crate) struct Target {
    host: String,
    port: u16,
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::Secured>,
    /// `AUTH` on connect: the user (none: `default`) and the password.
    auth: Option<(Option<String>, String)>,
    db: i64,
    nodelay: bool,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        let mut target = f.debug_struct("Target");
        target.field("host", &self.host).field("port", &self.port);
        #[cfg(feature = "tls")]
        target.field("tls", &self.tls.is_some());
        target
            .field("user", &self.auth.as_ref().map(|(user, _)| user))
            .field("db", &self.db)
            .field("nodelay", &self.nodelay)
            .finish()
    }
}

impl Target {
    /// The hot-path target of `client`'s node, or `None` when that node is
    /// reached through redis-rs only (a Unix socket, TLS without hostname
    /// checks, or TLS without the `tls` feature).
    pub(crate) fn of(
        client: &redis::Client,
        #[cfg(feature = "tls")] secured: Option<&crate::tls::Secured>,
    ) -> Option<Self> {
        let info = client.get_connection_info();
        let settings = info.redis_settings();
        let (host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
            #[cfg(feature = "tls")]
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                ..
            } if secured.is_some() => (host.clone(), *port),
            _ => return None,
        };
        #[cfg(feature = "tls")]
        let tls = match info.addr() {
            redis::ConnectionAddr::TcpTls { .. } => secured.cloned(),
            _ => None,
        };
        Some(Self {
            host,
            port,
            #[cfg(feature = "tls")]
            tls,
            auth: settings
                .password()
                .map(|password| (settings.username().map(str::to_owned), password.to_owned())),
            db: settings.db(),
            nodelay: info.tcp_settings().nodelay(),
        })
    }

    /// Opens the connection: TCP, TLS when the URL asked for it, then
    /// `AUTH` and `SELECT` as the URL says. Unbounded: the caller bounds it
    /// (the node's `connect_timeout`).
    pub(crate) async fn connect(&self) -> Result<HotWire, String> {
        let stream = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("hot-path connection: {e}"))?;
        stream
            .set_nodelay(self.nodelay)
            .map_err(|e| format!("hot-path connection: TCP_NODELAY: {e}"))?;
        #[cfg(feature = "tls")]
        let wire = match &self.tls {
            Some(secured) => HotWire::start(secured.connect(&self.host, stream).await?),
            None => HotWire::start(stream),
        };
        #[cfg(not(feature = "tls"))]
        let wire = HotWire::start(stream);
        if let Some((user, password)) = &self.auth {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = user {
                auth.arg(user);
            }
            auth.arg(password);
            wire.expect_ok(&auth, "AUTH").await?;
        }
        if self.db != 0 {
            wire.expect_ok(redis::cmd("SELECT").arg(self.db), "SELECT")
                .await?;
        }
        Ok(wire)
    }
}

/// Anything the wire can run on: a TCP stream, or TLS over one.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<S: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for S {}

/// A request waiting for its replies.
struct Waiting {
    /// How many replies it takes (a `TIME` pipelined in front of a
    /// command, an observation behind it).
    wants: usize,
    got: Vec<Value>,
    done: oneshot::Sender<Result<Vec<Value>, Failed>>,
}

/// Why a request got no replies.
#[derive(Debug, Clone)]
enum Failed {
    /// The connection broke or was given up: everything on it fails.
    Broken(String),
    /// The connection was sealed before the request reached the socket: it
    /// was never written; the connection itself is fine.
    Dropped(String),
}

impl Failed {
    /// As a redis-rs error: an I/O error for a broken connection (the node
    /// replaces it), a client error for a dropped request (it does not).
    fn error(self) -> RedisError {
        match self {
            Failed::Broken(why) => broken(&why),
            Failed::Dropped(why) => {
                RedisError::from((redis::ErrorKind::Client, "request not sent", why))
            }
        }
    }
}

#[derive(Default)]
struct State {
    /// Bytes of requests not yet handed to the writer.
    outgoing: Vec<u8>,
    /// Where each request in `outgoing` ends.
    ends: Vec<usize>,
    /// Requests sent or to be sent, in order: replies come in this order.
    waiting: VecDeque<Waiting>,
    /// Why the connection is no longer usable, once it is not.
    closed: Option<String>,
    /// Why it takes only cleanup now, once sealed.
    sealed: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    /// Set with `state.closed`, read without the lock.
    broken: AtomicBool,
    /// The batch being written, held while bytes are handed to the socket
    /// and by [`Shared::close`] and [`Shared::seal`] while they cut it: once
    /// they return, no byte they dropped reaches the socket, also from a
    /// writer running on another thread at that moment.
    gate: Mutex<Batch>,
    write_soon: Notify,
    /// The writer and the reader, stopped on close: a batch being written
    /// when the connection is given up must not go on to reach the node
    /// after requests sent on its replacement.
    tasks: OnceLock<[AbortHandle; 2]>,
}

/// The requests the writer is handing to the socket.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    /// Where each request ends.
    ends: Vec<usize>,
    /// How much of `bytes` the socket took.
    sent: usize,
}

impl Batch {
    /// Cuts the batch after the request being written (the stream must
    /// stay in step: a request goes whole or not at all); returns how many
    /// requests it dropped.
    fn cut(&mut self) -> usize {
        let kept = if self.sent == 0 {
            0
        } else {
            self.ends
                .iter()
                .position(|&end| end >= self.sent)
                .map_or(self.ends.len(), |i| i + 1)
        };
        let end = kept.checked_sub(1).map_or(0, |i| self.ends[i]);
        self.bytes.truncate(end);
        self.sent = self.sent.min(end);
        let dropped = self.ends.len() - kept;
        self.ends.truncate(kept);
        dropped
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gate(&self) -> MutexGuard<'_, Batch> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops every request not yet handed to the socket (all but the one
    /// being written, which goes whole) and fails them; later requests are
    /// written as usual, behind what went out before.
    fn seal(&self, why: &str) {
        let dropped = {
            let mut batch = self.gate();
            let mut state = self.state();
            // Once: what is sent after the first is cleanup, to go behind.
            if state.sealed.is_some() || state.closed.is_some() {
                return;
            }
            state.sealed = Some(why.to_owned());
            let count = batch.cut() + state.ends.len();
            state.outgoing.clear();
            state.ends.clear();
            let keep = state.waiting.len().saturating_sub(count);
            state.waiting.split_off(keep)
        };
        for request in dropped {
            let _ = request.done.send(Err(Failed::Dropped(why.to_owned())));
        }
    }

    /// Marks the connection unusable and fails every request in flight;
    /// nothing more is written once it returns.
    fn close(&self, why: &str) {
        let waiting = {
            let mut batch = self.gate();
            let mut state = self.state();
            if state.closed.is_some() {
                return;
            }
            state.closed = Some(why.to_owned());
            self.broken.store(true, Ordering::Relaxed);
            *batch = Batch::default();
            state.outgoing = Vec::new();
            state.ends = Vec::new();
            std::mem::take(&mut state.waiting)
        };
        for request in waiting {
            let _ = request.done.send(Err(Failed::Broken(why.to_owned())));
        }
        if let Some(tasks) = self.tasks.get() {
            for task in tasks {
                task.abort();
            }
        }
    }

    /// Hands `value` to the oldest request; `false` for a reply that no
    /// request waits for (the stream is out of step).
    fn deliver(&self, value: Value) -> bool {
        let finished = {
            let mut state = self.state();
            let Some(oldest) = state.waiting.front_mut() else {
                return false;
            };
            oldest.got.push(value);
            if oldest.got.len() < oldest.wants {
                return true;
            }
            state.waiting.pop_front()
        };
        if let Some(request) = finished {
            let _ = request.done.send(Ok(request.got));
        }
        true
    }
}

/// Closes the connection when dropped: with the task that holds it, also
/// when its runtime shuts down.
struct CloseOnDrop(Arc<Shared>, &'static str);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close(self.1);
    }
}

/// An open hot-path connection. Dropping it stops its tasks, which fails
/// whatever is still in flight on it.
pub(crate) struct HotWire {
    shared: Arc<Shared>,
    tasks: [AbortHandle; 2],
}

impl Drop for HotWire {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl HotWire {
    /// Starts the writer and reader tasks on `stream`, on the current
    /// runtime.
    fn start(stream: impl Stream) -> Self {
        let (reader, writer) = tokio::io::split(stream);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            broken: AtomicBool::new(false),
            gate: Mutex::default(),
            write_soon: Notify::new(),
            tasks: OnceLock::new(),
        });
        // The guards go into the tasks unpolled: a task dropped before it
        // ever ran still fails what waits.
        let writing = tokio::spawn(write_requests(
            writer,
            Arc::clone(&shared),
            CloseOnDrop(Arc::clone(&shared), "the connection's writer stopped"),
        ));
        let reading = tokio::spawn(read_replies(
            reader,
            Arc::clone(&shared),
            CloseOnDrop(Arc::clone(&shared), "the connection's reader stopped"),
        ));
        let tasks = [writing.abort_handle(), reading.abort_handle()];
        let _ = shared.tasks.set(tasks.clone());
        Self { shared, tasks }
    }

    /// Gives the connection up: what is in flight on it fails, and nothing
    /// more is written.
    pub(crate) fn give_up(&self, why: &str) {
        self.shared.close(why);
    }

    /// Drops (and fails, not as a broken connection) the requests not yet
    /// handed to the socket, so none of them is written after requests on
    /// a connection that replaces this one; from then on it takes only
    /// [`send_cleanup`](Self::send_cleanup), which goes out behind what was
    /// written before. Only the first call does anything.
    pub(crate) fn seal(&self, why: &str) {
        self.shared.seal(why);
    }

    /// Whether it broke (requests on it fail at once).
    pub(crate) fn is_broken(&self) -> bool {
        self.shared.broken.load(Ordering::Relaxed)
    }

    /// Queues `commands` (written back to back, once) and returns their
    /// replies, one per command, in order. The request joins the
    /// connection now, before the returned future is polled; dropping the
    /// future does not take it back (its replies are read and discarded).
    /// Fails with an I/O error when the connection breaks first, and (not
    /// sent at all) once the connection is sealed.
    pub(crate) fn send<'c>(
        &self,
        commands: impl IntoIterator<Item = &'c Cmd>,
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'static {
        self.join(commands, false)
    }

    /// As [`send`](Self::send), for a delete that cleans up after earlier
    /// requests: it is sent on a sealed connection too, behind them.
    pub(crate) fn send_cleanup<'c>(
        &self,
        commands: impl IntoIterator<Item = &'c Cmd>,
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'static {
        self.join(commands, true)
    }

    fn join<'c>(
        &self,
        commands: impl IntoIterator<Item = &'c Cmd>,
        cleanup: bool,
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'static {
        let (done, reply) = oneshot::channel();
        let joined = {
            let mut state = self.shared.state();
            match (&state.closed, &state.sealed) {
                (Some(why), _) => Err(Failed::Broken(why.clone())),
                (None, Some(why)) if !cleanup => Err(Failed::Dropped(why.clone())),
                _ => {
                    let before = state.outgoing.len();
                    let mut wants = 0;
                    for command in commands {
                        command.write_packed_command(&mut state.outgoing);
                        wants += 1;
                    }
                    debug_assert!(wants > 0, "a request without a command gets no reply");
                    let end = state.outgoing.len();
                    state.ends.push(end);
                    let was_idle = before == 0;
                    state.waiting.push_back(Waiting {
                        wants,
                        got: Vec::with_capacity(wants),
                        done,
                    });
                    Ok(was_idle)
                }
            }
        };
        if let Ok(true) = joined {
            self.shared.write_soon.notify_one();
        }
        async move {
            match joined {
                Err(failed) => Err(failed.error()),
                Ok(_) => match reply.await {
                    Ok(Ok(values)) => Ok(values),
                    Ok(Err(failed)) => Err(failed.error()),
                    Err(_) => Err(broken("the connection's task ended")),
                },
            }
        }
    }

    /// Sends `command` and expects `+OK` (connect-time `AUTH`, `SELECT`).
    async fn expect_ok(&self, command: &Cmd, name: &str) -> Result<(), String> {
        let replies = self
            .send([command])
            .await
            .map_err(|e| format!("hot-path connection, {name}: {e}"))?;
        match replies.into_iter().next() {
            Some(Value::Okay) => Ok(()),
            Some(other) => match other.extract_error() {
                // Said as the other stream says it: a wrong password reads
                // the same whichever stream met it first.
                Err(error) => Err(crate::reply_error::authentication_failure(&error)
                    .unwrap_or_else(|| format!("hot-path connection, {name}: {error}"))),
                Ok(other) => Err(format!("hot-path connection, {name} answered {other:?}")),
            },
            None => Err(format!("hot-path connection, {name}: no reply")),
        }
    }
}

/// The error of a request on a connection that broke: an I/O error, so
/// the node treats it as a connection failure and replaces the connection.
fn broken(why: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        why.to_owned(),
    ))
}

/// Writes queued requests, a batch at a time, until the connection closes.
async fn write_requests(
    mut writer: impl AsyncWrite + Unpin,
    shared: Arc<Shared>,
    _close: CloseOnDrop,
) {
    loop {
        shared.write_soon.notified().await;
        loop {
            // The next batch, once the last one is written.
            {
                let mut batch = shared.gate();
                let mut state = shared.state();
                if state.closed.is_some() {
                    return;
                }
                let Batch { bytes, ends, sent } = &mut *batch;
                if *sent == bytes.len() {
                    bytes.clear();
                    ends.clear();
                    *sent = 0;
                    std::mem::swap(&mut state.outgoing, bytes);
                    std::mem::swap(&mut state.ends, ends);
                }
                if bytes.is_empty() {
                    break;
                }
            }
            let written = std::future::poll_fn(|cx| write_some(&shared, &mut writer, cx)).await;
            if let Err(error) = written {
                if !shared.broken.load(Ordering::Relaxed) {
                    shared.close(&format!("writing to the node failed: {error}"));
                }
                return;
            }
        }
    }
}

/// Hands the batch to the socket and flushes it (TLS keeps what it was
/// given until then), under the gate: what `close` or `seal` dropped is
/// never written, and a closed connection writes nothing.
fn write_some(
    shared: &Shared,
    writer: &mut (impl AsyncWrite + Unpin),
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<()>> {
    let mut batch = shared.gate();
    if shared.broken.load(Ordering::Relaxed) {
        return Poll::Ready(Err(std::io::Error::other("the connection was given up")));
    }
    while batch.sent < batch.bytes.len() {
        let sent = batch.sent;
        match Pin::new(&mut *writer).poll_write(cx, &batch.bytes[sent..]) {
            Poll::Ready(Ok(0)) => return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
            Poll::Ready(Ok(n)) => batch.sent += n,
            Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
            Poll::Pending => return Poll::Pending,
        }
    }
    Pin::new(writer).poll_flush(cx)
}

/// Reads replies and hands them to the requests in order, until the
/// connection closes.
async fn read_replies(
    mut reader: impl AsyncRead + Unpin,
    shared: Arc<Shared>,
    _close: CloseOnDrop,
) {
    let mut buffer: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        if buffer.capacity() - buffer.len() < 4 * 1024 {
            buffer.reserve(16 * 1024);
        }
        match reader.read_buf(&mut buffer).await {
            Ok(0) => return shared.close("the node closed the connection"),
            Ok(_) => {}
            Err(error) => return shared.close(&format!("reading from the node failed: {error}")),
        }
        let mut start = 0;
        loop {
            match resp::parse(&buffer[start..]) {
                Ok(Some((value, used))) => {
                    start += used;
                    if !shared.deliver(value) {
                        return shared.close("the node sent a reply no request asked for");
                    }
                }
                Ok(None) => break,
                Err(error) => return shared.close(&error.to_string()),
            }
        }
        buffer.drain(..start);
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::time::Duration;

    use tokio::io::AsyncReadExt;

    use super::{HotWire, Wire};

    /// A wire whose peer stops reading (a stalled node) keeps requests
    /// queued; sealed, it writes none of them (but the one it was in the
    /// middle of), even once the peer reads again, and a request sent
    /// after the seal follows what went out, the stream in step.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sealed_wire_writes_nothing_that_was_queued() {
        let (ours, mut node) = tokio::io::duplex(64);
        let wire = HotWire::start(ours);
        let mut set = redis::cmd("SET");
        set.arg("quorumlock:{r}:lock").arg("v".repeat(100));
        let queued: Vec<_> = (0..10).map(|_| wire.send([&set])).collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        wire.seal("replaced");
        let mut delete = redis::cmd("DEL");
        delete.arg("quorumlock:{r}:lock");
        assert!(
            wire.send([&set]).await.is_err(),
            "a sealed wire takes no more key-setting requests"
        );
        let cleanup = wire.send_cleanup([&delete]);
        let mut reached = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_millis(200), node.read_to_end(&mut reached)).await;
        let commands: Vec<String> = std::iter::successors(Some(&reached[..]), |rest| {
            let (_, used) = crate::resp::parse(rest).ok().flatten()?;
            Some(&rest[used..]).filter(|rest| !rest.is_empty())
        })
        .filter_map(|rest| match crate::resp::parse(rest).ok().flatten()? {
            (redis::Value::Array(parts), _) => match parts.first()? {
                redis::Value::BulkString(name) => Some(String::from_utf8_lossy(name).into_owned()),
                _ => None,
            },
            _ => None,
        })
        .collect();
        // The pipe held 64 bytes: the first SET had begun, and goes whole.
        assert_eq!(
            commands,
            ["SET", "DEL"],
            "what reached the node after the seal ({} bytes)",
            reached.len()
        );
        // The first waits for its reply (none comes here); the nine not
        // yet written have failed.
        let mut failed = 0;
        for request in queued.into_iter().skip(1) {
            let reply = tokio::time::timeout(Duration::from_millis(100), request).await;
            if let Ok(Err(error)) = reply {
                assert!(
                    !crate::reply_error::is_connection_failure(&error),
                    "a dropped request must not read as a broken connection: {error}"
                );
                failed += 1;
            }
        }
        assert_eq!(failed, 9, "the requests not yet written fail");
        assert!(!wire.is_broken(), "sealed, not broken");
        drop(cleanup);
    }

    #[test]
    fn quorumlock_wire_names_a_wire_or_is_refused() {
        assert_eq!(Wire::named(None), Ok(None));
        assert_eq!(
            Wire::named(Some(OsStr::new("narrow"))),
            Ok(Some(Wire::Narrow))
        );
        assert_eq!(
            Wire::named(Some(OsStr::new("redis-rs"))),
            Ok(Some(Wire::RedisRs))
        );
        for bad in [
            OsStr::new("redis_rs"),
            OsStr::new(""),
            OsStr::from_bytes(b"narrow\xff"),
        ] {
            let error = Wire::named(Some(bad)).expect_err("no such wire");
            assert!(error.contains("names no wire"), "{bad:?}: {error}");
        }
    }
}
