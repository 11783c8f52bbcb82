//! One `redis-server` child process on a loopback port, with its own data
//! directory: start, wait until it answers, signal, stop.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use super::clock::{self, ClockControl};
use super::{die_with_parent, free_port, log_tail};
use crate::error::{Error, Result};

/// What to tell someone whose machine has no `redis-server`.
pub const MISSING_REDIS_SERVER: &str = "redis-server was not found on PATH. Install Redis 7 \
     (Debian/Ubuntu: `sudo apt-get install -y redis-server`; macOS: `brew install redis`), \
     or set QUORUMLOCK_NODES to the URLs of running nodes";

/// How long a starting server may take to answer PING.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// A `redis-server` process slot: the port and directory outlive restarts.
pub(crate) struct RedisServer {
    port: u16,
    /// The TLS port, for a node that also serves TLS.
    tls_port: Option<u16>,
    dir: PathBuf,
    extra_args: Vec<String>,
    /// The clock shim and its control, for a node with a fake clock.
    clock: Option<(PathBuf, ClockControl)>,
    child: Option<Child>,
    paused: bool,
}

/// How to start a server: extra arguments, and whether its wall clock is
/// steerable (see [`super::clock`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Launch {
    pub(crate) extra_args: Vec<String>,
    pub(crate) fake_clock: bool,
    /// TLS settings (certificate files) for a TLS port besides the plain
    /// one, which stays for the testkit's own checks.
    pub(crate) tls: Option<Vec<String>>,
}

impl RedisServer {
    /// Starts a server on a free loopback port, retrying with another port
    /// if the one picked was taken in between.
    pub(crate) fn start(dir: PathBuf, launch: &Launch) -> Result<Self> {
        let mut last_error = String::new();
        let fresh = is_empty_dir(&dir);
        for _ in 0..5 {
            let mut server = Self::new(free_port()?, dir.clone(), launch)?;
            match server.launch() {
                Ok(()) => return server.marked_if(fresh),
                Err(Error::Testkit(why)) if why.contains("Address already in use") => {
                    last_error = why;
                }
                Err(other) => return Err(other),
            }
        }
        Err(Error::Testkit(format!(
            "no free port found for redis-server: {last_error}"
        )))
    }

    /// Starts a server on `port`, which must be free.
    pub(crate) fn start_on(port: u16, dir: PathBuf, launch: &Launch) -> Result<Self> {
        let fresh = is_empty_dir(&dir);
        let mut server = Self::new(port, dir, launch)?;
        server.launch()?;
        server.marked_if(fresh)
    }

    /// A server started in an empty directory holds a data set that no
    /// client can have used: it says so with the node guard's mark, dated
    /// long ago (see `guard::judge::first_sight`), so that clients count it
    /// at once, as they count a node that loaded its data on a restart.
    /// Without the mark a brand-new node is not counted until its data
    /// set is older than the quarantine window, as a node that lost its
    /// data is not.
    fn marked_if(self, fresh: bool) -> Result<Self> {
        if fresh {
            let mark = format!("{} testkit 0", uuid::Uuid::new_v4().simple());
            let set = resp(&["SET", crate::guard::judge::DATA_SET_KEY, &mark, "NX"]);
            match exchange(self.port, &set) {
                Some(reply) if reply.starts_with(b"+OK") || reply.starts_with(b"$-1") => {}
                // A node that asks for a password: clients that cannot
                // see a mark wait out the window.
                Some(reply) if reply.starts_with(b"-NOAUTH") => {}
                // A node in cluster mode that serves no slot yet (the test
                // assigns them): unmarked as well.
                Some(reply) if reply.starts_with(b"-CLUSTERDOWN") => {}
                other => {
                    return Err(Error::Testkit(format!(
                        "cannot mark the data set of redis-server on port {}: {:?}",
                        self.port,
                        other.map(|r| String::from_utf8_lossy(&r).into_owned())
                    )));
                }
            }
        }
        Ok(self)
    }

    /// From now on, also start with `args` (after the others, so they
    /// override them).
    pub(crate) fn add_args(&mut self, args: &[String]) {
        self.extra_args.extend(args.iter().cloned());
    }

