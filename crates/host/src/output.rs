//! Output files that never look complete before they are: written under a temporary name in
//! the target's folder and renamed over the target when finished, so a run stopped by a full
//! disk, a signal or a crash leaves either the old file or none, never a truncated one that
//! reads as whole. The temporary is created exclusively without following symlinks, and the
//! rename replaces whatever sits at the final name (a planted symlink included) rather than
//! writing through it. A path that already is a device or a pipe (`/dev/null`, `/dev/stdout`,
//! a FIFO) is written directly: there is no file to replace; so is any path in /dev or /proc
//! (`-o /dev/stdout` with standard output redirected to a file). Every error names the path it
//! concerns.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

const CANNOT_CREATE: &str = "cannot create";
const CANNOT_OPEN: &str = "cannot open";

/// Who may read an output file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privacy {
    /// 0600, like perf.data: traces hold process names, command lines and kernel addresses.
    Private,
    /// 0644 less the umask: reports, pages, exported tables.
    Shared,
}

impl Privacy {
    fn mode(self) -> u32 {
        match self {
            Privacy::Private => 0o600,
            Privacy::Shared => 0o644,
        }
    }
}

/// An I/O error with the path it happened on, `writing 'PATH': cause`.
#[derive(Debug, thiserror::Error)]
#[error("{action} '{path}': {source}")]
pub struct OutputError {
    /// What failed ("cannot create", "cannot open", "writing", "finishing").
    pub action: &'static str,
    /// The final path (not the temporary one: that is what the user asked for).
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

impl OutputError {
    fn new<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> OutputError + 'a {
        move |source| OutputError { action, path: path.to_path_buf(), source }
    }

    /// Whether the path could not be opened at all (a missing folder, no permission): the
    /// user's to fix, unlike a disk that fills while writing.
    pub fn is_bad_path(&self) -> bool {
        self.action == CANNOT_CREATE || self.action == CANNOT_OPEN
    }

    /// Whether the file system is full (ENOSPC or EDQUOT).
    pub fn is_disk_full(&self) -> bool {
        matches!(self.source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
    }
}

/// A file being written to a temporary name next to `path`; [`OutputFile::commit`] puts it in
/// place. Dropped without a commit, the temporary is removed.
#[derive(Debug)]
pub struct OutputFile {
    file: Option<File>,
    /// None when writing a device or a pipe in place.
    temporary: Option<PathBuf>,
    path: PathBuf,
    written: u64,
    /// The reaper puts the temporary in place should this process be killed.
    kept_if_killed: bool,
}

impl OutputFile {
    /// Start writing `path`.
    pub fn create(path: &Path, privacy: Privacy) -> Result<OutputFile, OutputError> {
        // A device or a pipe (`/dev/null`, a FIFO), or a name in /dev or /proc that stands for
        // one of our descriptors (`/dev/stdout` redirected to a file): written where it is.
        let special = path.starts_with("/dev/") || path.starts_with("/proc/");
        if special || std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
            let file = OpenOptions::new().write(true).open(path).map_err(OutputError::new(CANNOT_OPEN, path))?;
            return Ok(OutputFile {
                file: Some(file),
                temporary: None,
                path: path.to_path_buf(),
                written: 0,
                kept_if_killed: false,
            });
        }
        // A folder cannot be replaced by a file: say so now, not after the work is done.
        if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            return Err(OutputError::new(CANNOT_CREATE, path)(io::Error::from_raw_os_error(libc::EISDIR)));
        }
        let temporary = temporary_name(path);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(privacy.mode())
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&temporary)
            .map_err(OutputError::new(CANNOT_CREATE, path))?;
        Ok(OutputFile {
            file: Some(file),
            temporary: Some(temporary),
            path: path.to_path_buf(),
            written: 0,
            kept_if_killed: false,
        })
    }

    /// Should this process be killed (SIGKILL, which runs no clean-up) before the file is
    /// committed, have what was written put in place under its name all the same: for a
    /// recording, which reads up to its last whole chunk. Without a reaper (`host::reaper`)
    /// the temporary stays.
    pub fn keep_if_killed(&mut self) {
        if let Some(temporary) = &self.temporary {
            self.kept_if_killed = crate::reaper::watch(&self.undo(temporary));
        }
    }

    fn undo(&self, temporary: &Path) -> crate::reaper::Undo {
        crate::reaper::Undo::KeepFile { temporary: temporary.to_path_buf(), path: self.path.clone() }
    }

    /// The reaper has nothing to do for this file any more.
    fn release(&mut self, temporary: &Path) {
        if std::mem::take(&mut self.kept_if_killed) {
            crate::reaper::done(&self.undo(temporary));
        }
    }

    /// The path it will have once committed.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Flush to disk and rename over the final path.
    pub fn commit(mut self) -> Result<(), OutputError> {
        let file = self.file.take().expect("an uncommitted output has its file");
        let Some(temporary) = self.temporary.take() else { return Ok(()) };
        // A full disk can surface only at the flush (delayed allocation): it must fail here,
        // before the rename, not leave a complete-looking file with a hole.
        if let Err(e) = file.sync_data() {
            let _ = std::fs::remove_file(&temporary);
            self.release(&temporary);
            return Err(OutputError::new("writing", &self.path)(e));
        }
        drop(file);
        let renamed = std::fs::rename(&temporary, &self.path).map_err(|e| {
            // Made a folder meanwhile, say: the temporary must not stay behind.
            let _ = std::fs::remove_file(&temporary);
            OutputError::new("finishing", &self.path)(e)
        });
        self.release(&temporary);
        renamed
    }

    /// Put what was written so far in place although it is not whole (a recording cut short
    /// by a full disk: its reader knows where it stops). Returns the bytes kept.
    pub fn keep_partial(mut self) -> Result<u64, OutputError> {
        drop(self.file.take());
        if let Some(temporary) = self.temporary.take() {
            let renamed = std::fs::rename(&temporary, &self.path);
            self.release(&temporary);
            renamed.map_err(OutputError::new("finishing", &self.path))?;
        }
        Ok(self.written)
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let file = self.file.as_mut().expect("an uncommitted output has its file");
        let n = file.write(buf).map_err(|e| with_path(e, "writing", &self.path))?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        let file = self.file.as_mut().expect("an uncommitted output has its file");
        file.flush().map_err(|e| with_path(e, "writing", &self.path))
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if let (Some(_), Some(temporary)) = (self.file.take(), self.temporary.clone()) {
            let _ = std::fs::remove_file(&temporary);
            self.release(&temporary);
        }
    }
}

