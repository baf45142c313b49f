//! virtprof's KVM layer: the micro-VMM test bed (`virtprof testvm`), KVM binary statistics for
//! our VMs and anyone else's, and (later) VM discovery.
//!
//! The test bed in four steps:
//! 1. a [`guest::Script`] of workload phases is assembled into a [`guest::GuestProgram`] with a
//!    symbol map;
//! 2. [`vmm::Vm::new`] creates a KVM VM with that program in long mode at CPL3;
//! 3. [`vmm::Vm::run`] runs each vCPU on a thread named `vcpuN`, counting every exit;
//! 4. [`launcher::run_testvm`] does this in one `virtprof-vm` process per VM and gathers the
//!    ground-truth [`virtprof_model::testvm::TestvmReport`].
#![deny(missing_docs)]

pub mod error;
pub mod guest;
pub mod launcher;
pub mod remote;
pub mod stats;
pub mod vmm;

pub use error::{StatsError, VmmError};
