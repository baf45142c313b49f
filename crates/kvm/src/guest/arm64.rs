//! The workloads as arm64 code, for KVM on aarch64 hosts: the same scripts, phases, shared page
//! and ground truth as on x86-64, assembled with dynasm.
//!
//! The vCPU starts with its MMU off (guest-virtual = guest-physical, data accesses to RAM are
//! Device memory, so every access is aligned) at EL1 or EL0, interrupts masked. arm64 has no
//! port I/O: an "`OUT` to port P" of the x86 programs is a 32-bit store to
//! [`layout::port_address`]`(P)`, an MMIO address no memslot backs, so the VMM sees the same
//! markers as `KVM_EXIT_MMIO`. The program starts with the EL1 exception vector table (VBAR_EL1
//! points at the program's base): every vector reports its index through [`ports::FAULT`].
//!
//! Registers: x28 = shared page (set by the VMM), x25 = port window, x24 = the userspace MMIO
//! doorbell, x26 = this vCPU's ioeventfd doorbell, x27 = iterations left or the counter
//! deadline. x0-x3 are scratch (an HVC's SMCCC call returns in them).

// dynasm expands a register operand `X(n)` to `n.into()`, a conversion clippy calls useless.
#![allow(clippy::useless_conversion)]

use dynasmrt::aarch64::Aarch64Relocation;
use dynasmrt::{dynasm, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};

use super::layout::{self, ports, shared};
use super::program::{GuestProgram, Symbol};
use super::workload::{Bound, Phase, Script, Workload, SYNC_ROUNDS};
use crate::error::VmmError;

/// The vector table's size: 16 entries of 0x80 bytes; `_start` follows it.
const VECTOR_TABLE: u64 = 0x800;
/// `ID_AA64PFR0_EL1` as an MRS operand (op0 3, op1 0, CRn 0, CRm 4, op2 0): KVM sets
/// HCR_EL2.TID3, so an EL1 read of it traps to KVM, which answers it (a SYS64 exit).
const ID_AA64PFR0_EL1: u32 = 0x4020;
/// `CNTVCT_EL0` (op0 3, op1 3, CRn 14, CRm 0, op2 2): the virtual counter, readable at EL0
/// once the VMM set CNTKCTL_EL1.EL0VCTEN.
const CNTVCT_EL0: u32 = 0x5f02;
/// SMCCC function id of PSCI_VERSION: KVM's PSCI answers it in the kernel.
const PSCI_VERSION: u32 = 0x8400_0000;

const X_SHARED: u8 = 28;
const X_BOUND: u8 = 27;
const X_DOORBELL: u8 = 26;
const X_PORTS: u8 = 25;
const X_MMIO_USER: u8 = 24;

/// Assemble `script` for arm64; `counter_khz` converts duration bounds into counter ticks.
pub fn assemble(script: &Script, counter_khz: u64) -> Result<GuestProgram, VmmError> {
    script.check_privilege().map_err(VmmError::Assemble)?;
    let mut b = Builder::new();
    emit_vectors(&mut b);
    b.function("_start");
    mov_imm(&mut b.ops, X_PORTS, layout::port_address(0));
    mov_imm(&mut b.ops, X_MMIO_USER, layout::MMIO_USER_ADDR);
    for (index, phase) in script.phases.iter().enumerate() {
        emit_phase(&mut b, index, phase, counter_khz)?;
    }
    let done = b.function("done");
    let done_offset = port_offset(ports::DONE);
    dynasm!(b.ops ; .arch aarch64 ; str w0, [X(X_PORTS), done_offset] ; b =>done);
    b.finish(layout::CODE_ADDR)
}

/// The vectors an IRQ taken at EL1 (SP_EL1) and from EL0 go to.
const IRQ_CURRENT_EL: u32 = 5;
const IRQ_FROM_EL0: u32 = 9;

/// The names of the 16 vectors, in table order (what a fault report says).
pub const VECTOR_NAMES: [&str; 16] = [
    "synchronous, current EL with SP_EL0",
    "IRQ, current EL with SP_EL0",
    "FIQ, current EL with SP_EL0",
    "SError, current EL with SP_EL0",
    "synchronous, current EL",
    "IRQ, current EL",
    "FIQ, current EL",
    "SError, current EL",
    "synchronous, from EL0",
    "IRQ, from EL0",
    "FIQ, from EL0",
    "SError, from EL0",
    "synchronous, from AArch32 EL0",
    "IRQ, from AArch32 EL0",
    "FIQ, from AArch32 EL0",
    "SError, from AArch32 EL0",
];