/// Write `bytes` as the whole of `path`.
pub fn write_file(path: &Path, bytes: &[u8], privacy: Privacy) -> Result<(), OutputError> {
    let mut out = OutputFile::create(path, privacy)?;
    // The file itself, not `out`'s Write: that names the path in its errors, and OutputError
    // names it again.
    let file = out.file.as_mut().expect("an uncommitted output has its file");
    file.write_all(bytes).map_err(OutputError::new("writing", path))?;
    out.commit()
}

/// An io::Error that keeps its kind (a full disk stays a full disk) and names the path.
fn with_path(e: io::Error, action: &str, path: &Path) -> io::Error {
    let kind = e.kind();
    let os = e.raw_os_error();
    let text = match os {
        Some(code) => io::Error::from_raw_os_error(code).to_string(),
        None => e.to_string(),
    };
    io::Error::new(kind, format!("{action} '{}': {text}", path.display()))
}

/// `DIR/.NAME.PID.tmp`: hidden, in the same folder (so the rename stays on one file system),
/// and unique to this process.
fn temporary_name(path: &Path) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(path.file_name().unwrap_or(path.as_os_str()));
    name.push(format!(".{}.tmp", std::process::id()));
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(name),
        _ => PathBuf::from(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("virtprof-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn nothing_is_at_the_path_until_commit_and_the_mode_is_kept() {
        let dir = scratch("commit");
        let path = dir.join("r.vprec");
        let mut out = OutputFile::create(&path, Privacy::Private).unwrap();
        out.write_all(b"hello").unwrap();
        assert!(!path.exists());
        out.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary left");
    }

    #[test]
    fn dropped_uncommitted_leaves_the_old_file_and_no_temporary() {
        let dir = scratch("drop");
        let path = dir.join("out.json");
        std::fs::write(&path, "old").unwrap();
        let mut out = OutputFile::create(&path, Privacy::Shared).unwrap();
        out.write_all(b"half").unwrap();
        drop(out);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    }

    #[test]
    fn a_folder_at_the_path_is_refused_at_once_and_nothing_is_left_beside_it() {
        let dir = scratch("folder");
        let path = dir.join("out");
        std::fs::create_dir(&path).unwrap();
        let err = OutputFile::create(&path, Privacy::Shared).unwrap_err();
        assert!(err.is_bad_path(), "{err}");
        assert!(err.to_string().contains("Is a directory"), "{err}");
        // A folder made while writing: the rename fails and the temporary goes.
        let later = dir.join("later");
        let out = OutputFile::create(&later, Privacy::Shared).unwrap();
        std::fs::create_dir(&later).unwrap();
        std::fs::write(later.join("x"), "x").unwrap();
        assert!(out.commit().is_err());
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "only the two folders: {names:?}");
    }

    #[test]
    fn a_symlink_at_the_path_is_replaced_not_written_through() {
        let dir = scratch("symlink");
        let target = dir.join("precious");
        std::fs::write(&target, "keep me").unwrap();
        let path = dir.join("out.txt");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        write_file(&path, b"new", Privacy::Shared).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        assert!(!std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
    }

    #[test]
    fn a_full_disk_names_the_path_and_keeps_its_kind() {
        let err = with_path(io::Error::from_raw_os_error(libc::ENOSPC), "writing", Path::new("/x/r.vprec"));
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert_eq!(err.to_string(), "writing '/x/r.vprec': No space left on device (os error 28)");
        let err =
            OutputError { action: "writing", path: "/x".into(), source: io::Error::from_raw_os_error(libc::ENOSPC) };
        assert!(err.is_disk_full());
    }

    #[test]
    fn a_whole_file_on_a_full_device_names_the_path_once() {
        let err = write_file(Path::new("/dev/full"), b"page", Privacy::Shared).unwrap_err();
        assert_eq!(err.to_string(), "writing '/dev/full': No space left on device (os error 28)");
    }

    #[test]
    fn a_device_is_written_in_place() {
        let mut out = OutputFile::create(Path::new("/dev/null"), Privacy::Private).unwrap();
        out.write_all(b"gone").unwrap();
        out.commit().unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(&std::fs::metadata("/dev/null").unwrap().file_type()));
    }

    #[test]
    fn a_missing_folder_is_named() {
        let err = OutputFile::create(Path::new("/nonexistent-virtprof/r.vprec"), Privacy::Private).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot create '/nonexistent-virtprof/r.vprec': No such file or directory (os error 2)"
        );
    }
}
