//! The command `run` starts, as a process tree that `quorumlock` owns: the
//! command leads a process group of its own, every signal goes to the
//! whole group, and the group never outlives `quorumlock`'s hold on the
//! lock: the command gets a parent-death signal (SIGKILL), and a guardian
//! (see `guardian.rs`) kills the whole group when `quorumlock` dies or
//! stops telling it that the lock is still valid.
//!
//! Under an interactive shell the group gets the terminal, as a shell
//! gives it to a job, and job control works through `quorumlock`: when
//! Ctrl-Z stops the command, `quorumlock` takes the terminal back and stops
//! too, so the shell sees its job stopped; `fg` or `bg` continues both.
//!
//! A process that leaves the group (`setsid`, a daemon) is out of reach,
//! as it is of `flock`.

use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{self, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::{self, Pid};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::guardian::{Guardian, boot_millis};

/// How often the group is checked for members once the command exited,
/// and, at a terminal, whether the command was stopped.
const POLL: Duration = Duration::from_millis(10);

/// The longest wait for a killed group to be gone: SIGKILL cannot be
/// caught, so only a process stuck in the kernel takes longer.
const KILLED_WAIT: Duration = Duration::from_secs(5);

/// A command running as the leader of its own process group.
pub struct Group {
    child: Child,
    pgid: Pid,
    /// The exit status, once reaped.
    status: Option<ExitStatus>,
    /// Whether the group runs at a terminal it was given (job control).
    at_terminal: bool,
    /// `None` once dismissed (the group is gone).
    guardian: Option<Guardian>,
}

impl Group {
    /// Starts `command` in a group of its own, watched by a guardian. When
    /// standard input is the terminal and `quorumlock` is in its
    /// foreground, the group gets the terminal, so an interactive command
    /// can read it and gets Ctrl-C.
    pub fn spawn(mut command: Command) -> std::io::Result<Self> {
        let mut guardian = Guardian::start()?;
        let at_terminal = is_terminal_foreground();
        let parent = unistd::getpid();
        // SAFETY: only async-signal-safe calls (setpgid, sigaction,
        // sigprocmask, tcsetpgrp, prctl, getppid) between fork and exec,
        // and no allocation.
        unsafe {
            command.pre_exec(move || {
                unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
                // `quorumlock` ignores SIGTTOU (see `ignore_terminal_stops`);
                // the command gets the usual behaviour.
                signal::signal(Signal::SIGTTOU, SigHandler::SigDfl)?;
                if at_terminal {
                    give_terminal_to(unistd::getpgrp())?;
                }
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // Died before the line above: no signal will come.
                if unistd::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        let pid = child.id().and_then(|id| i32::try_from(id).ok());
        let pgid = Pid::from_raw(pid.ok_or_else(|| std::io::Error::other("no child id"))?);
        guardian.watch(pgid)?;
        Ok(Self {
            child,
            pgid,
            status: None,
            at_terminal,
            guardian: Some(guardian),
        })
    }

    /// Tells the guardian the lock is valid until `valid_until`: it kills
    /// the group `margin` before that unless told a later moment. On the
    /// boot clock, which counts a suspended host.
    pub fn valid_until(&mut self, valid_until: Instant, margin: Duration) -> std::io::Result<()> {
        let left = valid_until
            .saturating_duration_since(Instant::now())
            .saturating_sub(margin);
        match (boot_millis(), self.guardian.as_mut()) {
            (Some(now), Some(guardian)) => guardian.kill_at(now + left.as_millis() as u64),
            _ => Ok(()),
        }
    }

    /// Starts a new guardian in place of one that died.
    pub fn replace_guardian(&mut self) -> std::io::Result<()> {
        if let Some(guardian) = self.guardian.as_mut() {
            *guardian = guardian.replace()?;
        }
        Ok(())
    }

    /// Sends `sig` to every process of the group, then SIGCONT, as a
    /// shell's `kill` does: a stopped process would not act on it.
    pub fn signal(&self, sig: Signal) {
        let _ = signal::killpg(self.pgid, sig);
        let _ = signal::killpg(self.pgid, Signal::SIGCONT);
    }

    /// What happens next to the group: it is gone (the command reaped and
    /// everything it started in the group ended), its guardian died, or,
    /// at a terminal, the command was stopped (Ctrl-Z, or a read from the
    /// terminal in the background; elsewhere a command stopped by someone
    /// keeps the lock, as under `flock`). Cancel-safe.
    pub async fn next_event(&mut self) -> GroupEvent {
        let pgid = self.pgid;
        let watch_stops = self.at_terminal && self.status.is_none();
        let (child, status, guardian) = (&mut self.child, &mut self.status, &mut self.guardian);
        let event = tokio::select! {
            gone = gone(child, status, pgid) => GroupEvent::Gone(gone),
            () = guardian_died(guardian) => GroupEvent::GuardianDied,
            () = stopped(pgid), if watch_stops => GroupEvent::Stopped,
        };
        if self.status.is_some() {
            self.take_back_terminal();
        }
        event
    }

    /// The command was stopped at the terminal: stop with it, so that the
    /// shell sees the job stopped and gets the terminal back. When the
    /// shell continues us (`fg`: with the terminal, `bg`: without), hand
    /// the terminal on if we have it, and continue the command. While
    /// stopped, nothing extends the lock: past its validity the guardian
    /// kills the command, and the run ends as lost.
    pub fn stop_with_the_command(&self) {
        let _ = give_terminal_to(unistd::getpgrp());
        // SAFETY: the default action installs no handler.
        let _ = unsafe { signal::signal(Signal::SIGTSTP, SigHandler::SigDfl) };
        let _ = signal::raise(Signal::SIGTSTP);
        // Continued.
        if is_terminal_foreground() {
            let _ = give_terminal_to(self.pgid);
        }
        let _ = signal::killpg(self.pgid, Signal::SIGCONT);
    }

    /// Ends the group before `deadline`: SIGTERM, up to `grace` (but not
    /// past the deadline) for it to be gone, then SIGKILL. Returns whether
    /// it is gone (after SIGKILL, within `KILLED_WAIT`).
    pub async fn terminate(&mut self, grace: Duration, deadline: Instant) -> bool {
        self.signal(Signal::SIGTERM);
        let kill_at = (Instant::now() + grace).min(deadline);
        let (child, status, pgid) = (&mut self.child, &mut self.status, self.pgid);
        if tokio::time::timeout_at(kill_at, gone(child, status, pgid))
            .await
            .is_ok()
        {
            return true;
        }
        let _ = signal::killpg(pgid, Signal::SIGKILL);
        tokio::time::timeout(KILLED_WAIT, gone(child, status, pgid))
            .await
            .is_ok()
    }

    /// The group is gone: the guardian must not kill a group that may
    /// reuse its id later.
    pub fn dismiss_guardian(&mut self) {
        if let Some(guardian) = self.guardian.take() {
            guardian.dismiss();
        }
    }

    fn take_back_terminal(&mut self) {
        if std::mem::take(&mut self.at_terminal) {
            let _ = give_terminal_to(unistd::getpgrp());
        }
    }
}

/// What [`Group::next_event`] saw.
pub enum GroupEvent {
    Gone(std::io::Result<ExitStatus>),
    GuardianDied,
    Stopped,
}

/// Reaps the command (once), then waits until its group is empty.
async fn gone(
    child: &mut Child,
    status: &mut Option<ExitStatus>,
    pgid: Pid,
) -> std::io::Result<ExitStatus> {
    let exited = match *status {
        Some(exited) => exited,
        None => *status.insert(child.wait().await?),
    };
    while signal::killpg(pgid, None) != Err(Errno::ESRCH) {
        tokio::time::sleep(POLL).await;
    }
    Ok(exited)
}

async fn guardian_died(guardian: &mut Option<Guardian>) {
    match guardian {
        Some(guardian) => guardian.died().await,
        None => std::future::pending().await,
    }
}

/// Until the group's leader is stopped (the report is left for others).
async fn stopped(pgid: Pid) {
    let flags = WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    while !matches!(waitid(Id::Pid(pgid), flags), Ok(WaitStatus::Stopped(..))) {
        tokio::time::sleep(POLL).await;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.take_back_terminal();
    }
}

/// `quorumlock` writes to the terminal and hands it around while its
/// command may own it: as a background process it must not be stopped by
/// SIGTTOU for that (its writes then go through, or fail harmlessly). The
/// command gets the usual behaviour back.
pub fn ignore_terminal_stops() {
    // SAFETY: ignoring a signal installs no handler.
    let _ = unsafe { signal::signal(Signal::SIGTTOU, SigHandler::SigIgn) };
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
