//! virtprof's recording container: the `.vprec` format, written chunk by chunk (each
//! checksummed, flushed as it goes) and read back without copying page data.
#![deny(missing_docs)]

pub mod recording;
