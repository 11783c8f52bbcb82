//! The processes of this host, as `/proc` shows them: what `run` and its
//! guardian find a command's processes with, and how they signal one
//! without hitting a process that took over its pid.

use std::collections::HashSet;
use std::os::fd::{FromRawFd, OwnedFd};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

/// A process, as `/proc/<pid>/stat` describes it.
pub struct Process {
    pub pid: Pid,
    pub parent: Pid,
    /// `R`, `S`, `T`, `Z` (its main thread exited), …
    pub state: char,
    /// Its live threads (`num_threads`): a process whose main thread
    /// exited shows `Z` while its other threads run on.
    pub threads: u64,
}

impl Process {
    /// Whether it has ended, every thread of it (then it only waits to be
    /// reaped): `Z` alone is not enough.
    pub fn ended(&self) -> bool {
        matches!(self.state, 'Z' | 'X') && self.threads <= 1
    }
}

/// Whether `/proc` shows this process as itself: else (no `/proc`, or
/// one of another pid namespace) no process of a tree can be found.
pub fn proc_shows_us() -> bool {
    process(nix::unistd::getpid()).is_some_and(|me| me.parent == nix::unistd::getppid())
}

/// Every process now, from `/proc`.
pub fn processes() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| process(Pid::from_raw(pid)))
        .collect()
}

/// Process `pid` now, if there is one.
fn process(pid: Pid) -> Option<Process> {
    // Bytes: the command name is cut at 15 bytes, perhaps inside a
    // character, and may hold spaces and parentheses; what follows the last
    // `)` is ASCII.
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.iter().rposition(|&b| b == b')')? + 2;
    let rest = std::str::from_utf8(stat.get(after..)?).ok()?;
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    let mut number = || fields.next()?.parse::<i64>().ok();
    let parent = number()?;
    // Fields 5 to 19 (process group … priority, nice), then num_threads.
    let threads = (0..15)
        .try_fold((), |(), _| number().map(drop))
        .and(number())?;
    Some(Process {
        pid,
        parent: Pid::from_raw(i32::try_from(parent).ok()?),
        state,
        threads: u64::try_from(threads).ok()?,
    })
}

/// The descendants of `root` in `table` (children, their children, …),
/// but not `skip` itself (its descendants are included).
pub fn descendants(table: &[Process], root: Pid, skip: Option<Pid>) -> Vec<&Process> {
    let mut parents = vec![root];
    let mut found = Vec::new();
    while let Some(parent) = parents.pop() {
        for process in table.iter().filter(|p| p.parent == parent) {
            parents.push(process.pid);
            if Some(process.pid) != skip {
                found.push(process);
            }
        }
    }
    found
}

/// Sends `sig` to each of `members` (a snapshot of a tree under `roots`)
/// that is still one of the tree: by a pidfd, opened before the process's
/// parent is checked, so a pid that was reaped and taken by an unrelated
/// process meanwhile is never signalled (a process whose parent is in the
/// tree is in the tree, also a new one).
pub fn signal_members(members: &[&Process], roots: &[Pid], sig: Signal) {
    let tree: HashSet<Pid> = members
        .iter()
        .map(|p| p.pid)
        .chain(roots.iter().copied())
        .collect();
    for member in members {
        signal_if_in(member.pid, &tree, sig);
    }
}

fn signal_if_in(pid: Pid, tree: &HashSet<Pid>, sig: Signal) {
    // SAFETY: pidfd_open takes a pid and flags, and returns a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        // Gone: nothing to do. No pidfds (a kernel before 5.3, or a
        // seccomp filter that forbids them): the pid as read, rather than
        // no signal at all.
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) {
            let _ = signal::kill(pid, sig);
        }
        return;
    }
    // SAFETY: a new fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let still_ours = process(pid).is_some_and(|now| tree.contains(&now.parent));
    if still_ours {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid pidfd, a signal number, no info, no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                sig as i32,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_as_alive_with_its_threads() {
        let me = process(nix::unistd::getpid()).expect("/proc/self");
        assert!(!me.ended());
        assert!(me.threads >= 1, "{}", me.threads);
        assert_eq!(me.parent, nix::unistd::getppid());
    }

    #[test]
    fn a_zombie_leader_with_live_threads_has_not_ended() {
        let table = |state, threads| Process {
            pid: Pid::from_raw(10),
            parent: Pid::from_raw(1),
            state,
            threads,
        };
        assert!(!table('Z', 2).ended(), "its other thread runs on");
        assert!(table('Z', 1).ended());
        assert!(!table('S', 1).ended());
    }
}
