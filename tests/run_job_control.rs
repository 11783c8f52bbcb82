//! `quorumlock run` under job control, stopped, and with its guardian
//! killed: the real binary, real redis-server nodes, real shells and a real
//! pseudo-terminal through `script` (util-linux). Each test failed before
//! its fix (an outside review's attacks): Ctrl-Z at an interactive shell,
//! a signal to `quorumlock` while the command's group is stopped, a loss
//! while the command owns a `tostop` terminal, a killed guardian, and a
//! resumed `quorumlock` whose command the guardian killed.

mod common;

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::command_log::Scratch;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use quorumlock::testkit::TestCluster;

const BIN: &str = env!("CARGO_BIN_EXE_quorumlock");

/// The arguments of `quorumlock run` on `resource` (before the command).
fn run_args(cluster: &TestCluster, resource: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "run".into(),
        "--nodes".into(),
        cluster.urls().join(","),
        "--resource".into(),
        resource.into(),
        "--node-timeout".into(),
        "200ms".into(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

fn run(cluster: &TestCluster, resource: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .env_remove("QUORUMLOCK_NODES")
        .args(run_args(cluster, resource, extra))
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Field `n` (1-based, as in proc(5)) of /proc/<pid>/stat.
fn stat_field(pid: i32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(n - 3).map(str::to_owned)
}

fn parent_of(pid: Pid) -> Option<Pid> {
    stat_field(pid.as_raw(), 4)?.parse().ok().map(Pid::from_raw)
}

fn state_of(pid: Pid) -> String {
    stat_field(pid.as_raw(), 3).unwrap_or_else(|| "gone".into())
}

/// The children of `parent` whose command line contains `needle`.
fn children_matching(parent: Pid, needle: &str) -> Vec<Pid> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if stat_field(pid, 4).and_then(|p| p.parse::<i32>().ok()) != Some(parent.as_raw()) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            found.push(Pid::from_raw(pid));
        }
    }
    found
}

/// Waits up to `limit` for `child` to exit.
fn wait_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills what a test left behind: quorumlock (its guardian then kills
/// the group), the command's group, and the harness process.
fn kill_leftovers(quorumlock: Option<Pid>, group: Option<Pid>, harness: Option<&mut Child>) {
    if let Some(pid) = quorumlock {
        let _ = signal::kill(pid, Signal::SIGKILL);
    }
    if let Some(pgid) = group {
        let _ = signal::killpg(pgid, Signal::SIGKILL);
    }
    if let Some(child) = harness {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A shell on a pseudo-terminal (`script`), fed through a pipe, its
/// output collected.
struct Pty {
    child: Child,
    output: Arc<Mutex<String>>,
}

impl Pty {
    fn start(shell_command: &str) -> Self {
        let mut child = Command::new("script")
            .args(["-qfec", shell_command, "/dev/null"])
            .env_remove("QUORUMLOCK_NODES")
            .env("PS1", "$ ")
            .env("TERM", "dumb")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("script(1) starts (util-linux)");
        let mut stdout = child.stdout.take().expect("stdout");
        let output = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&output);
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .expect("output")
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Self { child, output }
    }

    fn send(&mut self, bytes: &[u8]) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(bytes).expect("to the terminal");
        stdin.flush().expect("flush");
    }

    fn output(&self) -> String {
        self.output.lock().expect("output").clone()
    }

    /// Whether `text` shows up in the output within `limit`.
    fn shows(&self, text: &str, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.output().contains(text) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.output().contains(text)
    }
}

/// The command line of `quorumlock run` for a shell.
fn shell_line(cluster: &TestCluster, resource: &str, extra: &[&str]) -> String {
    let mut line = BIN.to_owned();
    for arg in run_args(cluster, resource, extra) {
        line.push(' ');
        line.push_str(&format!("'{arg}'"));
    }
    line
}

/// Job control: run from an interactive shell, `quorumlock run` hands the
/// terminal to the command's group; Ctrl-Z stops the command, and
/// `quorumlock` must take the terminal back and stop too, so that the shell
/// prompts again, as with `flock`. (It used to stay running, waiting
/// without seeing the stop: the shell never got the terminal back, and the
/// lock was extended with a stopped command for up to `--max-hold`.)
#[test]
fn ctrl_z_under_an_interactive_shell_gives_the_terminal_back() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:ctrl-z");
    let command = scratch.script(
        "a.sh",
        &format!(
            "echo $$ > {}; echo STARTED; sleep 30; echo FINISHED\n",
            scratch.path("pid").display()
        ),
    );
    let mut pty = Pty::start("bash --norc --noprofile -i");
    std::thread::sleep(Duration::from_millis(300));
    pty.send(
        format!(
            "{} -- sh {command}\n",
            shell_line(&cluster, &resource, &["--ttl", "3s"])
        )
        .as_bytes(),
    );
    let leader = scratch.wait_for_pid("pid");
    let quorumlock = parent_of(leader);
    assert!(pty.shows("STARTED", Duration::from_secs(10)), "setup");
    std::thread::sleep(Duration::from_millis(300));
    pty.send(b"\x1a"); // Ctrl-Z
    std::thread::sleep(Duration::from_millis(700));
    pty.send(b"echo SHELL-BACK-$((40+2))\n");
    let back = pty.shows("SHELL-BACK-42", Duration::from_secs(5));
    let command_state = state_of(leader);
    let quorumlock_state = quorumlock.map(state_of);
    pty.send(b"\x03"); // Ctrl-C
    std::thread::sleep(Duration::from_millis(500));
    let held = common::lock_entries(&cluster.urls(), &resource)
        .iter()
        .filter(|e| e.is_some())
        .count();
    let output = pty.output();
    kill_leftovers(quorumlock, Some(leader), Some(&mut pty.child));
    assert!(
        back,
        "after Ctrl-Z the shell never got the terminal back (5 s): the command was in state \
         {command_state:?}, quorumlock in state {quorumlock_state:?}, and after Ctrl-C too the \
         lock was still held on {held} of 3 nodes; terminal: {output:?}"
    );
}

