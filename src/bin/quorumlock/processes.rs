//! The processes of this host, as `/proc` shows them: what `run` and its
//! guardian find a command's processes with, how they signal one without
//! hitting a process that took over its pid, and how they end a tree that
//! keeps forking (stopped whole first, then killed).

use std::collections::HashSet;
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

/// A process, as `/proc/<pid>/stat` describes it.
#[derive(Debug, Clone)]
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

    /// Whether it is stopped (`T`; `t` under a tracer): it cannot fork
    /// until continued.
    pub fn stopped(&self) -> bool {
        matches!(self.state, 'T' | 't')
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

/// The tree below `root` now: its children, their children, …, but not
/// `skip` itself (its descendants are included). Found through each
/// process's own list of its children (`/proc/<pid>/task/<tid>/children`),
/// so a pass costs what the tree holds, not what the host runs: a pass
/// over every process's `stat` on a host of 1 600 processes let a tree that
/// forks at once slip through pass after pass. Where the kernel keeps no
/// such lists (`CONFIG_PROC_CHILDREN` off), every process of `/proc`.
pub fn tree(root: Pid, skip: Option<Pid>) -> Vec<Process> {
    walk(root, skip, |_, _| {})
}

/// [`tree`], calling `met` on each member as soon as it is read, with the
/// pids of the tree read so far (its ancestors among them): a pass that
/// stops what it meets stops a process that forks at once before it has
/// read the rest of the tree.
fn walk(
    root: Pid,
    skip: Option<Pid>,
    mut met: impl FnMut(&Process, &HashSet<Pid>),
) -> Vec<Process> {
    let mut known: HashSet<Pid> = std::iter::once(root).chain(skip).collect();
    let Some(root_children) = children_of(root) else {
        let table = processes();
        let found: Vec<Process> = descendants(&table, root, skip)
            .into_iter()
            .cloned()
            .collect();
        known.extend(found.iter().map(|p| p.pid));
        for process in &found {
            met(process, &known);
        }
        return found;
    };
    let mut found = Vec::new();
    // Newest last in each list: popped first, the process most likely to
    // fork next is met first.
    let mut next: Vec<(Pid, Pid)> = root_children.into_iter().map(|c| (c, root)).collect();
    while let Some((pid, parent)) = next.pop() {
        // Gone since its parent listed it (its children, if any, went to a
        // subreaper: the guardian, or `quorumlock`), or its pid taken by a
        // process of another parent: not of the tree.
        let Some(process) = process(pid).filter(|p| p.parent == parent) else {
            continue;
        };
        if !known.insert(pid) && Some(pid) != skip {
            continue;
        }
        if Some(pid) != skip {
            met(&process, &known);
        }
        if !process.ended() {
            next.extend(
                children_of(pid)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|child| (child, pid)),
            );
        }
        if Some(pid) != skip {
            found.push(process);
        }
    }
    found
}

/// The children of `pid`, from every thread's list; `None` when the
/// kernel keeps no lists (`CONFIG_PROC_CHILDREN` off) or `pid` is gone.
fn children_of(pid: Pid) -> Option<Vec<Pid>> {
    let mut children = Vec::new();
    let mut any_list = false;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let mut path = task.path();
        path.push("children");
        let Ok(list) = std::fs::read_to_string(&path) else {
            continue;
        };
        any_list = true;
        children.extend(
            list.split_ascii_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .map(Pid::from_raw),
        );
    }
    any_list.then_some(children)
}

/// How long [`freeze`] tries before the kill goes ahead anyway: a process
/// in an uninterruptible sleep (a disk, NFS) stops only once it wakes.
pub const FREEZE_FOR: Duration = Duration::from_secs(1);

/// Stops (`SIGSTOP`) every process of the tree below `root` (but `skip`),
/// pass after pass, until a pass finds none running: a stopped process
/// cannot fork, so the tree is then whole and still, and a kill that
/// follows reaches all of it. Each process is stopped as soon as a pass
/// reads it; one forked after its parent was read is met, running, by the
/// next pass. A process already sent a stop that still shows running
/// because it cannot act on it now (`D`: in an uninterruptible sleep; `Z`
/// with live threads: its main thread exited) counts as stopped. `between`
/// runs after each pass (the guardian reaps there, so that exited
/// processes do not pile up). Returns whether the tree froze within
/// `within`.
pub fn freeze(root: Pid, skip: Option<Pid>, within: Duration, mut between: impl FnMut()) -> bool {
    let deadline = Instant::now() + within;
    let mut stopped_once: HashSet<Pid> = HashSet::new();
    for pass in 0u32.. {
        let mut running = 0;
        walk(root, skip, |process, tree| {
            let held = process.stopped()
                || (stopped_once.contains(&process.pid) && matches!(process.state, 'D' | 'Z'));
            if process.ended() || held {
                return;
            }
            running += 1;
            signal_if_in(process.pid, tree, Signal::SIGSTOP);
            stopped_once.insert(process.pid);
        });
        between();
        if running == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        // A stop is delivered when the process next runs: look again at
        // once, then, for what cannot stop yet, a little later.
        if pass < 20 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    false
}

/// One pass of a kill: the tree below `root` (but `skip`) frozen (see
/// [`freeze`]), then `SIGKILL` to every member of it. `between` runs
/// between the passes of the freeze.
pub fn kill_pass(root: Pid, skip: Option<Pid>, between: impl FnMut()) {
    freeze(root, skip, FREEZE_FOR, between);
    walk(root, skip, |process, tree| {
        if !process.ended() {
            signal_if_in(process.pid, tree, Signal::SIGKILL);
        }
    });
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

/// Sends `sig` to each of `targets`, members of `members` (a snapshot of
/// a tree under `roots`), that is still one of the tree: by a pidfd,
/// opened before the process's parent is checked, so a pid that was reaped
/// and taken by an unrelated process meanwhile is never signalled (a
/// process whose parent is in the tree is in the tree, also a new one).
pub fn signal_members<'a>(
    targets: impl IntoIterator<Item = &'a Process>,
    members: &[Process],
    roots: &[Pid],
    sig: Signal,
) {
    let tree: HashSet<Pid> = members
        .iter()
        .map(|p| p.pid)
        .chain(roots.iter().copied())
        .collect();
    for target in targets {
        signal_if_in(target.pid, &tree, sig);
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
