//! Application counters any program can publish: a small file of named 64-bit slots that the
//! program maps and updates with plain atomic stores or adds, and the agent reads each
//! interval with one `pread` (never a mapping: a program that truncates its file must not
//! bring the agent down with SIGBUS). The writer pays one memory write per update.
//!
//! The layout is `model::appcounters` (also in `docs/agent.md`, `include/virtprof_counters.h`,
//! `examples/counters.py`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use virtprof_model::guest::GuestSeries;

use virtprof_model::appcounters::{image, parse, value, MAGIC};
pub use virtprof_model::appcounters::{Slot, MAX_SLOTS, SLOT};

/// Why a file is not a counter file (yet).
#[derive(Debug, thiserror::Error)]
pub enum CounterFileError {
    /// Open or map failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Not (yet) a counter file.
    #[error("{path}: {why}")]
    Bad {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// A counter file, read whole each interval.
#[derive(Debug)]
pub struct CounterFile {
    path: PathBuf,
    file: std::fs::File,
    buf: Vec<u8>,
    /// The application's name.
    pub app: String,
    /// Its slots, in file order.
    pub slots: Vec<Slot>,
}

impl CounterFile {
    /// Open `path` and read its header and names. A file whose magic is not there yet (a
    /// writer still setting it up) is [`CounterFileError::Bad`]; try again later.
    pub fn open(path: &Path) -> Result<CounterFile, CounterFileError> {
        let io = |source| CounterFileError::Io { path: path.to_path_buf(), source };
        let bad = |why: String| CounterFileError::Bad { path: path.to_path_buf(), why };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        let len = usize::try_from(meta.len()).unwrap_or(usize::MAX);
        if !(SLOT..=SLOT * (MAX_SLOTS + 1)).contains(&len) {
            return Err(bad(format!("{len} bytes: a counter file has 64 to {} bytes", SLOT * (MAX_SLOTS + 1))));
        }
        let mut this =
            CounterFile { path: path.to_path_buf(), file, buf: vec![0; len], app: String::new(), slots: Vec::new() };
        this.refresh().map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => bad(e.to_string()),
            _ => io(e),
        })?;
        let header = parse(&this.buf).map_err(bad)?;
        this.app = header.app;
        this.slots = header.slots;
        Ok(this)
    }

    /// The file it reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read the values now. An error (the file shrank, lost its magic) means the program
    /// rewrote it: open it again.
    pub fn refresh(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(&mut self.buf, 0)?;
        if n < self.buf.len() || &self.buf[..8] != MAGIC {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "no VPCOUNT1 magic or shorter than before (not ready yet, rewritten, or not a counter file)",
            ));
        }
        Ok(())
    }

    /// Slot `i`'s value at the last [`CounterFile::refresh`].
    pub fn value(&self, i: usize) -> u64 {
        value(&self.buf, i)
    }

    /// The series this file adds to a guest's rows: `app.APP.NAME`.
    pub fn series(&self) -> Vec<GuestSeries> {
        self.slots
            .iter()
            .map(|s| GuestSeries { name: format!("app.{}.{}", self.app, s.name), unit: "events".into(), kind: s.kind })
            .collect()
    }
}

/// A program's side: create a counter file and update its slots (what the C header and the
/// Python example do, for Rust programs and tests).
pub struct CounterWriter {
    map: memmap2::MmapMut,
}

impl CounterWriter {
    /// Create `path` (replacing it) for `app` with these slots.
    pub fn create(path: &Path, app: &str, slots: &[Slot]) -> std::io::Result<CounterWriter> {
        if slots.len() > MAX_SLOTS {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "too many slots"));
        }
        let len = virtprof_model::appcounters::size(slots.len());
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        file.set_len(len as u64)?;
        // SAFETY: a shared writable mapping of the file just sized; this process owns its
        // contents (readers only map it read-only).
        let mut map = unsafe { memmap2::MmapOptions::new().len(len).map_mut(&file) }?;
        // Everything but the magic first: a reader takes the file as ready once it is there.
        let header = image(app, slots);
        map[8..].copy_from_slice(&header[8..]);
        std::sync::atomic::fence(Ordering::Release);
        map[..8].copy_from_slice(MAGIC);
        Ok(CounterWriter { map })
    }

    fn slot(&self, i: usize) -> &AtomicU64 {
        let at = virtprof_model::appcounters::value_offset(i);
        assert!(at + 8 <= self.map.len(), "slot {i} exists");
        // SAFETY: aligned (page-aligned mapping, 64-byte slots) and inside the mapping
        // (asserted), which lives as long as `self`.
        unsafe { AtomicU64::from_ptr(self.map.as_ptr().add(at).cast_mut().cast()) }
    }

    /// Add to counter `i`.
    pub fn add(&self, i: usize, n: u64) {
        self.slot(i).fetch_add(n, Ordering::Relaxed);
    }

    /// Set slot `i` (a gauge).
    pub fn set(&self, i: usize, v: u64) {
        self.slot(i).store(v, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtprof_model::guest::SeriesKind;

    #[test]
    fn what_a_writer_publishes_the_reader_sees_and_damage_is_refused() {
        let dir = std::env::temp_dir().join(format!("vp-counters-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("web.counters");
        let slots = [
            Slot { name: "requests".into(), kind: SeriesKind::Counter },
            Slot { name: "queue depth".into(), kind: SeriesKind::Gauge },
        ];
        let w = CounterWriter::create(&path, "web", &slots).unwrap();
        w.add(0, 41);
        w.add(0, 1);
        w.set(1, 7);
        let mut r = CounterFile::open(&path).unwrap();
        assert_eq!(r.app, "web");
        assert_eq!(r.slots[1].name, "queue_depth");
        assert_eq!((r.value(0), r.value(1)), (42, 7));
        assert_eq!(r.series()[0].name, "app.web.requests");
        assert_eq!(r.series()[1].kind, SeriesKind::Gauge);
        w.add(0, 8);
        r.refresh().unwrap();
        assert_eq!(r.value(0), 50);

        // A slot count past the file's end, no magic, a short file.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[12] = 200;
        std::fs::write(&path, &bytes).unwrap();
        assert!(CounterFile::open(&path).unwrap_err().to_string().contains("do not fit"));
        bytes[..8].copy_from_slice(b"XXXXXXXX");
        std::fs::write(&path, &bytes).unwrap();
        assert!(CounterFile::open(&path).unwrap_err().to_string().contains("magic"));
        std::fs::write(&path, b"short").unwrap();
        assert!(CounterFile::open(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