/// The IRQ vectors (from the current EL and from EL0) acknowledge the VMM's wake-up and return;
/// every other vector stores its index to the fault port and stays there (the VMM reads
/// ESR_EL1, ELR_EL1 and FAR_EL1 itself).
fn emit_vectors(b: &mut Builder) {
    let fault = port_offset(ports::FAULT);
    let ack = port_offset(ports::WAKE_ACK);
    for (vector, _) in (0u32..).zip(VECTOR_NAMES) {
        b.function(format!("vector_{vector}"));
        if vector == IRQ_CURRENT_EL || vector == IRQ_FROM_EL0 {
            // Stores the zero register: the interrupted code keeps every register.
            dynasm!(b.ops ; .arch aarch64 ; str wzr, [X(X_PORTS), ack] ; eret);
        } else {
            let hang = b.ops.new_dynamic_label();
            dynasm!(b.ops ; .arch aarch64 ; movz w0, vector ; str w0, [X(X_PORTS), fault] ; =>hang ; b =>hang);
        }
        while b.ops.offset().0 % 0x80 != 0 {
            dynasm!(b.ops ; .arch aarch64 ; nop);
        }
    }
    debug_assert_eq!(b.ops.offset().0 as u64, VECTOR_TABLE);
}

fn emit_phase(b: &mut Builder, index: usize, phase: &Phase, counter_khz: u64) -> Result<(), VmmError> {
    let name = phase.function.clone().unwrap_or_else(|| format!("phase{index}_{}", phase.workload.symbol()));
    b.function(name.clone());
    let marker = port_offset(ports::PHASE);
    mov_imm(&mut b.ops, 0, index as u64);
    dynasm!(b.ops ; .arch aarch64
        ; str w0, [X(X_PORTS), marker]
        ; str x0, [X(X_SHARED), shared::PHASE as u32]
    );
    match phase.workload {
        Workload::MmioKernel => {
            dynasm!(b.ops ; .arch aarch64 ; ldr X(X_DOORBELL), [X(X_SHARED), shared::MMIO_KERNEL_ADDR as u32])
        }
        Workload::Noise => return emit_noise(b, &name, phase.bound, counter_khz),
        w if !w.runs_on_arm64() => {
            return Err(VmmError::Assemble(format!("the {w} workload is x86-64's; arm64 has {}", arm64_names())));
        }
        _ => {}
    }
    match phase.bound {
        Bound::Iterations(0) => return Ok(()),
        Bound::Iterations(n) => mov_imm(&mut b.ops, X_BOUND, n),
        Bound::Duration { ns } => {
            let ticks = u128::from(ns) * u128::from(counter_khz) / 1_000_000;
            mov_imm(&mut b.ops, X_BOUND, u64::try_from(ticks).unwrap_or(u64::MAX / 2));
            dynasm!(b.ops ; .arch aarch64 ; mrs x0, CNTVCT_EL0 ; add X(X_BOUND), X(X_BOUND), x0);
        }
    }
    let end = b.ops.new_dynamic_label();
    let top = if phase.function.is_some() {
        let top = b.ops.new_dynamic_label();
        dynasm!(b.ops ; .arch aarch64 ; =>top);
        top
    } else {
        b.function(format!("{name}_loop"))
    };
    match phase.workload {
        Workload::Compute => {}
        Workload::MmioUser => dynasm!(b.ops ; .arch aarch64 ; str w0, [X(X_MMIO_USER)]),
        Workload::MmioKernel => dynasm!(b.ops ; .arch aarch64 ; str w0, [X(X_DOORBELL)]),
        Workload::IoBound => {
            let block = port_offset(ports::IO_BLOCK);
            dynasm!(b.ops ; .arch aarch64 ; str w0, [X(X_PORTS), block])
        }
        Workload::Hvc => {
            mov_imm(&mut b.ops, 0, u64::from(PSCI_VERSION));
            dynasm!(b.ops ; .arch aarch64 ; hvc 0)
        }
        // Interrupts are unmasked only around the WFI: the VMM's wake-up is taken (and
        // acknowledged) right after it, or before it if it came early, so the line is always
        // down when a WFI starts, and every WFI traps and waits.
        Workload::Wfi => dynasm!(b.ops ; .arch aarch64 ; msr daifclr, 2 ; wfi ; msr daifset, 2),
        Workload::Sysreg => dynasm!(b.ops ; .arch aarch64 ; mrs x0, ID_AA64PFR0_EL1),
        Workload::Fault => dynasm!(b.ops ; .arch aarch64 ; udf 0),
        other => unreachable!("{other} was refused above"),
    }
    dynasm!(b.ops ; .arch aarch64
        ; ldr x0, [X(X_SHARED), shared::ITERATIONS as u32]
        ; add x0, x0, 1
        ; str x0, [X(X_SHARED), shared::ITERATIONS as u32]
        ; ldr x1, [X(X_SHARED), shared::STOP as u32]
        ; cbnz x1, =>end
    );
    match phase.bound {
        Bound::Iterations(_) => dynasm!(b.ops ; .arch aarch64 ; subs X(X_BOUND), XSP(X_BOUND), 1 ; b.ne =>top),
        Bound::Duration { .. } => {
            dynasm!(b.ops ; .arch aarch64 ; mrs x0, CNTVCT_EL0 ; cmp x0, X(X_BOUND) ; b.lo =>top)
        }
    }
    dynasm!(b.ops ; .arch aarch64 ; =>end ; nop);
    Ok(())
}

