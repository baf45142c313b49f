//! The workloads of `virtprof testvm` and the code each one runs.
//!
//! Every run is a [`Script`] of one or more [`Phase`]s. A phase announces itself with an `OUT`
//! to [`ports::PHASE`], then loops over its body until its bound (iterations or guest-TSC
//! deadline) is reached or the VMM raises the stop flag, counting iterations in the shared
//! page. The script ends with an `OUT` to [`ports::DONE`]. So every vCPU makes exactly
//! `phases + 1` marker `IO` exits besides what its workload asks for.

use std::fmt;
use std::str::FromStr;

use iced_x86::code_asm::*;
use serde::{Deserialize, Serialize};

use super::layout::{self, ports, shared};
use super::program::{asm_err, GuestProgram, ProgramBuilder};
use crate::error::VmmError;

/// What a phase's loop body does once per iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Nothing: the loop overhead alone (the baseline).
    Compute,
    /// `OUT` to a port the VMM handles in userspace: one `IO` exit per iteration.
    PioUser,
    /// `OUT` to a port registered with `KVM_IOEVENTFD`: handled in the kernel.
    PioKernel,
    /// A store to unbacked guest memory the VMM handles: one `MMIO` exit per iteration.
    MmioUser,
    /// A store to an MMIO address registered with `KVM_IOEVENTFD`.
    MmioKernel,
    /// A "disk" request: the VMM sleeps `--io-latency` before resuming the vCPU.
    IoBound,
    /// `CPUID` leaf 0 (a lightweight exit on VMX/SVM; on PVM hosts CPL3 CPUID never reaches
    /// our KVM).
    Cpuid,
    /// `UD2`: faults on purpose, to exercise fault reporting.
    Fault,
    /// `HLT` (CPL0 only): with no in-kernel interrupt controller KVM hands every halt to the
    /// VMM, which resumes the vCPU: one heavyweight `hlt` exit per iteration on VMX/SVM.
    Hlt,
    /// `RDMSR` of IA32_APIC_BASE (CPL0 only): KVM answers it itself, a lightweight `msr` exit
    /// on VMX/SVM.
    Rdmsr,
    /// `HVC #0` with PSCI_VERSION (arm64, EL1 only): KVM's PSCI answers it in the kernel, a
    /// lightweight `HVC64` exit.
    Hvc,
    /// `WFI` (arm64): KVM traps it and blocks the vCPU until the VMM raises its interrupt line
    /// (every millisecond): one `WFx` exit per iteration, most of it the guest idling.
    Wfi,
    /// A read of `ID_AA64PFR0_EL1` (arm64, EL1 only): KVM traps ID registers (HCR_EL2.TID3)
    /// and answers in the kernel, a lightweight `SYS64` exit.
    Sysreg,
    /// A store to the next page of the vCPU's 4 MiB touch buffer (1024 pages, wrapping): once
    /// every page is mapped it makes no exit, unless the host takes the buffer back
    /// (`--reclaim-hz`, as a balloon does) and KVM has to fault each page in again.
    Touch,
    /// An OS-noise loop: reads the TSC; a step above the VMM-given threshold is a sample,
    /// stored with the steal time and the VMM's exit counters accumulated since the previous
    /// sample. Clock-sync exits before and after let the host map guest TSC to its clock.
    Noise,
}

