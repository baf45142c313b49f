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

/// A one-line /proc file without its newline (empty if unreadable).
pub fn read_trimmed(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    // A thread names itself: escape what a terminal would act on.
    virtprof_model::units::printable(text.trim_end_matches('\n')).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_this_process_and_its_threads() {
        let me = std::process::id();
        let proc_root = Path::new("/proc");
        assert!(pids(proc_root).contains(&me));
        assert!(threads(proc_root, me).iter().any(|(tid, comm)| *tid == me && !comm.is_empty()));
        assert!(all_threads(proc_root).iter().any(|(tid, pid, _)| *tid == me && *pid == me));
    }
}
