//! x86-64: vCPUs with the host's supported CPUID, started in long mode with paging at the
//! script's CPL (the tables are in [`crate::guest::layout`]); the guest's clock is its TSC.

use kvm_bindings::{kvm_msr_entry, kvm_segment, kvm_sregs, Msrs, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::super::kvm_err;
use crate::error::VmmError;
use crate::guest::layout::{self, selectors};
use crate::guest::{GuestProgram, Privilege};

/// `MSR_KVM_STEAL_TIME`: the guest-physical address of the steal-time record, bit 0 enables.
const MSR_KVM_STEAL_TIME: u32 = 0x4b56_4d03;
/// `IA32_TSC`.
const MSR_IA32_TSC: u32 = 0x10;
/// RFLAGS for the workload: reserved bit 1 and IOPL 3, so CPL3 code may use IN/OUT; interrupts
/// stay off (there is no interrupt controller to deliver any).
const USER_RFLAGS: u64 = 0x3002;

/// `count` vCPUs of `vm`, each with every CPUID leaf the host supports.
pub(crate) fn create_vcpus(kvm: &Kvm, vm: &VmFd, count: u32) -> Result<Vec<VcpuFd>, VmmError> {
    // Intel VMX needs a TSS area below 4 GiB for real-mode emulation; other hosts ignore or
    // reject it, and we never enter real mode.
    let _ = vm.set_tss_address(0xfffb_d000);
    let supported = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
    (0..count)
        .map(|index| {
            let vcpu = vm.create_vcpu(u64::from(index)).map_err(kvm_err("KVM_CREATE_VCPU"))?;
            vcpu.set_cpuid2(&supported).map_err(kvm_err("KVM_SET_CPUID2"))?;
            Ok(vcpu)
        })
        .collect()
}

/// The rate of the counter guest programs time themselves with (the TSC), in kHz.
pub(crate) fn counter_khz(vcpu: &VcpuFd) -> Result<u64, VmmError> {
    Ok(u64::from(vcpu.get_tsc_khz().map_err(kvm_err("KVM_GET_TSC_KHZ"))?))
}

/// Start vCPU `index` at the program's entry, on its own stack, at `privilege`'s CPL, with
/// its shared page's address in R15.
pub(crate) fn init_registers(
    vcpu: &VcpuFd,
    program: &GuestProgram,
    privilege: Privilege,
    index: u32,
) -> Result<(), VmmError> {
    let sregs = vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
    vcpu.set_sregs(&long_mode_sregs(sregs, privilege)).map_err(kvm_err("KVM_SET_SREGS"))?;
    let mut regs = vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
    regs.rip = program.entry;
    regs.rsp = layout::stack_top(index);
    regs.rflags = USER_RFLAGS;
    regs.r15 = layout::shared_page(index);
    vcpu.set_regs(&regs).map_err(kvm_err("KVM_SET_REGS"))
}

/// Have KVM keep the vCPU's steal-time record at guest-physical `gpa`.
pub(crate) fn enable_steal_time(vcpu: &VcpuFd, gpa: u64) -> Result<(), VmmError> {
    let msrs = Msrs::from_entries(&[kvm_msr_entry { index: MSR_KVM_STEAL_TIME, data: gpa | 1, ..Default::default() }])
        .map_err(|e| VmmError::Memory(format!("MSR list: {e:?}")))?;
    let written = vcpu.set_msrs(&msrs).map_err(kvm_err("KVM_SET_MSRS (steal time)"))?;
    if written != 1 {
        return Err(VmmError::Memory("the host refused MSR_KVM_STEAL_TIME (is CONFIG_SCHED_INFO off?)".into()));
    }
    Ok(())
}

/// The guest's TSC now (`IA32_TSC` through `KVM_GET_MSRS`: the vCPU is stopped, so the read
/// takes one ioctl, and bracketing it with the host clock gives a tight sync point).
pub(crate) fn guest_counter(vcpu: &VcpuFd) -> Result<u64, VmmError> {
    let mut msrs = Msrs::from_entries(&[kvm_msr_entry { index: MSR_IA32_TSC, ..Default::default() }])
        .map_err(|e| VmmError::Memory(format!("MSR list: {e:?}")))?;
    vcpu.get_msrs(&mut msrs).map_err(kvm_err("KVM_GET_MSRS (IA32_TSC)"))?;
    Ok(msrs.as_slice()[0].data)
}

/// A stopped vCPU's program counter (RIP).
pub(crate) fn program_counter(vcpu: &VcpuFd) -> Result<u64, VmmError> {
    Ok(vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?.rip)
}

/// A stopped vCPU's privilege level (CS.DPL: 0 kernel, 3 user).
pub(crate) fn privilege_level(vcpu: &VcpuFd) -> Result<u8, VmmError> {
    Ok(vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?.cs.dpl)
}

/// Where the steal-time record keeps the stolen nanoseconds, in the shared page.
pub(crate) const STEAL_NS: u64 = layout::shared::STEAL_NS_X86_64;

/// Whether guests here have port I/O (and so PIO ioeventfds).
pub(crate) const HAS_PORT_IO: bool = true;

/// Write the descriptor tables and page tables into `image` (guest RAM from address 0).
pub(crate) fn prepare_memory(image: &mut [u8], program: &GuestProgram) -> Result<(), VmmError> {
    layout::write_system_tables(image, program)
}

/// No x86-64 workload waits for an interrupt (HLT returns to the VMM), so there is no line to
/// raise.
pub(crate) fn set_wake_line(_vm: &VmFd, _index: u32, _level: bool) -> Result<(), VmmError> {
    Err(VmmError::Unsupported("no x86-64 workload waits for an interrupt".into()))
}

const VECTOR_NAMES: [&str; 22] = [
    "#DE",
    "#DB",
    "NMI",
    "#BP",
    "#OF",
    "#BR",
    "#UD",
    "#NM",
    "#DF",
    "coprocessor overrun",
    "#TS",
    "#NP",
    "#SS",
    "#GP",
    "#PF",
    "reserved",
    "#MF",
    "#AC",
    "#MC",
    "#XM",
    "#VE",
    "#CP",
];

/// Describe the exception a fault stub reported, from the frame it left on the CPL0 stack.
pub(crate) fn fault_message(vcpu: &VcpuFd, memory: &GuestMemoryMmap, program: &GuestProgram, vector: u32) -> String {
    let rsp = vcpu.get_regs().map(|r| r.rsp).unwrap_or(0);
    let word = |i: u64| memory.read_obj::<u64>(GuestAddress(rsp + 8 * i)).unwrap_or(0);
    let (error_code, rip) = (word(1), word(2));
    let name = VECTOR_NAMES.get(vector as usize).copied().unwrap_or("exception");
    let cr2 = match (vector, vcpu.get_sregs()) {
        (14, Ok(sregs)) => format!(", CR2 {:#x}", sregs.cr2),
        _ => String::new(),
    };
    format!(
        "guest exception {name} (vector {vector}, error code {error_code:#x}{cr2}) at RIP {} (reported through an IO exit on the fault port)",
        program.describe(rip)
    )
}

/// Special registers for long mode with paging, starting at `privilege`'s CPL.
fn long_mode_sregs(mut sregs: kvm_sregs, privilege: Privilege) -> kvm_sregs {
    let flat = |selector: u16, type_: u8, dpl: u8, code: bool| kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl,
        db: u8::from(!code),
        s: 1,
        l: u8::from(code),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    let (code, data) = match privilege {
        Privilege::User => (selectors::USER_CODE, selectors::USER_DATA),
        Privilege::Kernel => (selectors::KERNEL_CODE, selectors::KERNEL_DATA),
    };
    let dpl = privilege.cpl();
    sregs.cs = flat(code, 0xb, dpl, true);
    let data = flat(data, 0x3, dpl, false);
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = kvm_segment {
        base: layout::TSS_ADDR,
        limit: layout::TSS_LIMIT as u32,
        selector: selectors::TSS,
        type_: 0xb, // busy 64-bit TSS, as VMX entry checks require
        present: 1,
        s: 0,
        ..Default::default()
    };
    sregs.ldt = kvm_segment { type_: 0x2, unusable: 1, ..Default::default() };
    sregs.gdt.base = layout::GDT_ADDR;
    sregs.gdt.limit = 7 * 8 - 1;
    sregs.idt.base = layout::IDT_ADDR;
    sregs.idt.limit = (layout::FAULT_VECTORS * 16 - 1) as u16;
    sregs.cr3 = layout::PML4_ADDR;
    sregs.cr4 = (1 << 5) | (1 << 9) | (1 << 10); // PAE, OSFXSR, OSXMMEXCPT
    sregs.cr0 = (1 << 0) | (1 << 1) | (1 << 4) | (1 << 5) | (1 << 16) | (1 << 31); // PE MP ET NE WP PG
    sregs.efer = (1 << 8) | (1 << 10); // LME, LMA
    sregs
}
