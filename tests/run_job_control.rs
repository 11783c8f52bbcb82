//! `quorumlock run` at a terminal and under signals, as a user meets it:
//! the real binary, real redis-server nodes, real shells and a real
//! pseudo-terminal (`script`, util-linux). Job control behaves as it does
//! for `flock` (Ctrl-Z, `fg`, `bg`, `&`, Ctrl-C in a script), and no path
//! (a stop past the validity, a killed guardian, `timeout` inside or
//! outside, a closed terminal) lets the command outlive the lock or leaves
//! a process behind. Most of these were found by two outside reviews; each
//! failed before its fix.

mod common;

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::command_log::{BIN, Scratch, run, run_args, start_b};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use quorumlock::testkit::TestCluster;

const GUARD: &str = "__quorumlock-guard-group";

/// How long the interactive shell may take to answer (see
/// `Pty::shell_answers`): beside a CPU and disk load, over 5 s.
const SHELL_ANSWER: Duration = Duration::from_secs(15);

/// Field `n` (1-based, as in proc(5)) of /proc/<pid>/stat.
fn stat_field(pid: i32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(n - 3).map(str::to_owned)
}

/// The start time (in clock ticks since boot) of every process a test
/// noted, by pid: a test kills only processes that are still the ones it
/// noted. Pids wrap (at 32 768 on this machine, within a run of the
/// suite), and a kill of a pid whose process had ended could hit another
/// test's process that got the number.
static NOTED: std::sync::LazyLock<Mutex<std::collections::HashMap<i32, String>>> =
    std::sync::LazyLock::new(Mutex::default);

/// Notes `pid` as the test's (see [`NOTED`]).
fn noted(pid: Pid) -> Pid {
    if let Some(start) = stat_field(pid.as_raw(), 22) {
        NOTED.lock().expect("noted").insert(pid.as_raw(), start);
    }
    pid
}

/// Whether `pid` is the process the test noted, or no process at all (a
/// signal to it then does nothing).
fn ours_or_gone(pid: Pid) -> bool {
    let Some(start) = stat_field(pid.as_raw(), 22) else {
        return true;
    };
    NOTED.lock().expect("noted").get(&pid.as_raw()) == Some(&start)
}

/// SIGKILL to `pid`, if it is still the process the test noted.
fn kill_if_ours(pid: Pid) {
    if ours_or_gone(pid) {
        let _ = signal::kill(pid, Signal::SIGKILL);
    }
}

/// SIGKILL to group `pgid`, if its leader is still the process the test
/// noted or gone (a group's number is not given to a new process while
/// the group has members).
fn killpg_if_ours(pgid: Pid) {
    if ours_or_gone(pgid) {
        let _ = signal::killpg(pgid, Signal::SIGKILL);
    }
}

fn parent_of(pid: Pid) -> Option<Pid> {
    stat_field(pid.as_raw(), 4)?.parse().ok().map(Pid::from_raw)
}

/// The `quorumlock` that runs the command `leader`: the parent of its
/// parent, the guardian.
fn quorumlock_of(leader: Pid) -> Option<Pid> {
    let guardian = parent_of(leader)?;
    parent_of(guardian).map(noted)
}

fn state_of(pid: Pid) -> String {
    stat_field(pid.as_raw(), 3).unwrap_or_else(|| "gone".into())
}

fn pgrp_of(pid: Pid) -> Option<i32> {
    stat_field(pid.as_raw(), 5)?.parse().ok()
}

/// The terminal's foreground group as seen from `pid` (tpgid).
fn tpgid_of(pid: Pid) -> Option<i32> {
    stat_field(pid.as_raw(), 8)?.parse().ok()
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

/// The guardians of `quorumlock` (its children running the guard), which
/// the "no guardian left behind" checks then watch: fails unless one is
/// found and the command `leader` is its child, so that those checks
/// never pass on an empty list.
fn guardians_of(quorumlock: Pid, leader: Pid) -> Vec<Pid> {
    let guardians: Vec<Pid> = children_matching(quorumlock, GUARD)
        .into_iter()
        .map(noted)
        .collect();
    let parent = parent_of(leader);
    assert!(
        !guardians.is_empty() && parent.is_some_and(|p| guardians.contains(&p)),
        "setup: quorumlock {quorumlock} has guardians {guardians:?} (children whose command line \
         has {GUARD:?}), but the command {leader}'s parent is {parent:?}: no guardian to watch"
    );
    guardians
}

/// Every live process whose command line contains `needle`.
fn processes_matching(needle: &str) -> Vec<(Pid, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push((Pid::from_raw(pid), cmdline));
        }
    }
    found
}

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

