//! virtprof's kernel event sources: tracefs control (mounting, private instances, event
//! enabling) and, in later modules, the ftrace ring-buffer decoder.
//!
//! Only [`tracefs`] touches files; decoding stays sans-IO.
#![deny(missing_docs)]

pub mod buffer_sizing;
pub mod capture;
pub mod decode;
pub mod dump;
pub mod error;
pub mod exit_hist;
pub mod format;
pub mod merge;
pub mod page;
pub mod perf;
pub mod segment;
pub mod text;
pub mod tracedat;
pub mod tracefs;

pub use error::TraceError;
pub use tracefs::{Instance, Tracefs};
