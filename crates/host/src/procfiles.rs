//! Small `/proc` files a live view reads at every refresh (a task's `stat`, `schedstat`), kept
//! open and read again in place.
//!
//! Opening `/proc/PID/task/TID/stat` looks up every component of the path and checks the task
//! at each step, and `read_to_string` then takes three reads; with hundreds of VMs that was
//! most of a scrape's cost. Kept open, a file is one `pread` at offset 0, which makes the
//! kernel write its text afresh. An open file also stays with its task: once the task has
//! exited, reads fail, so a thread id the kernel gives to a new thread is never read as the old
//! thread's (the file is dropped, and the path opened again finds the new one).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::procfs::{parse_task_stat, trimmed_text, TaskStat};
use crate::schedstat::Schedstat;

/// The longest text read: the files kept are a few hundred bytes; one that fills the buffer is
/// not read at all rather than read in part.
pub const MAX_TEXT: usize = 4096;

/// Files kept open, at most a bound of them, each dropped when a read fails or when a
/// [`ProcFiles::sweep`] finds it unread for [`ProcFiles::IDLE`].
#[derive(Debug)]
pub struct ProcFiles {
    open: HashMap<PathBuf, Kept>,
    max_open: usize,
    buffer: Box<[u8; MAX_TEXT]>,
}

#[derive(Debug)]
struct Kept {
    file: File,
    last_read: Instant,
}

impl ProcFiles {
    /// Keep at most `max_open` files open (0: open and close every time).
    pub fn new(max_open: usize) -> ProcFiles {
        ProcFiles { open: HashMap::new(), max_open, buffer: Box::new([0; MAX_TEXT]) }
    }

    /// Keep at most an eighth of the files this process may open (the rest stay for the
    /// trace, the VMs' stats fds, clients and other such caches), and never more than 16 384.
    pub fn for_this_process() -> ProcFiles {
        ProcFiles::new(usize::try_from(open_file_limit() / 8).unwrap_or(usize::MAX).min(16_384))
    }

    /// The text of `path` now (None if it cannot be read, e.g. its task is gone).
    pub fn read(&mut self, path: &Path) -> Option<&[u8]> {
        let now = Instant::now();
        if let Some(kept) = self.open.get_mut(path) {
            if let Some(n) = read_whole(&kept.file, &mut self.buffer) {
                kept.last_read = now;
                return Some(&self.buffer[..n]);
            }
            self.open.remove(path);
        }
        let file = File::open(path).ok()?;
        let n = read_whole(&file, &mut self.buffer)?;
        if self.open.len() < self.max_open {
            self.open.insert(path.to_path_buf(), Kept { file, last_read: now });
        }
        Some(&self.buffer[..n])
    }

    /// A task's `stat` file, parsed.
    pub fn task_stat(&mut self, path: &Path) -> Option<TaskStat> {
        parse_task_stat(self.read(path)?)
    }

    /// A task's `schedstat` file, parsed.
    pub fn schedstat(&mut self, path: &Path) -> Option<Schedstat> {
        Schedstat::parse(std::str::from_utf8(self.read(path)?).ok()?)
    }

    /// How long a file may go unread before a sweep closes it: longer than any scrape
    /// interval, so the files a scrape reads stay open between scrapes.
    pub const IDLE: Duration = Duration::from_secs(300);