/// Waits until `pid` is gone (not even a zombie) or `limit` passes.
fn gone_within(pid: Pid, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if state_of(pid) == "gone" {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    state_of(pid) == "gone"
}

fn held_on(cluster: &TestCluster, resource: &str) -> usize {
    common::lock_entries(&cluster.urls(), resource)
        .iter()
        .filter(|e| e.is_some())
        .count()
}

/// Kills what a test left behind: quorumlock (its guardian then kills
/// the group), the command's group, and the harness process.
fn kill_leftovers(quorumlock: Option<Pid>, group: Option<Pid>, harness: Option<&mut Child>) {
    if let Some(pid) = quorumlock {
        kill_if_ours(pid);
    }
    if let Some(pgid) = group {
        killpg_if_ours(pgid);
    }
    if let Some(child) = harness {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A shell on a pseudo-terminal (`script`), fed through a pipe.
struct Pty {
    child: Child,
    output: Arc<Mutex<String>>,
}

impl Pty {
    fn start(shell_command: &str) -> Self {
        let mut command = Command::new("script");
        // A terminal's Ctrl-C and Ctrl-\ do what they do at a login: a
        // test run started in the background (`cargo test &`, nohup, CI
        // under a non-interactive shell) ignores SIGINT and SIGQUIT, and
        // the ignoring is inherited down to the jobs the test's shell
        // runs: the control's flock and sleep then outlived a Ctrl-C (in
        // every background run, never in the foreground).
        // SAFETY: only sigaction, which is async-signal-safe, runs between
        // fork and exec.
        unsafe {
            command.pre_exec(|| {
                for interrupt in [Signal::SIGINT, Signal::SIGQUIT] {
                    signal::signal(interrupt, signal::SigHandler::SigDfl)
                        .map_err(std::io::Error::from)?;
                }
                Ok(())
            });
        }
        let mut child = command
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

    fn interactive() -> Self {
        let pty = Self::start("bash --norc --noprofile -i");
        std::thread::sleep(Duration::from_millis(400));
        pty
    }

    fn send(&mut self, bytes: &[u8]) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        let _ = stdin.write_all(bytes);
        let _ = stdin.flush();
    }

    fn output(&self) -> String {
        self.output.lock().expect("output").clone()
    }

    /// Whether the terminal shows `text` within `limit`, or within
    /// [`SHELL_ANSWER`] if that is longer: each check is that it shows
    /// at all, and a loaded machine's terminal lags by seconds.
    /// Whether `text` shows within `limit` (at least [`SHELL_ANSWER`]).
    /// The terminal echoes what is typed: the output of a typed `echo X`
    /// is looked for as "\nX" (on a loaded machine a key sent on seeing
    /// the echo came before the command ran).
    fn shows(&self, text: &str, limit: Duration) -> bool {
        let until = Instant::now() + limit.max(SHELL_ANSWER);
        while Instant::now() < until {
            if self.output().contains(text) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.output().contains(text)
    }

    fn count(&self, text: &str) -> usize {
        self.output().matches(text).count()
    }

    /// The interactive shell answers a command (proof it has the terminal).
    /// Whether the interactive shell answers a command within
    /// [`SHELL_ANSWER`]: what is checked is that it answers at all (it
    /// has the terminal back), not how soon, and a loaded machine took
    /// over 5 s.
    fn shell_answers(&mut self, tag: &str) -> bool {
        // The arithmetic keeps the echoed command line from matching.
        self.send(format!("echo {tag}-$((40+2))\n").as_bytes());
        self.shows(&format!("{tag}-42"), SHELL_ANSWER)
    }

    fn close(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn shell_line(cluster: &TestCluster, resource: &str, extra: &[&str]) -> String {
    let mut line = BIN.to_owned();
    for arg in run_args(cluster, resource, extra) {
        line.push(' ');
        line.push_str(&format!("'{arg}'"));
    }
    line
}

/// Kills by pid what a test may have left: quorumlock, a group, guardians.
fn cleanup(quorumlock: Option<Pid>, group: Option<Pid>, guardians: &[Pid]) {
    if let Some(pid) = quorumlock {
        kill_if_ours(pid);
    }
    if let Some(pgid) = group {
        killpg_if_ours(pgid);
    }
    for g in guardians {
        kill_if_ours(*g);
    }
}

/// Starts `quorumlock run` at an interactive shell on a pty with a script
/// that writes its pid and prints STARTED; returns (pty, leader, quorumlock, guardians).
fn start_interactive(
    cluster: &TestCluster,
    resource: &str,
    scratch: &Scratch,
    extra: &[&str],
    body: &str,
    suffix: &str,
) -> (Pty, Pid, Pid, Vec<Pid>) {
    let command = scratch.script(
        "a.sh",
        &format!(
            "echo $$ > {}; echo STARTED\n{body}",
            scratch.path("pid").display()
        ),
    );
    let mut pty = Pty::interactive();
    pty.send(
        format!(
            "{} -- sh {command}{suffix}\n",
            shell_line(cluster, resource, extra)
        )
        .as_bytes(),
    );
    let leader = noted(scratch.wait_for_pid("pid"));
    let quorumlock = quorumlock_of(leader).expect("quorumlock is the leader's grandparent");
    assert!(
        pty.shows("STARTED", Duration::from_secs(10)),
        "setup: STARTED"
    );
    let guardians = guardians_of(quorumlock, leader);
    (pty, leader, quorumlock, guardians)
}

// ---------------------------------------------------------------------------
// Job control at an interactive shell
// ---------------------------------------------------------------------------

/// Ctrl-Z, then `fg` within the validity: the lock survives the short
/// stop, the command gets the terminal back and reads from it, and the run
/// ends with the command's code, leaving no guardian behind.
#[test]
fn ctrl_z_then_fg_gives_the_terminal_back_and_keeps_the_lock() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:fg");
    let (mut pty, leader, quorumlock, guardians) = start_interactive(
        &cluster,
        &resource,
        &scratch,
        &["--ttl", "6s"],
        "sleep 1; read x; echo GOT-$x; exit 7\n",
        "",
    );
    std::thread::sleep(Duration::from_millis(200));
    pty.send(b"\x1a");
    let stopped = pty.shows("Stopped", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(1_000));
    pty.send(b"fg\n");
    std::thread::sleep(Duration::from_millis(1_500));
    let held_after_fg = held_on(&cluster, &resource);
    pty.send(b"hello\n");
    let got = pty.shows("GOT-hello", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(500));
    pty.send(b"echo EXIT=$?\n");
    let exited = pty.shows("\nEXIT=", Duration::from_secs(5));
    let output = pty.output();
    let guardians_gone = guardians
        .iter()
        .all(|g| gone_within(*g, Duration::from_secs(3)));
    let quorumlock_state = state_of(quorumlock);
    cleanup(Some(quorumlock), Some(leader), &guardians);
    pty.close();
    assert!(
        stopped,
        "Ctrl-Z: the shell never reported the job stopped: {output:?}"
    );
    assert_eq!(
        held_after_fg, 3,
        "the lock did not survive a 1 s stop (TTL 6 s)"
    );
    assert!(
        got,
        "after Ctrl-Z and fg, the command never read the line typed at the terminal: {output:?}"
    );
    assert!(
        exited && output.contains("EXIT=7"),
        "the command's exit code 7 was not passed on: {output:?}"
    );
    assert!(
        guardians_gone,
        "a guardian outlived the run (quorumlock {quorumlock_state}): {guardians:?}"
    );
}

/// Ctrl-Z, `bg`, and the command finishes in the background: the
/// interactive shell keeps its terminal (quorumlock, when it handed the
/// terminal around, took it back here and the shell read end-of-file).
#[test]
fn a_command_finishing_after_bg_leaves_the_terminal_to_the_shell() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:bg-exit");
    let (mut pty, leader, quorumlock, guardians) = start_interactive(
        &cluster,
        &resource,
        &scratch,
        &["--ttl", "6s"],
        "sleep 2; echo FINISHED\n",
        "",
    );
    std::thread::sleep(Duration::from_millis(200));
    pty.send(b"\x1a");
    assert!(
        pty.shows("Stopped", Duration::from_secs(5)),
        "setup: stopped"
    );
    pty.send(b"bg\n");
    assert!(
        pty.shows("FINISHED", Duration::from_secs(10)),
        "setup: finished"
    );
    // quorumlock exits right after its command.
    let quorumlock_gone = gone_within(quorumlock, Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    let answers = pty.shell_answers("SHELL-OK");
    let shell_alive = pty.child.try_wait().ok().flatten().is_none();
    let output = pty.output();
    cleanup(Some(quorumlock), Some(leader), &guardians);
    pty.close();
    assert!(quorumlock_gone, "setup: quorumlock exited");
    assert!(
        answers,
        "Ctrl-Z, bg, then the command finished: the interactive shell no longer answers \
         (shell still running: {shell_alive}); quorumlock, a background job, handed the \
         terminal to its own group when the command ended; terminal: {output:?}"
    );
}

/// Ctrl-Z, `bg`, then the command reads the terminal in the background
/// (SIGTTIN stops it): the shell the user types at keeps the terminal.
#[test]
fn a_background_read_after_bg_leaves_the_terminal_to_the_shell() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:bg-read");
    let (mut pty, leader, quorumlock, guardians) = start_interactive(
        &cluster,
        &resource,
        &scratch,
        &["--ttl", "6s"],
        "sleep 1.5; read x; echo GOT-$x\n",
        "",
    );
    std::thread::sleep(Duration::from_millis(200));
    pty.send(b"\x1a");
    assert!(
        pty.shows("Stopped", Duration::from_secs(5)),
        "setup: stopped"
    );
    pty.send(b"bg\n");
    // The read (SIGTTIN) comes 1.5 s after the start.
    std::thread::sleep(Duration::from_millis(2_500));
    let shell_pid = parent_of(quorumlock);
    let tpgid = shell_pid.and_then(tpgid_of);
    let shell_pgrp = shell_pid.and_then(pgrp_of);
    let answers = pty.shell_answers("SHELL-OK");
    let shell_alive = pty.child.try_wait().ok().flatten().is_none();
    let output = pty.output();
    let states = (state_of(quorumlock), state_of(leader));
    cleanup(Some(quorumlock), Some(leader), &guardians);
    pty.close();
    let after_bg = &output[output.rfind("# bg").unwrap_or(0)..];
    let shell_saw_eof = after_bg.contains("There are stopped jobs") || after_bg.contains("# exit");
    assert!(
        answers && !shell_saw_eof,
        "Ctrl-Z, bg, then a background read (SIGTTIN): the interactive shell no longer answers \
         (shell alive: {shell_alive}; terminal foreground group {tpgid:?}, shell's group \
         {shell_pgrp:?}, quorumlock pid {quorumlock}; states quorumlock/command {states:?}); \
         the shell read an end of file at its prompt (it tried to exit; only the stopped job \
         kept it alive): {shell_saw_eof}; terminal: {output:?}"
    );
}

/// Ctrl-Z, `bg`, then `fg`: the command must be in the foreground again
/// and read what is typed (one `fg`, as for any job).
#[test]
fn fg_after_bg_gives_the_command_the_terminal() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:bg-fg");
    let (mut pty, leader, quorumlock, guardians) = start_interactive(
        &cluster,
        &resource,
        &scratch,
        &["--ttl", "6s"],
        "sleep 2; read x; echo GOT-$x\n",
        "",
    );
    std::thread::sleep(Duration::from_millis(200));
    pty.send(b"\x1a");
    assert!(
        pty.shows("Stopped", Duration::from_secs(5)),
        "setup: stopped"
    );
    pty.send(b"bg\n");
    std::thread::sleep(Duration::from_millis(300));
    pty.send(b"fg\n");
    // The command reads 2 s after its start: it must then be in the foreground.
    std::thread::sleep(Duration::from_millis(2_500));
    let tpgid = tpgid_of(quorumlock);
    pty.send(b"hello\n");
    let got = pty.shows("GOT-hello", Duration::from_secs(4));
    let stopped_again = pty.count("Stopped");
    let output = pty.output();
    cleanup(Some(quorumlock), Some(leader), &guardians);
    pty.close();
    assert!(
        got,
        "Ctrl-Z, bg, fg: the command never read the line typed after fg (terminal foreground \
         group {tpgid:?}, command's group {leader}, quorumlock {quorumlock}; the shell printed \
         \"Stopped\" {stopped_again} times); terminal: {output:?}"
    );
}

/// `quorumlock run ... &` then `fg`: the command must get the terminal,
/// as with `flock ... &` then `fg`.
#[test]
fn a_run_started_in_the_background_then_fg_gives_the_command_the_terminal() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:amp-fg");
    let (mut pty, leader, quorumlock, guardians) = start_interactive(
        &cluster,
        &resource,
        &scratch,
        &["--ttl", "3s", "--max-hold", "30s"],
        "sleep 1; read x; echo GOT-$x\n",
        " &",
    );
    std::thread::sleep(Duration::from_millis(200));
    pty.send(b"fg\n");
    std::thread::sleep(Duration::from_millis(2_000));
    let command_state = state_of(leader);
    let tpgid = tpgid_of(quorumlock);
    pty.send(b"hello\n");
    let got = pty.shows("GOT-hello", Duration::from_secs(4));
    let held = held_on(&cluster, &resource);
    let output = pty.output();
    cleanup(Some(quorumlock), Some(leader), &guardians);
    pty.close();
    assert!(
        got,
        "`quorumlock run ... &` then fg: the command never read the line typed (its state \
         {command_state:?}, terminal foreground group {tpgid:?}, command's group {leader}, \
         quorumlock {quorumlock}); meanwhile the lock stays held on {held} of 3 nodes by a \
         stopped command; terminal: {output:?}"
    );
}

/// Ctrl-Z under a wrapper without job control (`bash -c '...; echo'`, as
/// any script, `/usr/bin/time` or `sudo` is): the whole job stops and the
/// interactive shell gets the terminal back, as with flock.
#[test]
fn ctrl_z_under_a_non_interactive_script_gives_the_shell_back() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:bash-c");
    let command = scratch.script(
        "a.sh",
        &format!(
            "echo $$ > {}; echo STARTED; sleep 30\n",
            scratch.path("pid").display()
        ),
    );
    let mut pty = Pty::interactive();
    pty.send(
        format!(
            "bash -c \"{} -- sh {command}; echo AFTER\"\n",
            shell_line(&cluster, &resource, &["--ttl", "3s"])
        )
        .as_bytes(),
    );
    let leader = noted(scratch.wait_for_pid("pid"));
    let quorumlock = quorumlock_of(leader).expect("quorumlock");
    let guardians = guardians_of(quorumlock, leader);
    assert!(pty.shows("STARTED", Duration::from_secs(10)), "setup");
    std::thread::sleep(Duration::from_millis(300));
    pty.send(b"\x1a");
    std::thread::sleep(Duration::from_millis(700));
    let answers = pty.shell_answers("SHELL-BACK");
    let states = (state_of(quorumlock), state_of(leader));
    // Ctrl-C does not help either: the script waits for a stopped quorumlock.
    pty.send(b"\x03");
    std::thread::sleep(Duration::from_millis(4_000));
    let after_ctrl_c = (state_of(quorumlock), state_of(leader));
    let output = pty.output();
    cleanup(Some(quorumlock), Some(leader), &guardians);
    pty.close();
    assert!(
        answers,
        "Ctrl-Z under `bash -c 'quorumlock run ...; echo AFTER'`: the shell never got the \
         terminal back (quorumlock/command states {states:?}; 4 s after a Ctrl-C too: \
         {after_ctrl_c:?}, the guardian having killed the command at the end of the \
         validity); terminal: {output:?}"
    );
}

/// Ctrl-C in a script that runs `quorumlock run` at a terminal: the
/// command dies of SIGINT, and so does quorumlock, so the script stops
/// too, as with flock (it used to exit 130 normally, and the script went
/// on with its next line).
#[test]
fn ctrl_c_stops_the_script_that_runs_quorumlock_as_it_does_with_flock() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:bash-c-int");
    let lockfile = scratch.path("flock");
    let mut outcomes = Vec::new();
    for (who, prefix) in [
        ("flock", format!("flock {} ", lockfile.display())),
        (
            "quorumlock",
            format!("{} -- ", shell_line(&cluster, &resource, &["--ttl", "3s"])),
        ),
    ] {
        let mut pty = Pty::interactive();
        // The marker the command prints (START2ED) is not in the typed
        // line, which the terminal echoes.
        pty.send(
            format!(
                "bash -c \"{prefix}sh -c 'echo START$((1+1))ED; sleep 30'; echo SCRIPT-CONTINUED\"\n"
            )
            .as_bytes(),
        );
        assert!(
            pty.shows("START2ED", Duration::from_secs(10)),
            "setup {who}"
        );
        std::thread::sleep(Duration::from_millis(300));
        pty.send(b"\x03");
        std::thread::sleep(Duration::from_millis(1_500));
        assert!(
            pty.shell_answers("DONE"),
            "setup {who}: the shell never answered after the Ctrl-C; terminal: {:?}",
            pty.output()
        );
        let output = pty.output();
        pty.close();
        let after = &output[output.find("START2ED").unwrap_or(0)..];
        outcomes.push((who, after.contains("SCRIPT-CONTINUED"), output));
    }
    assert!(
        !outcomes[0].1,
        "control: with flock, Ctrl-C stopped the script: {:?}",
        outcomes[0].2
    );
    assert!(
        !outcomes[1].1,
        "Ctrl-C at a terminal while a script ran `quorumlock run`: the script carried on with \
         its next line (quorumlock took the terminal for its command's group; the script never \
         got SIGINT and saw an ordinary exit 130); with flock it stopped; terminal: {:?}",
        outcomes[1].2
    );
}