impl Workload {
    /// Every workload, in help order.
    pub const ALL: [Workload; 15] = [
        Workload::Compute,
        Workload::PioUser,
        Workload::PioKernel,
        Workload::MmioUser,
        Workload::MmioKernel,
        Workload::IoBound,
        Workload::Cpuid,
        Workload::Fault,
        Workload::Touch,
        Workload::Noise,
        Workload::Hlt,
        Workload::Rdmsr,
        Workload::Hvc,
        Workload::Wfi,
        Workload::Sysreg,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Compute => "compute",
            Workload::PioUser => "pio-user",
            Workload::PioKernel => "pio-kernel",
            Workload::MmioUser => "mmio-user",
            Workload::MmioKernel => "mmio-kernel",
            Workload::IoBound => "io-bound",
            Workload::Cpuid => "cpuid",
            Workload::Fault => "fault",
            Workload::Touch => "touch",
            Workload::Noise => "noise",
            Workload::Hlt => "hlt",
            Workload::Rdmsr => "rdmsr",
            Workload::Hvc => "hvc",
            Workload::Wfi => "wfi",
            Workload::Sysreg => "sysreg",
        }
    }

    /// It stores into the vCPU's buffer ([`layout::noise_buffer`]): a VM has buffers for
    /// [`layout::NOISE_VCPUS`] vCPUs.
    pub fn uses_buffer(self) -> bool {
        matches!(self, Workload::Noise | Workload::Touch)
    }

    /// Privileged instructions: at CPL3 (EL0) they fault instead of reaching the hypervisor.
    pub fn needs_kernel(self) -> bool {
        matches!(self, Workload::Hlt | Workload::Rdmsr | Workload::Hvc | Workload::Sysreg)
    }

    /// Whether x86-64 has this workload (port I/O, CPUID, HLT and MSRs are x86's).
    pub fn runs_on_x86_64(self) -> bool {
        !matches!(self, Workload::Hvc | Workload::Wfi | Workload::Sysreg)
    }

    /// Whether arm64 has this workload (HVC, WFI and system registers are arm64's).
    pub fn runs_on_arm64(self) -> bool {
        matches!(
            self,
            Workload::Compute
                | Workload::MmioUser
                | Workload::MmioKernel
                | Workload::IoBound
                | Workload::Fault
                | Workload::Hvc
                | Workload::Wfi
                | Workload::Sysreg
                | Workload::Noise
        )
    }

    /// Whether this host's architecture has this workload.
    pub fn runs_here(self) -> bool {
        if cfg!(target_arch = "aarch64") {
            self.runs_on_arm64()
        } else {
            self.runs_on_x86_64()
        }
    }

    pub(crate) fn symbol(self) -> String {
        self.name().replace('-', "_")
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL.into_iter().find(|w| w.name() == s).ok_or_else(|| {
            let names: Vec<_> = Workload::ALL.iter().map(|w| w.name()).collect();
            format!("unknown workload '{s}' (expected one of: {}, phases, boot)", names.join(", "))
        })
    }
}

/// When a phase ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bound {
    /// After this many iterations.
    Iterations(u64),
    /// After this many nanoseconds of guest TSC time.
    Duration {
        /// Nanoseconds.
        ns: u64,
    },
}

/// One step of a script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phase {
    /// What the loop does.
    pub workload: Workload,
    /// When it stops.
    pub bound: Bound,
    /// A function name for the whole phase (the `boot` workload's named functions); None
    /// names it `phaseN_WORKLOAD` with a separate `_loop` symbol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
}

impl Phase {
    /// A phase without a function name.
    pub fn new(workload: Workload, bound: Bound) -> Self {
        Phase { workload, bound, function: None }
    }

    /// What reports call this phase: its function name, else its workload.
    pub fn label(&self) -> &str {
        self.function.as_deref().unwrap_or(self.workload.name())
    }
}

/// The privilege level guest code runs at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Privilege {
    /// CPL3, the default: on PVM hosts this code runs natively.
    #[default]
    User,
    /// CPL0, where a guest kernel runs: privileged instructions (`hlt`, `rdmsr`) are allowed.
    /// On PVM hosts every CPL0 instruction is interpreted, so loops run far slower there.
    Kernel,
}

impl Privilege {
    /// The x86 current privilege level.
    pub fn cpl(self) -> u8 {
        match self {
            Privilege::User => 3,
            Privilege::Kernel => 0,
        }
    }

    /// The privilege level of a CPL (0 or 3, the two the test bed has).
    pub fn from_cpl(cpl: u8) -> Option<Self> {
        match cpl {
            3 => Some(Privilege::User),
            0 => Some(Privilege::Kernel),
            _ => None,
        }
    }
}

/// The sequence of phases every vCPU of a VM runs, and the privilege level it runs them at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Script {
    /// The phases, in order.
    pub phases: Vec<Phase>,
    /// Where the code runs (CPL3 unless asked).
    #[serde(default)]
    pub privilege: Privilege,
}

impl Script {
    /// A single-phase script.
    pub fn single(workload: Workload, bound: Bound) -> Self {
        Script { phases: vec![Phase::new(workload, bound)], privilege: Privilege::User }
    }

