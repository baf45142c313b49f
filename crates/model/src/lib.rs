//! virtprof's data model: the entities (hosts, VMs, vCPUs) and records every other crate
//! exchanges. This crate does no I/O; it only names things.
//!
//! Serialization is behind the `serde` feature so analyzers can use the model without it.
#![deny(missing_docs)]

pub mod appcounters;
pub mod clock;
pub mod clock_sync;
pub mod entity;
pub mod event;
pub mod evidence;
pub mod guest;
pub mod host;
pub mod ids;
pub mod interval;
pub mod kernel_hist;
pub mod loss;
pub mod pcsample;
pub mod testvm;
pub mod units;
pub mod vmm;

pub use entity::{KernelLoss, VcpuThread};
pub use event::{Event, EventKind, StrId, Timestamp, ARM64_NOT_A_TRAP, ISA_ARM64};
pub use host::HostKind;
pub use ids::{Cpu, Pid, Tid};
pub use loss::{CpuLoss, Loss};
pub use vmm::VmmKind;