/// Standard input not a terminal (`< /dev/null`) at an interactive shell:
/// Ctrl-Z stops quorumlock and the command alike.
#[test]
fn ctrl_z_with_stdin_redirected_stops_the_command_too() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:stdin-null");
    let (mut pty, leader, quorumlock, guardians) = start_interactive(
        &cluster,
        &resource,
        &scratch,
        &["--ttl", "6s"],
        "while :; do echo TICK; sleep 0.2; done\n",
        " < /dev/null",
    );
    std::thread::sleep(Duration::from_millis(300));
    pty.send(b"\x1a");
    let stopped = pty.shows("Stopped", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    let before = pty.count("TICK");
    std::thread::sleep(Duration::from_millis(1_500));
    let after = pty.count("TICK");
    let states = (state_of(quorumlock), state_of(leader));
    let output = pty.output();
    cleanup(Some(quorumlock), Some(leader), &guardians);
    pty.close();
    assert!(
        stopped,
        "setup: the shell reported the job stopped: {output:?}"
    );
    assert_eq!(
        after,
        before,
        "Ctrl-Z with stdin redirected: the shell reported the job stopped, but the command \
         went on printing ({} more TICKs in 1.5 s; quorumlock/command states {states:?}): \
         quorumlock stopped alone and extends nothing, so the command is killed at the end \
         of the validity although the user only paused it",
        after - before
    );
}