    /// Parse `compute:200ms,pio-user:10000,io-bound:50`: a count without a unit is iterations,
    /// a count with one (`ns`, `us`, `ms`, `s`, `m`) is a duration.
    pub fn parse_phases(spec: &str) -> Result<Self, String> {
        let phases = spec
            .split(',')
            .map(|item| {
                let (name, bound) = item.split_once(':').ok_or_else(|| {
                    format!(
                        "phase '{item}' lacks a bound; write WORKLOAD:COUNT or WORKLOAD:DURATION, e.g. 'compute:200ms'"
                    )
                })?;
                let workload: Workload = name.trim().parse()?;
                let bound = bound.trim();
                let bound = if bound.chars().all(|c| c.is_ascii_digit()) {
                    Bound::Iterations(bound.parse().map_err(|e| format!("phase '{item}': {e}"))?)
                } else {
                    Bound::Duration {
                        ns: virtprof_model::units::parse_duration_ns(bound)
                            .map_err(|e| format!("phase '{item}': {e}"))?,
                    }
                };
                Ok(Phase::new(workload, bound))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if phases.is_empty() {
            return Err("empty phase script".into());
        }
        Ok(Script { phases, privilege: Privilege::User })
    }

    /// The same script run at `privilege`.
    pub fn at(self, privilege: Privilege) -> Self {
        Script { privilege, ..self }
    }

    /// Why this script cannot run on this host (its architecture or privilege level), if it
    /// cannot.
    pub fn check(&self) -> Result<(), String> {
        if let Some(p) = self.phases.iter().find(|p| !p.workload.runs_here()) {
            let here: Vec<_> = Workload::ALL.iter().filter(|w| w.runs_here()).map(|w| w.name()).collect();
            return Err(format!(
                "the {} workload does not exist on {}; this host has: {}",
                p.workload,
                std::env::consts::ARCH,
                here.join(", ")
            ));
        }
        self.check_privilege()
    }

    /// Why this script cannot run at its privilege level, if it cannot.
    pub fn check_privilege(&self) -> Result<(), String> {
        match self.phases.iter().find(|p| p.workload.needs_kernel()) {
            Some(p) if self.privilege == Privilege::User => Err(format!(
                "the {} workload is privileged (at CPL3/EL0 it faults); run it at CPL0/EL1 with --cpl 0",
                p.workload
            )),
            _ => Ok(()),
        }
    }

    /// Marker `IO` exits each vCPU makes: one per phase plus "done".
    pub fn marker_exits(&self) -> u64 {
        self.phases.len() as u64 + 1
    }

    /// Assemble the program for this script for this host's architecture. `tsc_khz` (the
    /// guest's counter rate) converts duration bounds into counter ticks.
    pub fn assemble(&self, tsc_khz: u64) -> Result<GuestProgram, VmmError> {
        self.check().map_err(VmmError::Assemble)?;
        if cfg!(target_arch = "aarch64") {
            super::arm64::assemble(self, tsc_khz)
        } else {
            self.assemble_x86_64(tsc_khz)
        }
    }

    /// The x86-64 program for this script.
    pub fn assemble_x86_64(&self, tsc_khz: u64) -> Result<GuestProgram, VmmError> {
        if let Some(p) = self.phases.iter().find(|p| !p.workload.runs_on_x86_64()) {
            return Err(VmmError::Assemble(format!("the {} workload is arm64's", p.workload)));
        }
        self.check_privilege().map_err(VmmError::Assemble)?;
        let mut b = ProgramBuilder::new()?;
        b.function("_start")?;
        b.asm.mov(rbp, rsp).map_err(asm_err)?;
        for (index, phase) in self.phases.iter().enumerate() {
            emit_phase(&mut b, index, phase, tsc_khz)?;
        }
        let done = b.function("done")?;
        b.asm.out(i32::from(ports::DONE), al).map_err(asm_err)?;
        b.asm.jmp(done).map_err(asm_err)?;
        layout::emit_fault_handlers(&mut b)?;
        b.finish(layout::CODE_ADDR)
    }
}

impl fmt::Display for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [only] = self.phases.as_slice() {
            return f.write_str(only.workload.name());
        }
        for (i, p) in self.phases.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            match p.bound {
                Bound::Iterations(n) => write!(f, "{sep}{}:{n}", p.workload)?,
                Bound::Duration { ns } => {
                    write!(f, "{sep}{}:{}", p.workload, virtprof_model::units::format_duration_ns(ns))?
                }
            }
        }
        Ok(())
    }
}

