//! The command `run` starts, and every process it starts in turn (its
//! tree), which `quorumlock` answers for: every signal `quorumlock` passes
//! on goes to the whole tree, the lock is released only once the tree is
//! gone, and the tree never outlives `quorumlock`'s hold on the lock: the
//! command's parent is a guardian (see `guardian.rs`) that outlives a
//! killed `quorumlock`, keeps the tree below it (a child subreaper:
//! `setsid`, `setpgid` and double forks do not leave it), and ends the
//! tree when `quorumlock` dies or stops telling it the lock is still
//! valid.
//!
//! Which process group the command leads or joins depends on where
//! `quorumlock` runs:
//!
//! - **Its own job** (it leads its process group: an interactive shell
//!   started it, or a supervisor with `setsid`): the command joins that
//!   group, so the terminal treats `quorumlock` and its command as one job,
//!   as it treats `flock` and its command: the command reads the terminal,
//!   Ctrl-C and Ctrl-Z reach both, `fg` and `bg` continue both. (The
//!   guardian keeps a group of its own: the terminal's signals do not
//!   reach it.)
//! - **Someone else's group** (a script, `make`, `cron`): the command
//!   leads a group of its own, so that what `quorumlock` sends it never
//!   reaches the caller. Signals from the terminal reach `quorumlock` only,
//!   and it passes them on (Ctrl-Z stops both). The command's group is not
//!   the terminal's foreground: reading the terminal stops it.
//!
//! `quorumlock` is a child subreaper too: if the guardian is killed, the
//! command dies with it (a parent-death signal) and what it started comes
//! to `quorumlock`, which ends it before letting go of the lock.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{self, Pid};
use tokio::time::Instant;

use crate::guardian::{Guardian, Heard, Spawn, boot_millis};
use crate::processes::{kill_pass, proc_shows_us, signal_members, tree};

/// How often the tree is checked for members once the command exited.
const POLL: Duration = Duration::from_millis(10);

/// How long a guardian that may have ended the tree is given to finish
/// exiting, to learn whether it did.
const ACTED_EXIT_WAIT: Duration = Duration::from_millis(200);

/// The longest wait for a killed tree to be gone: SIGKILL cannot be
/// caught, so only a process stuck in the kernel takes longer.
const KILLED_WAIT: Duration = Duration::from_secs(5);

/// What `quorumlock` answers for: its descendants (the command and all it
/// started, below the guardian, or below `quorumlock` if the guardian
/// died), but the guardian.
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
        let members = tree(self.me, self.guardian);
        let roots: Vec<Pid> = std::iter::once(self.me).chain(self.guardian).collect();
        for &sig in signals {
            signal_members(&members, &members, &roots, sig);
        }
    }

    /// One pass of a kill (see [`kill_pass`]): the tree stopped whole,
    /// then SIGKILL to all of it. Off the runtime's threads: stopping a
    /// tree that keeps forking takes passes.
    async fn kill_pass(self) {
        let _ = tokio::task::spawn_blocking(move || {
            kill_pass(self.me, self.guardian, || {
                self.reap_orphans();
            })
        })
        .await;
    }

    /// Reaps what ended among `quorumlock`'s children once the guardian
    /// is gone (its orphans come to `quorumlock`, a subreaper); whether
    /// it has no child left at all. With a guardian, nothing is reaped
    /// (its status is the runtime's to collect) and the answer is no.
    fn reap_orphans(self) -> bool {
        if self.guardian.is_some() {
            return false;
        }
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return false,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::ECHILD) => return true,
                Err(_) => return false,
            }
        }
    }

    /// Whether every member has ended (every thread of it: a process
    /// whose main thread exited has not). Once the guardian is gone, only
    /// "no child left" says so (reaping what ended): a process below
    /// `quorumlock` that outlives its parent becomes `quorumlock`'s child,
    /// so while any lives `quorumlock` has one, where a walk of the tree
    /// may miss one reparented after it read `quorumlock`'s list.
    pub fn empty(self) -> bool {
        if self.guardian.is_none() {
            return self.reap_orphans();
        }
        tree(self.me, self.guardian)
            .iter()
            .all(|member| member.ended())
    }
}

