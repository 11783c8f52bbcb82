//! The guardian: a small process (this binary again, `GUARD_ARG`) that
//! kills the command's process group when `quorumlock` can no longer
//! answer for it:
//!
//! - `quorumlock` died (SIGKILL, a crash): the guardian holds the read end
//!   of a pipe whose write end only `quorumlock` holds, so the pipe closes
//!   exactly when `quorumlock` ends;
//! - the lock's validity, as `quorumlock` last told it, is about to end (a
//!   `quorumlock` stopped by SIGSTOP or starved of CPU extends nothing).
//!
//! `quorumlock` watches its guardian in turn and starts another if it dies.

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// The hidden first argument that makes this binary a guardian.
pub const GUARD_ARG: &str = "__quorumlock-guard-group";

/// The guardian's exit code after it killed the group.
const KILLED: i32 = 3;

/// `quorumlock`'s end of a guardian.
pub struct Guardian {
    process: Child,
    pipe: std::io::PipeWriter,
    /// What it was told, to tell a successor.
    group: Option<(Pid, Pid)>,
    kill_at: Option<u64>,
}

impl Guardian {
    /// Starts one, in a process group of its own (the terminal's signals
    /// do not reach it).
    pub fn start() -> std::io::Result<Self> {
        let (reader, pipe) = std::io::pipe()?;
        let process = Command::new(std::env::current_exe()?)
            .arg(GUARD_ARG)
            .stdin(reader)
            .stdout(Stdio::null())
            .process_group(0)
            .kill_on_drop(false)
            .spawn()?;
        Ok(Self {
            process,
            pipe,
            group: None,
            kill_at: None,
        })
    }

    /// From now on it answers for `group`, `quorumlock` (`me`) excepted
    /// when it is a member.
    pub fn watch(&mut self, group: Pid, me: Pid) -> std::io::Result<()> {
        writeln!(self.pipe, "group {group} {me}")?;
        self.group = Some((group, me));
        Ok(())
    }

    /// Its process id.
    pub fn pid(&self) -> Option<Pid> {
        self.process
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
    }

    /// It kills the group at `kill_at` (boot clock, ms) unless told a later
    /// moment first.
    pub fn kill_at(&mut self, kill_at: u64) -> std::io::Result<()> {
        if self.kill_at != Some(kill_at) {
            writeln!(self.pipe, "kill-at {kill_at}")?;
            self.kill_at = Some(kill_at);
        }
        Ok(())
    }

    /// The group is gone: it must not kill a group that may reuse its id.
    pub fn dismiss(mut self) {
        let _ = writeln!(self.pipe, "done");
    }

    /// Resolves when the guardian process ends: `true` if it killed the
    /// group (`KILLED`), `false` if it was killed.
    pub async fn ended(&mut self) -> bool {
        let status = self.process.wait().await;
        status.is_ok_and(|status| status.code() == Some(KILLED))
    }

    /// After a write to it failed: whether it ended having killed the
    /// group (it closes its end of the pipe as it exits; waits for that
    /// exit up to `limit`).
    pub async fn acted(&mut self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.ended())
            .await
            .unwrap_or(false)
    }

    /// A successor, told what this one was told.
    pub fn replace(&self) -> std::io::Result<Self> {
        let mut next = Self::start()?;
        if let Some((group, me)) = self.group {
            next.watch(group, me)?;
        }
        if let Some(kill_at) = self.kill_at {
            next.kill_at(kill_at)?;
        }
        Ok(next)
    }
}

/// The boot clock (`CLOCK_BOOTTIME`, counts suspend) in milliseconds.
pub fn boot_millis() -> Option<u64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } != 0 {
        return None;
    }
    let secs = u64::try_from(now.tv_sec).ok()?;
    Some(secs * 1000 + u64::try_from(now.tv_nsec).ok()? / 1_000_000)
}

/// What the guardian knows, from the lines `quorumlock` sends.
#[derive(Debug, Default, PartialEq)]
struct Guard {
    /// The group, and `quorumlock` (spared when it is a member).
    group: Option<(Pid, Pid)>,
    /// When to kill the group (boot clock, ms).
    kill_at: Option<u64>,
    done: bool,
}

