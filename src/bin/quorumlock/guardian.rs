//! The guardian: the command's parent, a small process (this binary again,
//! `GUARD_ARG`) that answers for everything the command starts when
//! `quorumlock` cannot:
//!
//! - it starts the command and is a child subreaper, so every process the
//!   command starts stays below it, also one that leaves the command's
//!   group or session (`setsid`, a double fork), and it reaps them;
//! - `quorumlock` died (SIGKILL, a crash): its end of the control socket,
//!   which only `quorumlock` holds, closes, and the guardian kills the
//!   whole tree at once;
//! - the lock's validity, as `quorumlock` last told it, is about to end (a
//!   `quorumlock` stopped by SIGSTOP or starved of CPU extends nothing):
//!   SIGTERM to the whole tree, then SIGKILL, by the moments it was told.
//!
//! It tells `quorumlock` the command's pid, and its wait status once it
//! ended. A process counts as gone only when none of its threads lives,
//! and is signalled through a pidfd checked to be still in the tree (see
//! `processes.rs`), so a recycled pid is never hit.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{self, SigHandler, Signal};
use nix::unistd::{self, Pid};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};

use crate::processes::{descendants, processes, signal_members};

/// The hidden first argument that makes this binary a guardian.
pub const GUARD_ARG: &str = "__quorumlock-guard-group";

/// The guardian's exit code after it killed the tree.
const KILLED: i32 = 3;

/// The file descriptor the guardian finds its control socket on.
const CONTROL_FD: i32 = 3;

/// How long `quorumlock` waits for the guardian to say it started the
/// command.
const STARTED_WITHIN: Duration = Duration::from_secs(10);

/// How often the guardian reaps and looks at its deadlines while nothing
/// arrives.
const TICK: Duration = Duration::from_millis(20);

/// How long the guardian keeps killing a tree that will not go (a process
/// stuck in the kernel cannot be killed).
const KILL_FOR: Duration = Duration::from_secs(5);

/// What the command is, for the guardian to start.
pub struct Spawn<'a> {
    pub program: &'a str,
    pub args: &'a [String],
    pub env: Vec<(String, String)>,
    /// The process group the command joins (`quorumlock`'s, when that is
    /// its own job), or `None`: a group of its own.
    pub group: Option<Pid>,
}

/// `quorumlock`'s end of a guardian.
pub struct Guardian {
    process: Child,
    replies: tokio::io::Lines<tokio::io::BufReader<OwnedReadHalf>>,
    orders: OwnedWriteHalf,
    /// What it was last told: `(term_at, kill_at)`, boot clock ms.
    end_at: Option<(u64, u64)>,
}

/// What a guardian said or did.
pub enum Heard {
    /// The command ended so.
    Exited(ExitStatus),
    /// It began to end the tree: the validity it was told is running out.
    Acted,
    /// The guardian ended: `true` if it killed the tree (its deadline
    /// passed, or `quorumlock` was gone), else it was killed.
    Ended { killed: bool },
}