/// A signal to `quorumlock` while the command's group is stopped (SIGSTOP
/// to the group, SIGTTIN of a background read) must still end it: the
/// signal is followed by SIGCONT, as a shell's `kill` of a stopped job
/// does. (It used to be forwarded alone: the stopped group never acted on
/// it, and the lock was extended for up to `--max-hold`.)
#[test]
fn sigterm_to_quorumlock_ends_a_stopped_command_group() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:stopped-group");
    let mut a = run(
        &cluster,
        &resource,
        &[
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            &format!("echo $$ > {}; sleep 30", scratch.path("pid").display()),
        ],
    )
    .spawn()
    .expect("A starts");
    let leader = scratch.wait_for_pid("pid");
    let quorumlock = Pid::from_raw(a.id() as i32);
    signal::killpg(leader, Signal::SIGSTOP).expect("stop the group");
    std::thread::sleep(Duration::from_millis(300));
    signal::kill(quorumlock, Signal::SIGTERM).expect("SIGTERM to quorumlock");
    let exited = wait_within(&mut a, Duration::from_secs(6));
    let command_state = state_of(leader);
    let held = common::lock_entries(&cluster.urls(), &resource)
        .iter()
        .filter(|e| e.is_some())
        .count();
    kill_leftovers(Some(quorumlock), Some(leader), Some(&mut a));
    assert!(
        exited.is_some(),
        "SIGTERM to quorumlock while its command's group was stopped: quorumlock still ran 6 s \
         later, the command in state {command_state:?} (the forwarded SIGTERM never acted), the \
         lock still held on {held} of 3 nodes"
    );
}

/// A loss while the command owns the terminal: `quorumlock` is then in the
/// background, and with `stty tostop` (or in an orphaned group) its writes
/// to the terminal fail or would stop it. The loss must still end the
/// command first and exit 123. (An `eprintln!` used to panic there: exit
/// 101, with the release sent while the group still ran.)
#[test]
fn a_loss_under_a_tostop_terminal_is_reported_not_a_panic() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:tostop");
    let command = scratch.script(
        "a.sh",
        "trap '' TERM; echo STARTED; sleep 6; echo FINISHED\n",
    );
    let line = format!(
        "stty tostop; {} -- sh {command}; echo EXIT=$?",
        shell_line(
            &cluster,
            &resource,
            &["--ttl", "3s", "--max-hold", "2s", "--grace", "1s"]
        )
    );
    let mut pty = Pty::start(&line);
    let shown = pty.shows("EXIT=", Duration::from_secs(15));
    let output = pty.output();
    kill_leftovers(None, None, Some(&mut pty.child));
    assert!(shown, "setup: quorumlock never exited: {output:?}");
    assert!(
        output.contains("EXIT=123"),
        "max_hold reached while the command held the terminal (stty tostop): quorumlock should \
         exit 123 (lost); terminal: {output:?} (101 = a Rust panic: eprintln! to the terminal \
         failed with EIO)"
    );
}

