//! Scans of `/proc` (or a test's stand-in root): processes, their threads and names.

use std::fs;
use std::path::Path;

/// The process ids under `proc_root`.
pub fn pids(proc_root: &Path) -> Vec<u32> {
    let Ok(entries) = fs::read_dir(proc_root) else { return Vec::new() };
    entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

/// The threads of `pid`, sorted: (tid, comm).
pub fn threads(proc_root: &Path, pid: u32) -> Vec<(u32, String)> {
    let Ok(entries) = fs::read_dir(proc_root.join(pid.to_string()).join("task")) else { return Vec::new() };
    let mut out: Vec<(u32, String)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let tid = e.file_name().to_str()?.parse().ok()?;
            Some((tid, read_trimmed(&e.path().join("comm"))))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Every thread on the host: (tid, pid, comm).
pub fn all_threads(proc_root: &Path) -> Vec<(u32, u32, String)> {
    pids(proc_root)
        .into_iter()
        .flat_map(|pid| threads(proc_root, pid).into_iter().map(move |(tid, comm)| (tid, pid, comm)))
        .collect()
}

/// Clock ticks per second: the unit of /proc's CPU times (`utime`, `stime`, /proc/stat).
pub fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// What a `/proc/PID/stat` or `/proc/PID/task/TID/stat` file says of its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskStat {
    /// State `R`: running or runnable.
    pub runnable: bool,
    /// The CPU it last ran on.
    pub cpu: u32,
    /// `utime + stime` in clock ticks (a process's file counts its exited threads too).
    pub cpu_ticks: u64,
}

/// Read a task's `stat` file (None if it is gone or not as the kernel writes it). A view that
/// reads the same tasks at every refresh keeps them open instead ([`crate::procfiles`]).
pub fn task_stat(path: &Path) -> Option<TaskStat> {
    parse_task_stat(&fs::read(path).ok()?)
}

pub(crate) fn parse_task_stat(text: &[u8]) -> Option<TaskStat> {
    // The comm may hold spaces, parentheses or any other byte: the fields start after the last
    // ')', and are ASCII. Counted from there, state is field 0, utime 11, stime 12 and
    // processor 36.
    let after_comm = &text[text.iter().rposition(|&b| b == b')')? + 1..];
    let fields: Vec<&str> = std::str::from_utf8(after_comm).ok()?.split_ascii_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some(TaskStat {
        runnable: *fields.first()? == "R",
        cpu: fields.get(36)?.parse().ok()?,
        cpu_ticks: ticks(11)? + ticks(12)?,
    })
}

/// A process's start time in clock ticks since boot (field 22 of `/proc/PID/stat`): with the
/// pid, what tells a process from a later one given the same pid.
pub fn parse_start_ticks(stat: &[u8]) -> Option<u64> {
    let after_comm = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    std::str::from_utf8(after_comm).ok()?.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// A one-line /proc file without its newline (empty if unreadable).
pub fn read_trimmed(path: &Path) -> String {
    trimmed_text(&fs::read(path).unwrap_or_default())
}

/// A one-line /proc file's text without its newline, printable.
pub(crate) fn trimmed_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    // A thread names itself: escape what a terminal would act on.
    virtprof_model::units::printable(text.trim_end_matches('\n')).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_stat_reads_past_a_comm_with_spaces_and_parentheses() {
        // Fields after ')': state, then 1, 2, ... with utime (11) 100, stime (12) 20, CPU (36) 7.
        let fields: Vec<String> = (1..=44)
            .map(|i| match i {
                11 => "100".to_string(),
                12 => "20".to_string(),
                36 => "7".to_string(),
                _ => i.to_string(),
            })
            .collect();
        let text = format!("4242 (CPU 0/KVM) (x)) R {}\n", fields.join(" "));
        let s = parse_task_stat(text.as_bytes()).unwrap();
        assert_eq!(s, TaskStat { runnable: true, cpu: 7, cpu_ticks: 120 });
        assert!(parse_task_stat(b"garbage").is_none());
        // A thread may name itself with bytes that are not UTF-8: its figures still read.
        let mut named = b"4242 (\xff\xfe)".to_vec();
        named.extend_from_slice(text.rsplit_once(')').unwrap().1.as_bytes());
        assert_eq!(parse_task_stat(&named), Some(s));
        assert_eq!(parse_start_ticks(&named), Some(19), "field 22 of the file: 19th after the state");
        assert!(task_stat(Path::new("/proc/self/stat")).is_some());
    }

    #[test]
    fn finds_this_process_and_its_threads() {
        let me = std::process::id();
        let proc_root = Path::new("/proc");
        assert!(pids(proc_root).contains(&me));
        assert!(threads(proc_root, me).iter().any(|(tid, comm)| *tid == me && !comm.is_empty()));
        assert!(all_threads(proc_root).iter().any(|(tid, pid, _)| *tid == me && *pid == me));
    }
}

/// A /proc file kept open and read whole with `pread` into a kept buffer: a sample costs one
/// syscall per buffer-full and allocates only when the file outgrows the buffer.
#[derive(Debug)]
pub struct ProcFile {
    file: std::fs::File,
    buf: Vec<u8>,
}

impl ProcFile {
    /// The most a /proc file is read to (a runaway file must not take all memory).
    const MAX: usize = 16 << 20;

    /// Open `path`.
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<ProcFile> {
        Ok(ProcFile { file: std::fs::File::open(path)?, buf: vec![0; 64 << 10] })
    }

    /// The file's bytes now.
    pub fn read_bytes(&mut self) -> std::io::Result<&[u8]> {
        use std::os::unix::fs::FileExt;
        let mut len = 0;
        loop {
            let n = self.file.read_at(&mut self.buf[len..], len as u64)?;
            if n == 0 {
                break;
            }
            len += n;
            if len == self.buf.len() {
                if len >= Self::MAX {
                    break;
                }
                self.buf.resize(len * 2, 0);
            }
        }
        Ok(&self.buf[..len])
    }

    /// The file's text now.
    pub fn read(&mut self) -> std::io::Result<&str> {
        std::str::from_utf8(self.read_bytes()?).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}