    /// The threads of `pid`, sorted: (tid, comm), as [`crate::procfs::threads`] lists them,
    /// with each name read through a kept file.
    pub fn threads(&mut self, proc_root: &Path, pid: u32) -> Vec<(u32, String)> {
        let task = proc_root.join(pid.to_string()).join("task");
        let Ok(entries) = std::fs::read_dir(&task) else { return Vec::new() };
        let tids: Vec<u32> =
            entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
        let mut out: Vec<(u32, String)> = tids
            .into_iter()
            .map(|tid| {
                let comm = self.read(&task.join(tid.to_string()).join("comm")).map(trimmed_text).unwrap_or_default();
                (tid, comm)
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Close the files unread for [`ProcFiles::IDLE`] (tasks no longer looked at, e.g. of a VM
    /// that a filter now leaves out).
    pub fn sweep(&mut self) {
        self.sweep_idle(Self::IDLE);
    }

    fn sweep_idle(&mut self, idle: Duration) {
        self.open.retain(|_, kept| kept.last_read.elapsed() < idle);
    }

    /// Files open now.
    pub fn open_count(&self) -> usize {
        self.open.len()
    }
}

/// How many files this process may have open (its soft `RLIMIT_NOFILE`).
pub fn open_file_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur
    } else {
        1024
    }
}

/// Let this process open as many files as its hard limit allows (at most 1 Mi): a live view
/// of hundreds of VMs holds a stats fd per VM and per vCPU and keeps /proc files open, past
/// the soft limit of 1 024 most systems set for compatibility with `select()`, which virtprof
/// does not use. Go raises it so for every program. Failing leaves the limit as it was.
pub fn raise_open_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct it is given; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max.min(1 << 20);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// The whole text of a /proc file read from its start in one read (a seq_file gives all of a
/// short file at once); None on an error, an empty file or one too long for the buffer.
fn read_whole(file: &File, buffer: &mut [u8; MAX_TEXT]) -> Option<usize> {
    match file.read_at(buffer, 0) {
        Ok(n) if n > 0 && n < MAX_TEXT => Some(n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_thread_stat() -> PathBuf {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        PathBuf::from(format!("/proc/{}/task/{tid}/stat", std::process::id()))
    }

    #[test]
    fn a_kept_file_reads_fresh_figures_each_time() {
        let mut files = ProcFiles::new(8);
        let path = own_thread_stat();
        let before = files.task_stat(&path).unwrap();
        assert_eq!(files.open_count(), 1);
        // Burn CPU until the tick count moves: the kept file must show it.
        let start = std::time::Instant::now();
        let mut after = before;
        while after.cpu_ticks == before.cpu_ticks && start.elapsed().as_secs() < 10 {
            std::hint::black_box((0..100_000u64).sum::<u64>());
            after = files.task_stat(&path).unwrap();
        }
        assert!(after.cpu_ticks > before.cpu_ticks, "{before:?} -> {after:?}");
        assert!(after.runnable, "this thread is running while it reads");
        assert_eq!(files.open_count(), 1);
        let sched = files.schedstat(&path.with_file_name("schedstat")).unwrap();
        assert!(sched.run_ns > 0);
    }

    #[test]
    fn a_file_of_an_exited_thread_is_dropped_and_none_is_read() {
        let mut files = ProcFiles::new(8);
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            tx.send(own_thread_stat()).unwrap();
            done_rx.recv().unwrap();
        });
        let path = rx.recv().unwrap();
        assert!(files.task_stat(&path).is_some());
        done_tx.send(()).unwrap();
        thread.join().unwrap();
        // The thread is reaped with its process's next look; its kept file fails either way.
        assert!(files.task_stat(&path).is_none());
        assert_eq!(files.open_count(), 0);
    }

    #[test]
    fn threads_are_listed_as_procfs_lists_them() {
        let mut files = ProcFiles::new(64);
        let (root, pid) = (Path::new("/proc"), std::process::id());
        assert_eq!(files.threads(root, pid), crate::procfs::threads(root, pid));
        assert_eq!(files.threads(root, pid), crate::procfs::threads(root, pid), "again, from kept files");
        assert!(files.open_count() > 0);
    }

    #[test]
    fn open_files_are_bounded_and_swept() {
        let mut files = ProcFiles::new(1);
        let stat = own_thread_stat();
        let schedstat = stat.with_file_name("schedstat");
        assert!(files.read(&stat).is_some());
        assert!(files.read(&schedstat).is_some(), "read though not kept");
        assert_eq!(files.open_count(), 1);
        files.sweep();
        assert_eq!(files.open_count(), 1, "read just now");
        std::thread::sleep(Duration::from_millis(20));
        files.sweep_idle(Duration::from_millis(10));
        assert_eq!(files.open_count(), 0, "unread for longer than the idle time");
        assert!(ProcFiles::new(0).read(&stat).is_some());
        assert!(files.read(Path::new("/proc/self/no-such-file")).is_none());
    }
}
