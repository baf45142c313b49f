//! arm64: not yet. The guest programs are x86-64 code (assembled with iced-x86), and arm64
//! programs with their own ground truth (WFI, HVC, MMIO, a sysreg trap; issue 37) are not
//! written, so a micro-VM cannot start here; creating its vCPUs says so. Everything that reads
//! traces, recordings and other VMMs' KVM stats works on arm64 as on x86-64.

use kvm_ioctls::{Kvm, VcpuFd, VmFd};

use crate::error::VmmError;
use crate::guest::{GuestProgram, Privilege};

fn unsupported<T>() -> Result<T, VmmError> {
    Err(VmmError::Unsupported(
        "testvm's guest programs are x86-64 code; arm64 guest programs are not written yet".into(),
    ))
}

/// Refused: see the module's documentation.
pub(crate) fn create_vcpus(_kvm: &Kvm, _vm: &VmFd, _count: u32) -> Result<Vec<VcpuFd>, VmmError> {
    unsupported()
}

/// Unreachable without vCPUs.
pub(crate) fn counter_khz(_vcpu: &VcpuFd) -> Result<u64, VmmError> {
    unsupported()
}

/// Unreachable without vCPUs.
pub(crate) fn init_registers(
    _vcpu: &VcpuFd,
    _program: &GuestProgram,
    _privilege: Privilege,
    _index: u32,
) -> Result<(), VmmError> {
    unsupported()
}

/// Unreachable without vCPUs.
pub(crate) fn enable_steal_time(_vcpu: &VcpuFd, _gpa: u64) -> Result<(), VmmError> {
    unsupported()
}

/// Unreachable without vCPUs.
pub(crate) fn guest_counter(_vcpu: &VcpuFd) -> Result<u64, VmmError> {
    unsupported()
}

/// Unreachable without vCPUs.
pub(crate) fn program_counter(_vcpu: &VcpuFd) -> Result<u64, VmmError> {
    unsupported()
}

/// Unreachable without vCPUs.
pub(crate) fn privilege_level(_vcpu: &VcpuFd) -> Result<u8, VmmError> {
    unsupported()
}

/// Unreachable without vCPUs.
pub(crate) fn stack_pointer(_vcpu: &VcpuFd) -> Result<u64, VmmError> {
    unsupported()
}

/// Unreachable without vCPUs.
pub(crate) fn fault_address(_vcpu: &VcpuFd) -> Result<u64, VmmError> {
    unsupported()
}