    /// Deletes its data (append-only files and snapshot), as a lost disk
    /// would; only while it is stopped.
    pub(crate) fn wipe(&mut self) -> Result<()> {
        if self.child.is_some() {
            return Err(Error::Testkit(
                "stop a node before wiping its data".to_owned(),
            ));
        }
        for name in ["appendonlydir", "appendonly.aof", "dump.rdb"] {
            let path = self.dir.join(name);
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match removed {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    return Err(Error::Testkit(format!(
                        "cannot delete {}: {e}",
                        path.display()
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn new(port: u16, dir: PathBuf, launch: &Launch) -> Result<Self> {
        let clock = if launch.fake_clock {
            Some((clock::shim()?, ClockControl::create(&dir)?))
        } else {
            None
        };
        let mut extra_args = launch.extra_args.clone();
        let tls_port = match &launch.tls {
            Some(tls) => {
                let tls_port = free_port()?;
                extra_args.extend(["--tls-port".to_owned(), tls_port.to_string()]);
                extra_args.extend(tls.iter().cloned());
                Some(tls_port)
            }
            None => None,
        };
        Ok(Self {
            port,
            tls_port,
            dir,
            extra_args,
            clock,
            child: None,
            paused: false,
        })
    }

    /// The control of this node's fake clock.
    pub(crate) fn clock(&mut self) -> Result<&mut ClockControl> {
        match &mut self.clock {
            Some((_, control)) => Ok(control),
            None => Err(Error::Testkit(
                "this node has a real clock; start the cluster with ClusterOptions::fake_clocks"
                    .to_owned(),
            )),
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// How the process ended, if it ended on its own since it was started
    /// (reaped here, so it leaves no zombie); `None` while it runs.
    pub(crate) fn ended(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        self.paused = false;
        Some(status)
    }

    /// Starts the process (again) on the same port with the same data.
    pub(crate) fn launch(&mut self) -> Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| Error::Testkit(format!("cannot create {}: {e}", self.dir.display())))?;
        let log = self.dir.join("redis.log");
        let mut command = Command::new("redis-server");
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // With the clock shim, the dynamic loader's complaint (a shim that
        // cannot be preloaded is skipped with a line on stderr) is kept.
        let loader_log = self.dir.join("stderr.log");
        if let Some((shim, control)) = &self.clock {
            let stderr = std::fs::File::create(&loader_log).map_err(|e| {
                Error::Testkit(format!("cannot create {}: {e}", loader_log.display()))
            })?;
            command
                .env("LD_PRELOAD", shim)
                .env(clock::CONTROL_ENV, control.path())
                .stderr(stderr);
        }
        die_with_parent(&mut command);
        let child = command.spawn().map_err(|e| {
            if e.kind() == ErrorKind::NotFound {
                Error::Testkit(MISSING_REDIS_SERVER.to_owned())
            } else {
                Error::Testkit(format!("cannot start redis-server: {e}"))
            }
        })?;
        self.child = Some(child);
        self.paused = false;
        if let Err(why) = self.wait_ready() {
            self.stop();
            return Err(Error::Testkit(format!(
                "redis-server on port {} did not start: {why}; log: {}",
                self.port,
                log_tail(&log, 5)
            )));
        }
        if let Err(why) = self.check_clock_shim() {
            self.stop();
            return Err(Error::Testkit(format!(
                "redis-server on port {} runs without its clock shim ({why}): its clock \
                 could not be steered; stderr: {}",
                self.port,
                log_tail(&loader_log, 5)
            )));
        }
        Ok(())
    }

    /// For a node with a fake clock: whether the shim is loaded in the
    /// process (a shim the loader skipped leaves a normal clock, silently).
    fn check_clock_shim(&self) -> std::result::Result<(), String> {
        let (Some((shim, _)), Some(child)) = (&self.clock, &self.child) else {
            return Ok(());
        };
        let stderr = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
        if stderr.contains("cannot be preloaded") {
            return Err(format!("the loader skipped {}", shim.display()));
        }
        if cfg!(target_os = "linux") {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id()))
                .map_err(|e| format!("cannot read its memory map: {e}"))?;
            let name = shim.file_name().unwrap_or_default().to_string_lossy();
            if !maps.contains(&*name) {
                return Err(format!("{} is not mapped", shim.display()));
            }
        }
        Ok(())
    }

    /// SIGKILL, then reap. Safe on a stopped or paused server.
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Errors mean it is already gone, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// SIGTERM (a clean shutdown), SIGKILL if still alive after 5 s.
    pub(crate) fn shutdown(&mut self) {
        if self.paused {
            let _ = self.signal(Signal::SIGCONT);
        }
        if self.signal(Signal::SIGTERM).is_ok()
            && let Some(child) = self.child.as_mut()
        {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.stop();
    }

    /// SIGSTOP: the process keeps its sockets but answers nothing.
    pub(crate) fn pause(&mut self) -> Result<()> {
        self.signal(Signal::SIGSTOP)?;
        self.paused = true;
        Ok(())
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub(crate) fn resume(&mut self) -> Result<()> {
        self.signal(Signal::SIGCONT)?;
        self.paused = false;
        Ok(())
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    fn signal(&self, signal: Signal) -> Result<()> {
        let child = self.child.as_ref().ok_or_else(|| {
            Error::Testkit(format!(
                "redis-server on port {} is not running; start it with restart()",
                self.port
            ))
        })?;
        let pid = i32::try_from(child.id())
            .map_err(|_| Error::Testkit(format!("pid {} out of range", child.id())))?;
        signal::kill(Pid::from_raw(pid), signal)
            .map_err(|e| Error::Testkit(format!("cannot send {signal} to redis-server: {e}")))
    }

    /// Polls PING until PONG, the process exits, or the startup bound passes.
    fn wait_ready(&mut self) -> std::result::Result<(), String> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("exited with {status}"));
            }
            // A PING may reach another test's server that took the port
            // between `free_port` and our bind (ours then fails to bind and
            // exits): only a server with our process id counts.
            let ours = self.child.as_ref().map(|child| child.id());
            if ping(self.port) && !ours.is_some_and(|pid| answered_by_another(self.port, pid)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no PONG within {STARTUP_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether `dir` is missing or empty.
fn is_empty_dir(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut entries| entries.next().is_none())
}

/// A command in RESP.
fn resp(words: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for word in words {
        out.extend(format!("${}\r\n{word}\r\n", word.len()).bytes());
    }
    out
}

/// Sends `request` to the server on `port` and reads one short reply (a
/// status, an error, or a nil), each step bounded as [`connect`] bounds
/// them.
fn exchange(port: u16, request: &[u8]) -> Option<Vec<u8>> {
    let mut stream = connect(port)?;
    stream.write_all(request).ok()?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 256];
    while !reply.ends_with(b"\r\n") {
        let read = stream.read(&mut chunk).ok().filter(|&n| n > 0)?;
        reply.extend_from_slice(&chunk[..read]);
    }
    Some(reply)
}

/// A connection to the server on loopback `port`, each step bounded by
/// 200 ms.
fn connect(port: u16) -> Option<TcpStream> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    let bound = Some(Duration::from_millis(200));
    stream.set_read_timeout(bound).ok()?;
    stream.set_write_timeout(bound).ok()?;
    Some(stream)
}

/// Whether the server on `port` says its process id is not `pid` (false
/// when it cannot tell, e.g. it requires a password).
fn answered_by_another(port: u16, pid: u32) -> bool {
    let Some(mut stream) = connect(port) else {
        return false;
    };
    if stream.write_all(b"INFO server\r\n").is_err() {
        return false;
    }
    // The reply is one bulk string of a few hundred bytes; read until its
    // `process_id` line has arrived or the reply ends.
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(read @ 1..) = stream.read(&mut chunk) {
        reply.extend_from_slice(&chunk[..read]);
        // An error reply (`-NOAUTH`): it cannot tell.
        if reply.first() == Some(&b'-') && reply.ends_with(b"\r\n") {
            return false;
        }
        let text = String::from_utf8_lossy(&reply);
        if let Some(at) = text.find("process_id:")
            && let Some(end) = text[at..].find("\r\n")
        {
            let id = &text[at + "process_id:".len()..at + end];
            return id.trim().parse::<u32>().is_ok_and(|id| id != pid);
        }
        if reply.len() > 64 * 1024 {
            break;
        }
    }
    false
}

/// One inline PING; true on `+PONG`, or on `-NOAUTH` from a server that
/// requires a password (it is up); false on `-LOADING` or silence.
fn ping(port: u16) -> bool {
    let Some(mut stream) = connect(port) else {
        return false;
    };
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && (&reply == b"+PONG\r\n" || &reply == b"-NOAUTH")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second server on a port another server holds fails to bind and
    /// exits; the first one's PONG must not make it look started.
    #[test]
    fn a_server_whose_port_is_taken_is_not_started() {
        let first_dir = tempfile::tempdir().expect("temp dir");
        let first = RedisServer::start(first_dir.path().to_owned(), &Launch::default())
            .expect("the first server starts");
        let second_dir = tempfile::tempdir().expect("temp dir");
        for _ in 0..3 {
            let second = RedisServer::start_on(
                first.port(),
                second_dir.path().to_owned(),
                &Launch::default(),
            );
            match second {
                Err(Error::Testkit(why)) => assert!(
                    why.contains("Address already in use") || why.contains("exited"),
                    "refused, but for another reason: {why}"
                ),
                Err(other) => panic!("refused with an unexpected error: {other}"),
                Ok(second) => panic!(
                    "a server on the taken port {} reported started",
                    second.port()
                ),
            }
        }
        assert!(ping(first.port()), "the first server still answers");
    }
}
