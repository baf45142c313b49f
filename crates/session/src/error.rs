//! What can go wrong opening or walking a source, typed so the CLI can choose the exit code:
//! bad input (a missing, corrupt or foreign file) is the user's to fix; the rest failed at run
//! time.

use std::path::Path;

/// An error opening, decoding or tracing a source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The input is not what it must be; the message says what, where and how to fix it.
    #[error("{0}")]
    BadInput(String),
    /// Reading failed at run time.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the file.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Live tracing failed.
    #[error(transparent)]
    Trace(#[from] virtprof_trace::TraceError),
    /// An input file refused before reading (not a regular file, too large) or unreadable.
    #[error(transparent)]
    Input(#[from] virtprof_host::input::InputError),
    /// A live trace's pages or this kernel's formats did not decode.
    #[error("live trace: {0}")]
    Live(String),
}

impl SessionError {
    /// Whether the user's input is at fault (the CLI's exit code 2).
    pub fn is_bad_input(&self) -> bool {
        match self {
            SessionError::BadInput(_) => true,
            SessionError::Input(e) => e.is_bad_input(),
            SessionError::Trace(e) => e.is_bad_input(),
            _ => false,
        }
    }

    /// Bad input about `path`.
    pub(crate) fn in_file(path: &Path, message: impl std::fmt::Display) -> SessionError {
        SessionError::BadInput(format!("'{}': {message}", path.display()))
    }

    /// A run-time I/O failure while doing `what`.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SessionError {
        let what = what.into();
        move |source| SessionError::Io { what, source }
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, SessionError>;
