//! What a killed virtprof would leave behind, undone by a process that outlives it. SIGKILL
//! runs no destructor: a tracefs instance would stay with tracing on and its buffers filling,
//! and a recording would stay a hidden temporary file. So before it creates either, virtprof
//! starts a small reaper (itself, re-executed as [`REAPER_ARG`]) and tells it, over a pipe,
//! what to undo; when virtprof ends in any way the pipe closes, and the reaper undoes whatever
//! virtprof has not said is done: it turns each instance's tracing off and removes it, puts
//! each recording in place cut short (a recording without its footer reads up to its last
//! whole chunk), and gives each thread `balance` moved its CPU affinity back. A virtprof that ends normally has said everything is done, and the
//! reaper exits at once.
//!
//! The reaper is in a session of its own and ignores the stop signals, so a Ctrl-C or a kill
//! of the whole group does not take it with virtprof; it holds nothing but the pipe's read end.
//! Only the `virtprof` binary, which calls [`enable`], starts one: a library user (a test)
//! gets no reaper and undoes what it made by dropping it, as before.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;

/// The first argument that makes `virtprof` the reaper.
pub const REAPER_ARG: &str = "__virtprof-reaper";

/// What to undo, should virtprof die before it says the thing is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// A tracefs instance: tracing off, events off, the directory removed.
    Instance(PathBuf),
    /// A recording's temporary file: renamed to its final name, cut short.
    KeepFile {
        /// The temporary file being written.
        temporary: PathBuf,
        /// The name it gets.
        path: PathBuf,
    },
    /// A synthetic event (its triggers are in an instance, removed first): deleted.
    SyntheticEvent {
        /// The tracefs root holding `synthetic_events`.
        root: PathBuf,
        /// The event's name.
        name: String,
    },
    /// A thread moved to other CPUs: its affinity given back.
    Affinity {
        /// The thread.
        tid: u32,
        /// The CPUs it may run on again.
        cpus: Vec<u32>,
    },
}

impl Undo {
    /// What names it in `done` messages.
    fn key(&self) -> Vec<u8> {
        match self {
            Undo::Instance(path) => absolute(path).into_os_string().into_vec(),
            Undo::KeepFile { temporary, .. } => absolute(temporary).into_os_string().into_vec(),
            Undo::SyntheticEvent { root, name } => {
                let mut key = b"synthetic ".to_vec();
                key.extend_from_slice(absolute(root).join(name).as_os_str().as_bytes());
                key
            }
            Undo::Affinity { tid, .. } => format!("thread {tid}").into_bytes(),
        }
    }

    /// The message that asks for it.
    fn message(&self) -> Vec<u8> {
        match self {
            Undo::Instance(path) => encode(&[b"instance", absolute(path).as_os_str().as_bytes()]),
            Undo::KeepFile { temporary, path } => {
                encode(&[b"keep", absolute(temporary).as_os_str().as_bytes(), absolute(path).as_os_str().as_bytes()])
            }
            Undo::SyntheticEvent { root, name } => {
                encode(&[b"synthetic", absolute(root).as_os_str().as_bytes(), name.as_bytes()])
            }
            Undo::Affinity { tid, cpus } => {
                let cpus: Vec<String> = cpus.iter().map(u32::to_string).collect();
                encode(&[b"affinity", tid.to_string().as_bytes(), cpus.join(",").as_bytes()])
            }
        }
    }
}

/// The running reaper, started on first use.
struct Reaper {
    child: Child,
    pipe: ChildStdin,
}

/// The executable that can be the reaper: set by [`enable`].
static EXECUTABLE: Mutex<Option<PathBuf>> = Mutex::new(None);
static REAPER: Mutex<Option<Reaper>> = Mutex::new(None);