impl Guard {
    /// `group <pgid> <quorumlock's pid>`, `kill-at <ms>`, or `done`;
    /// anything else is ignored.
    fn heard(&mut self, line: &str) {
        match line.split_once(' ') {
            Some(("group", ids)) => {
                self.group = ids.split_once(' ').and_then(|(group, me)| {
                    Some((
                        Pid::from_raw(group.parse().ok()?),
                        Pid::from_raw(me.parse().ok()?),
                    ))
                });
            }
            Some(("kill-at", at)) => self.kill_at = at.parse().ok(),
            _ if line == "done" => self.done = true,
            _ => {}
        }
    }

    /// How long to wait for the next line before the kill is due (`None`:
    /// no deadline yet); zero when it is due now.
    fn wait(&self, now_ms: u64) -> Option<Duration> {
        self.kill_at
            .map(|at| Duration::from_millis(at.saturating_sub(now_ms)))
    }
}

/// The guardian's life: read what `quorumlock` says until it says `done`
/// (the group is gone), its pipe closes (it died), or the lock's validity
/// as last told ends. The last two kill the group.
pub fn guard_group() -> std::process::ExitCode {
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        // SAFETY: ignoring a signal installs no handler.
        let _ = unsafe { signal::signal(sig, signal::SigHandler::SigIgn) };
    }
    // Unbuffered: `poll` must see every byte not yet read.
    // SAFETY: fd 0 is the pipe, open for the process's whole life.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(0) };
    let mut guard = Guard::default();
    let mut pending = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        let wait = boot_millis().and_then(|now| guard.wait(now));
        if wait == Some(Duration::ZERO) {
            break;
        }
        // At most a second: poll's clock stops while the host is
        // suspended, the boot clock (looked at above) does not.
        let timeout_ms = wait.map_or(-1, |w| w.min(Duration::from_secs(1)).as_millis() as i32);
        let mut ready = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut ready, 1, timeout_ms) } <= 0 {
            continue; // timed out (the deadline is checked above) or EINTR
        }
        let Ok(read) = pipe.read(&mut buf) else { break };
        if read == 0 {
            break; // quorumlock is gone
        }
        pending.extend_from_slice(&buf[..read]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            guard.heard(String::from_utf8_lossy(&line).trim());
        }
        if guard.done {
            return std::process::ExitCode::SUCCESS;
        }
    }
    match guard.group {
        // `quorumlock` died: everything left of the group goes.
        Some((group, me)) if group != me || signal::kill(me, None).is_err() => {
            let _ = signal::killpg(group, Signal::SIGKILL);
        }
        // `quorumlock`'s own job, and it lives (stopped past the lock): all
        // but `quorumlock`, which reports the loss once continued.
        Some((group, me)) => kill_group_but(group, me),
        None => return std::process::ExitCode::SUCCESS,
    }
    std::process::ExitCode::from(KILLED as u8)
}

/// SIGKILL to every process of `group` but `spared`.
fn kill_group_but(group: Pid, spared: Pid) {
    for process in crate::processes::processes() {
        if process.group == group && process.pid != spared {
            let _ = signal::kill(process.pid, Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guardian_follows_what_it_is_told() {
        let mut guard = Guard::default();
        assert_eq!(guard.wait(1_000), None, "no deadline before one is told");
        guard.heard("group 4242 17");
        guard.heard("kill-at 5000");
        assert_eq!(guard.group, Some((Pid::from_raw(4242), Pid::from_raw(17))));
        assert_eq!(guard.wait(1_000), Some(Duration::from_millis(4_000)));
        assert_eq!(guard.wait(6_000), Some(Duration::ZERO), "due");
        guard.heard("kill-at 9000");
        assert_eq!(
            guard.wait(6_000),
            Some(Duration::from_millis(3_000)),
            "extended"
        );
        guard.heard("nonsense");
        assert!(!guard.done);
        guard.heard("done");
        assert!(guard.done);
    }
}
