//! tracefs: find or mount it, list events and tracers, and run a private instance
//! (`instances/virtprof-<pid>`) that is torn down on drop — events disabled, directory removed —
//! so a run never leaves tracing state behind.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use virtprof_host::reaper::{self, Undo};
use virtprof_host::triggers;

use crate::decode::Layout;
use crate::error::TraceError;
use crate::format::{parse_event_format, parse_header_page};

/// Where tracefs is mounted on modern kernels.
pub const DEFAULT_MOUNT: &str = "/sys/kernel/tracing";
/// The old debugfs location.
const DEBUGFS_MOUNT: &str = "/sys/kernel/debug/tracing";
/// Prefix of every instance virtprof creates (`doctor --cleanup` removes leftovers).
pub const INSTANCE_PREFIX: &str = "virtprof-";
/// Synthetic events virtprof creates are named `virtprof_<what>_<pid>`.
pub const SYNTHETIC_PREFIX: &str = "virtprof_";

/// The most a tracefs text file (a format, header_page, a stats file) is read to.
pub const MAX_TEXT: u64 = 64 << 20;

/// Read a tracefs file whole. tracefs reports size 0, so `fs::read_to_string` starts with a
/// 32-byte probe read; some files (`events/header_page`) cannot be read in pieces and return
/// EOF after it. One large read first avoids that. The same reader takes these files from a
/// dump on disk, where a FIFO or a device in their place must not block or be read forever:
/// anything but a regular file is refused, and no tracefs text file is over [`MAX_TEXT`].
pub fn read_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = virtprof_host::input::open_regular(path, "tracefs file").map_err(|e| match e {
        virtprof_host::input::InputError::Open { source, .. }
        | virtprof_host::input::InputError::Read { source, .. } => source,
        other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
    })?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut len = 0;
    loop {
        if len == buf.len() {
            if len as u64 >= MAX_TEXT {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("over {MAX_TEXT} bytes: not a tracefs text file"),
                ));
            }
            buf.resize(buf.len() * 2, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A mounted tracefs.
#[derive(Debug, Clone)]
pub struct Tracefs {
    root: PathBuf,
}

impl Tracefs {
    /// Use tracefs at `root` (tests point this at a fake tree).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Tracefs { root: root.into() }
    }

    /// Find a mounted tracefs through /proc/mounts.
    pub fn locate() -> Option<Tracefs> {
        let mounts = read_file(Path::new("/proc/mounts")).unwrap_or_default();
        find_tracefs_mount(&mounts)
            .or_else(|| Path::new(DEBUGFS_MOUNT).join("events").is_dir().then(|| PathBuf::from(DEBUGFS_MOUNT)))
            .map(Tracefs::at)
    }

    /// Find tracefs, mounting it at [`DEFAULT_MOUNT`] if it is not mounted (needs root).
    pub fn locate_or_mount() -> Result<Tracefs, TraceError> {
        if let Some(t) = Self::locate() {
            return Ok(t);
        }
        mount_tracefs(Path::new(DEFAULT_MOUNT)).map_err(|e| TraceError::NotMounted(Some(e)))?;
        Self::locate().ok_or(TraceError::NotMounted(None))
    }

    /// The mount point.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Event names of one system (`kvm`, `sched`, ...), sorted; empty if the system is absent.
    pub fn events(&self, system: &str) -> Vec<String> {
        let dir = self.root.join("events").join(system);
        let mut names: Vec<String> = fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter(|e| e.path().join("format").is_file())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    /// Whether `system:name` exists.
    pub fn has_event(&self, system: &str, name: &str) -> bool {
        self.root.join("events").join(system).join(name).join("format").is_file()
    }

    /// The tracers this kernel offers (`nop`, `function`, `osnoise`, ...).
    pub fn available_tracers(&self) -> Vec<String> {
        read_file(&self.root.join("available_tracers"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// Instances left behind by earlier virtprof runs whose process is gone.
    pub fn stale_instances(&self) -> Vec<PathBuf> {
        fs::read_dir(self.root.join("instances"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let pid: u32 = name.strip_prefix(INSTANCE_PREFIX)?.rsplit('-').next()?.parse().ok()?;
                (!Path::new("/proc").join(pid.to_string()).exists()).then(|| e.path())
            })
            .collect()
    }

    /// Create the private instance `virtprof-<purpose>-<pid>` with tracing off. Instances
    /// left by virtprof processes that are gone are removed first (said on stderr), and the
    /// reaper (`host::reaper`, where this process has one) removes this one should the process
    /// be killed before dropping it.
    pub fn create_instance(&self, purpose: &str) -> Result<Instance, TraceError> {
        for (stale, removed) in cleanup_stale(self) {
            let said = match removed {
                Ok(()) => format!("removed tracefs instance {} left by a virtprof that is gone", stale.display()),
                Err(e) => format!("a virtprof that is gone left tracefs instance {}: {e}", stale.display()),
            };
            let _ = writeln!(std::io::stderr(), "virtprof: {said}");
        }
        let name = format!("{INSTANCE_PREFIX}{purpose}-{}", std::process::id());
        let path = self.root.join("instances").join(&name);
        if path.exists() {
            Instance::remove_dir(&path)?;
        }
        fs::create_dir(&path).map_err(TraceError::file(&path))?;
        reaper::watch(&Undo::Instance(path.clone()));
        let instance = Instance { root: self.root.clone(), path, enabled: Vec::new() };
        instance.write("tracing_on", "0")?;
        Ok(instance)
    }
}

fn find_tracefs_mount(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_dev, dir, kind) = (fields.next()?, fields.next()?, fields.next()?);
        (kind == "tracefs").then(|| PathBuf::from(dir))
    })
}

fn mount_tracefs(target: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    let c = |s: &str| CString::new(s).expect("no NUL in constant");
    let dir = CString::new(target.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: all pointers are valid NUL-terminated strings or null for the data argument.
    let rc = unsafe { libc::mount(c("nodev").as_ptr(), dir.as_ptr(), c("tracefs").as_ptr(), 0, std::ptr::null()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A private tracefs instance. Dropping it disables what it enabled and removes it.
#[derive(Debug)]
pub struct Instance {
    root: PathBuf,
    path: PathBuf,
    enabled: Vec<PathBuf>,
}

impl Instance {
    /// The instance directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write a control file of the instance (`tracing_on`, `buffer_size_kb`, `trace_clock`...).
    pub fn write(&self, file: &str, value: &str) -> Result<(), TraceError> {
        let path = self.path.join(file);
        fs::write(&path, value).map_err(TraceError::file(path))
    }

    /// Read a file of the instance.
    pub fn read(&self, file: &str) -> Result<String, TraceError> {
        let path = self.path.join(file);
        read_file(&path).map_err(TraceError::file(path))
    }

    /// Enable one event (`kvm`, `kvm_exit`) or a whole system (`kvm`, `None`).
    pub fn enable(&mut self, system: &str, name: Option<&str>) -> Result<(), TraceError> {
        let mut dir = self.path.join("events").join(system);
        if let Some(name) = name {
            if !self.root.join("events").join(system).join(name).is_dir() {
                return Err(TraceError::NoSuchEvent {
                    root: self.root.clone(),
                    system: system.into(),
                    name: name.into(),
                });
            }
            dir = dir.join(name);
        }
        let file = dir.join("enable");
        fs::write(&file, "1").map_err(TraceError::file(&file))?;
        self.enabled.push(file);
        Ok(())
    }

    /// Clear the instance's ring buffers.
    pub fn clear(&self) -> Result<(), TraceError> {
        self.write("trace", "")
    }

    fn remove_dir(path: &Path) -> Result<(), TraceError> {
        // The kernel refuses rmdir while a reader holds trace_pipe_raw open (callers close
        // readers before dropping the instance) and while its events carry hist triggers
        // (their owner takes them out first; one killed could not).
        match fs::remove_dir(path) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && triggers::clear_instance_triggers(path) == 0 => {
                fs::remove_dir(path).map_err(TraceError::file(path))
            }
            done => done.map_err(TraceError::file(path)),
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.write("tracing_on", "0");
        for file in &self.enabled {
            let _ = fs::write(file, "0");
        }
        match Self::remove_dir(&self.path) {
            Ok(()) => reaper::done(&Undo::Instance(self.path.clone())),
            // Left to the reaper, which retries once this process is gone.
            Err(e) => log::warn!("could not remove tracefs instance: {e}"),
        }
    }
}

/// Remove leftover instances of dead virtprof processes (tracing turned off first, should a
/// removal fail), then their synthetic events; returns what was removed.
pub fn cleanup_stale(tracefs: &Tracefs) -> Vec<(PathBuf, Result<(), TraceError>)> {
    let mut removed: Vec<(PathBuf, Result<(), TraceError>)> = tracefs
        .stale_instances()
        .into_iter()
        .map(|p| {
            let _ = fs::write(p.join("tracing_on"), "0");
            let r = Instance::remove_dir(&p);
            (p, r)
        })
        .collect();
    let listing = fs::read_to_string(tracefs.root.join("synthetic_events")).unwrap_or_default();
    for name in triggers::synthetic_event_names(&listing) {
        let Some(pid) = name.strip_prefix(SYNTHETIC_PREFIX).and_then(|rest| rest.rsplit('_').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let r = triggers::remove_synthetic_event(&tracefs.root, name)
                .map_err(TraceError::file(tracefs.root.join("synthetic_events")));
            removed.push((tracefs.root.join("synthetic_events").join(name), r));
        }
    }
    removed
}

/// The raw `format` texts of `systems` (all when empty) as (system, text), sorted.
pub fn format_texts(root: &Path, systems: &[&str]) -> Result<Vec<(String, String)>, TraceError> {
    let events = root.join("events");
    let mut out = Vec::new();
    let mut system_dirs: Vec<PathBuf> = fs::read_dir(&events)
        .map_err(TraceError::file(&events))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .filter(|p| systems.is_empty() || p.file_name().and_then(|n| n.to_str()).is_some_and(|n| systems.contains(&n)))
        .collect();
    system_dirs.sort();
    for dir in system_dirs {
        let system = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let mut event_dirs: Vec<PathBuf> =
            fs::read_dir(&dir).map_err(TraceError::file(&dir))?.filter_map(Result::ok).map(|e| e.path()).collect();
        event_dirs.sort();
        for event_dir in event_dirs {
            if let Ok(text) = read_file(&event_dir.join("format")) {
                out.push((system.clone(), text));
            }
        }
    }
    Ok(out)
}

/// `[local] global counter` (a `trace_clock` file) → `local`; a bare name stays as it is.
pub fn selected_clock(text: &str) -> String {
    match (text.find('['), text.find(']')) {
        (Some(a), Some(b)) if a < b => text[a + 1..b].to_string(),
        _ => text.trim().to_string(),
    }
}

/// Tasks from `saved_cmdlines` (`tid comm` lines) and `saved_tgids` (`tid tgid` lines):
/// (tid, tgid, comm), the tgid falling back to the tid where unknown.
pub fn parse_saved_tasks(cmdlines: &str, tgids: &str) -> Vec<(u32, u32, String)> {
    fn pair(line: &str) -> Option<(u32, &str)> {
        let (a, b) = line.split_once(' ')?;
        Some((a.trim().parse().ok()?, b.trim()))
    }
    let tgids: std::collections::HashMap<u32, u32> =
        tgids.lines().filter_map(pair).filter_map(|(t, p)| Some((t, p.parse().ok()?))).collect();
    cmdlines
        .lines()
        .filter_map(pair)
        .filter(|(tid, _)| *tid != 0)
        .map(|(tid, comm)| (tid, tgids.get(&tid).copied().unwrap_or(tid), comm.to_string()))
        .collect()
}

/// Load the page header and the formats of `systems` (all systems when empty) from a tracefs
/// tree: the live mount, an instance's parent, or a dump with the same layout.
pub fn load_layout(root: &Path, systems: &[&str]) -> Result<Layout, TraceError> {
    let header_path = root.join("events").join("header_page");
    let header_text = read_file(&header_path).map_err(TraceError::file(&header_path))?;
    let header = parse_header_page(&header_text).map_err(|e| TraceError::Format { path: header_path, source: e })?;
    let formats = format_texts(root, systems)?
        .into_iter()
        .map(|(system, text)| {
            parse_event_format(&system, &text)
                .map_err(|e| TraceError::Format { path: root.join("events").join(&system), source: e })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Layout::new(header, formats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_tracefs_in_proc_mounts() {
        let mounts = "proc /proc proc rw 0 0\nnodev /sys/kernel/tracing tracefs rw,relatime 0 0\n";
        assert_eq!(find_tracefs_mount(mounts), Some(PathBuf::from("/sys/kernel/tracing")));
        assert_eq!(find_tracefs_mount("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn parses_clock_and_saved_tasks() {
        assert_eq!(selected_clock("[local] global counter\n"), "local");
        assert_eq!(selected_clock("mono"), "mono");
        let tasks = parse_saved_tasks("0 <idle>\n284 vcpu0\n285 vcpu1\n", "284 283\n");
        assert_eq!(tasks, [(284, 283, "vcpu0".to_string()), (285, 285, "vcpu1".to_string())]);
    }

    #[test]
    fn lists_events_of_a_fake_tree() {
        let root = std::env::temp_dir().join(format!("virtprof-fake-tracefs-{}", std::process::id()));
        for ev in ["kvm_exit", "kvm_pio"] {
            let dir = root.join("events/kvm").join(ev);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("format"), "name: x\n").unwrap();
        }
        let t = Tracefs::at(&root);
        assert_eq!(t.events("kvm"), ["kvm_exit", "kvm_pio"]);
        assert!(t.has_event("kvm", "kvm_pio"));
        assert!(!t.has_event("kvm", "kvm_entry"));
        assert!(t.events("sched").is_empty());
        fs::remove_dir_all(root).unwrap();
    }
}
