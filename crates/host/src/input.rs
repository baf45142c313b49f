//! Input files read with their size and kind checked first: a FIFO, a terminal or a device
//! named as an input would block or never end (`/dev/zero`), and a sparse file of 64 GiB
//! named as a `header_page` would be read whole. Each reader states the most it accepts; past
//! that, or for anything but a regular file, the error says what the path is and what is
//! expected, before anything is read.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why an input was refused or could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// It could not be opened (missing, no permission).
    #[error("cannot open {what} '{}': {source}", path.display())]
    Open {
        /// What the input is for.
        what: String,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A FIFO, socket or device where a file is expected.
    #[error("{what} '{}' is a {kind}, not a regular file: save it to a file first (e.g. `cat {} > file`)", path.display(), path.display())]
    NotRegular {
        /// What the input is for.
        what: String,
        /// The path.
        path: PathBuf,
        /// "FIFO", "character device", ...
        kind: &'static str,
    },
    /// Larger than such an input can be.
    #[error("{what} '{}' is over {} bytes, more than such a file can be; is it the right file?", path.display(), max)]
    TooLarge {
        /// What the input is for.
        what: String,
        /// The path.
        path: PathBuf,
        /// The most accepted.
        max: u64,
    },
    /// Reading failed part way (an I/O error, not the input's fault).
    #[error("reading {what} '{}': {source}", path.display())]
    Read {
        /// What the input is for.
        what: String,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl InputError {
    /// Whether the input is at fault (exit 2), not the machine.
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, InputError::Read { .. })
    }
}

/// Open `path` for reading if it is a regular file (following symlinks: an input link is the
/// user's to give). Never blocks on a FIFO: its kind is checked before it is opened.
pub fn open_regular(path: &Path, what: &str) -> Result<File, InputError> {
    let open_error = |source| InputError::Open { what: what.into(), path: path.into(), source };
    let kind = std::fs::metadata(path).map_err(open_error)?.file_type();
    let not_regular = |kind| InputError::NotRegular { what: what.into(), path: path.into(), kind };
    if kind.is_fifo() {
        return Err(not_regular("FIFO"));
    }
    if kind.is_socket() {
        return Err(not_regular("socket"));
    }
    if kind.is_char_device() {
        return Err(not_regular("character device"));
    }
    if kind.is_block_device() {
        return Err(not_regular("block device"));
    }
    if kind.is_dir() {
        return Err(not_regular("directory"));
    }
    // O_NONBLOCK: should the path be swapped for a FIFO after the check, opening still
    // returns at once (and a regular file ignores the flag).
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(open_error)
}

/// Read a whole regular file of at most `max` bytes. Files whose size the kernel reports as 0
/// (tracefs, /proc) are read up to the same limit.
pub fn read_bytes(path: &Path, what: &str, max: u64) -> Result<Vec<u8>, InputError> {
    let file = open_regular(path, what)?;
    let read_error = |source| InputError::Read { what: what.into(), path: path.into(), source };
    let too_large = || InputError::TooLarge { what: what.into(), path: path.into(), max };
    let size = file.metadata().map_err(read_error)?.len();
    if size > max {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(max + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok(bytes)
}

/// [`read_bytes`] as UTF-8 text; other bytes are bad input, named by offset.
pub fn read_text(path: &Path, what: &str, max: u64) -> Result<String, InputError> {
    let bytes = read_bytes(path, what, max)?;
    String::from_utf8(bytes).map_err(|e| InputError::Open {
        what: what.into(),
        path: path.into(),
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not UTF-8 text: invalid byte at offset {}", e.utf8_error().valid_up_to()),
        ),
    })
}

/// The most a text input of a few lines (a model, a list, a header) can be.
pub const SMALL_TEXT: u64 = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_fifos_are_refused_before_opening() {
        let err = read_bytes(Path::new("/dev/zero"), "header_page", SMALL_TEXT).unwrap_err();
        assert!(err.to_string().contains("is a character device, not a regular file"), "{err}");
        let dir = std::env::temp_dir().join(format!("virtprof-input-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let err = read_text(&fifo, "--weights", SMALL_TEXT).unwrap_err();
        assert!(err.to_string().contains("is a FIFO"), "{err}");
        assert!(err.is_bad_input());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_sparse_giant_is_refused_by_its_size() {
        let path = std::env::temp_dir().join(format!("virtprof-input-sparse-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        file.set_len(64 << 30).unwrap();
        let err = read_bytes(&path, "header_page", SMALL_TEXT).unwrap_err();
        assert!(matches!(err, InputError::TooLarge { .. }), "{err}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn zero_sized_proc_files_are_read() {
        let text = read_text(Path::new("/proc/self/status"), "status", SMALL_TEXT).unwrap();
        assert!(text.contains("Pid:"));
    }
}