impl Guardian {
    /// Starts a guardian, in a process group of its own (the terminal's
    /// signals do not reach it), which starts the command. A command that
    /// cannot be started is the error, with the reason `exec` gave.
    pub async fn spawn(command: Spawn<'_>) -> std::io::Result<Self> {
        let (ours, theirs) = UnixStream::pair()?;
        let theirs_fd = theirs.as_raw_fd();
        let mut guardian = Command::new(std::env::current_exe()?);
        guardian
            .arg(GUARD_ARG)
            .arg(command.group.map_or(0, Pid::as_raw).to_string())
            .arg("--")
            .arg(command.program)
            .args(command.args)
            .envs(command.env)
            .process_group(0)
            .kill_on_drop(false);
        // SAFETY: only dup2 and fcntl between fork and exec.
        unsafe {
            guardian.pre_exec(move || {
                // At fd 3 already, dup2 would do nothing, and close-on-exec
                // would close it: cleared by hand.
                let moved = if theirs_fd == CONTROL_FD {
                    libc::fcntl(CONTROL_FD, libc::F_SETFD, 0)
                } else {
                    libc::dup2(theirs_fd, CONTROL_FD)
                };
                if moved < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let process = guardian.spawn()?;
        drop(theirs);
        ours.set_nonblocking(true)?;
        let (reader, orders) = tokio::net::UnixStream::from_std(ours)?.into_split();
        let mut replies = tokio::io::BufReader::new(reader).lines();
        let first = tokio::time::timeout(STARTED_WITHIN, replies.next_line())
            .await
            .map_err(|_| std::io::Error::other("the guardian did not start the command"))??
            .unwrap_or_default();
        let started = matches!(
            first.split_once(' '),
            Some(("pid", pid)) if pid.parse::<i32>().is_ok()
        );
        if !started {
            return Err(match first.split_once(' ') {
                Some(("failed", why)) => {
                    let (errno, message) = why.split_once(' ').unwrap_or((why, ""));
                    match errno.parse::<i32>() {
                        Ok(errno) if errno > 0 => std::io::Error::from_raw_os_error(errno),
                        _ => std::io::Error::other(message.to_owned()),
                    }
                }
                _ => std::io::Error::other(format!("the guardian said {first:?}")),
            });
        }
        Ok(Self {
            process,
            replies,
            orders,
            end_at: None,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> Option<Pid> {
        self.process
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
    }

    /// It sends SIGTERM to the tree at `term_at` and SIGKILL at `kill_at`
    /// (boot clock, ms) unless told later moments first.
    pub async fn end_at(&mut self, term_at: u64, kill_at: u64) -> std::io::Result<()> {
        if self.end_at != Some((term_at, kill_at)) {
            let line = format!("end {term_at} {kill_at}\n");
            self.orders.write_all(line.as_bytes()).await?;
            self.end_at = Some((term_at, kill_at));
        }
        Ok(())
    }

    /// The tree is gone: it must not signal pids that may be reused later.
    pub async fn dismiss(mut self) {
        let _ = self.orders.write_all(b"done\n").await;
    }

    /// What it says or does next. Cancel-safe.
    pub async fn next(&mut self) -> Heard {
        loop {
            tokio::select! {
                line = self.replies.next_line() => match line {
                    Ok(Some(line)) => {
                        if let Some(raw) = line.strip_prefix("exit ").and_then(|s| s.parse().ok()) {
                            return Heard::Exited(ExitStatus::from_raw(raw));
                        }
                        if line == "acted" {
                            return Heard::Acted;
                        }
                    }
                    // Its end closed: it ended; what it says next is how.
                    _ => return self.ended().await,
                },
                ended = self.process.wait() => {
                    return Heard::Ended {
                        killed: ended.is_ok_and(|status| status.code() == Some(KILLED)),
                    };
                }
            }
        }
    }

    async fn ended(&mut self) -> Heard {
        let status = self.process.wait().await;
        Heard::Ended {
            killed: status.is_ok_and(|status| status.code() == Some(KILLED)),
        }
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

/// What the guardian was told, from the lines `quorumlock` sends.
#[derive(Debug, Default, PartialEq)]
struct Orders {
    /// When to send SIGTERM, then SIGKILL, to the tree (boot clock, ms).
    end_at: Option<(u64, u64)>,
    done: bool,
}

/// What the guardian does next, by the clock.
#[derive(Debug, PartialEq)]
enum Due {
    Nothing { within: Option<Duration> },
    Terminate,
    Kill,
}

impl Orders {
    /// `end <term_at> <kill_at>` or `done`; anything else is ignored.
    fn heard(&mut self, line: &str) {
        match line.split_once(' ') {
            Some(("end", at)) => {
                self.end_at = at.split_once(' ').and_then(|(term, kill)| {
                    let kill = kill.parse().ok()?;
                    Some((term.parse::<u64>().ok()?.min(kill), kill))
                });
            }
            _ if line == "done" => self.done = true,
            _ => {}
        }
    }

    /// What is due at `now_ms`, the SIGTERM counted once (`terminated`).
    fn due(&self, now_ms: u64, terminated: bool) -> Due {
        match self.end_at {
            None => Due::Nothing { within: None },
            Some((_, kill)) if now_ms >= kill => Due::Kill,
            Some((term, _)) if now_ms >= term && !terminated => Due::Terminate,
            Some((term, kill)) => Due::Nothing {
                within: Some(Duration::from_millis(
                    if terminated { kill } else { term }.saturating_sub(now_ms),
                )),
            },
        }
    }
}

/// The guardian's life (`quorumlock __quorumlock-guard-group <group> --
/// program args…`, its control socket on fd 3): start the command, tell
/// its pid, reap what ends below, tell the command's wait status, and end
/// the tree when told moments pass or `quorumlock` is gone; exit once
/// told `done` (the tree is gone).
pub fn guard_main(args: &[String]) -> std::process::ExitCode {
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        // SAFETY: ignoring a signal installs no handler.
        let _ = unsafe { signal::signal(sig, SigHandler::SigIgn) };
    }
    // SAFETY: fd 3 is the control socket, open for the process's life.
    let control = unsafe { UnixStream::from_raw_fd(CONTROL_FD) };
    let Ok(mut writer) = control.try_clone() else {
        return std::process::ExitCode::FAILURE;
    };
    // Not the command's.
    for fd in [CONTROL_FD, writer.as_raw_fd()] {
        // SAFETY: setting a flag on an fd we own.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    let (group, program, command_args) = match args {
        [group, dashes, program, rest @ ..] if dashes == "--" => {
            (group.parse::<i32>().unwrap_or(0), program, rest)
        }
        _ => return std::process::ExitCode::FAILURE,
    };
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        let _ = writeln!(writer, "failed 0 cannot become a subreaper: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let command = match start(program, command_args, Pid::from_raw(group)) {
        Ok(pid) => pid,
        Err(e) => {
            let _ = writeln!(writer, "failed {} {e}", e.raw_os_error().unwrap_or(0));
            return std::process::ExitCode::SUCCESS;
        }
    };
    if writeln!(writer, "pid {command}").is_err() {
        kill_tree(command);
        return std::process::ExitCode::from(KILLED as u8);
    }
    watch(control, writer, command)
}

/// Starts the command as our child, in `group` (0: its own), with the
/// signal dispositions a shell gives it, and a parent-death signal: if
/// the guardian is killed, the command goes with it.
fn start(program: &str, args: &[String], group: Pid) -> std::io::Result<Pid> {
    let me = unistd::getpid();
    let mut command = std::process::Command::new(program);
    command.args(args);
    // SAFETY: only async-signal-safe calls (setpgid, sigaction, prctl,
    // getppid) between fork and exec, and no allocation.
    unsafe {
        command.pre_exec(move || {
            unistd::setpgid(Pid::from_raw(0), group)?;
            // The guardian's ignored signals, and `quorumlock`'s ignored
            // SIGTTOU (see `ignore_terminal_stops`): the usual behaviour.
            for sig in [
                Signal::SIGINT,
                Signal::SIGTERM,
                Signal::SIGHUP,
                Signal::SIGQUIT,
                Signal::SIGTTOU,
            ] {
                signal::signal(sig, SigHandler::SigDfl)?;
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // Died before the line above: no signal will come.
            if unistd::getppid() != me {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let child = command.spawn()?;
    // Reaped by `reap`, not by std.
    Ok(Pid::from_raw(child.id() as i32))
}

/// Reaps every child that ended; returns the command's raw wait status
/// if it was among them.
fn reap(command: Pid) -> Option<i32> {
    let mut exited = None;
    loop {
        let mut status = 0;
        // SAFETY: a valid pointer to an int.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return exited;
        }
        if pid == command.as_raw() {
            exited = Some(status);
        }
    }
}

/// The guardian's loop, from the command's start.
fn watch(control: UnixStream, mut writer: UnixStream, command: Pid) -> std::process::ExitCode {
    let mut orders = Orders::default();
    let mut reader = BufReader::new(control);
    let mut terminated = false;
    loop {
        if let Some(raw) = reap(command) {
            let _ = writeln!(writer, "exit {raw}");
        }
        let due = boot_millis().map(|now| orders.due(now, terminated));
        match due {
            Some(Due::Kill) => {
                let _ = writeln!(writer, "acted");
                if let Some(raw) = kill_tree(command) {
                    let _ = writeln!(writer, "exit {raw}");
                }
                return std::process::ExitCode::from(KILLED as u8);
            }
            Some(Due::Terminate) => {
                terminated = true;
                let _ = writeln!(writer, "acted");
                let table = processes();
                let tree = descendants(&table, unistd::getpid(), None);
                signal_members(&tree, &[unistd::getpid()], Signal::SIGTERM);
                signal_members(&tree, &[unistd::getpid()], Signal::SIGCONT);
                continue;
            }
            _ => {}
        }
        // At most a tick: reaping waits on it, and poll's clock stops while
        // the host is suspended, the boot clock (looked at above) does not.
        let within = match due {
            Some(Due::Nothing {
                within: Some(within),
            }) => within.min(TICK),
            _ => TICK,
        };
        let mut ready = libc::pollfd {
            fd: reader.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut ready, 1, within.as_millis() as i32) } <= 0 {
            continue; // timed out (the deadlines are checked above) or EINTR
        }
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => {
                // `quorumlock` is gone: nothing answers for the tree.
                kill_tree(command);
                return std::process::ExitCode::from(KILLED as u8);
            }
            Ok(_) => orders.heard(line.trim()),
        }
        if orders.done {
            return std::process::ExitCode::SUCCESS;
        }
    }
}

/// SIGKILL to every process below the guardian, again (new ones may have
/// been forked meanwhile) until none is left or `KILL_FOR` passed,
/// reaping what becomes ours; the command's raw wait status, if it was
/// reaped here.
fn kill_tree(command: Pid) -> Option<i32> {
    let me = unistd::getpid();
    let until = std::time::Instant::now() + KILL_FOR;
    let mut exited = None;
    while std::time::Instant::now() < until {
        let table = processes();
        let alive: Vec<_> = descendants(&table, me, None)
            .into_iter()
            .filter(|p| !p.ended())
            .collect();
        signal_members(&alive, &[me], Signal::SIGKILL);
        exited = exited.or(reap(command));
        if alive.is_empty() && descendants(&processes(), me, None).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    exited
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guardian_follows_what_it_is_told() {
        let mut orders = Orders::default();
        assert_eq!(orders.due(1_000, false), Due::Nothing { within: None });
        orders.heard("end 4000 5000");
        assert_eq!(
            orders.due(1_000, false),
            Due::Nothing {
                within: Some(Duration::from_millis(3_000))
            }
        );
        assert_eq!(orders.due(4_000, false), Due::Terminate);
        assert_eq!(
            orders.due(4_500, true),
            Due::Nothing {
                within: Some(Duration::from_millis(500))
            }
        );
        assert_eq!(orders.due(5_000, true), Due::Kill);
        orders.heard("end 8000 9000");
        assert_eq!(
            orders.due(6_000, true),
            Due::Nothing {
                within: Some(Duration::from_millis(3_000))
            },
            "extended"
        );
        orders.heard("end 9500 9000");
        assert_eq!(
            orders.end_at,
            Some((9_000, 9_000)),
            "SIGTERM never after SIGKILL"
        );
        orders.heard("nonsense");
        assert!(!orders.done);
        orders.heard("done");
        assert!(orders.done);
    }
}