/// A command and its tree, which `quorumlock` answers for.
pub struct Group {
    shared: bool,
    members: Members,
    /// The command's exit status, once the guardian told it.
    status: Option<ExitStatus>,
    /// The guardian said nothing is left below it.
    empty: bool,
    /// `None` once it ended or was dismissed.
    guardian: Option<Guardian>,
    guardian_acted: bool,
    /// The guardian ended without ending the tree (it was killed).
    guardian_died: bool,
}

/// What [`Group::next_event`] saw.
pub enum GroupEvent {
    /// The command exited (so), and every process it started ended.
    Gone(ExitStatus),
    /// The guardian was killed: the command died with it; what it started
    /// is `quorumlock`'s to end.
    GuardianDied,
}

impl Group {
    /// Starts `command` under a guardian, in `quorumlock`'s group if that
    /// is its own job, else in a group of its own. On an error, nothing of
    /// it is left running.
    pub async fn spawn(mut command: Spawn<'_>) -> std::io::Result<Self> {
        if !proc_shows_us() {
            return Err(std::io::Error::other(
                "/proc does not show this process (not mounted, or of another pid namespace): \
                 the command's processes could not be followed",
            ));
        }
        let me = unistd::getpid();
        let shared = unistd::getpgrp() == me;
        command.group = shared.then_some(me);
        nix::sys::prctl::set_child_subreaper(true)?;
        let guardian = match Guardian::spawn(command).await {
            Ok(guardian) => guardian,
            Err(e) => {
                end_strays().await;
                return Err(e);
            }
        };
        Ok(Self {
            shared,
            members: Members {
                me,
                guardian: guardian.pid(),
            },
            status: None,
            empty: false,
            guardian: Some(guardian),
            guardian_acted: false,
            guardian_died: false,
        })
    }

    /// Whether the command shares `quorumlock`'s job (see the module docs).
    pub fn shared(&self) -> bool {
        self.shared
    }

    /// Tells the guardian the lock is valid until `valid_until`: it sends
    /// the tree SIGTERM `grace` before `margin` before that, and SIGKILL
    /// `margin` before it, unless told later moments. On the boot clock,
    /// which counts a suspended host. A guardian that cannot be told ended
    /// (noted: whether it ended the tree).
    pub async fn valid_until(&mut self, valid_until: Instant, margin: Duration, grace: Duration) {
        let (Some((term_at, kill_at)), Some(guardian)) = (
            end_moments(valid_until, margin, grace),
            self.guardian.as_mut(),
        ) else {
            return;
        };
        if guardian.end_at(term_at, kill_at).is_err() {
            let heard = tokio::time::timeout(ACTED_EXIT_WAIT, guardian.next()).await;
            if let Ok(heard) = heard {
                self.heard(heard);
            }
        }
    }

    fn heard(&mut self, heard: Heard) {
        match heard {
            Heard::Exited(status) => self.status = Some(status),
            Heard::Empty => self.empty = true,
            Heard::Acted => self.guardian_acted = true,
            Heard::Ended { killed } => {
                self.guardian = None;
                // Its pid may be given to another process: no longer
                // skipped; what it left below it came to us.
                self.members.guardian = None;
                self.guardian_acted |= killed;
                self.guardian_died |= !killed;
            }
        }
    }