/// The noise loop, as x86-64's (`workload::emit_noise`) with the virtual counter for the TSC
/// and KVM's PV time record for the steal-time one. Registers: x19 = threshold ticks, x20 =
/// sample buffer, x21 = samples seen, x22 = previous counter, x27 = deadline; x9/x10/x11 =
/// steal, heavyweight and lightweight counters at the previous sample.
fn emit_noise(b: &mut Builder, name: &str, bound: Bound, counter_khz: u64) -> Result<(), VmmError> {
    let Bound::Duration { ns } = bound else {
        return Err(VmmError::Assemble("the noise workload runs for a duration, not a count".into()));
    };
    let capacity = layout::NOISE_AREA / layout::NOISE_RECORD;
    // Touch every page of the sample buffer first: a first touch inside the loop is an exit
    // (the host maps the page) that would land in the middle of storing a sample.
    let touch = b.ops.new_dynamic_label();
    dynasm!(b.ops ; .arch aarch64 ; ldr x2, [X(X_SHARED), shared::NOISE_BUFFER as u32]);
    mov_imm(&mut b.ops, 3, layout::NOISE_AREA / 4096);
    dynasm!(b.ops ; .arch aarch64
        ; =>touch
        ; str xzr, [x2]
        ; add x2, x2, 1, lsl 12
        ; subs x3, x3, 1
        ; b.ne =>touch
    );
    emit_sync(b);
    let ticks = u128::from(ns) * u128::from(counter_khz) / 1_000_000;
    dynasm!(b.ops ; .arch aarch64
        ; ldr x19, [X(X_SHARED), shared::NOISE_THRESHOLD as u32]
        ; ldr x20, [X(X_SHARED), shared::NOISE_BUFFER as u32]
        ; movz x21, 0
        ; ldr x9, [X(X_SHARED), shared::STEAL_NS_ARM64 as u32]
        ; ldr x10, [X(X_SHARED), shared::VMM_USERSPACE_EXITS as u32]
        ; ldr x11, [X(X_SHARED), shared::VMM_LW_EXITS as u32]
    );
    mov_imm(&mut b.ops, X_BOUND, u64::try_from(ticks).unwrap_or(u64::MAX / 2));
    mov_imm(&mut b.ops, 8, capacity);
    dynasm!(b.ops ; .arch aarch64 ; mrs x0, CNTVCT_EL0 ; mov x22, x0 ; add X(X_BOUND), X(X_BOUND), x0);
    let (quiet, full, end) = (b.ops.new_dynamic_label(), b.ops.new_dynamic_label(), b.ops.new_dynamic_label());
    let top = b.function(format!("{name}_loop"));
    dynasm!(b.ops ; .arch aarch64
        ; mrs x0, CNTVCT_EL0
        ; sub x1, x0, x22
        ; cmp x1, x19
        ; b.ls =>quiet
        // A sample: [x20 + 32 * x21] = start, length, steal delta, exit deltas.
        ; cmp x21, x8
        ; b.hs =>full
        ; add x3, x20, x21, lsl 5
        ; str x22, [x3]
        ; str x1, [x3, 8]
        ; ldr x4, [X(X_SHARED), shared::STEAL_NS_ARM64 as u32]
        ; sub x5, x4, x9
        ; mov x9, x4
        ; str x5, [x3, 16]
        ; ldr x4, [X(X_SHARED), shared::VMM_USERSPACE_EXITS as u32]
        ; sub w5, w4, w10
        ; mov x10, x4
        ; ldr x6, [X(X_SHARED), shared::VMM_LW_EXITS as u32]
        ; sub w7, w6, w11
        ; mov x11, x6
        ; orr x5, x5, x7, lsl 32
        ; str x5, [x3, 24]
        ; =>full
        ; add x21, x21, 1
        ; str x21, [X(X_SHARED), shared::NOISE_SAMPLES as u32]
        // The next step is measured from the end of this gap, so storing the sample is inside
        // it (as on x86-64).
        ; =>quiet
        ; mov x22, x0
        ; ldr x4, [X(X_SHARED), shared::ITERATIONS as u32]
        ; add x4, x4, 1
        ; str x4, [X(X_SHARED), shared::ITERATIONS as u32]
        ; ldr x4, [X(X_SHARED), shared::STOP as u32]
        ; cbnz x4, =>end
        ; cmp x0, X(X_BOUND)
        ; b.lo =>top
        ; =>end
    );
    emit_sync(b);
    Ok(())
}