/// Registers: r15 = shared page, r14 = iteration counter or TSC deadline, r13 = PIO doorbell
/// port, rdi = MMIO doorbell address, r12 = the touch buffer (rbx the offset in it).
/// rax/rbx/rcx/rdx are free for other bodies (CPUID clobbers them).
fn emit_phase(b: &mut ProgramBuilder, index: usize, phase: &Phase, tsc_khz: u64) -> Result<(), VmmError> {
    let name = phase.function.clone().unwrap_or_else(|| format!("phase{index}_{}", phase.workload.symbol()));
    let a = |r: Result<(), IcedError>| r.map_err(asm_err);
    b.function(name.clone())?;
    a(b.asm.mov(eax, index as u32))?;
    a(b.asm.out(i32::from(ports::PHASE), eax))?;
    a(b.asm.mov(qword_ptr(r15 + shared::PHASE as i32), index as i32))?;
    if phase.workload == Workload::Noise {
        return emit_noise(b, &name, phase.bound, tsc_khz);
    }
    match phase.workload {
        Workload::PioKernel => a(b.asm.movzx(r13d, word_ptr(r15 + shared::PIO_KERNEL_PORT as i32)))?,
        Workload::MmioKernel => a(b.asm.mov(rdi, qword_ptr(r15 + shared::MMIO_KERNEL_ADDR as i32)))?,
        Workload::MmioUser => a(b.asm.mov(rdi, layout::MMIO_USER_ADDR))?,
        Workload::Touch => {
            a(b.asm.mov(r12, qword_ptr(r15 + shared::NOISE_BUFFER as i32)))?;
            a(b.asm.xor(ebx, ebx))?
        }
        _ => {}
    }
    match phase.bound {
        Bound::Iterations(n) => {
            if n == 0 {
                return Ok(());
            }
            a(b.asm.mov(r14, n))?
        }
        Bound::Duration { ns } => {
            let ticks = u128::from(ns) * u128::from(tsc_khz) / 1_000_000;
            emit_rdtsc64(b)?;
            a(b.asm.mov(r14, u64::try_from(ticks).unwrap_or(u64::MAX / 2)))?;
            a(b.asm.add(r14, rax))?;
        }
    }
    let mut end = b.asm.create_label();
    // A named function keeps its loop inside its own symbol, as a compiled function would.
    let top = if phase.function.is_some() {
        let mut top = b.asm.create_label();
        a(b.asm.set_label(&mut top))?;
        top
    } else {
        b.function(format!("{name}_loop"))?
    };
    match phase.workload {
        Workload::Compute => {}
        Workload::PioUser => a(b.asm.out(i32::from(ports::PIO_USER), al))?,
        Workload::IoBound => a(b.asm.out(i32::from(ports::IO_BLOCK), al))?,
        Workload::PioKernel => {
            a(b.asm.mov(edx, r13d))?;
            a(b.asm.out(dx, al))?
        }
        Workload::MmioUser | Workload::MmioKernel => a(b.asm.mov(dword_ptr(rdi), eax))?,
        Workload::Cpuid => {
            a(b.asm.xor(eax, eax))?;
            a(b.asm.cpuid())?
        }
        Workload::Fault => a(b.asm.ud2())?,
        Workload::Touch => {
            a(b.asm.mov(dword_ptr(r12 + rbx), eax))?;
            a(b.asm.add(rbx, 4096))?;
            a(b.asm.and(rbx, (layout::NOISE_AREA - 1) as i32))?
        }
        Workload::Hlt => a(b.asm.hlt())?,
        Workload::Rdmsr => {
            a(b.asm.mov(ecx, IA32_APIC_BASE))?;
            a(b.asm.rdmsr())?
        }
        Workload::Noise => unreachable!("noise phases have their own loop"),
        Workload::Hvc | Workload::Wfi | Workload::Sysreg => unreachable!("refused by assemble_x86_64"),
    }
    a(b.asm.inc(qword_ptr(r15 + shared::ITERATIONS as i32)))?;
    a(b.asm.cmp(qword_ptr(r15 + shared::STOP as i32), 0))?;
    a(b.asm.jne(end))?;
    match phase.bound {
        Bound::Iterations(_) => {
            a(b.asm.dec(r14))?;
            a(b.asm.jnz(top))?;
        }
        Bound::Duration { .. } => {
            emit_rdtsc64(b)?;
            a(b.asm.cmp(rax, r14))?;
            a(b.asm.jb(top))?;
        }
    }
    a(b.asm.set_label(&mut end))?;
    a(b.asm.nop())?;
    Ok(())
}

/// The MSR the `rdmsr` workload reads: every KVM answers it in the kernel, in-kernel local
/// APIC or not.
const IA32_APIC_BASE: u32 = 0x1b;