/// Ctrl-Z, then a stop longer than the validity, then `fg`: the guardian
/// kills the command before the validity ends, the run reports the loss
/// (123), the shell gets its terminal back and no guardian is left.
#[test]
fn a_stop_past_the_validity_ends_as_lost_and_leaves_nothing() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:long-stop");
    let (mut pty, leader, quorumlock, guardians) = start_interactive(
        &cluster,
        &resource,
        &scratch,
        &["--ttl", "2s"],
        "sleep 30\n",
        "",
    );
    std::thread::sleep(Duration::from_millis(200));
    pty.send(b"\x1a");
    assert!(
        pty.shows("Stopped", Duration::from_secs(5)),
        "setup: stopped"
    );
    std::thread::sleep(Duration::from_millis(3_000));
    let command_during_stop = state_of(leader);
    let held_during_stop = held_on(&cluster, &resource);
    pty.send(b"fg\n");
    std::thread::sleep(Duration::from_millis(1_500));
    pty.send(b"echo EXIT=$?\n");
    let exited = pty.shows("\nEXIT=", Duration::from_secs(5));
    let answers = pty.shell_answers("SHELL-OK");
    let guardians_gone = guardians
        .iter()
        .all(|g| gone_within(*g, Duration::from_secs(3)));
    let quorumlock_gone = gone_within(quorumlock, Duration::from_secs(3));
    let output = pty.output();
    cleanup(Some(quorumlock), Some(leader), &guardians);
    pty.close();
    assert!(
        matches!(command_during_stop.as_str(), "gone" | "Z") && held_during_stop == 0,
        "3 s into a stop with a 2 s TTL: the command was {command_during_stop:?} and the lock \
         held on {held_during_stop} nodes"
    );
    assert!(
        exited && output.contains("EXIT=123") && answers,
        "fg after a stop past the validity: expected exit 123 and the shell back; terminal: \
         {output:?}"
    );
    assert!(
        guardians_gone && quorumlock_gone,
        "left behind: guardians {guardians:?} gone={guardians_gone}, quorumlock gone={quorumlock_gone}"
    );
}