/// [`SYNC_ROUNDS`] clock-sync exits: the counter into the shared page, then a store to the
/// sync port (the VMM reads the counter itself between two host clock readings).
fn emit_sync(b: &mut Builder) {
    let again = b.ops.new_dynamic_label();
    let sync = port_offset(ports::SYNC);
    mov_imm(&mut b.ops, 12, SYNC_ROUNDS);
    dynasm!(b.ops ; .arch aarch64
        ; =>again
        ; mrs x0, CNTVCT_EL0
        ; str x0, [X(X_SHARED), shared::SYNC_TSC as u32]
        ; str w0, [X(X_PORTS), sync]
        ; subs x12, x12, 1
        ; b.ne =>again
    );
}

/// The byte offset of port `port`'s doorbell from the port window (x25).
fn port_offset(port: u16) -> u32 {
    (layout::port_address(port) - layout::port_address(0)) as u32
}

/// `x{reg} = value` in one MOVZ and a MOVK per further nonzero 16-bit half.
fn mov_imm(ops: &mut VecAssembler<Aarch64Relocation>, reg: u8, value: u64) {
    dynasm!(ops ; .arch aarch64 ; movz X(reg), (value & 0xffff) as u32);
    for shift in [16u32, 32, 48] {
        let half = ((value >> shift) & 0xffff) as u32;
        if half != 0 {
            match shift {
                16 => dynasm!(ops ; .arch aarch64 ; movk X(reg), half, lsl 16),
                32 => dynasm!(ops ; .arch aarch64 ; movk X(reg), half, lsl 32),
                _ => dynasm!(ops ; .arch aarch64 ; movk X(reg), half, lsl 48),
            }
        }
    }
}

fn arm64_names() -> String {
    let names: Vec<_> = Workload::ALL.iter().filter(|w| w.runs_on_arm64()).map(|w| w.name()).collect();
    names.join(", ")
}

/// dynasm's assembler plus the named labels that become symbols.
struct Builder {
    ops: VecAssembler<Aarch64Relocation>,
    named: Vec<(String, DynamicLabel)>,
}

impl Builder {
    fn new() -> Self {
        Builder { ops: VecAssembler::new(0), named: Vec::new() }
    }