/// Clock-sync exits at each end of a noise phase (the tightest bracket wins).
pub const SYNC_ROUNDS: u64 = 8;

/// The noise loop. Registers: rbx = threshold ticks, r12 = sample buffer, r13 = samples seen,
/// r14 = TSC deadline, r11 = previous TSC; r8/r9/r10 = steal, heavyweight and lightweight
/// counters at the previous sample.
fn emit_noise(b: &mut ProgramBuilder, name: &str, bound: Bound, tsc_khz: u64) -> Result<(), VmmError> {
    let a = |r: Result<(), IcedError>| r.map_err(asm_err);
    let Bound::Duration { ns } = bound else {
        return Err(VmmError::Assemble("the noise workload runs for a duration, not a count".into()));
    };
    let capacity = layout::NOISE_AREA / layout::NOISE_RECORD;
    // Touch every page of the sample buffer first: a first touch inside the loop is an exit
    // (the host maps the page) that would land in the middle of storing a sample.
    a(b.asm.mov(rdx, qword_ptr(r15 + shared::NOISE_BUFFER as i32)))?;
    a(b.asm.mov(rcx, layout::NOISE_AREA / 4096))?;
    let mut touch = b.asm.create_label();
    a(b.asm.set_label(&mut touch))?;
    a(b.asm.mov(qword_ptr(rdx), 0))?;
    a(b.asm.add(rdx, 4096))?;
    a(b.asm.dec(rcx))?;
    a(b.asm.jnz(touch))?;
    emit_sync(b)?;
    a(b.asm.mov(rbx, qword_ptr(r15 + shared::NOISE_THRESHOLD as i32)))?;
    a(b.asm.mov(r12, qword_ptr(r15 + shared::NOISE_BUFFER as i32)))?;
    a(b.asm.xor(r13, r13))?;
    a(b.asm.mov(r8, qword_ptr(r15 + shared::STEAL_TIME as i32)))?;
    a(b.asm.mov(r9, qword_ptr(r15 + shared::VMM_USERSPACE_EXITS as i32)))?;
    a(b.asm.mov(r10, qword_ptr(r15 + shared::VMM_LW_EXITS as i32)))?;
    let ticks = u128::from(ns) * u128::from(tsc_khz) / 1_000_000;
    emit_rdtsc64(b)?;
    a(b.asm.mov(r11, rax))?;
    a(b.asm.mov(r14, u64::try_from(ticks).unwrap_or(u64::MAX / 2)))?;
    a(b.asm.add(r14, rax))?;
    let (mut quiet, mut full, mut end) = (b.asm.create_label(), b.asm.create_label(), b.asm.create_label());
    let top = b.function(format!("{name}_loop"))?;
    emit_rdtsc64(b)?;
    a(b.asm.mov(rcx, rax))?;
    a(b.asm.sub(rcx, r11))?;
    a(b.asm.cmp(rcx, rbx))?;
    a(b.asm.jbe(quiet))?;
    // A sample: [r12 + 32 * r13] = start, length, steal delta, exit deltas.
    a(b.asm.cmp(r13, capacity as i32))?;
    a(b.asm.jae(full))?;
    a(b.asm.mov(rdx, r13))?;
    a(b.asm.shl(rdx, 5))?;
    a(b.asm.add(rdx, r12))?;
    a(b.asm.mov(qword_ptr(rdx), r11))?;
    a(b.asm.mov(qword_ptr(rdx + 8), rcx))?;
    a(b.asm.mov(rsi, qword_ptr(r15 + shared::STEAL_TIME as i32)))?;
    a(b.asm.mov(rdi, rsi))?;
    a(b.asm.sub(rdi, r8))?;
    a(b.asm.mov(r8, rsi))?;
    a(b.asm.mov(qword_ptr(rdx + 16), rdi))?;
    a(b.asm.mov(rsi, qword_ptr(r15 + shared::VMM_USERSPACE_EXITS as i32)))?;
    a(b.asm.mov(edi, esi))?;
    a(b.asm.sub(edi, r9d))?;
    a(b.asm.mov(r9, rsi))?;
    a(b.asm.mov(rsi, qword_ptr(r15 + shared::VMM_LW_EXITS as i32)))?;
    a(b.asm.mov(ecx, esi))?;
    a(b.asm.sub(ecx, r10d))?;
    a(b.asm.mov(r10, rsi))?;
    a(b.asm.shl(rcx, 32))?;
    a(b.asm.or(rdi, rcx))?;
    a(b.asm.mov(qword_ptr(rdx + 24), rdi))?;
    a(b.asm.set_label(&mut full))?;
    a(b.asm.inc(r13))?;
    a(b.asm.mov(qword_ptr(r15 + shared::NOISE_SAMPLES as i32), r13))?;
    // The next step is measured from the end of this gap (rax), so storing the sample is
    // inside it: an exit that lands while the sample is stored is seen (with the clock
    // restarted here it went unseen, while its counters were charged to this sample).
    a(b.asm.set_label(&mut quiet))?;
    a(b.asm.mov(r11, rax))?;
    a(b.asm.inc(qword_ptr(r15 + shared::ITERATIONS as i32)))?;
    a(b.asm.cmp(qword_ptr(r15 + shared::STOP as i32), 0))?;
    a(b.asm.jne(end))?;
    a(b.asm.cmp(rax, r14))?;
    a(b.asm.jb(top))?;
    a(b.asm.set_label(&mut end))?;
    emit_sync(b)
}