/// Ctrl-Z, then `kill %1` (SIGTERM then SIGCONT to quorumlock's group):
/// the command's group ends, the lock is released at once, exit 143, and
/// nothing is left.
#[test]
fn ctrl_z_then_kill_job_ends_everything_and_releases() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:kill-job");
    let (mut pty, leader, quorumlock, guardians) = start_interactive(
        &cluster,
        &resource,
        &scratch,
        &["--ttl", "20s"],
        "sh -c 'sleep 30' & sleep 30\n",
        "",
    );
    std::thread::sleep(Duration::from_millis(200));
    pty.send(b"\x1a");
    assert!(
        pty.shows("Stopped", Duration::from_secs(5)),
        "setup: stopped"
    );
    // bash may still list the job as stopped for a moment after `kill`
    // continues it (quorumlock then cleans up: a release, not an instant
    // death); `wait` on a job bash thinks stopped returns at once.
    pty.send(
        b"kill %1; while jobs -s %1 >/dev/null 2>&1; do sleep 0.05; done; wait %1 2>/dev/null; \
          echo EXIT=$?\n",
    );
    let exited = pty.shows("\nEXIT=", Duration::from_secs(8));
    let held = held_on(&cluster, &resource);
    let group_left = nix::sys::signal::killpg(leader, None).is_ok();
    let guardians_gone = guardians
        .iter()
        .all(|g| gone_within(*g, Duration::from_secs(3)));
    let answers = pty.shell_answers("SHELL-OK");
    let output = pty.output();
    cleanup(Some(quorumlock), Some(leader), &guardians);
    pty.close();
    // Ended by SIGTERM, as the command was, or with 143: bash reports the
    // job itself ("Terminated", "Exit 143"), or `wait` gives 143.
    let ended_by_term = ["EXIT=143", "Terminated", "Exit 143"]
        .iter()
        .any(|seen| output.contains(seen));
    assert!(
        exited && ended_by_term,
        "kill %1 of a stopped `quorumlock run`: expected an end by SIGTERM; terminal: {output:?}"
    );
    assert_eq!(
        held, 0,
        "the lock (TTL 20 s) was not released after kill %1"
    );
    assert!(!group_left, "the command's group outlived quorumlock");
    assert!(
        guardians_gone && answers,
        "guardians left or shell lost: {output:?}"
    );
}

