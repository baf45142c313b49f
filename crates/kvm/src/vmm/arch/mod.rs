//! What the micro-VMM does differently per CPU architecture: creating vCPUs, their first
//! registers and memory, the guest's cycle counter and steal-time record, the interrupt line
//! that ends a WFI, reading a stopped vCPU's program counter and describing its faults. The rest
//! of the VMM (memory, doorbells, exits to the VMM, the ground truth) is the same everywhere;
//! this is the one place that chooses by `target_arch`.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;

#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::*;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;
