//! The command `run` starts, as a process group that `quorumlock` answers
//! for: every signal `quorumlock` passes on goes to the whole group, the
//! lock is released only once the group is empty, and the group never
//! outlives `quorumlock`'s hold on the lock (the command gets a
//! parent-death signal, and a guardian, see `guardian.rs`, kills the group
//! when `quorumlock` dies or stops telling it the lock is still valid).
//!
//! Which group depends on where `quorumlock` runs:
//!
//! - **Its own job** (it leads its process group: an interactive shell
//!   started it, or a supervisor with `setsid`): the command joins that
//!   group, so the terminal treats `quorumlock` and its command as one job,
//!   as it treats `flock` and its command: the command reads the terminal,
//!   Ctrl-C and Ctrl-Z reach both, `fg` and `bg` continue both.
//! - **Someone else's group** (a script, `make`, `cron`): the command
//!   leads a group of its own, so that what `quorumlock` sends it never
//!   reaches the caller. Signals from the terminal reach `quorumlock` only,
//!   and it passes them on (Ctrl-Z stops both). The command's group is not
//!   the terminal's foreground: reading the terminal stops it.
//!
//! `quorumlock` is a child subreaper: what the command starts stays in its
//! process tree even when its parent exits, so the lock waits for, and a
//! loss ends, every descendant, also one that left the group (`setsid`,
//! `setpgid`: `timeout` does). Only the guardian, once `quorumlock` is
//! gone, is limited to the group.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{self, SigHandler, Signal};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{self, Pid};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::guardian::{Guardian, boot_millis};
use crate::processes::processes;

/// How often the group is checked for members once the command exited.
const POLL: Duration = Duration::from_millis(10);

/// How long a guardian that cannot be told is given to finish exiting,
/// to learn whether it killed the group.
const ACTED_EXIT_WAIT: Duration = Duration::from_millis(200);

/// The longest wait for a killed group to be gone: SIGKILL cannot be
/// caught, so only a process stuck in the kernel takes longer.
const KILLED_WAIT: Duration = Duration::from_secs(5);

/// What `quorumlock` answers for: its descendants (the command and all it
/// started, kept in the tree by the subreaper), but its guardian.
#[derive(Debug, Clone, Copy)]
pub struct Members {
    /// `quorumlock` itself.
    me: Pid,
    /// The guardian, which is no member.
    guardian: Option<Pid>,
}

impl Members {
    /// Sends `signals`, in order, to every member.
    pub fn signal(self, signals: &[Signal]) {
        for (pid, _) in self.list() {
            for &sig in signals {
                let _ = signal::kill(pid, sig);
            }
        }
    }

    /// Whether no member is left, reaping the exited ones that became
    /// ours (`command`, tokio's to reap, excepted).
    pub fn empty(self, command: Pid) -> bool {
        let mut left = false;
        for (pid, state) in self.list() {
            if state == 'Z' && pid != command {
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
            } else {
                left = true;
            }
        }
        !left
    }

    /// The members now, with their state (`Z` for exited, not reaped).
    fn list(self) -> Vec<(Pid, char)> {
        let table = processes();
        let mut found = vec![self.me];
        let mut members = Vec::new();
        while let Some(parent) = found.pop() {
            for process in &table {
                if process.parent == parent && Some(process.pid) != self.guardian {
                    found.push(process.pid);
                    members.push((process.pid, process.state));
                }
            }
        }
        members
    }
}

/// A command running in a process group `quorumlock` answers for.
pub struct Group {
    child: Child,
    command: Pid,
    shared: bool,
    members: Members,
    /// The exit status, once reaped.
    status: Option<ExitStatus>,
    /// `None` once dismissed (the group is gone).
    guardian: Option<Guardian>,
    guardian_acted: bool,
}

