//! A throw-away PostgreSQL server for fencing tests and examples: `initdb`
//! in a temporary directory, `postgres` on a free loopback port, stopped and
//! deleted on drop. Needs the server binaries (Debian: `postgresql`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::{Pid, User, geteuid};
use tempfile::TempDir;

use super::{die_with_parent, free_port, log_tail};
use crate::error::{Error, Result};

/// What to tell someone whose machine has no PostgreSQL server binaries.
pub const MISSING_POSTGRES: &str = "PostgreSQL server binaries (initdb, postgres) were not \
     found on PATH or in /usr/lib/postgresql/*/bin. Install them \
     (Debian/Ubuntu: `sudo apt-get install -y postgresql`; macOS: `brew install postgresql`)";

const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// A running PostgreSQL server owned by the test; user `postgres`, no
/// password (trust authentication on loopback), database `postgres`.
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    // Declared last: removed after the server has stopped.
    dir: TempDir,
}

impl std::fmt::Debug for PostgresServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresServer")
            .field("port", &self.port)
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl PostgresServer {
    /// Creates a database cluster and starts a server on a free loopback
    /// port; returns once it accepts connections. As root, the server runs
    /// as the `postgres` user (PostgreSQL refuses to run as root).
    pub fn start() -> Result<Self> {
        let bin = find_binaries()?;
        let run_as = service_user()?;
        let dir = tempfile::Builder::new()
            .prefix("quorumlock-postgres-")
            .tempdir()
            .map_err(|e| testkit_error(format!("cannot create a temporary directory: {e}")))?;
        if let Some(user) = &run_as {
            std::os::unix::fs::chown(dir.path(), Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .map_err(|e| testkit_error(format!("cannot hand the data directory over: {e}")))?;
        }
        let data = dir.path().join("data");
        let log = dir.path().join("postgres.log");

        let initdb = command(&bin.join("initdb"), run_as.as_ref(), &log)?
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .status()
            .map_err(|e| testkit_error(format!("cannot run initdb: {e}")))?;
        if !initdb.success() {
            return Err(testkit_error(format!(
                "initdb failed ({initdb}); log: {}",
                log_tail(&log, 8)
            )));
        }

        let port = free_port()?;
        let child = command(&bin.join("postgres"), run_as.as_ref(), &log)?
            .arg("-D")
            .arg(&data)
            .arg("-p")
            .arg(port.to_string())
            .arg("-c")
            .arg("listen_addresses=127.0.0.1")
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.path().display()))
            // A test database: durability is not what is under test here.
            .args(["-c", "fsync=off", "-c", "max_connections=20"])
            .spawn()
            .map_err(|e| testkit_error(format!("cannot start postgres: {e}")))?;
        let mut server = Self {
            child: Some(child),
            port,
            dir,
        };
        server.wait_ready(&log)?;
        Ok(server)
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq-style connection string (`host=127.0.0.1 port=… user=postgres dbname=postgres`).
    pub fn connection_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    fn wait_ready(&mut self, log: &Path) -> Result<()> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if std::fs::read_to_string(log)
                .unwrap_or_default()
                .contains("ready to accept connections")
            {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = exited {
                return Err(testkit_error(format!(
                    "postgres exited with {status}; log: {}",
                    log_tail(log, 8)
                )));
            }
            if Instant::now() >= deadline {
                return Err(testkit_error(format!(
                    "postgres not ready within {STARTUP_TIMEOUT:?}; log: {}",
                    log_tail(log, 8)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SIGQUIT: immediate shutdown, which also ends the backends.
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = signal::kill(Pid::from_raw(pid), Signal::SIGQUIT);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn testkit_error(message: String) -> Error {
    Error::Testkit(message)
}

/// A command for a server binary, as `run_as` when given, with its output
/// appended to `log`.
fn command(program: &Path, run_as: Option<&User>, log: &Path) -> Result<Command> {
    let open_log = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| testkit_error(format!("cannot open {}: {e}", log.display())))
    };
    let mut command = Command::new(program);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(open_log()?))
        .stderr(Stdio::from(open_log()?));
    if let Some(user) = run_as {
        command
            .uid(user.uid.as_raw())
            .gid(user.gid.as_raw())
            .env("HOME", &user.dir)
            .env("USER", &user.name);
    }
    // After the uid change (which clears it), so it stays set.
    die_with_parent(&mut command);
    Ok(command)
}

/// The user to run as: `postgres` when we are root, else ourselves.
fn service_user() -> Result<Option<User>> {
    if !geteuid().is_root() {
        return Ok(None);
    }
    match User::from_name("postgres") {
        Ok(Some(user)) => Ok(Some(user)),
        _ => Err(testkit_error(
            "running as root, but there is no `postgres` user to run the server as; \
             install Debian's postgresql package, which creates it"
                .to_owned(),
        )),
    }
}

/// The directory holding `initdb` and `postgres`.
fn find_binaries() -> Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut versioned: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
                .collect()
        })
        .unwrap_or_default();
    // Newest major version first.
    versioned.sort_by_key(|path| {
        std::cmp::Reverse(
            path.parent()
                .and_then(|p| p.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0),
        )
    });
    on_path
        .into_iter()
        .chain(versioned)
        .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
        .ok_or_else(|| testkit_error(MISSING_POSTGRES.to_owned()))
}
