//! virtprof's analyzers: pure functions from the event stream to tables. They never touch the
//! system (no clocks, files or threads), so every analyzer runs identically live, on a
//! recording, or in a test. The first analyzer (exits) arrives with the trace pipeline; the
//! test bed's ground truth (`virtprof_model::testvm`) is what they are checked against.
#![deny(missing_docs)]
