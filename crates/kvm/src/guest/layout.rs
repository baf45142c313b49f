//! The guest-physical memory map and the descriptor tables that put a vCPU directly in 64-bit
//! long mode at CPL3, or at CPL0 when asked (no guest kernel: on PVM hosts CPL0 code is
//! interpreted instruction by instruction, so CPL3 workloads never go there unless they fault).
//!
//! Everything below 1 GiB is identity-mapped with user-accessible 2 MiB pages; RAM is the
//! first [`RAM_SIZE`] bytes, and the MMIO doorbells sit above RAM where no memslot backs them.

use iced_x86::code_asm::*;

use super::program::{asm_err, GuestProgram, ProgramBuilder};
use crate::error::VmmError;

/// Start of the `noise` workload's sample buffers, one [`NOISE_AREA`] per vCPU.
pub const NOISE_BASE: u64 = 4 << 20;
/// Bytes of samples per vCPU.
pub const NOISE_AREA: u64 = 4 << 20;
/// vCPUs a `noise` VM may have.
pub const NOISE_VCPUS: u32 = 8;
/// Bytes per noise sample: start TSC, length in TSC ticks, steal ns since the previous sample,
/// heavyweight (low 32 bits) and lightweight (high 32 bits) exits since the previous sample.
pub const NOISE_RECORD: u64 = 32;
/// Guest RAM size (the sample buffers are untouched, so unallocated, unless `noise` runs).
pub const RAM_SIZE: u64 = NOISE_BASE + NOISE_VCPUS as u64 * NOISE_AREA;
/// Global descriptor table.
pub const GDT_ADDR: u64 = 0x1000;
/// 64-bit task state segment: RSP0 for exception entry, then an I/O permission bitmap that
/// allows every port. PVM hosts ignore a CPL3 guest's IOPL and let KVM's emulator check this
/// bitmap instead when an IN/OUT traps; VMX/SVM hosts take IOPL 3 directly.
pub const TSS_ADDR: u64 = 0x6000;
/// Offset of the I/O permission bitmap inside the TSS (right after the 104-byte TSS proper).
const IO_BITMAP_OFFSET: u64 = 0x68;
/// TSS limit: the bitmap covers all 65536 ports (8 KiB) plus the required 0xff terminator byte.
pub(crate) const TSS_LIMIT: u64 = IO_BITMAP_OFFSET + 0x2000;
/// Page-map level 4.
pub const PML4_ADDR: u64 = 0x2000;
/// Page-directory-pointer table.
pub const PDPT_ADDR: u64 = 0x3000;
/// Page directory of 2 MiB pages mapping [0, 1 GiB).
pub const PD_ADDR: u64 = 0x4000;
/// Interrupt descriptor table (vectors 0–31 used).
pub const IDT_ADDR: u64 = 0x5000;
/// Top of the CPL0 stack used by the fault handlers.
pub const KERNEL_STACK_TOP: u64 = 0xf000;
/// Where guest code is loaded.
pub const CODE_ADDR: u64 = 0x10000;
/// Largest program that fits before the per-vCPU areas.
pub const CODE_MAX: u64 = PER_VCPU_BASE - CODE_ADDR;
/// Start of the per-vCPU areas: shared page, then stack page.
pub const PER_VCPU_BASE: u64 = 0x10_0000;
/// Bytes per vCPU area.
pub const PER_VCPU_SIZE: u64 = 0x2000;
/// vCPUs that fit in RAM.
pub const MAX_VCPUS: u32 = ((NOISE_BASE - PER_VCPU_BASE) / PER_VCPU_SIZE) as u32;
/// Userspace-handled MMIO doorbell (no memslot, no ioeventfd).
pub const MMIO_USER_ADDR: u64 = 0x2000_0000;
/// In-kernel MMIO doorbells (ioeventfd), 8 bytes per vCPU.
pub const MMIO_KERNEL_BASE: u64 = 0x2000_1000;
/// Where architectures without port I/O (arm64) reach the [`ports`]: a store to
/// [`port_address`]`(P)` is what `OUT` to port P is on x86-64.
pub const PORT_WINDOW: u64 = 0x2100_0000;

/// The MMIO address standing for port `port` (8 bytes apart, so 32-bit stores reach each one
/// with an immediate offset).
pub const fn port_address(port: u16) -> u64 {
    PORT_WINDOW + 8 * port as u64
}

