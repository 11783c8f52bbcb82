//! The command `run` starts, as a process tree that `quorumlock` owns: the
//! command leads a process group of its own, every signal goes to the
//! whole group, and the group never outlives `quorumlock`:
//!
//! - the command gets a parent-death signal (SIGKILL), and
//! - a small guardian process (this binary, `GUARD_ARG`) kills the whole
//!   group when `quorumlock` dies without saying it is done (SIGKILL, a
//!   crash): it holds the read end of a pipe whose write end only
//!   `quorumlock` holds, so the pipe closes exactly when `quorumlock` ends;
//!   and it kills the group when the lock's validity, as `quorumlock` last
//!   told it, is about to end (a `quorumlock` stopped by SIGSTOP or starved
//!   of CPU extends nothing, and its command must not outlive the lock).
//!
//! A process that leaves the group (`setsid`, a daemon) is out of reach,
//! as it is of `flock`.

use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsFd;
use std::os::fd::FromRawFd;
use std::os::unix::process::CommandExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::unistd::{self, Pid};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The hidden first argument that makes this binary a guardian.
pub const GUARD_ARG: &str = "__quorumlock-guard-group";

/// How often the group is checked for members once the command exited.
const GONE_POLL: Duration = Duration::from_millis(10);

/// The longest wait for a killed group to be gone: SIGKILL cannot be
/// caught, so only a process stuck in the kernel takes longer.
const KILLED_WAIT: Duration = Duration::from_secs(5);

/// A command running as the leader of its own process group.
pub struct Group {
    child: Child,
    pgid: Pid,
    /// The exit status, once reaped.
    status: Option<ExitStatus>,
    /// Whether the terminal was handed to the group (to take it back).
    took_terminal: bool,
    /// The guardian's pipe; `None` once told that we are done.
    guardian: Option<std::io::PipeWriter>,
    /// When the guardian kills the group (boot clock, ms), as last told.
    kill_at: Option<u64>,
}

impl Group {
    /// Starts `command` in a group of its own, watched by a guardian. When
    /// standard input is the terminal and `quorumlock` is in its
    /// foreground, the group gets the terminal (as a shell gives it to a
    /// job), so an interactive command can read it and gets Ctrl-C.
    pub fn spawn(mut command: Command) -> std::io::Result<Self> {
        let guardian = start_guardian()?;
        let foreground = is_terminal_foreground();
        let parent = unistd::getpid();
        // SAFETY: only async-signal-safe calls (setpgid, sigprocmask,
        // tcsetpgrp, prctl, getppid) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
                if foreground {
                    give_terminal_to(unistd::getpgrp())?;
                }
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // Died before the line above: no signal will come. (No
                // allocation here, between fork and exec.)
                if unistd::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        let pid = child.id().and_then(|id| i32::try_from(id).ok());
        let pgid = Pid::from_raw(pid.ok_or_else(|| std::io::Error::other("no child id"))?);
        let mut guardian = Some(guardian);
        if let Some(pipe) = guardian.as_mut() {
            writeln!(pipe, "group {pgid}")?;
        }
        Ok(Self {
            child,
            pgid,
            status: None,
            took_terminal: foreground,
            guardian,
            kill_at: None,
        })
    }

    /// Tells the guardian the lock is valid until `valid_until`: it kills
    /// the group `margin` before that unless told a later moment. On the
    /// boot clock, which counts a suspended host.
    pub fn valid_until(&mut self, valid_until: Instant, margin: Duration) {
        let left = valid_until
            .saturating_duration_since(Instant::now())
            .saturating_sub(margin);
        let Some(kill_at) = boot_millis().map(|now| now + left.as_millis() as u64) else {
            return;
        };
        if self.kill_at != Some(kill_at)
            && let Some(pipe) = self.guardian.as_mut()
            && writeln!(pipe, "kill-at {kill_at}").is_ok()
        {
            self.kill_at = Some(kill_at);
        }
    }

    /// Sends `sig` to every process of the group.
    pub fn signal(&self, sig: Signal) {
        let _ = signal::killpg(self.pgid, sig);
    }