/// The terminal closes (the pty goes away) while the job is stopped: the
/// command's whole group ends, quorumlock exits, no guardian is left, and
/// the lock does not outlive them.
#[test]
fn a_terminal_closed_while_stopped_leaves_nothing_running() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:hangup");
    let (mut pty, leader, quorumlock, guardians) = start_interactive(
        &cluster,
        &resource,
        &scratch,
        &["--ttl", "20s"],
        &format!(
            "sh -c 'sleep 4; {}' & sleep 30\n",
            scratch.append("A-write")
        ),
        "",
    );
    std::thread::sleep(Duration::from_millis(200));
    pty.send(b"\x1a");
    assert!(
        pty.shows("Stopped", Duration::from_secs(5)),
        "setup: stopped"
    );
    let script = Pid::from_raw(pty.child.id() as i32);
    signal::kill(script, Signal::SIGKILL).expect("close the terminal");
    let _ = pty.child.wait();
    let quorumlock_gone = gone_within(quorumlock, Duration::from_secs(8));
    let group_left = nix::sys::signal::killpg(leader, None).is_ok();
    let guardians_gone = guardians
        .iter()
        .all(|g| gone_within(*g, Duration::from_secs(3)));
    let held = held_on(&cluster, &resource);
    let state = state_of(quorumlock);
    std::thread::sleep(Duration::from_millis(4_000));
    let wrote = scratch.lines();
    cleanup(Some(quorumlock), Some(leader), &guardians);
    assert!(
        quorumlock_gone && !group_left && guardians_gone,
        "terminal closed while the job was stopped: quorumlock gone={quorumlock_gone} (state \
         {state}), the command's group still there={group_left}, guardians gone={guardians_gone}"
    );
    assert_eq!(
        held, 0,
        "the lock (TTL 20 s) outlived quorumlock after the hangup"
    );
    assert!(
        wrote.is_empty(),
        "a grandchild wrote after the hangup: {wrote:?}"
    );
}

