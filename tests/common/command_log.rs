//! For the `quorumlock run` tests: the command line of a run, and a
//! scratch directory whose log several processes append lines to, in the
//! order things happen, to see whether a command wrote after another
//! holder's command started.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::unistd::Pid;
use quorumlock::testkit::TestCluster;

/// The `quorumlock` binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_quorumlock");

/// The arguments of `quorumlock run` on `resource`, with a node timeout a
/// loaded machine meets, then `extra` (the command after `--`).
pub fn run_args(cluster: &TestCluster, resource: &str, extra: &[&str]) -> Vec<String> {
    run_args_with_node_timeout(cluster, resource, "200ms", extra)
}

/// [`run_args`] with another node timeout.
pub fn run_args_with_node_timeout(
    cluster: &TestCluster,
    resource: &str,
    node_timeout: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "run".into(),
        "--nodes".into(),
        cluster.urls().join(","),
        resource.into(),
        "--node-timeout".into(),
        node_timeout.into(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// `quorumlock run` (see [`run_args`]), stdin closed, stderr captured.
pub fn run(cluster: &TestCluster, resource: &str, extra: &[&str]) -> Command {
    command_of(run_args(cluster, resource, extra))
}

/// `quorumlock` with `args`, stdin closed, stderr captured.
pub fn command_of(args: Vec<String>) -> Command {
    let mut command = Command::new(BIN);
    command
        .env_remove("QUORUMLOCK_NODES")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// B: waits up to 30 s for the lock, then logs that it started.
pub fn start_b(cluster: &TestCluster, resource: &str, log: &Scratch) -> Child {
    run(
        cluster,
        resource,
        &[
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            &log.append_stamped("B-start"),
        ],
    )
    .spawn()
    .expect("B starts")
}

/// A scratch directory with a log several processes append to. Dropped
/// (also when a test fails), it kills every process whose command line
/// names it: a command that outlived its lock must not outlive the test
/// too (holding the test's output open, it would hang whoever reads it).
pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let needle = self.dir.path().display().to_string();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&needle) {
                let _ =
                    nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

impl Scratch {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("log"), "").expect("log");
        Self { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A shell command that appends `line` to the log.
    pub fn append(&self, line: &str) -> String {
        format!("echo {line} >> {}", self.path("log").display())
    }

    /// A shell command that writes the time (nanoseconds since the epoch)
    /// to `<line>.at`, then appends `line` to the log: once a test saw the
    /// line, the stamp is there, even if the command is killed right after
    /// (beside a load, a `date` started after the line could be).
    pub fn append_stamped(&self, line: &str) -> String {
        format!(
            "date +%s%N > {}; {}",
            self.path(&format!("{line}.at")).display(),
            self.append(line)
        )
    }

    /// When the command of [`Self::append_stamped`] logged `line`.
    fn stamp(&self, line: &str) -> Option<Duration> {
        let text = std::fs::read_to_string(self.path(&format!("{line}.at"))).ok()?;
        text.trim().parse::<u64>().ok().map(Duration::from_nanos)
    }

    /// Fails unless B started (`B-start`) less than `due` after A's command
    /// logged `A-start` (both stamped): before A's scheduled write, so that
    /// "no write after B started" had a write to refuse. Returns the margin.
    pub fn assert_b_started_before_a_would_write(&self, context: &str, due: Duration) -> Duration {
        let (a, b) = (self.stamp("A-start"), self.stamp("B-start"));
        let (Some(a), Some(b)) = (a, b) else {
            panic!(
                "{context}: the start times were not stamped (A {a:?}, B {b:?}): {:?}",
                self.lines()
            );
        };
        let after = b.saturating_sub(a);
        assert!(
            after < due,
            "{context}: B started {after:?} after A's command, not before A's write due {due:?} \
             after it: the check that A did not write after B started tested nothing: {:?}",
            self.lines()
        );
        due - after
    }

    /// Writes a shell script and returns its path.
    pub fn script(&self, name: &str, body: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, body).expect("script");
        path.display().to_string()
    }

    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("log"))
            .expect("log")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    pub fn wait_for_line(&self, line: &str) {
        let until = Instant::now() + Duration::from_secs(15);
        while !self.lines().iter().any(|l| l == line) {
            assert!(
                Instant::now() < until,
                "setup: {line} never logged: {:?}",
                self.lines()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The pid a command wrote to `name` (`echo $$ > name`).
    pub fn wait_for_pid(&self, name: &str) -> Pid {
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(text) = std::fs::read_to_string(self.path(name))
                && let Ok(pid) = text.trim().parse::<i32>()
            {
                return Pid::from_raw(pid);
            }
            assert!(Instant::now() < until, "setup: {name} never written");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn assert_no_write_after_b_started(&self, context: &str) {
        let lines = self.lines();
        let b = lines.iter().position(|l| l == "B-start");
        let b = b.unwrap_or_else(|| panic!("{context}: B never started: {lines:?}"));
        assert!(
            !lines[b..].iter().any(|l| l == "A-write"),
            "{context}: A's command wrote after B's command started under the same lock: \
             {lines:?}"
        );
    }
}

/// The processes whose command name (`comm`) is `name`.
pub fn processes_named(name: &str) -> Vec<Pid> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == name {
            found.push(Pid::from_raw(pid));
        }
    }
    found
}

/// `parent` itself if its command name is `name`, else its first child so
/// named, within a second.
pub fn wait_for_child_named(parent: Pid, name: &str) -> Option<Pid> {
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        let comm = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        if comm(parent.as_raw()) == name {
            return Some(parent);
        }
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rfind(')')
                .and_then(|end| stat[end + 2..].split(' ').nth(1)?.parse::<i32>().ok());
            if ppid == Some(parent.as_raw()) && comm(pid) == name {
                return Some(Pid::from_raw(pid));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// The parent of `pid`, from `/proc`.
pub fn parent_of(pid: Pid) -> Option<Pid> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.iter().rposition(|&b| b == b')')? + 2;
    let rest = String::from_utf8_lossy(stat.get(after..)?).into_owned();
    rest.split(' ').nth(1)?.parse().ok().map(Pid::from_raw)
}
