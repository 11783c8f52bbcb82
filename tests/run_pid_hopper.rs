//! `quorumlock run` against a command that keeps forking: a process that
//! forks its successor and exits at once, over and over (a pid-hopping
//! loop, as re-daemonizing scripts do), appending `A-write` to the log
//! every 50 ms, on a host busy with 600 other processes. Host A runs it
//! under `run --ttl 2s`; host B waits for the same resource. Whatever ends
//! A's hold (`quorumlock` killed, `--max-hold`, `quorumlock` stopped past
//! the validity), no `A-write` may come after B's command started, and
//! nothing of the loop may be left.
//!
//! Found in review with the real binary: the tree was read from `/proc`
//! and then signalled, pass after pass; on a busy host each pass read
//! every process's `stat`, the loop moved on to a new pid in between, and
//! after five seconds the guardian reported the tree gone: A wrote after B
//! started in 4 of 5 runs (SIGKILL), 3 of 5 (`--max-hold`), 2 of 2
//! (SIGSTOP). Now each pass walks the tree's own child lists and stops it
//! whole before the SIGKILL, and the tree is said to be gone only when a
//! pass found it empty.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::command_log::{Scratch, processes_named, run, start_b};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

/// Processes that only sleep, as on a busy host (killed when dropped).
struct BusyHost(Vec<Child>);

impl BusyHost {
    fn start(count: usize) -> Self {
        let sleepers = (0..count)
            .map(|_| {
                Command::new("sleep")
                    .arg("600")
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("sleep starts")
            })
            .collect();
        Self(sleepers)
    }
}

impl Drop for BusyHost {
    fn drop(&mut self) {
        for sleeper in &mut self.0 {
            let _ = sleeper.kill();
            let _ = sleeper.wait();
        }
    }
}

/// Kills whatever is left of the loop, whatever happens (its pids change
/// all the time: found by name).
struct KillHoppers;

impl Drop for KillHoppers {
    fn drop(&mut self) {
        for _ in 0..50 {
            let left = processes_named("hopper");
            if left.is_empty() {
                return;
            }
            for pid in left {
                let _ = signal::kill(pid, Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

const HOPPER: &str = r#"#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}
int main(int argc, char **argv) {
    long long last = 0, until;
    if (argc < 2) return 2;
    /* Whatever happens to the test, the loop ends by itself: after 60 s,
       or once its log is gone (the test's scratch directory removed). */
    until = now_ms() + 60000;
    signal(SIGTERM, SIG_IGN);
    for (;;) {
        long long now = now_ms();
        if (now > until) _exit(0);
        if (now - last >= 50) {
            FILE *f = fopen(argv[1], "a");
            if (!f) _exit(0);
            fputs("A-write\n", f);
            fclose(f);
            last = now;
        }
        pid_t child = fork();
        if (child > 0) _exit(0);
        if (child < 0) usleep(1000);
    }
}
"#;

/// What ends A's hold.
#[derive(Debug, Clone, Copy)]
enum End {
    /// SIGKILL to A's `quorumlock`: its guardian ends the tree.
    Killed,
    /// `--max-hold 1s`: `quorumlock` ends the tree itself (exit 123).
    MaxHold,
    /// SIGSTOP to A's `quorumlock` past the validity: its guardian ends
    /// the tree; continued, `quorumlock` ends as lost (123).
    Stopped,
}

fn pid(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("pid"))
}

fn one_run(cluster: &quorumlock::testkit::TestCluster, program: &str, end: End) {
    let log = Scratch::new();
    let resource = common::resource("tree:hopper");
    let log_file = log.path("log").display().to_string();
    let mut extra = vec!["--ttl", "2s"];
    if let End::MaxHold = end {
        extra.extend(["--max-hold", "1s", "--grace", "300ms"]);
    }
    extra.extend(["--", program, &log_file]);
    let a = run(cluster, &resource, &extra).spawn().expect("A starts");
    log.wait_for_line("A-write");
    let b = start_b(cluster, &resource, &log);
    std::thread::sleep(Duration::from_millis(300));
    match end {
        End::Killed => signal::kill(pid(&a), Signal::SIGKILL).expect("SIGKILL"),
        End::Stopped => signal::kill(pid(&a), Signal::SIGSTOP).expect("SIGSTOP"),
        End::MaxHold => {}
    }
    let b_out = b.wait_with_output().expect("B exits");
    assert_eq!(
        b_out.status.code(),
        Some(0),
        "{end:?}: B ran once A's hold ended: {}",
        String::from_utf8_lossy(&b_out.stderr)
    );
    // The loop writes every 50 ms: had it survived, it would have by now.
    std::thread::sleep(Duration::from_millis(500));
    let left = processes_named("hopper");
    if let End::Stopped = end {
        let _ = signal::kill(pid(&a), Signal::SIGCONT);
    }
    let a_out = a.wait_with_output().expect("A exits");
    let a_err = String::from_utf8_lossy(&a_out.stderr);
    log.assert_no_write_after_b_started(&format!("{end:?}"));
    assert!(
        left.is_empty(),
        "{end:?}: {} process(es) of the loop still ran after B's command: {left:?}",
        left.len()
    );
    if let End::MaxHold | End::Stopped = end {
        assert_eq!(
            a_out.status.code(),
            Some(123),
            "{end:?}: A lost its lock: {a_err}"
        );
    }
}

#[test]
fn a_tree_that_keeps_forking_is_ended_before_anyone_else_holds() {
    let cluster = common::cluster(3);
    let scratch = Scratch::new();
    let source = scratch.script("hopper.c", HOPPER);
    let program = scratch.path("hopper").display().to_string();
    let built = Command::new("cc")
        .args(["-O2", "-o", &program, &source])
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", quorumlock::testkit::MISSING_CC));
    assert!(built.success(), "cc failed to build the test program");
    let _leftovers = KillHoppers;
    let _busy = BusyHost::start(600);
    let runs = common::quick_or_long(1, 3);
    for _ in 0..runs {
        for end in [End::Killed, End::MaxHold, End::Stopped] {
            one_run(&cluster, &program, end);
        }
    }
}