/// A command that runs its work under `timeout` (coreutils; it puts
/// itself in a process group of its own unless `--foreground`), as many
/// scripts do: quorumlock follows its descendants, not only its group (it
/// is a child subreaper), so the work ends before B starts (it used to
/// write after).
#[test]
fn work_under_timeout_in_the_command_does_not_outlive_the_lock() {
    let cluster = common::cluster(3);
    let log = Scratch::new();
    let resource = common::resource("job:timeout-inside");
    let a = run(
        &cluster,
        &resource,
        &[
            "--ttl",
            "3s",
            "--max-hold",
            "1s",
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
            &format!(
                "{}; timeout 30 sh -c 'sleep 3; {}'",
                log.append_stamped("A-start"),
                log.append("A-write")
            ),
        ],
    )
    .spawn()
    .expect("A starts");
    log.wait_for_line("A-start");
    let mut b = start_b(&cluster, &resource, &log);
    let a_out = a.wait_with_output().expect("A exits");
    let b_status = wait_within(&mut b, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(3_500));
    let leftovers = processes_matching(&log.path("log").display().to_string());
    for (pid, _) in &leftovers {
        let _ = signal::kill(*pid, Signal::SIGKILL);
    }
    assert_eq!(
        a_out.status.code(),
        Some(123),
        "A: {}",
        String::from_utf8_lossy(&a_out.stderr)
    );
    assert!(b_status.is_some_and(|s| s.success()), "B ran");
    let context = "max_hold reached while the command ran its work under `timeout 30` (which \
                   leaves the group): quorumlock released once its group was empty";
    let margin = log.assert_b_started_before_a_would_write(context, Duration::from_secs(3));
    eprintln!("B started {margin:?} before A's write was due");
    log.assert_no_write_after_b_started(context);
}

/// quorumlock stopped (SIGSTOP, or starved) and continued right after its
/// guardian killed the command, which it does 100 ms before the validity
/// it was told ends: the lease may still be valid then, and the run must
/// report the loss (123), not the guardian's SIGKILL as the command's own
/// death (137).
#[test]
fn a_quorumlock_continued_within_the_kill_margin_reports_the_loss() {
    let cluster = common::cluster(3);
    let mut codes = Vec::new();
    for round in 0..4 {
        let scratch = Scratch::new();
        let resource = common::resource("job:margin");
        let mut a = run(
            &cluster,
            &resource,
            &[
                "--ttl",
                "1s",
                "--",
                "sh",
                "-c",
                &format!("echo $$ > {}; sleep 30", scratch.path("pid").display()),
            ],
        )
        .spawn()
        .expect("A starts");
        let leader = noted(scratch.wait_for_pid("pid"));
        std::thread::sleep(Duration::from_millis(300));
        let quorumlock = Pid::from_raw(a.id() as i32);
        signal::kill(quorumlock, Signal::SIGSTOP).expect("stop");
        let until = Instant::now() + Duration::from_secs(3);
        // Killed: a zombie, or already reaped by the guardian, its parent.
        let ended = || matches!(state_of(leader).as_str(), "Z" | "gone");
        while !ended() && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(500));
        }
        let killed = ended();
        let seen = (state_of(leader), until.elapsed());
        signal::kill(quorumlock, Signal::SIGCONT).expect("continue");
        let status = wait_within(&mut a, Duration::from_secs(10));
        let mut stderr = String::new();
        if let Some(mut err) = a.stderr.take() {
            let _ = err.read_to_string(&mut stderr);
        }
        cleanup(Some(quorumlock), Some(leader), &[]);
        let _ = a.wait();
        assert!(
            killed,
            "round {round}: setup: the guardian did not kill the command within 3 s of \
             quorumlock's stop (its state then, and how long after the 3 s: {seen:?}); \
             quorumlock then exited {status:?}: {stderr}"
        );
        codes.push((status.and_then(|s| s.code()), stderr));
    }
    assert!(
        codes.iter().all(|(code, _)| *code == Some(123)),
        "quorumlock stopped until its guardian killed the command (100 ms before the validity \
         ended), then continued at once: exit codes and messages {codes:?} (123 = lost; 137 = \
         the guardian's SIGKILL reported as the command's own)"
    );
}

