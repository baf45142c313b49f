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