impl Group {
    /// Starts `command`, in `quorumlock`'s group if that is its own job,
    /// else in a group of its own; watched by a guardian.
    pub fn spawn(mut command: Command) -> std::io::Result<Self> {
        let me = unistd::getpid();
        let shared = unistd::getpgrp() == me;
        let mut guardian = Guardian::start()?;
        // SAFETY: only async-signal-safe calls (setpgid, sigaction, prctl,
        // getppid) between fork and exec, and no allocation.
        unsafe {
            command.pre_exec(move || {
                if !shared {
                    unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
                }
                // `quorumlock` ignores SIGTTOU (see `ignore_terminal_stops`);
                // the command gets the usual behaviour.
                signal::signal(Signal::SIGTTOU, SigHandler::SigDfl)?;
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // Died before the line above: no signal will come.
                if unistd::getppid() != me {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        nix::sys::prctl::set_child_subreaper(true)?;
        let child = command.spawn()?;
        let pid = child.id().and_then(|id| i32::try_from(id).ok());
        let pid = Pid::from_raw(pid.ok_or_else(|| std::io::Error::other("no child id"))?);
        let pgid = if shared { me } else { pid };
        if let Err(e) = guardian.watch(pgid, me) {
            // Unguarded, it must not run: it has not started its work yet.
            let _ = signal::kill(pid, Signal::SIGKILL);
            return Err(e);
        }
        Ok(Self {
            child,
            command: pid,
            shared,
            members: Members {
                me,
                guardian: guardian.pid(),
            },
            status: None,
            guardian: Some(guardian),
            guardian_acted: false,
        })
    }

    /// Whether the command shares `quorumlock`'s job (see the module docs).
    pub fn shared(&self) -> bool {
        self.shared
    }

    /// Tells the guardian the lock is valid until `valid_until`: it kills
    /// the group `margin` before that unless told a later moment. On the
    /// boot clock, which counts a suspended host. A guardian that cannot
    /// be told either killed the group already (noted), or died (an error:
    /// it needs a successor).
    pub async fn valid_until(
        &mut self,
        valid_until: Instant,
        margin: Duration,
    ) -> std::io::Result<()> {
        let left = valid_until
            .saturating_duration_since(Instant::now())
            .saturating_sub(margin);
        let (Some(now), Some(guardian)) = (boot_millis(), self.guardian.as_mut()) else {
            return Ok(());
        };
        let Err(e) = guardian.kill_at(now + left.as_millis() as u64) else {
            return Ok(());
        };
        if guardian.acted(ACTED_EXIT_WAIT).await {
            self.guardian_acted = true;
            self.guardian = None;
            return Ok(());
        }
        Err(e)
    }

    /// Whether the guardian killed the group (the validity it was last
    /// told ran out while quorumlock was stopped or starved). A command
    /// killed by SIGKILL may have been killed by it just now: then it is
    /// given a moment to say so (its exit).
    pub async fn guardian_acted(&mut self) -> bool {
        let killed = self
            .status
            .is_some_and(|status| status.signal() == Some(Signal::SIGKILL as i32));
        if killed
            && !self.guardian_acted
            && let Some(guardian) = self.guardian.as_mut()
            && guardian.acted(ACTED_EXIT_WAIT).await
        {
            self.guardian_acted = true;
            self.guardian = None;
        }
        self.guardian_acted
    }

    /// Starts a new guardian in place of one that died.
    pub fn replace_guardian(&mut self) -> std::io::Result<()> {
        if let Some(guardian) = self.guardian.as_mut() {
            *guardian = guardian.replace()?;
            self.members.guardian = guardian.pid();
        }
        Ok(())
    }

    /// Sends `sig` to every member; after a signal that ends or stops a
    /// process, SIGCONT too, as a shell's `kill` does: a stopped process
    /// would not act on it.
    pub fn signal(&self, sig: Signal) {
        if matches!(sig, Signal::SIGCONT | Signal::SIGTSTP | Signal::SIGSTOP) {
            self.members.signal(&[sig]);
        } else {
            self.members.signal(&[sig, Signal::SIGCONT]);
        }
    }

    /// What happens next to the group: it is gone (the command reaped and
    /// every other member ended), or its guardian died (killed: it needs a
    /// successor); a guardian that killed the group is noted, and the wait
    /// goes on for the group to be gone. Cancel-safe.
    pub async fn next_event(&mut self) -> GroupEvent {
        loop {
            let (members, command) = (self.members, self.command);
            let (child, status, guardian) = (&mut self.child, &mut self.status, &mut self.guardian);
            tokio::select! {
                gone = gone(child, status, members, command) => return GroupEvent::Gone(gone),
                acted = guardian_ended(guardian) => {
                    if !acted {
                        return GroupEvent::GuardianDied;
                    }
                    self.guardian_acted = true;
                    // It did its work and left: nothing to dismiss later.
                    self.guardian = None;
                }
            }
        }
    }

    /// Ends the group before `deadline`: SIGTERM, up to `grace` (but not
    /// past the deadline) for it to be gone, then SIGKILL. Returns whether
    /// it is gone (after SIGKILL, within `KILLED_WAIT`).
    pub async fn terminate(&mut self, grace: Duration, deadline: Instant) -> bool {
        self.signal(Signal::SIGTERM);
        let kill_at = (Instant::now() + grace).min(deadline);
        let (child, status, members) = (&mut self.child, &mut self.status, self.members);
        let command = self.command;
        if tokio::time::timeout_at(kill_at, gone(child, status, members, command))
            .await
            .is_ok()
        {
            return true;
        }
        let killed = async {
            // Again until empty: a member may fork meanwhile.
            loop {
                members.signal(&[Signal::SIGKILL]);
                let gone = gone(child, status, members, command);
                if let Ok(status) = tokio::time::timeout(POLL, gone).await {
                    return status;
                }
            }
        };
        tokio::time::timeout(KILLED_WAIT, killed).await.is_ok()
    }

    /// The group is gone: the guardian must not kill a group that may
    /// reuse its id later.
    pub fn dismiss_guardian(&mut self) {
        if let Some(guardian) = self.guardian.take() {
            guardian.dismiss();
        }
    }
}

/// What [`Group::next_event`] saw.
pub enum GroupEvent {
    Gone(std::io::Result<ExitStatus>),
    GuardianDied,
}

/// Reaps the command (once), then waits until no member is left.
async fn gone(
    child: &mut Child,
    status: &mut Option<ExitStatus>,
    members: Members,
    command: Pid,
) -> std::io::Result<ExitStatus> {
    let exited = match *status {
        Some(exited) => exited,
        None => *status.insert(child.wait().await?),
    };
    while !members.empty(command) {
        tokio::time::sleep(POLL).await;
    }
    Ok(exited)
}

/// When the guardian ends: whether it killed the group (see
/// [`Guardian::ended`]).
async fn guardian_ended(guardian: &mut Option<Guardian>) -> bool {
    match guardian {
        Some(guardian) => guardian.ended().await,
        None => std::future::pending().await,
    }
}

/// `quorumlock` writes diagnostics while it may be in the background of
/// a terminal (`stty tostop`): SIGTTOU must not stop it for that (its
/// writes then go through, or fail harmlessly). The command gets the usual
/// behaviour back.
pub fn ignore_terminal_stops() {
    // SAFETY: ignoring a signal installs no handler.
    let _ = unsafe { signal::signal(Signal::SIGTTOU, SigHandler::SigIgn) };
}