/// The port an MMIO address in the port window stands for.
pub fn port_at(addr: u64) -> Option<u16> {
    let offset = addr.checked_sub(PORT_WINDOW)?;
    (offset % 8 == 0).then_some(offset / 8).and_then(|p| u16::try_from(p).ok())
}

/// The GDT's selectors (user ones with RPL 3); the vCPU setup of `vmm::arch` loads them, and
/// there is none but x86-64's yet.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) mod selectors {
    pub(crate) const KERNEL_CODE: u16 = 0x08;
    pub(crate) const KERNEL_DATA: u16 = 0x10;
    pub(crate) const USER_DATA: u16 = 0x18 | 3;
    pub(crate) const USER_CODE: u16 = 0x20 | 3;
    pub(crate) const TSS: u16 = 0x28;
}

/// I/O ports the guest programs use.
pub mod ports {
    /// Userspace-handled PIO (the VMM counts and returns).
    pub const PIO_USER: u16 = 0xe0;
    /// In-kernel PIO doorbells (ioeventfd): base + vCPU index.
    pub const PIO_KERNEL_BASE: u16 = 0x0c00;
    /// Phase marker: EAX = phase index.
    pub const PHASE: u16 = 0xf0;
    /// Guest finished.
    pub const DONE: u16 = 0xf1;
    /// An exception reached a fault stub: EAX = vector; the frame is on the CPL0 stack.
    pub const FAULT: u16 = 0xf3;
    /// "Disk" request: the VMM sleeps `--io-latency` before returning.
    pub const IO_BLOCK: u16 = 0xf4;
    /// Clock sync: the VMM reads the guest's TSC between two CLOCK_MONOTONIC readings (the
    /// guest also leaves its own reading in [`super::shared::SYNC_TSC`], for checking).
    pub const SYNC: u16 = 0xf5;
    /// The guest took the interrupt that ended a `wfi` wait: the VMM lowers the line before
    /// the guest runs on, so its next WFI waits again (arm64).
    pub const WAKE_ACK: u16 = 0xf6;
}

/// Offsets inside a vCPU's shared page (first page of its per-vCPU area).
pub mod shared {
    use virtprof_model::appcounters;
    use virtprof_model::guest::SeriesKind;

    /// The slots at [`COUNTERS`], in order.
    pub fn counter_slots() -> [appcounters::Slot; 3] {
        let slot = |name: &str, kind| appcounters::Slot { name: name.into(), kind };
        [
            slot("iterations", SeriesKind::Counter),
            slot("phase", SeriesKind::Gauge),
            slot("noise_samples", SeriesKind::Counter),
        ]
    }

