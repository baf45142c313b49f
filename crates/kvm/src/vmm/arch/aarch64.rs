//! arm64: vCPUs of KVM's preferred target with PSCI 0.2 (so an HVC's PSCI call is answered in
//! the kernel), started with the MMU off at EL1 or EL0 with interrupts masked; the guest's clock
//! is the virtual counter. There is no interrupt controller: the `wfi` workload is woken by the
//! VMM raising the vCPU's IRQ line (`KVM_IRQ_LINE`), which KVM allows without a vGIC.

use std::mem::offset_of;

use kvm_bindings::{
    kvm_device_attr, kvm_regs, kvm_vcpu_init, user_pt_regs, KVM_ARM_IRQ_CPU_IRQ, KVM_ARM_IRQ_TYPE_CPU,
    KVM_ARM_IRQ_TYPE_SHIFT, KVM_ARM_IRQ_VCPU_SHIFT, KVM_ARM_VCPU_PSCI_0_2, KVM_ARM_VCPU_PVTIME_CTRL,
    KVM_ARM_VCPU_PVTIME_IPA, KVM_REG_ARM64, KVM_REG_ARM64_SYSREG, KVM_REG_ARM_CORE, KVM_REG_SIZE_U64,
};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::GuestMemoryMmap;

use super::super::kvm_err;
use crate::error::VmmError;
use crate::guest::arm64::VECTOR_NAMES;
use crate::guest::layout;
use crate::guest::{GuestProgram, Privilege};

/// PSTATE: EL1 with SP_EL1 (EL1h), or EL0; D, A, I and F masked either way.
const PSTATE_EL1H: u64 = 0x3c5;
const PSTATE_EL0T: u64 = 0x3c0;
/// SCTLR_EL1.nTWI and nTWE: WFI/WFE at EL0 do not trap to EL1, so they reach KVM (which traps
/// them at EL2) as they do from EL1; UMA: EL0 may unmask interrupts around its WFI.
const SCTLR_EL0_WAITS: u64 = (1 << 16) | (1 << 18) | (1 << 9);
/// CNTKCTL_EL1.EL0VCTEN: EL0 may read the virtual counter (duration-bound loops do).
const CNTKCTL_EL0VCTEN: u64 = 1 << 1;

/// No port I/O on arm64: the guest's ports are stores to the port window.
pub(crate) const HAS_PORT_IO: bool = false;

/// `count` vCPUs of the host's preferred target, with PSCI 0.2.
pub(crate) fn create_vcpus(_kvm: &Kvm, vm: &VmFd, count: u32) -> Result<Vec<VcpuFd>, VmmError> {
    let mut init = kvm_vcpu_init::default();
    vm.get_preferred_target(&mut init).map_err(kvm_err("KVM_ARM_PREFERRED_TARGET"))?;
    init.features[0] |= 1 << KVM_ARM_VCPU_PSCI_0_2;
    (0..count)
        .map(|index| {
            let vcpu = vm.create_vcpu(u64::from(index)).map_err(kvm_err("KVM_CREATE_VCPU"))?;
            vcpu.vcpu_init(&init).map_err(kvm_err("KVM_ARM_VCPU_INIT"))?;
            Ok(vcpu)
        })
        .collect()
}

/// The virtual counter's rate in kHz: CNTFRQ_EL0, which EL0 may read and which KVM gives the
/// guest unchanged.
pub(crate) fn counter_khz(_vcpu: &VcpuFd) -> Result<u64, VmmError> {
    let hz: u64;
    // SAFETY: reading CNTFRQ_EL0 has no side effects and is allowed at EL0.
    unsafe { std::arch::asm!("mrs {}, cntfrq_el0", out(reg) hz) };
    if hz == 0 {
        return Err(VmmError::Unsupported("CNTFRQ_EL0 reads 0: the firmware did not set the counter's rate".into()));
    }
    Ok(hz / 1000)
}

/// Start vCPU `index` at the program's entry with its shared page's address in x28, at EL1
/// (`Privilege::Kernel`) or EL0, exceptions vectored into the program.
pub(crate) fn init_registers(
    vcpu: &VcpuFd,
    program: &GuestProgram,
    privilege: Privilege,
    index: u32,
) -> Result<(), VmmError> {
    let pstate = match privilege {
        Privilege::Kernel => PSTATE_EL1H,
        Privilege::User => PSTATE_EL0T,
    };
    let stack = layout::stack_top(index);
    set(vcpu, core(offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, pc)), program.entry)?;
    set(vcpu, core(offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, pstate)), pstate)?;
    set(vcpu, core(offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, sp)), stack)?;
    set(vcpu, core(offset_of!(kvm_regs, sp_el1)), stack)?;
    set(vcpu, core(offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, regs) + 8 * 28), layout::shared_page(index))?;
    set(vcpu, sysreg(3, 0, 12, 0, 0), program.base)?; // VBAR_EL1
    let sctlr = get(vcpu, sysreg(3, 0, 1, 0, 0))?;
    set(vcpu, sysreg(3, 0, 1, 0, 0), sctlr | SCTLR_EL0_WAITS)?;
    let cntkctl = get(vcpu, sysreg(3, 0, 14, 1, 0))?;
    set(vcpu, sysreg(3, 0, 14, 1, 0), cntkctl | CNTKCTL_EL0VCTEN)
}

/// Nothing to write: the MMU is off and the vector table is part of the program.
pub(crate) fn prepare_memory(_image: &mut [u8], _program: &GuestProgram) -> Result<(), VmmError> {
    Ok(())
}

