//! The processes of this host, as `/proc` shows them: what `run` and its
//! guardian find a command's processes with.

use nix::unistd::Pid;

/// A process, as `/proc/<pid>/stat` describes it.
pub struct Process {
    pub pid: Pid,
    pub parent: Pid,
    pub group: Pid,
    /// `R`, `S`, `T`, `Z` (exited, not reaped), …
    pub state: char,
}

/// Every process now, from `/proc`.
pub fn processes() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name, in parentheses, may hold spaces.
            let mut fields = stat.get(stat.rfind(')')? + 2..)?.split(' ');
            let state = fields.next()?.chars().next()?;
            let mut number = || fields.next()?.parse().ok().map(Pid::from_raw);
            let (parent, group) = (number()?, number()?);
            Some(Process {
                pid: Pid::from_raw(pid),
                parent,
                group,
                state,
            })
        })
        .collect()
}