/// SIGKILL of the guardian, then of `quorumlock`: the parent-death signal
/// reaches the command only (children do not inherit it), so the guardian
/// is what kills the rest of the group, and `quorumlock` must replace one
/// that died. (It used to ignore the death: once `quorumlock` was killed
/// too, a grandchild ran on without a lock.)
#[test]
fn a_killed_guardian_is_noticed_before_quorumlock_dies_too() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:guardian");
    let mut a = run(
        &cluster,
        &resource,
        &[
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
            &format!(
                "{}; sh -c 'sleep 2.5; {}' & sleep 30",
                scratch.append("A-start"),
                scratch.append("A-write")
            ),
        ],
    )
    .spawn()
    .expect("A starts");
    scratch.wait_for_line("A-start");
    let quorumlock = Pid::from_raw(a.id() as i32);
    let guardians = children_matching(quorumlock, "__quorumlock-guard-group");
    assert_eq!(guardians.len(), 1, "setup: one guardian");
    signal::kill(guardians[0], Signal::SIGKILL).expect("kill the guardian");
    // A few of quorumlock's reports to its guardian (every TTL/6) fail.
    std::thread::sleep(Duration::from_millis(500));
    let mut b = run(
        &cluster,
        &resource,
        &[
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            &scratch.append("B-start"),
        ],
    )
    .spawn()
    .expect("B starts");
    std::thread::sleep(Duration::from_millis(200));
    signal::kill(quorumlock, Signal::SIGKILL).expect("kill quorumlock");
    let _ = a.wait();
    let b_status = wait_within(&mut b, Duration::from_secs(30));
    // The grandchild would have written by now.
    std::thread::sleep(Duration::from_millis(3_000));
    kill_leftovers(None, None, Some(&mut b));
    assert!(b_status.is_some_and(|s| s.success()), "B ran");
    scratch.assert_no_write_after_b_started(
        "guardian SIGKILLed, then quorumlock SIGKILLed (the leader died of its parent-death \
         signal, its child did not)",
    );
}

/// `quorumlock` stopped (SIGSTOP) past its lock's validity: the guardian
/// kills the command's group before the validity ends, and once
/// `quorumlock` is continued the run reports the loss (123), not the
/// command's SIGKILL (137) as though the command had ended on its own
/// (which it used to, in about a third of the runs).
#[test]
fn a_resumed_quorumlock_reports_the_loss_the_guardian_acted_on() {
    let cluster = common::cluster(3);
    let mut codes = Vec::new();
    for round in 0..6 {
        let scratch = Scratch::new();
        let resource = common::resource("job:resumed");
        let mut a = run(
            &cluster,
            &resource,
            &[
                "--ttl",
                "1s",
                "--",
                "sh",
                "-c",
                &format!("{}; sleep 30", scratch.append("A-start")),
            ],
        )
        .spawn()
        .expect("A starts");
        scratch.wait_for_line("A-start");
        let quorumlock = Pid::from_raw(a.id() as i32);
        signal::kill(quorumlock, Signal::SIGSTOP).expect("stop");
        std::thread::sleep(Duration::from_millis(2_000));
        signal::kill(quorumlock, Signal::SIGCONT).expect("continue");
        let status = wait_within(&mut a, Duration::from_secs(10));
        let mut stderr = String::new();
        if let Some(mut err) = a.stderr.take() {
            let _ = err.read_to_string(&mut stderr);
        }
        kill_leftovers(Some(quorumlock), None, Some(&mut a));
        let status = status.unwrap_or_else(|| panic!("round {round}: quorumlock never exited"));
        codes.push((status.code(), stderr));
    }
    assert!(
        codes.iter().all(|(code, _)| *code == Some(123)),
        "quorumlock stopped past its validity, its command killed by the guardian, then \
         continued: exit codes and messages {codes:?} (123 = lost; 137 = reported as the \
         command's own SIGKILL)"
    );
}

/// A command that exits but leaves a background process in its group: the
/// lock stays until that process is gone, and B starts only after its
/// write.
#[test]
fn a_background_process_left_in_the_group_keeps_the_lock() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:lingering");
    let a = run(
        &cluster,
        &resource,
        &[
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
            &format!(
                "{}; sh -c 'trap \"\" TERM HUP; sleep 2; {}' > /dev/null 2>&1 & exit 0",
                scratch.append("A-start"),
                scratch.append("A-write")
            ),
        ],
    )
    .spawn()
    .expect("A starts");
    scratch.wait_for_line("A-start");
    let mut b = run(
        &cluster,
        &resource,
        &[
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            &scratch.append("B-start"),
        ],
    )
    .spawn()
    .expect("B starts");
    let a_output = a.wait_with_output().expect("A exits");
    let b_status = wait_within(&mut b, Duration::from_secs(30));
    kill_leftovers(None, None, Some(&mut b));
    assert_eq!(
        a_output.status.code(),
        Some(0),
        "A: {}",
        String::from_utf8_lossy(&a_output.stderr)
    );
    assert!(b_status.is_some_and(|s| s.success()), "B ran");
    scratch.assert_no_write_after_b_started("the command exited leaving a process in its group");
}