/// [`SYNC_ROUNDS`] clock-sync exits: TSC into the shared page, then `OUT` to the sync port.
fn emit_sync(b: &mut ProgramBuilder) -> Result<(), VmmError> {
    let a = |r: Result<(), IcedError>| r.map_err(asm_err);
    a(b.asm.mov(rsi, SYNC_ROUNDS))?;
    let mut again = b.asm.create_label();
    a(b.asm.set_label(&mut again))?;
    emit_rdtsc64(b)?;
    a(b.asm.mov(qword_ptr(r15 + shared::SYNC_TSC as i32), rax))?;
    a(b.asm.out(i32::from(ports::SYNC), al))?;
    a(b.asm.dec(rsi))?;
    a(b.asm.jnz(again))
}

/// rax = full 64-bit TSC (clobbers rdx).
fn emit_rdtsc64(b: &mut ProgramBuilder) -> Result<(), VmmError> {
    b.asm.rdtsc().map_err(asm_err)?;
    b.asm.shl(rdx, 32).map_err(asm_err)?;
    b.asm.or(rax, rdx).map_err(asm_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_phase_scripts() {
        let s = Script::parse_phases("compute:200ms,pio-user:10000,io-bound:50").unwrap();
        assert_eq!(s.phases.len(), 3);
        assert_eq!(s.phases[0].bound, Bound::Duration { ns: 200_000_000 });
        assert_eq!(s.phases[1], Phase::new(Workload::PioUser, Bound::Iterations(10_000)));
        assert_eq!(s.marker_exits(), 4);
        assert_eq!(s.to_string(), "compute:200ms,pio-user:10000,io-bound:50");
    }

    #[test]
    fn rejects_bad_phase_scripts() {
        assert!(Script::parse_phases("compute").unwrap_err().contains("lacks a bound"));
        assert!(Script::parse_phases("bogus:5").unwrap_err().contains("unknown workload 'bogus'"));
        assert!(Script::parse_phases("compute:5parsecs").is_err());
    }

    #[test]
    fn privileged_workloads_need_cpl0() {
        let s = Script::parse_phases("cpuid:2,hlt:2,rdmsr:2").unwrap();
        assert!(s.check_privilege().unwrap_err().contains("--cpl 0"));
        assert!(s.assemble_x86_64(2_000_000).is_err());
        let kernel = s.at(Privilege::Kernel);
        assert!(kernel.assemble_x86_64(2_000_000).unwrap().symbol_addr("phase1_hlt_loop").is_some());
        assert_eq!(Privilege::from_cpl(0), Some(Privilege::Kernel));
        assert_eq!(Privilege::from_cpl(1), None);
    }

    #[test]
    fn assembles_with_symbols_for_every_phase() {
        let s = Script::parse_phases("compute:1ms,pio-kernel:3,cpuid:2").unwrap();
        let p = s.assemble_x86_64(2_000_000).unwrap();
        assert_eq!(p.symbol_addr("_start"), Some(layout::CODE_ADDR));
        for name in ["phase0_compute_loop", "phase1_pio_kernel", "phase2_cpuid_loop", "done", "fault_vector_13"] {
            assert!(p.symbol_addr(name).is_some(), "missing {name}");
        }
        let addr = p.symbol_addr("phase1_pio_kernel").unwrap() + 2;
        assert!(p.describe(addr).contains("phase1_pio_kernel+0x2"));
        assert!(p.system_map().contains(" t done\n"));
    }
}
