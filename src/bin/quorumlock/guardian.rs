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
//! It tells `quorumlock` that it started the command, when it begins to
//! end the tree, the command's wait status, and when nothing is left below
//! it: `waitpid` says it has no child at all, which (as the subreaper of
//! everything below it) cannot miss a live descendant, where a walk of
//! `/proc` could. Processes are signalled through a pidfd checked to be
//! still in the tree (see `processes.rs`), so a recycled pid is never hit.
//! It names itself `GUARDIAN_NAME`, so that `killall quorumlock` does not
//! reach it.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{self, SigHandler, Signal};
use nix::unistd::{self, Pid};
use tokio::io::AsyncBufReadExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};

use crate::processes::{kill_pass, signal_members, tree};

/// The hidden first argument that makes this binary a guardian.
pub const GUARD_ARG: &str = "__quorumlock-guard-group";

/// The guardian's exit code after it killed the tree.
const KILLED: i32 = 3;

/// The guardian's process name (`comm`, at most 15 bytes).
const GUARDIAN_NAME: &str = "qlock-guardian";

/// How long `quorumlock` waits for the guardian to say it started the
/// command.
const STARTED_WITHIN: Duration = Duration::from_secs(10);

/// How often the guardian reaps and looks at its deadlines while nothing
/// arrives.
const TICK: Duration = Duration::from_millis(20);