/// Under `timeout 2` (coreutils: SIGTERM to quorumlock, then to its
/// group): the command's group ends, the lock is released, exit 124 from
/// timeout, and no guardian is left.
#[test]
fn run_under_timeout_ends_cleanly() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:timeout-outside");
    let mut args = vec!["2".to_owned(), BIN.to_owned()];
    args.extend(run_args(
        &cluster,
        &resource,
        &[
            "--ttl",
            "20s",
            "--",
            "sh",
            "-c",
            &format!(
                "echo $$ > {}; sh -c 'sleep 30' & sleep 30",
                scratch.path("pid").display()
            ),
        ],
    ));
    let mut t = Command::new("timeout")
        .args(&args)
        .env_remove("QUORUMLOCK_NODES")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("timeout starts");
    let leader = noted(scratch.wait_for_pid("pid"));
    let quorumlock = quorumlock_of(leader).expect("quorumlock");
    let guardians = guardians_of(quorumlock, leader);
    let status = wait_within(&mut t, Duration::from_secs(10));
    let held = held_on(&cluster, &resource);
    let group_left = signal::killpg(leader, None).is_ok();
    let guardians_gone = guardians
        .iter()
        .all(|g| gone_within(*g, Duration::from_secs(3)));
    cleanup(Some(quorumlock), Some(leader), &guardians);
    let _ = t.kill();
    let _ = t.wait();
    assert_eq!(status.and_then(|s| s.code()), Some(124), "timeout's code");
    assert!(
        held == 0 && !group_left && guardians_gone,
        "after `timeout 2 quorumlock run`: lock held on {held} nodes, group left={group_left}, \
         guardians gone={guardians_gone}"
    );
}

/// Ctrl-Z while `quorumlock run --wait` is queued at an interactive shell,
/// then `fg`: the wait goes on and the command runs once the holder lets
/// go; another waiter is held up at most about a TTL by the stopped one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_z_while_waiting_then_fg() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let resource = common::resource("job:wait-ctrl-z");
    let holder = common::manager(cluster.urls());
    let held = holder
        .lock(&resource)
        .ttl(Duration::from_secs(20))
        .await
        .expect("free");
    let command = scratch.script(
        "a.sh",
        &format!(
            "echo $$ > {}; echo STARTED; read x; echo GOT-$x\n",
            scratch.path("pid").display()
        ),
    );
    let mut pty = Pty::interactive();
    pty.send(
        format!(
            "{} -- sh {command}\n",
            shell_line(&cluster, &resource, &["--ttl", "2s", "--wait", "30s"])
        )
        .as_bytes(),
    );
    let urls = cluster.urls();
    let queued = common::eventually(Duration::from_secs(10), || {
        urls.iter()
            .filter(|u| common::queued_on(u, &resource) == 1)
            .count()
            >= 2
    })
    .await;
    assert!(queued, "setup: queued");
    pty.send(b"\x1a");
    let stopped = pty.shows("Stopped", Duration::from_secs(5));
    held.release().await.expect("release");
    // Another waiter behind the stopped one.
    let started = Instant::now();
    let mut c = run(
        &cluster,
        &resource,
        &["--ttl", "2s", "--wait", "20s", "--", "true"],
    )
    .spawn()
    .expect("C");
    let c_status = tokio::task::spawn_blocking(move || {
        let s = wait_within(&mut c, Duration::from_secs(25));
        let _ = c.kill();
        s
    })
    .await
    .expect("join");
    let c_took = started.elapsed();
    pty.send(b"fg\n");
    let ran = pty.shows("STARTED", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    pty.send(b"hello\n");
    let got = pty.shows("GOT-hello", Duration::from_secs(5));
    let output = pty.output();
    if let Ok(text) = std::fs::read_to_string(scratch.path("pid"))
        && let Ok(pid) = text.trim().parse::<i32>()
    {
        cleanup(
            quorumlock_of(Pid::from_raw(pid)),
            Some(Pid::from_raw(pid)),
            &[],
        );
    }
    pty.close();
    assert!(stopped, "setup: stopped while waiting: {output:?}");
    assert!(
        // Long before C's own 20 s wait ran out (a stopped waiter keeps
        // its place about a TTL, 2 s; a loaded machine adds seconds).
        c_status.is_some_and(|s| s.success()) && c_took < Duration::from_secs(10),
        "a waiter behind a stopped one: {c_status:?} after {c_took:?}"
    );
    assert!(
        ran && got,
        "fg after a stop while waiting: ran={ran}, read={got}; {output:?}"
    );
}

/// Job control: run from an interactive shell, Ctrl-Z stops the command
/// and `quorumlock` alike, and the shell prompts again, as with `flock`.
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
    let leader = noted(scratch.wait_for_pid("pid"));
    let quorumlock = quorumlock_of(leader);
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
    let leader = noted(scratch.wait_for_pid("pid"));
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

/// A loss under `stty tostop`: `quorumlock`'s diagnostics must neither
/// stop it nor panic (an `eprintln!` once panicked there with EIO, exit
/// 101, the release sent while the group still ran); the loss ends the
/// command first and exits 123.
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
                scratch.append_stamped("A-start"),
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
            &scratch.append_stamped("B-start"),
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
    let context = "guardian SIGKILLed, then quorumlock SIGKILLed (the leader died of its \
                   parent-death signal, its child did not)";
    let margin =
        scratch.assert_b_started_before_a_would_write(context, Duration::from_millis(2_500));
    eprintln!("B started {margin:?} before A's write was due");
    scratch.assert_no_write_after_b_started(context);
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
