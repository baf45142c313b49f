//! virtprof's sinks, the end of the pipeline: every report as an aligned text or CSV
//! [`Table`], the Parquet tables and the Perfetto trace `export` writes, the interval rows as
//! CSV, and self-contained HTML pages with plots. Writers take an `io::Write` or a path, so
//! tests render into memory; errors are typed ([`SinkError`]).
#![deny(missing_docs)]

pub mod csv;
pub mod html;
pub mod parquet;
pub mod perfetto;
pub mod table;

pub use table::Table;

use virtprof_host::output::OutputError;

/// What can go wrong writing a sink.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// An output file could not be created or written; the error names it.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// Writing failed (a full disk, a closed pipe).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// JSON encoding failed.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The Parquet writer failed.
    #[error("parquet: {0}")]
    Parquet(#[from] ::parquet::errors::ParquetError),
    /// Building an Arrow batch failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
}

impl SinkError {
    /// Whether the user's input (the output path) is at fault: the CLI's exit code 2.
    pub fn is_bad_input(&self) -> bool {
        // A path that cannot be created is the user's to fix; a disk that fills while writing is not.
        matches!(self, SinkError::Output(e) if e.is_bad_path())
    }

    /// Whether writing met a closed pipe (a reader such as `head` that had enough). The
    /// variants are transparent, so an error chain never shows the I/O error inside.
    pub fn is_broken_pipe(&self) -> bool {
        use std::io::ErrorKind::BrokenPipe;
        match self {
            SinkError::Io(e) => e.kind() == BrokenPipe,
            SinkError::Json(e) => e.io_error_kind() == Some(BrokenPipe),
            _ => false,
        }
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, SinkError>;