/// What the command is, for the guardian to start.
pub struct Spawn<'a> {
    pub program: &'a str,
    pub args: &'a [String],
    pub env: Vec<(String, String)>,
    /// The process group the command joins (`quorumlock`'s, when that is
    /// its own job), or `None`: a group of its own.
    pub group: Option<Pid>,
    /// When to end the tree, `(term_at, kill_at)` on the boot clock (ms),
    /// until told otherwise; the command is not started past `kill_at`.
    pub end_at: (u64, u64),
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
    /// Nothing is left below it: the command and all it started ended.
    Empty,
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
        let (term_at, kill_at) = command.end_at;
        // This very binary, also after an upgrade replaced the file.
        let mut guardian = Command::new("/proc/self/exe");
        guardian
            .arg0("quorumlock")
            .arg(GUARD_ARG)
            .arg(theirs_fd.to_string())
            .arg(command.group.map_or(0, Pid::as_raw).to_string())
            .arg(term_at.to_string())
            .arg(kill_at.to_string())
            .arg("--")
            .arg(command.program)
            .args(command.args)
            .envs(command.env)
            .process_group(0)
            .kill_on_drop(false);
        // SAFETY: only fcntl between fork and exec.
        unsafe {
            guardian.pre_exec(move || {
                // Its number stays (it is an argument); no other fd moves,
                // so those the command inherits stay where they were.
                if libc::fcntl(theirs_fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut process = guardian.spawn()?;
        drop(theirs);
        ours.set_nonblocking(true)?;
        let (reader, orders) = tokio::net::UnixStream::from_std(ours)?.into_split();
        let mut replies = tokio::io::BufReader::new(reader).lines();
        let first = match tokio::time::timeout(STARTED_WITHIN, replies.next_line()).await {
            Ok(line) => line?.unwrap_or_default(),
            Err(_) => {
                // Stopped, or starved: it may have started the command,
                // which dies with it (its parent-death signal).
                let _ = process.start_kill();
                let _ = process.wait().await;
                return Err(std::io::Error::other(
                    "the guardian did not say within 10 s that it started the command",
                ));
            }
        };
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
    /// (boot clock, ms) unless told later moments first. Never waits: a
    /// guardian that does not read (stopped) is not told this time (its
    /// socket holds hundreds of TTLs of lines before that happens).
    pub fn end_at(&mut self, term_at: u64, kill_at: u64) -> std::io::Result<()> {
        if self.end_at != Some((term_at, kill_at)) {
            let line = format!("end {term_at} {kill_at}\n");
            match self.orders.try_write(line.as_bytes()) {
                Ok(n) if n == line.len() => self.end_at = Some((term_at, kill_at)),
                Ok(_) => return Err(std::io::Error::other("a line written in part")),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The tree is gone: it must not signal pids that may be reused later.
    pub fn dismiss(self) {
        let _ = self.orders.try_write(b"done\n");
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
                        if line == "empty" {
                            return Heard::Empty;
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
                if let Some(end_at) = Self::moments(at) {
                    self.end_at = Some(end_at);
                }
            }
            _ if line == "done" => self.done = true,
            _ => {}
        }
    }

    /// `<term_at> <kill_at>`, the SIGTERM never after the SIGKILL.
    fn moments(text: &str) -> Option<(u64, u64)> {
        let (term, kill) = text.split_once(' ')?;
        let kill = kill.parse().ok()?;
        Some((term.parse::<u64>().ok()?.min(kill), kill))
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

/// The guardian's life (`quorumlock __quorumlock-guard-group <control fd>
/// <group> <term_at> <kill_at> -- program args…`): start the command (not
/// past `kill_at`), tell it started, reap what ends below, tell the
/// command's wait status and when nothing is left, and end the tree when
/// told moments pass or `quorumlock` is gone; exit once told `done`.
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
    let [
        fd,
        group,
        term_at,
        kill_at,
        dashes,
        program,
        command_args @ ..,
    ] = args
    else {
        return std::process::ExitCode::FAILURE;
    };
    let (Ok(fd), Some(end_at)) = (
        fd.parse::<i32>(),
        Orders::moments(&format!("{term_at} {kill_at}")),
    ) else {
        return std::process::ExitCode::FAILURE;
    };
    if dashes != "--" {
        return std::process::ExitCode::FAILURE;
    }
    // SAFETY: the control socket, passed to us at this number.
    let control = unsafe { UnixStream::from_raw_fd(fd) };
    let Ok(mut writer) = control.try_clone() else {
        return std::process::ExitCode::FAILURE;
    };
    // Not the command's.
    for fd in [fd, writer.as_raw_fd()] {
        // SAFETY: setting a flag on an fd we own.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    let _ = nix::sys::prctl::set_name(&std::ffi::CString::new(GUARDIAN_NAME).unwrap_or_default());
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        let _ = writeln!(writer, "failed 0 cannot become a subreaper: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let orders = Orders {
        end_at: Some(end_at),
        done: false,
    };
    if boot_millis().is_none_or(|now| now >= end_at.1) {
        let _ = writeln!(
            writer,
            "failed 0 the lock's validity ran out before the command could start"
        );
        return std::process::ExitCode::SUCCESS;
    }
    let group = Pid::from_raw(group.parse().unwrap_or(0));
    let command = match start(program, command_args, group) {
        Ok(pid) => pid,
        Err(e) => {
            let _ = writeln!(writer, "failed {} {e}", e.raw_os_error().unwrap_or(0));
            return std::process::ExitCode::SUCCESS;
        }
    };
    if writeln!(writer, "pid {command}").is_err() {
        kill_tree();
        return std::process::ExitCode::from(KILLED as u8);
    }
    watch(control, writer, command, orders)
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

/// What reaping found.
#[derive(Debug, Default)]
struct Reaped {
    /// The command's raw wait status, if it was reaped now.
    command: Option<i32>,
    /// No child is left at all (`ECHILD`): nothing lives below us.
    none_left: bool,
}

/// Reaps every child that ended.
fn reap(command: Pid) -> Reaped {
    let mut reaped = Reaped::default();
    loop {
        let mut status = 0;
        // SAFETY: a valid pointer to an int.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid < 0 {
            reaped.none_left = std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
            return reaped;
        }
        if pid == 0 {
            return reaped;
        }
        if pid == command.as_raw() {
            reaped.command = Some(status);
        }
    }
}

/// The guardian's loop, from the command's start.
fn watch(
    control: UnixStream,
    mut writer: UnixStream,
    command: Pid,
    mut orders: Orders,
) -> std::process::ExitCode {
    let mut reader = BufReader::new(control);
    let mut terminated = false;
    // The command's pid once it is reaped: no longer the command's (an
    // orphan may be given it).
    let mut command = Some(command);
    let mut told_empty = false;
    loop {
        let reaped = reap(command.unwrap_or(Pid::from_raw(-1)));
        if let Some(raw) = reaped.command {
            command = None;
            let _ = writeln!(writer, "exit {raw}");
        }
        if command.is_none() && reaped.none_left && !told_empty {
            told_empty = true;
            let _ = writeln!(writer, "empty");
        }
        // Everything `quorumlock` sent so far; the last moments count.
        let open = read_orders(&mut reader, &mut orders).is_ok();
        if orders.done {
            return std::process::ExitCode::SUCCESS;
        }
        if !open {
            // `quorumlock` is gone: nothing answers for the tree.
            kill_tree();
            return std::process::ExitCode::from(KILLED as u8);
        }
        let Some(now) = boot_millis() else {
            continue;
        };
        if terminated && orders.end_at.is_some_and(|(term, _)| term > now) {
            // Told later moments since: a later SIGTERM is due again.
            terminated = false;
        }
        let due = orders.due(now, terminated);
        match due {
            Due::Kill => {
                let _ = writeln!(writer, "acted");
                if let Some(raw) = kill_tree().command
                    && command.is_some()
                {
                    let _ = writeln!(writer, "exit {raw}");
                }
                if !told_empty {
                    let _ = writeln!(writer, "empty");
                }
                return std::process::ExitCode::from(KILLED as u8);
            }
            Due::Terminate => {
                terminated = true;
                let _ = writeln!(writer, "acted");
                let me = unistd::getpid();
                let members = tree(me, None);
                signal_members(&members, &members, &[me], Signal::SIGTERM);
                signal_members(&members, &members, &[me], Signal::SIGCONT);
                continue;
            }
            Due::Nothing { .. } => {}
        }
        // At most a tick: reaping waits on it, and poll's clock stops while
        // the host is suspended, the boot clock (looked at above) does not.
        let within = match due {
            Due::Nothing {
                within: Some(within),
            } => within.min(TICK),
            _ => TICK,
        };
        let mut ready = libc::pollfd {
            fd: reader.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd. Its result does not matter: the lines
        // are read (without blocking) at the top of the loop.
        unsafe { libc::poll(&mut ready, 1, within.as_millis() as i32) };
    }
}

/// Takes in every line `quorumlock` has sent, without blocking; an error
/// when its end is closed (`quorumlock` is gone).
fn read_orders(reader: &mut BufReader<UnixStream>, orders: &mut Orders) -> std::io::Result<()> {
    reader.get_ref().set_nonblocking(true)?;
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) if line.ends_with('\n') => orders.heard(line.trim()),
            // A line in part: the rest comes with the next read.
            Ok(_) => {
                let mut rest = String::new();
                reader.get_ref().set_nonblocking(false)?;
                reader.read_line(&mut rest)?;
                reader.get_ref().set_nonblocking(true)?;
                line.push_str(&rest);
                orders.heard(line.trim());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Ends every process below the guardian: each pass stops the tree whole
/// (a stopped process cannot fork), then sends it SIGKILL, reaping what
/// becomes ours, until a pass finds nothing left. It does not give up:
/// nothing else answers for the tree once `quorumlock` is gone, and the
/// tree is said to be gone only once it is.
fn kill_tree() -> Reaped {
    let me = unistd::getpid();
    let mut all = Reaped::default();
    loop {
        kill_pass(me, None, || {
            all.command = all.command.or(reap(Pid::from_raw(-1)).command);
        });
        let reaped = reap(Pid::from_raw(-1));
        all.command = all.command.or(reaped.command);
        if reaped.none_left {
            all.none_left = true;
            return all;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
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