    /// Whether the guardian ended the tree (the validity it was last told
    /// ran out while quorumlock was stopped or starved). A command killed
    /// by a signal may have been killed by it just now: then it is given a
    /// moment to say so (its exit).
    pub async fn guardian_acted(&mut self) -> bool {
        let signalled = self.status.is_some_and(|status| {
            matches!(
                status.signal().and_then(|s| Signal::try_from(s).ok()),
                Some(Signal::SIGKILL | Signal::SIGTERM)
            )
        });
        if signalled
            && !self.guardian_acted
            && let Some(guardian) = self.guardian.as_mut()
            && let Ok(heard) = tokio::time::timeout(ACTED_EXIT_WAIT, guardian.next()).await
        {
            self.heard(heard);
        }
        self.guardian_acted
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

    /// What happens next to the tree: it is gone (the command exited and
    /// every other member ended), or the guardian was killed; a guardian
    /// that ended the tree is noted, and the wait goes on for the tree to
    /// be gone. Cancel-safe.
    pub async fn next_event(&mut self) -> GroupEvent {
        loop {
            if std::mem::take(&mut self.guardian_died) {
                return GroupEvent::GuardianDied;
            }
            if let Some(status) = self.finished() {
                return GroupEvent::Gone(status);
            }
            match self.guardian.as_mut() {
                Some(guardian) => {
                    tokio::select! {
                        heard = guardian.next() => self.heard(heard),
                        () = tokio::time::sleep(POLL), if self.status.is_some() => {}
                    }
                }
                None => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// The command's status once the tree is gone: as the guardian told
    /// it, or, from a guardian that ended without telling, as killed. Gone
    /// as the guardian says (it has no child left: nothing below it can
    /// live), or, once it ended, as `/proc` shows `quorumlock`'s tree.
    fn finished(&self) -> Option<ExitStatus> {
        let status = match self.status {
            Some(status) => status,
            None if self.guardian.is_none() => ExitStatus::from_raw(Signal::SIGKILL as i32),
            None => return None,
        };
        let gone = if self.guardian.is_some() {
            self.empty
        } else {
            self.members.empty()
        };
        gone.then_some(status)
    }

    /// Ends the tree before `deadline`: SIGTERM, up to `grace` (but not
    /// past the deadline) for it to be gone, then SIGKILL. Returns whether
    /// it is gone (after SIGKILL, within `KILLED_WAIT`).
    pub async fn terminate(&mut self, grace: Duration, deadline: Instant) -> bool {
        self.signal(Signal::SIGTERM);
        let kill_at = (Instant::now() + grace).min(deadline);
        if tokio::time::timeout_at(kill_at, self.gone()).await.is_ok() {
            return true;
        }
        let killed = async {
            // Again until empty: stopped whole first, so that a member
            // that keeps forking is caught.
            loop {
                self.members.kill_pass().await;
                if tokio::time::timeout(POLL, self.gone()).await.is_ok() {
                    return;
                }
            }
        };
        tokio::time::timeout(KILLED_WAIT, killed).await.is_ok()
    }

    /// Waits until the tree is gone (whatever the guardian does meanwhile).
    async fn gone(&mut self) {
        loop {
            if self.finished().is_some() {
                return;
            }
            match self.guardian.as_mut() {
                Some(guardian) => {
                    tokio::select! {
                        heard = guardian.next() => self.heard(heard),
                        () = tokio::time::sleep(POLL) => {}
                    }
                }
                None => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// The tree is gone: the guardian must not signal pids that may be
    /// reused later.
    pub fn dismiss_guardian(&mut self) {
        if let Some(guardian) = self.guardian.take() {
            guardian.dismiss();
        }
    }
}

/// When the guardian is to end the tree for a lock valid until
/// `valid_until`: `(term_at, kill_at)` on the boot clock (ms), SIGKILL
/// `margin` before that, SIGTERM `grace` before the SIGKILL. The boot
/// clock is read first: a stall between the two readings moves the
/// moments earlier, never later.
pub fn end_moments(valid_until: Instant, margin: Duration, grace: Duration) -> Option<(u64, u64)> {
    let now = boot_millis()?;
    let left = valid_until
        .saturating_duration_since(Instant::now())
        .saturating_sub(margin);
    let kill_at = now + left.as_millis() as u64;
    Some((kill_at.saturating_sub(grace.as_millis() as u64), kill_at))
}

/// SIGKILL to every process below `quorumlock` (what a guardian that died
/// left), until none is left or `KILLED_WAIT` passed.
async fn end_strays() {
    let members = Members {
        me: unistd::getpid(),
        guardian: None,
    };
    let killed = async {
        while !members.empty() {
            members.kill_pass().await;
            tokio::time::sleep(POLL).await;
        }
    };
    let _ = tokio::time::timeout(KILLED_WAIT, killed).await;
}

/// `quorumlock` writes diagnostics while it may be in the background of
/// a terminal (`stty tostop`): SIGTTOU must not stop it for that (its
/// writes then go through, or fail harmlessly). The command gets the usual
/// behaviour back (the guardian restores it).
pub fn ignore_terminal_stops() {
    // SAFETY: ignoring a signal installs no handler.
    let _ =
        unsafe { nix::sys::signal::signal(Signal::SIGTTOU, nix::sys::signal::SigHandler::SigIgn) };
}
