//! `quorumlock run` owns the command's process tree: the real binary, real
//! child processes, a real cluster. In each case a command A runs under
//! the lock and writes to a log at some point, and a second
//! `quorumlock run` (B, waiting for the same resource) writes to the same
//! log when it starts: no write of A may come after B started, whatever
//! happens to A (the lock lost at `max_hold`, signals to `quorumlock`,
//! `quorumlock` killed or stopped). Also: a command that cannot start releases at
//! once, and a signal during `--wait` leaves no queue entry behind.

mod common;

use std::process::{Child, ExitStatus};
use std::time::Duration;

use common::command_log::{Scratch, run, start_b};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

fn finish(child: Child, who: &str) -> (ExitStatus, String) {
    let (status, stderr) = ended(child);
    assert!(
        status.code().is_some(),
        "{who}: quorumlock itself was killed ({status}): {stderr}"
    );
    (status, stderr)
}

/// How `child` ended (a signal included), and what it said.
fn ended(child: Child) -> (ExitStatus, String) {
    let output = child.wait_with_output().expect("exits");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status, stderr)
}

fn pid(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("pid"))
}

/// The review's case: `max_hold` reached while the command (which ignores
/// SIGTERM) finishes its work. The lock used to be deleted at once, and B
/// started 2 s before A's write; now A is killed before the validity ends
/// and the lock goes only once A's group is gone.
#[test]
fn max_hold_ends_the_command_before_anyone_else_starts() {
    let cluster = common::cluster(5);
    let log = Scratch::new();
    let a = run(
        &cluster,
        "tree:max-hold",
        &[
            "--ttl",
            "3s",
            "--max-hold",
            "2s",
            "--grace",
            "2s",
            "--",
            "sh",
            "-c",
            &format!(
                "trap '' TERM; {}; sleep 3.5; {}",
                log.append("A-start"),
                log.append("A-write")
            ),
        ],
    )
    .spawn()
    .expect("A starts");
    log.wait_for_line("A-start");
    let b = start_b(&cluster, "tree:max-hold", &log);
    let (a_status, a_err) = finish(a, "A");
    let (b_status, b_err) = finish(b, "B");
    assert_eq!(a_status.code(), Some(123), "A lost its lock: {a_err}");
    assert_eq!(b_status.code(), Some(0), "B ran: {b_err}");
    log.assert_no_write_after_b_started("max_hold reached");
}

/// SIGTERM (and the signals a closed terminal or a quit key send) to
/// `quorumlock` reach the command's whole process group, not only the
/// direct child: a grandchild used to write 2 s after B started.
#[test]
fn signals_to_quorumlock_reach_the_whole_group() {
    for sig in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT] {
        let cluster = common::cluster(3);
        let log = Scratch::new();
        let resource = format!("tree:{sig}");
        // A short TTL: if quorumlock died, the lock would expire soon.
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
                    "{}; sh -c 'sleep 3; {}'; true",
                    log.append("A-start"),
                    log.append("A-write")
                ),
            ],
        )
        .spawn()
        .expect("A starts");
        log.wait_for_line("A-start");
        let b = start_b(&cluster, &resource, &log);
        std::thread::sleep(Duration::from_millis(300));
        signal::kill(pid(&a), sig).expect("signal");
        // The command died of the signal, and so does quorumlock.
        let (a_status, a_err) = ended(a);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&a_status),
            Some(sig as i32),
            "{sig}: A ended {a_status}: {a_err}"
        );
        let (b_status, b_err) = finish(b, "B");
        assert_eq!(
            b_status.code(),
            Some(0),
            "{sig}: B ran: {b_err} (A: {a_err})"
        );
        // The grandchild would have written by now.
        std::thread::sleep(Duration::from_millis(3_500));
        log.assert_no_write_after_b_started(&format!("{sig} to A's quorumlock"));
    }
}

/// `quorumlock` SIGKILLed, or stopped (SIGSTOP, or starved like a process
/// in a long GC pause): it extends nothing, and its lock expires while the
/// command (here with a grandchild) would run on. The guardian kills the
/// command's group at once (killed) or before the validity it was last
/// told ends (stopped); the command used to write after B started.
#[test]
fn a_killed_or_stopped_quorumlock_leaves_no_command_running() {
    for sig in [Signal::SIGKILL, Signal::SIGSTOP] {
        let cluster = common::cluster(3);
        let log = Scratch::new();
        let resource = format!("tree:{sig}");
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
                    "{}; sh -c 'sleep 2.5; {}' & sleep 2.5; {}",
                    log.append("A-start"),
                    log.append("A-write"),
                    log.append("A-write")
                ),
            ],
        )
        .spawn()
        .expect("A starts");
        log.wait_for_line("A-start");
        let b = start_b(&cluster, &resource, &log);
        std::thread::sleep(Duration::from_millis(300));
        signal::kill(pid(&a), sig).expect("signal");
        let (b_status, b_err) = finish(b, "B");
        assert_eq!(
            b_status.code(),
            Some(0),
            "{sig}: B ran once the lock expired: {b_err}"
        );
        std::thread::sleep(Duration::from_millis(2_500));
        let _ = signal::kill(pid(&a), Signal::SIGKILL);
        let _ = a.wait_with_output();
        log.assert_no_write_after_b_started(&format!("{sig} to A's quorumlock"));
    }
}

/// A command that cannot be started: the exit code says why, and the lock
/// is released before `quorumlock` exits (it used to stay for the TTL).
#[test]
fn a_command_that_cannot_start_releases_the_lock_at_once() {
    let cluster = common::cluster(3);
    for (command, code) in [("/nonexistent-cmd", 127), ("/dev/null", 126)] {
        let resource = common::resource("tree:cannot-start");
        let output = run(&cluster, &resource, &["--ttl", "30s", "--", command])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{command}: {stderr}");
        assert!(
            common::nothing_left(&cluster.urls(), &resource),
            "{command}: the lock outlived quorumlock: {:?}",
            common::lock_entries(&cluster.urls(), &resource)
        );
    }
}

/// SIGINT while waiting for the lock ends the wait with 130 and takes the
/// waiter out of the queue (it used to stay there for a TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_waiting_leaves_no_queue_entry() {
    let cluster = common::cluster(3);
    let holder = common::manager(cluster.urls());
    let resource = common::resource("tree:wait");
    let held = holder
        .lock(&resource)
        .ttl(Duration::from_secs(20))
        .await
        .expect("free");
    let waiter = run(
        &cluster,
        &resource,
        &["--ttl", "20s", "--wait", "30s", "--", "true"],
    )
    .spawn()
    .expect("starts");
    let urls = cluster.urls();
    let queued = common::eventually(Duration::from_secs(10), || {
        urls.iter()
            .filter(|url| common::queued_on(url, &resource) == 1)
            .count()
            >= 2
    })
    .await;
    assert!(queued, "setup: the waiter queued");
    signal::kill(pid(&waiter), Signal::SIGINT).expect("signal");
    let (status, stderr) = tokio::task::spawn_blocking(move || ended(waiter))
        .await
        .expect("no panic");
    // It ends by the signal, as a shell's caller expects of Ctrl-C.
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(2),
        "{status}: {stderr}"
    );
    let left = common::eventually(Duration::from_secs(1), || {
        urls.iter()
            .all(|url| common::queued_on(url, &resource) == 0)
    })
    .await;
    assert!(
        left,
        "the waiter's queue entries outlived it: {:?}",
        urls.iter()
            .map(|url| common::queued_on(url, &resource))
            .collect::<Vec<_>>()
    );
    held.release().await.expect("release");
}