    /// Waits for the command to exit (reaping it), and returns its status.
    pub async fn exited(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = self.child.wait().await?;
        self.status = Some(status);
        self.take_back_terminal();
        Ok(status)
    }

    /// Waits until no process of the group is left: the command reaped
    /// and everything it started in the group ended.
    pub async fn gone(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.exited().await?;
        while signal::killpg(self.pgid, None) != Err(Errno::ESRCH) {
            tokio::time::sleep(GONE_POLL).await;
        }
        Ok(status)
    }

    /// Ends the group before `deadline`: SIGTERM, up to `grace` (but not
    /// past the deadline) for it to be gone, then SIGKILL. Returns whether
    /// it is gone (after SIGKILL, within `KILLED_WAIT`).
    pub async fn terminate(&mut self, grace: Duration, deadline: Instant) -> bool {
        self.signal(Signal::SIGTERM);
        let kill_at = (Instant::now() + grace).min(deadline);
        if tokio::time::timeout_at(kill_at, self.gone()).await.is_ok() {
            return true;
        }
        self.signal(Signal::SIGKILL);
        tokio::time::timeout(KILLED_WAIT, self.gone()).await.is_ok()
    }

    /// The group is gone (or left to run, knowingly): the guardian must
    /// not kill a group that may reuse its id later.
    pub fn dismiss_guardian(&mut self) {
        if let Some(mut pipe) = self.guardian.take() {
            let _ = writeln!(pipe, "done");
        }
    }

    fn take_back_terminal(&mut self) {
        if std::mem::take(&mut self.took_terminal) {
            let _ = give_terminal_to(unistd::getpgrp());
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.take_back_terminal();
    }
}

/// Whether standard input is a terminal whose foreground group is ours.
fn is_terminal_foreground() -> bool {
    let stdin = std::io::stdin();
    stdin.is_terminal() && unistd::tcgetpgrp(stdin.as_fd()).ok() == Some(unistd::getpgrp())
}

/// Makes `pgrp` the terminal's foreground group. A background process
/// that does this gets SIGTTOU unless it blocks it, as shells do.
fn give_terminal_to(pgrp: Pid) -> nix::Result<()> {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old))?;
    // SAFETY: fd 0 is open for the process's whole life.
    let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    let result = unistd::tcsetpgrp(stdin, pgrp);
    signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None)?;
    result
}

/// Starts the guardian: this binary again, in a group of its own (the
/// terminal's signals do not reach it), reading the pipe.
fn start_guardian() -> std::io::Result<std::io::PipeWriter> {
    let (reader, writer) = std::io::pipe()?;
    let mut guardian = std::process::Command::new(std::env::current_exe()?);
    guardian
        .arg(GUARD_ARG)
        .stdin(reader)
        .stdout(Stdio::null())
        .process_group(0);
    // Not waited for: it ends on `done` or with quorumlock.
    guardian.spawn()?;
    Ok(writer)
}

/// The boot clock (`CLOCK_BOOTTIME`, counts suspend) in milliseconds.
fn boot_millis() -> Option<u64> {
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
    group: Option<Pid>,
    /// When to kill the group (boot clock, ms).
    kill_at: Option<u64>,
    done: bool,
}

impl Guard {
    /// `group <pgid>`, `kill-at <ms>`, or `done`; anything else is ignored.
    fn heard(&mut self, line: &str) {
        match line.split_once(' ') {
            Some(("group", id)) => self.group = id.parse().ok().map(Pid::from_raw),
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
        let timeout_ms = wait.map_or(-1, |w| i32::try_from(w.as_millis()).unwrap_or(i32::MAX));
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
    if let Some(group) = guard.group {
        let _ = signal::killpg(group, Signal::SIGKILL);
    }
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guardian_follows_what_it_is_told() {
        let mut guard = Guard::default();
        assert_eq!(guard.wait(1_000), None, "no deadline before one is told");
        guard.heard("group 4242");
        guard.heard("kill-at 5000");
        assert_eq!(guard.group, Some(Pid::from_raw(4242)));
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