    /// Written by the VMM: b"VPROFSHR" so the guest (and humans with a dump) can check.
    pub const MAGIC: u64 = 0x00;
    /// VMM → guest: KVM_RUN returns the VMM handled so far.
    pub const VMM_USERSPACE_EXITS: u64 = 0x08;
    /// VMM → guest: of those, `IO` exits.
    pub const VMM_IO_EXITS: u64 = 0x10;
    /// VMM → guest: of those, `MMIO` exits.
    pub const VMM_MMIO_EXITS: u64 = 0x18;
    /// VMM → guest: nonzero asks the workload loop to stop.
    pub const STOP: u64 = 0x20;
    /// VMM → guest: guest TSC frequency in kHz.
    pub const TSC_KHZ: u64 = 0x28;
    /// VMM → guest: this vCPU's index.
    pub const VCPU_INDEX: u64 = 0x30;
    /// VMM → guest: this vCPU's in-kernel PIO doorbell port.
    pub const PIO_KERNEL_PORT: u64 = 0x38;
    /// VMM → guest: this vCPU's in-kernel MMIO doorbell address.
    pub const MMIO_KERNEL_ADDR: u64 = 0x40;
    /// VMM → guest: the `noise` loop's threshold in TSC ticks.
    pub const NOISE_THRESHOLD: u64 = 0x48;
    /// VMM → guest: guest-physical address of this vCPU's noise sample buffer (the `touch`
    /// workload's buffer too).
    pub const NOISE_BUFFER: u64 = 0x50;
    /// VMM → guest: lightweight exits (the KVM stats fd's `exits` minus the VMM's returns),
    /// published by the VMM's main thread every 100 µs.
    pub const VMM_LW_EXITS: u64 = 0x58;
    /// The guest's application counters, in the layout any program publishes its own in
    /// (`model::appcounters`): header and names written by the VMM, values by the guest.
    pub const COUNTERS: u64 = 0x400;
    /// Guest → VMM: workload iterations completed (the application counter; slot 0).
    pub const ITERATIONS: u64 = COUNTERS + appcounters::value_offset(0) as u64;
    /// Guest → VMM: index of the phase running now (slot 1, a gauge).
    pub const PHASE: u64 = COUNTERS + appcounters::value_offset(1) as u64;
    /// Guest → VMM: noise samples detected (records beyond the buffer are counted, not kept;
    /// slot 2).
    pub const NOISE_SAMPLES: u64 = COUNTERS + appcounters::value_offset(2) as u64;
    /// Guest → VMM: the guest's TSC at a [`super::ports::SYNC`] exit.
    pub const SYNC_TSC: u64 = 0x98;
    /// The KVM steal-time record (64-byte aligned), when `--steal-time` is on.
    pub const STEAL_TIME: u64 = 0x800;
    /// Where that record keeps the stolen nanoseconds: first in x86-64's `kvm_steal_time`,
    /// after the revision and attributes words in arm64's PV time record
    /// (`pvclock_vcpu_stolen_time`).
    pub const STEAL_NS_X86_64: u64 = STEAL_TIME;
    /// See [`STEAL_NS_X86_64`].
    pub const STEAL_NS_ARM64: u64 = STEAL_TIME + 8;
    /// Magic value.
    pub const MAGIC_VALUE: u64 = u64::from_le_bytes(*b"VPROFSHR");
}

/// Name of the memfd backing guest RAM (`/proc/PID/fd` shows `/memfd:NAME (deleted)`).
pub const GUEST_RAM_NAME: &str = "virtprof-guest-ram";

/// Guest-physical address of vCPU `index`'s shared page.
pub fn shared_page(index: u32) -> u64 {
    PER_VCPU_BASE + u64::from(index) * PER_VCPU_SIZE
}

/// Guest-physical address of vCPU `index`'s noise sample buffer.
pub fn noise_buffer(index: u32) -> u64 {
    NOISE_BASE + u64::from(index) * NOISE_AREA
}

/// Initial stack pointer of vCPU `index`.
pub fn stack_top(index: u32) -> u64 {
    shared_page(index) + PER_VCPU_SIZE
}

/// Exceptions that push an error code (the stubs push a zero for the others).
const HAS_ERROR_CODE: [u8; 8] = [8, 10, 11, 12, 13, 14, 17, 21];
/// Vectors given fault stubs (the architectural exceptions).
pub const FAULT_VECTORS: u32 = 32;

/// Emit one stub per exception vector plus the common tail that reports it through
/// [`ports::FAULT`]. The stubs run at CPL0 and only when something already went wrong.
pub fn emit_fault_handlers(b: &mut ProgramBuilder) -> Result<(), VmmError> {
    // The common tail comes first so every stub jumps backwards to an already-placed label.
    let report = b.function("fault_report")?;
    b.asm.mov(rax, qword_ptr(rsp)).map_err(asm_err)?;
    b.asm.out(i32::from(ports::FAULT), eax).map_err(asm_err)?;
    let hang = b.function("fault_hang")?;
    b.asm.jmp(hang).map_err(asm_err)?;
    for vector in 0..FAULT_VECTORS {
        b.function(format!("fault_vector_{vector}"))?;
        if !HAS_ERROR_CODE.contains(&(vector as u8)) {
            b.asm.push(0).map_err(asm_err)?;
        }
        b.asm.push(vector as i32).map_err(asm_err)?;
        b.asm.jmp(report).map_err(asm_err)?;
    }
    Ok(())
}

