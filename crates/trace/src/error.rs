//! Errors of the tracing layer, each naming the file and the fix.

use std::path::PathBuf;

/// Errors controlling tracefs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// tracefs is not mounted and could not be mounted.
    #[error("tracefs is not mounted{}; mount it with `mount -t tracefs nodev /sys/kernel/tracing` (as root)", .0.as_ref().map(|e| format!(" and mounting it failed: {e}")).unwrap_or_default())]
    NotMounted(Option<std::io::Error>),
    /// A tracefs file could not be read or written.
    #[error("'{}': {source}{}", path.display(), hint(source))]
    File {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A format file could not be parsed.
    #[error("'{}': {source}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// Where and what.
        #[source]
        source: crate::format::FormatError,
    },
    /// The trace clock asked for is not one this kernel offers.
    #[error("trace clock '{clock}' is not offered by this kernel; choose one of: {}", offered.join(" "))]
    NoSuchClock {
        /// The clock asked for.
        clock: String,
        /// What `trace_clock` lists.
        offered: Vec<String>,
    },
    /// A clock the kernel offers whose timestamps are not nanoseconds.
    #[error("trace clock '{clock}' counts {counts}, which virtprof would print as nanoseconds; choose one that counts nanoseconds: {}", virtprof_model::clock::NANOSECOND_CLOCKS)]
    ClockNotNanoseconds {
        /// The clock asked for.
        clock: String,
        /// What it counts.
        counts: &'static str,
    },
    /// A per-CPU buffer size no kernel takes, or more memory than the host can spare.
    #[error("--buffer-size {kb}: {why}")]
    BufferSize {
        /// KB per CPU asked for.
        kb: u32,
        /// Why it cannot be had, and what would do.
        why: String,
    },
    /// None of the events asked for exists: the capture would record nothing.
    #[error("none of the events asked for exists on this kernel: {} (see {}/available_events)", asked.join(", "), root.display())]
    NoEvents {
        /// tracefs root.
        root: PathBuf,
        /// The event specs.
        asked: Vec<String>,
    },
    /// An event the caller asked for does not exist on this kernel.
    #[error("event '{system}:{name}' does not exist on this kernel (see {}/events/{system}/)", root.display())]
    NoSuchEvent {
        /// tracefs root.
        root: PathBuf,
        /// Event system.
        system: String,
        /// Event name.
        name: String,
    },
    /// A facility this kernel or host does not have, or refused: what and why.
    #[error("{0}")]
    Unsupported(String),
    /// A tracefs dump laid out as no kernel leaves one.
    #[error("{0}")]
    BadDump(String),
    /// An input file refused (not a regular file, too large) or unreadable.
    #[error(transparent)]
    Input(#[from] virtprof_host::input::InputError),
}

impl TraceError {
    /// Whether the caller asked for something this kernel or host cannot give (a usage error),
    /// rather than tracing failing underway.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            TraceError::NoSuchClock { .. }
                | TraceError::ClockNotNanoseconds { .. }
                | TraceError::BufferSize { .. }
                | TraceError::NoEvents { .. }
                | TraceError::NoSuchEvent { .. }
                | TraceError::BadDump(_)
                | TraceError::Unsupported(_)
        ) || matches!(self, TraceError::Input(e) if e.is_bad_input())
            // Not root and no CAP_SYS_ADMIN/CAP_PERFMON: the message says which is missing.
            || matches!(self, TraceError::File { source, .. } if matches!(source.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)))
    }
}

fn hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => " (tracing needs root or CAP_SYS_ADMIN/CAP_PERFMON)",
        _ => "",
    }
}

impl TraceError {
    pub(crate) fn file(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TraceError {
        let path = path.into();
        move |source| TraceError::File { path, source }
    }
}