/// Where KVM's PV time record keeps the stolen nanoseconds, in the shared page.
pub(crate) const STEAL_NS: u64 = layout::shared::STEAL_NS_ARM64;

/// Have KVM keep the vCPU's PV time record (stolen time) at guest-physical `gpa`.
pub(crate) fn enable_steal_time(vcpu: &VcpuFd, gpa: u64) -> Result<(), VmmError> {
    let attr = kvm_device_attr {
        group: KVM_ARM_VCPU_PVTIME_CTRL,
        attr: u64::from(KVM_ARM_VCPU_PVTIME_IPA),
        addr: &gpa as *const u64 as u64,
        flags: 0,
    };
    vcpu.set_device_attr(&attr).map_err(|source| match source.errno() {
        libc::ENXIO | libc::ENODEV | libc::EINVAL => VmmError::Unsupported(format!(
            "this host's KVM has no PV time for arm64 guests (KVM_ARM_VCPU_PVTIME_CTRL: {source}); steal time is unavailable"
        )),
        _ => kvm_err("KVM_SET_DEVICE_ATTR (PV time)")(source),
    })
}

/// The guest's virtual counter now (`KVM_REG_ARM_TIMER_CNT`, which the UAPI encodes as
/// op0 3, op1 3, CRn 14, CRm 3, op2 2).
pub(crate) fn guest_counter(vcpu: &VcpuFd) -> Result<u64, VmmError> {
    get(vcpu, sysreg(3, 3, 14, 3, 2))
}

/// A stopped vCPU's program counter.
pub(crate) fn program_counter(vcpu: &VcpuFd) -> Result<u64, VmmError> {
    get(vcpu, core(offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, pc)))
}

/// A stopped vCPU's privilege level in the x86 terms the samples keep: EL0 is 3 (user), EL1 is
/// 0 (kernel).
pub(crate) fn privilege_level(vcpu: &VcpuFd) -> Result<u8, VmmError> {
    let pstate = get(vcpu, core(offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, pstate)))?;
    Ok(if (pstate >> 2) & 0b11 == 0 { 3 } else { 0 })
}

/// Raise or lower vCPU `index`'s IRQ line: a raised line ends its `WFI` (see `vmm::wake`).
pub(crate) fn set_wake_line(vm: &VmFd, index: u32, level: bool) -> Result<(), VmmError> {
    let irq =
        (KVM_ARM_IRQ_TYPE_CPU << KVM_ARM_IRQ_TYPE_SHIFT) | (index << KVM_ARM_IRQ_VCPU_SHIFT) | KVM_ARM_IRQ_CPU_IRQ;
    vm.set_irq_line(irq, level).map_err(kvm_err("KVM_IRQ_LINE"))
}

/// Describe the exception a vector reported: the syndrome, where, and the faulting address.
pub(crate) fn fault_message(vcpu: &VcpuFd, _memory: &GuestMemoryMmap, program: &GuestProgram, vector: u32) -> String {
    let esr = get(vcpu, sysreg(3, 0, 5, 2, 0)).unwrap_or(0);
    let far = get(vcpu, sysreg(3, 0, 6, 0, 0)).unwrap_or(0);
    let elr = get(vcpu, core(offset_of!(kvm_regs, elr_el1))).unwrap_or(0);
    let class = esr >> 26;
    let name = VECTOR_NAMES.get(vector as usize).copied().unwrap_or("unknown vector");
    format!(
        "guest exception ({name}; ESR_EL1 {esr:#x}, class {class:#x}{}, FAR_EL1 {far:#x}) at PC {} (reported through the fault port)",
        exception_class_name(class).map(|n| format!(" {n}")).unwrap_or_default(),
        program.describe(elr)
    )
}

/// The exception classes a test-bed guest can raise, by the Arm ARM's names.
fn exception_class_name(class: u64) -> Option<&'static str> {
    Some(match class {
        0x00 => "UNKNOWN (an undefined instruction)",
        0x01 => "WFx",
        0x15 => "SVC64",
        0x16 => "HVC64",
        0x18 => "SYS64",
        0x20 => "IABT_LOW",
        0x21 => "IABT_CUR",
        0x22 => "PC_ALIGN",
        0x24 => "DABT_LOW",
        0x25 => "DABT_CUR",
        0x26 => "SP_ALIGN",
        _ => return None,
    })
}

fn core(offset: usize) -> u64 {
    KVM_REG_ARM64 | KVM_REG_SIZE_U64 | u64::from(KVM_REG_ARM_CORE) | (offset / 4) as u64
}

fn sysreg(op0: u64, op1: u64, crn: u64, crm: u64, op2: u64) -> u64 {
    KVM_REG_ARM64
        | KVM_REG_SIZE_U64
        | u64::from(KVM_REG_ARM64_SYSREG)
        | (op0 << 14)
        | (op1 << 11)
        | (crn << 7)
        | (crm << 3)
        | op2
}

fn set(vcpu: &VcpuFd, id: u64, value: u64) -> Result<(), VmmError> {
    vcpu.set_one_reg(id, &value.to_le_bytes()).map(drop).map_err(kvm_err("KVM_SET_ONE_REG"))
}

fn get(vcpu: &VcpuFd, id: u64) -> Result<u64, VmmError> {
    let mut bytes = [0u8; 8];
    vcpu.get_one_reg(id, &mut bytes).map_err(kvm_err("KVM_GET_ONE_REG"))?;
    Ok(u64::from_le_bytes(bytes))
}
