//! The interval engine (VrtProf, SPEC §3 "Intervals"): every source the host offers is read at
//! the end of each fixed-width interval and its deltas become one row of a table, one column
//! per series (entity × metric). Rows go into a fixed-size circular buffer indexed by a global
//! interval counter ([`ring`]), so a late sampler or a slow consumer shows up as missing or
//! overwritten rows, never silently.
//!
//! Sources: `/proc/stat` per CPU ([`procstat`]), schedstat and perf counters per vCPU thread
//! ([`counters`], with VrtProf's round-robin multiplexing in [`mux`]), the KVM binary stats
//! fd per vCPU, and the testvm guests' application counters. [`sampler`] ties them together.
#![deny(missing_docs)]

pub mod counters;
pub mod event_names;
pub mod mux;
pub mod procstat;
pub mod ring;
pub mod sampler;
