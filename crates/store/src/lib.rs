//! virtprof's sinks: every report is a [`table::Table`] rendered as aligned text or CSV (JSON
//! goes through serde on the report types themselves). Writers are generic over `io::Write` so
//! tests render into a `Vec<u8>`.
#![deny(missing_docs)]

pub mod recording;
pub mod table;

pub use table::Table;