/// Write GDT, TSS, page tables and IDT into `ram` (a host view of guest RAM from address 0).
pub fn write_system_tables(ram: &mut [u8], program: &GuestProgram) -> Result<(), VmmError> {
    let gdt: [u64; 7] = [
        0,
        0x0020_9a00_0000_0000, // kernel code: present, DPL0, 64-bit
        0x0000_9200_0000_0000, // kernel data
        0x0000_f200_0000_0000, // user data: DPL3
        0x0020_fa00_0000_0000, // user code: DPL3, 64-bit
        tss_descriptor_low(TSS_ADDR, TSS_LIMIT),
        TSS_ADDR >> 32,
    ];
    for (i, entry) in gdt.iter().enumerate() {
        put_u64(ram, GDT_ADDR + 8 * i as u64, *entry);
    }
    // 64-bit TSS: RSP0 at offset 4, I/O bitmap offset at 102; bitmap bytes stay zero (allowed)
    // and the byte after the bitmap is 0xff as the architecture requires.
    put_u64(ram, TSS_ADDR + 4, KERNEL_STACK_TOP);
    ram[(TSS_ADDR + 102) as usize..(TSS_ADDR + 104) as usize].copy_from_slice(&(IO_BITMAP_OFFSET as u16).to_le_bytes());
    ram[(TSS_ADDR + TSS_LIMIT) as usize] = 0xff;

    const PRESENT_RW_USER: u64 = 0b111;
    const HUGE: u64 = 1 << 7;
    put_u64(ram, PML4_ADDR, PDPT_ADDR | PRESENT_RW_USER);
    put_u64(ram, PDPT_ADDR, PD_ADDR | PRESENT_RW_USER);
    for i in 0..512u64 {
        put_u64(ram, PD_ADDR + 8 * i, (i << 21) | PRESENT_RW_USER | HUGE);
    }

    for vector in 0..FAULT_VECTORS {
        let handler = program
            .symbol_addr(&format!("fault_vector_{vector}"))
            .ok_or_else(|| VmmError::Assemble(format!("program lacks fault_vector_{vector}")))?;
        let (lo, hi) = interrupt_gate(handler);
        put_u64(ram, IDT_ADDR + 16 * u64::from(vector), lo);
        put_u64(ram, IDT_ADDR + 16 * u64::from(vector) + 8, hi);
    }
    Ok(())
}

fn tss_descriptor_low(base: u64, limit: u64) -> u64 {
    let present_type = 0x89u64; // present, DPL0, type 9 = available 64-bit TSS
    (limit & 0xffff)
        | ((base & 0xff_ffff) << 16)
        | (present_type << 40)
        | (((limit >> 16) & 0xf) << 48)
        | (((base >> 24) & 0xff) << 56)
}

fn interrupt_gate(handler: u64) -> (u64, u64) {
    let type_attr = 0x8eu64; // present, DPL0, 64-bit interrupt gate
    let lo = (handler & 0xffff)
        | (u64::from(selectors::KERNEL_CODE) << 16)
        | (type_attr << 40)
        | (((handler >> 16) & 0xffff) << 48);
    (lo, handler >> 32)
}

fn put_u64(ram: &mut [u8], addr: u64, value: u64) {
    ram[addr as usize..addr as usize + 8].copy_from_slice(&value.to_le_bytes());
}

// The memory map checks itself at compile time: tables, stacks and code never overlap.
const _: () = {
    assert!(IDT_ADDR + 16 * FAULT_VECTORS as u64 <= TSS_ADDR);
    assert!(TSS_ADDR + TSS_LIMIT < KERNEL_STACK_TOP - 0x1000);
    assert!(KERNEL_STACK_TOP <= CODE_ADDR);
    assert!(shared::STEAL_TIME % 64 == 0);
    assert!(MMIO_USER_ADDR >= RAM_SIZE && MMIO_KERNEL_BASE >= RAM_SIZE);
    assert!(PORT_WINDOW >= MMIO_KERNEL_BASE + 8 * MAX_VCPUS as u64);
    assert!(PER_VCPU_BASE + MAX_VCPUS as u64 * PER_VCPU_SIZE <= NOISE_BASE);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tss_descriptor_encodes_base_and_limit() {
        let d = tss_descriptor_low(0x6000, 0x2068);
        assert_eq!(d & 0xffff, 0x2068);
        assert_eq!((d >> 16) & 0xff_ffff, 0x6000);
        assert_eq!((d >> 40) & 0xff, 0x89);
    }

    #[test]
    fn per_vcpu_areas_fit_in_ram() {
        assert!(stack_top(MAX_VCPUS - 1) <= RAM_SIZE);
        assert_eq!(shared_page(1) - shared_page(0), PER_VCPU_SIZE);
    }
}
