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
    let mut args: Vec<String> = vec![
        "run".into(),
        "--nodes".into(),
        cluster.urls().join(","),
        resource.into(),
        "--node-timeout".into(),
        "200ms".into(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// `quorumlock run` (see [`run_args`]), stdin closed, stderr captured.
pub fn run(cluster: &TestCluster, resource: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .env_remove("QUORUMLOCK_NODES")
        .args(run_args(cluster, resource, extra))
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// B: waits up to 30 s for the lock, then logs that it started.
pub fn start_b(cluster: &TestCluster, resource: &str, log: &Scratch) -> Child {
    run(
        cluster,
        resource,
        &["--wait", "30s", "--", "sh", "-c", &log.append("B-start")],
    )
    .spawn()
    .expect("B starts")
}

/// A scratch directory with a log several processes append to.
pub struct Scratch {
    dir: tempfile::TempDir,
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
