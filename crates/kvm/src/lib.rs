//! virtprof's KVM layer: the micro-VMM test bed (`virtprof testvm`), KVM binary statistics for
//! our VMs and anyone else's, VM discovery and KVM's announcements of VMs.
//!
//! The test bed in four steps:
//! 1. a [`guest::Script`] of workload phases is assembled into a [`guest::GuestProgram`] with a
//!    symbol map;
//! 2. [`vmm::Vm::new`] creates a KVM VM with that program in long mode at CPL3;
//! 3. [`vmm::Vm::run`] runs each vCPU on a thread named `vcpuN`, counting every exit;
//! 4. [`launcher::run_testvm`] does this in one `virtprof-vm` process per VM and gathers the
//!    ground-truth [`virtprof_model::testvm::TestvmReport`].
#![deny(missing_docs)]
// This crate drives x86-64 KVM only (64-bit usize) and its guest map spans 4 MiB, so address
// and offset casts cannot truncate; the lint stays on for the decoders elsewhere.
#![allow(clippy::cast_possible_truncation)]

pub mod caps;
pub mod discover;
pub mod error;
pub mod gdbstub;
pub mod guest;
pub mod guest_counters;
pub mod launcher;
pub mod owner;
pub mod remote;
pub mod stats;
pub mod uevents;
pub mod vmm;

pub use error::{StatsError, VmmError};