    /// Start a named function here (a symbol `boot` and fault reports resolve PCs against).
    fn function(&mut self, name: impl Into<String>) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch aarch64 ; =>label);
        self.named.push((name.into(), label));
        label
    }

    fn finish(self, base: u64) -> Result<GuestProgram, VmmError> {
        let mut symbols = Vec::with_capacity(self.named.len());
        for (name, label) in &self.named {
            let offset = self.ops.labels().resolve_dynamic(*label).map_err(|e| VmmError::Assemble(e.to_string()))?;
            symbols.push(Symbol { name: name.clone(), addr: base + offset.0 as u64, size: 0 });
        }
        let code = self.ops.finalize().map_err(|e| VmmError::Assemble(format!("{e:?}")))?;
        GuestProgram::new(base, base + VECTOR_TABLE, code, symbols)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::Privilege;

    fn words(program: &GuestProgram, symbol: &str, count: usize) -> Vec<u32> {
        let at = (program.symbol_addr(symbol).unwrap() - program.base) as usize;
        program.code[at..at + 4 * count].chunks(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect()
    }

    #[test]
    fn starts_after_the_vector_table_and_names_every_phase() {
        let s = Script::parse_phases("compute:1ms,hvc:3,wfi:2,sysreg:2,mmio-user:1,mmio-kernel:1,io-bound:1,noise:5ms")
            .unwrap();
        let p = assemble(&s.at(Privilege::Kernel), 62_500).unwrap();
        assert!(p.symbol_addr("phase7_noise_loop").is_some());
        assert_eq!(p.entry, layout::CODE_ADDR + 0x800);
        assert_eq!(p.symbol_addr("_start"), Some(p.entry));
        assert_eq!(p.symbol_addr("vector_4"), Some(layout::CODE_ADDR + 4 * 0x80));
        for name in ["phase0_compute_loop", "phase1_hvc_loop", "phase2_wfi_loop", "phase3_sysreg_loop", "done"] {
            assert!(p.symbol_addr(name).is_some(), "missing {name}");
        }
    }

    // Expected words from GNU as (aarch64-linux-gnu-as) for the same instructions.
    #[test]
    fn loop_bodies_are_the_instructions_that_make_their_exits() {
        let s = Script::parse_phases("hvc:5,wfi:5,sysreg:5,mmio-user:5").unwrap().at(Privilege::Kernel);
        let p = assemble(&s, 62_500).unwrap();
        // movz x0, #0 ; movk x0, #0x8400, lsl #16 ; hvc #0
        assert_eq!(words(&p, "phase0_hvc_loop", 3), [0xd280_0000, 0xf2b0_8000, 0xd400_0002]);
        // msr daifclr, #2 ; wfi ; msr daifset, #2
        assert_eq!(words(&p, "phase1_wfi_loop", 3), [0xd503_42ff, 0xd503_207f, 0xd503_42df]);
        // mrs x0, id_aa64pfr0_el1
        assert_eq!(words(&p, "phase2_sysreg_loop", 1), [0xd538_0400]);
        // str w0, [x24]
        assert_eq!(words(&p, "phase3_mmio_user_loop", 1), [0xb900_0300]);
    }

    #[test]
    fn a_vector_reports_its_index_to_the_fault_port() {
        let p = assemble(&Script::single(Workload::Compute, Bound::Iterations(1)), 62_500).unwrap();
        // movz w0, #8 ; str w0, [x25, #0x798] ; b .
        assert_eq!(words(&p, "vector_8", 3), [0x5280_0100, 0xb907_9b20, 0x1400_0000]);
    }

    #[test]
    fn an_interrupt_acknowledges_the_wake_up_and_returns() {
        let p = assemble(&Script::single(Workload::Wfi, Bound::Iterations(1)), 62_500).unwrap();
        // str wzr, [x25, #0x7b0] ; eret
        assert_eq!(words(&p, "vector_5", 2), [0xb907_b33f, 0xd69f_03e0]);
        assert_eq!(words(&p, "vector_9", 2), [0xb907_b33f, 0xd69f_03e0]);
    }

    #[test]
    fn the_noise_loop_runs_for_a_duration() {
        let err = assemble(&Script::single(Workload::Noise, Bound::Iterations(5)), 62_500).unwrap_err();
        assert!(err.to_string().contains("runs for a duration"), "{err}");
    }

    #[test]
    fn x86_workloads_are_refused_by_name() {
        let err = assemble(&Script::single(Workload::PioUser, Bound::Iterations(1)), 62_500).unwrap_err();
        assert!(err.to_string().contains("pio-user workload is x86-64's"), "{err}");
        assert!(err.to_string().contains("hvc"), "{err}");
    }
}