/// This process's executable can run as the reaper (`virtprof`'s main calls this).
pub fn enable() {
    if let Ok(exe) = std::env::current_exe() {
        *lock(&EXECUTABLE) = Some(exe);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Have `undo` done should this process die before [`done`] is called with it. False when no
/// reaper can be had (not enabled, or it could not start): the caller's own cleanup is then
/// all there is.
pub fn watch(undo: &Undo) -> bool {
    let Some(exe) = lock(&EXECUTABLE).clone() else { return false };
    let mut reaper = lock(&REAPER);
    if reaper.as_mut().is_some_and(|r| r.child.try_wait().ok().flatten().is_some()) {
        *reaper = None;
    }
    if reaper.is_none() {
        match start(&exe) {
            Ok(r) => *reaper = Some(r),
            Err(e) => {
                log::warn!("could not start the reaper that cleans up after a kill: {e}");
                return false;
            }
        }
    }
    reaper.as_mut().is_some_and(|r| r.pipe.write_all(&undo.message()).is_ok())
}

/// `undo` needs doing no more (this process did it, or it is whole).
pub fn done(undo: &Undo) {
    if let Some(r) = lock(&REAPER).as_mut() {
        let _ = r.pipe.write_all(&encode(&[b"done", &undo.key()]));
    }
}

/// Start the reaper: its standard input is the pipe, its standard error ours (it says what
/// it undid there).
fn start(exe: &Path) -> std::io::Result<Reaper> {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(exe);
    command.arg(REAPER_ARG).stdin(Stdio::piped()).stdout(Stdio::null());
    // SAFETY: setsid is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    let pipe = child.stdin.take().ok_or_else(|| std::io::Error::other("no pipe to the reaper"))?;
    Ok(Reaper { child, pipe })
}

/// Paths the reaper gets are absolute: it does not share our working directory's future.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A message: its fields, each ended by a NUL (no path holds one), then an empty field.
fn encode(fields: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for field in fields {
        out.extend_from_slice(field);
        out.push(0);
    }
    out.push(0);
    out
}

/// The messages in `input`, up to its end (a message cut short by a death is dropped).
fn decode(input: impl Read) -> Vec<Undo> {
    let mut pending: Vec<Undo> = Vec::new();
    let mut reader = std::io::BufReader::new(input);
    let mut fields: Vec<OsString> = Vec::new();
    let mut field = Vec::new();
    loop {
        field.clear();
        match reader.read_until(0, &mut field) {
            Ok(0) | Err(_) => return pending,
            Ok(_) if field.last() != Some(&0) => return pending,
            Ok(_) => {}
        }
        field.pop();
        if !field.is_empty() {
            fields.push(OsString::from_vec(field.clone()));
            continue;
        }
        let parts: Vec<&OsStr> = fields.iter().map(OsString::as_os_str).collect();
        match parts.as_slice() {
            [kind, path] if kind.as_bytes() == b"instance" => pending.push(Undo::Instance(path.into())),
            [kind, temporary, path] if kind.as_bytes() == b"keep" => {
                pending.push(Undo::KeepFile { temporary: temporary.into(), path: path.into() });
            }
            [kind, root, name] if kind.as_bytes() == b"synthetic" => {
                if let Some(name) = name.to_str() {
                    pending.push(Undo::SyntheticEvent { root: root.into(), name: name.to_string() });
                }
            }
            [kind, tid, cpus] if kind.as_bytes() == b"affinity" => {
                let tid = tid.to_str().and_then(|t| t.parse().ok());
                let cpus: Option<Vec<u32>> = cpus.to_str().and_then(|c| c.split(',').map(|n| n.parse().ok()).collect());
                if let (Some(tid), Some(cpus)) = (tid, cpus) {
                    // The first affinity asked for a thread is its original one.
                    if !pending.iter().any(|u| matches!(u, Undo::Affinity { tid: t, .. } if *t == tid)) {
                        pending.push(Undo::Affinity { tid, cpus });
                    }
                }
            }
            [kind, key] if kind.as_bytes() == b"done" => pending.retain(|u| u.key() != key.as_bytes()),
            _ => {}
        }
        fields.clear();
    }
}

/// The reaper's life: wait for virtprof to end (its end of the pipe to close), undo what is
/// left, exit. Never returns.
pub fn run() -> ! {
    // SAFETY: PR_SET_NAME with a NUL-terminated name shorter than 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"virtprof-reaper".as_ptr(), 0, 0, 0) };
    for signal in crate::stop::STOP_SIGNALS.into_iter().chain([libc::SIGPIPE]) {
        // SAFETY: ignoring a signal has no preconditions.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    let left = decode(std::io::stdin().lock());
    for undo in &left {
        let said = match undo {
            Undo::Instance(path) => remove_instance(path),
            Undo::KeepFile { temporary, path } => keep_file(temporary, path),
            // Its triggers went with the instance (asked for before it, so undone before it).
            Undo::SyntheticEvent { root, name } => crate::triggers::remove_synthetic_event(root, name)
                .ok()
                .map(|()| format!("the run ended without cleaning up: deleted its synthetic event {name}")),
            // A thread that has exited has nothing to give back.
            Undo::Affinity { tid, cpus } => crate::affinity::set(*tid, cpus)
                .ok()
                .map(|()| format!("the run ended without cleaning up: gave thread {tid} its CPU affinity back")),
        };
        if let Some(said) = said {
            let _ = writeln!(std::io::stderr(), "virtprof: {said}");
        }
    }
    std::process::exit(0)
}

/// Turn a tracefs instance's tracing off and remove it; what was done, if anything.
fn remove_instance(path: &Path) -> Option<String> {
    if !path.is_dir() {
        return None;
    }
    let _ = std::fs::write(path.join("tracing_on"), "0");
    let _ = std::fs::write(path.join("events/enable"), "0");
    // The kernel refuses while a reader still holds the instance's files (a dead process's
    // are closed as it exits, which can take a moment) or while its events carry hist
    // triggers (taken out at the first refusal).
    let mut triggers_cleared = false;
    for _ in 0..100 {
        match std::fs::remove_dir(path) {
            Ok(()) => return Some(format!("the run ended without cleaning up: removed its tracefs instance {}", path.display())),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && !triggers_cleared => {
                crate::triggers::clear_instance_triggers(path);
                triggers_cleared = true;
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => return Some(format!("the run ended without cleaning up; its tracefs instance {} (tracing turned off) could not be removed: {e}", path.display())),
        }
    }
    Some(format!("the run ended without cleaning up; its tracefs instance {} (tracing turned off) is still busy; `virtprof doctor --cleanup` removes it", path.display()))
}

/// Put a recording's temporary file in place under its name (an empty one is removed: the
/// run was killed before it wrote anything); what was done, if anything.
fn keep_file(temporary: &Path, path: &Path) -> Option<String> {
    let bytes = std::fs::metadata(temporary).ok()?.len();
    if bytes == 0 {
        let _ = std::fs::remove_file(temporary);
        return None;
    }
    Some(match std::fs::rename(temporary, path) {
        Ok(()) => format!(
            "the run ended before its recording was finished: kept {} cut short ({bytes} bytes; it reads up to its last whole chunk)",
            path.display()
        ),
        Err(e) => format!("the run ended before its recording was finished; {} could not be put in place: {e}", temporary.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_said_done_is_not_undone_and_a_message_cut_short_is_dropped() {
        let mut pipe = Vec::new();
        pipe.extend(encode(&[b"instance", b"/t/instances/virtprof-record-1"]));
        pipe.extend(encode(&[b"keep", b"/d/.r.vprec.1.tmp", b"/d/r.vprec"]));
        pipe.extend(encode(&[b"instance", b"/t/instances/virtprof-exits-1"]));
        pipe.extend(encode(&[b"done", b"/t/instances/virtprof-record-1"]));
        pipe.extend(encode(&[b"instance", b"/odd\nname with\ttabs"]));
        pipe.extend(Undo::Affinity { tid: 42, cpus: vec![0, 1] }.message());
        pipe.extend(Undo::Affinity { tid: 42, cpus: vec![1] }.message());
        pipe.extend(Undo::Affinity { tid: 43, cpus: vec![1] }.message());
        pipe.extend(encode(&[b"done", b"thread 43"]));
        let synthetic = |name: &str| Undo::SyntheticEvent { root: "/t".into(), name: name.into() };
        pipe.extend(synthetic("virtprof_exit_1").message());
        pipe.extend(synthetic("virtprof_exit_2").message());
        pipe.extend(encode(&[b"done", b"synthetic /t/virtprof_exit_2"]));
        let whole = pipe.len();
        pipe.extend(encode(&[b"instance", b"/cut"]));
        let left = decode(&pipe[..pipe.len() - 3]);
        assert_eq!(
            left,
            vec![
                Undo::KeepFile { temporary: "/d/.r.vprec.1.tmp".into(), path: "/d/r.vprec".into() },
                Undo::Instance("/t/instances/virtprof-exits-1".into()),
                Undo::Instance("/odd\nname with\ttabs".into()),
                Undo::Affinity { tid: 42, cpus: vec![0, 1] },
                synthetic("virtprof_exit_1"),
            ]
        );
        assert_eq!(decode(&pipe[..whole]).len(), 5);
        assert!(decode(&b""[..]).is_empty());
    }
}
