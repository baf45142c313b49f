//! Typed trace events: one small `Copy` record per kernel event, timestamped in the recording's
//! reference clock. Strings (task names) are interned as [`StrId`] by whoever decodes, so
//! events stay `Copy` and cheap to sort and merge.

/// Nanoseconds in the recording's reference clock (the host trace clock).
pub type Timestamp = u64;

/// Handle of an interned string (a task `comm`, an event name). Resolve it with the table of
/// the decoder that produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrId(pub u32);

/// One decoded trace event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    /// When, in the reference clock.
    pub ts: Timestamp,
    /// The CPU whose ring buffer held it.
    pub cpu: u32,
    /// The task current when it fired (`common_pid`, a thread id).
    pub tid: u32,
    /// What it was.
    pub kind: EventKind,
}

// Every event of a walk is written by a decoding thread and read on another core by the merge:
// its size is memory traffic per event. 56 bytes (with two kvm_exit fields no analysis read)
// cost a walk of 800k events about a tenth more CPU than 40; keep it from growing unnoticed.
const _: () = assert!(std::mem::size_of::<Event>() == 40);

/// [`EventKind::KvmExit`]'s `isa` for an arm64 exit. arm64's `kvm_exit` records an exit code
/// (`ret`: IRQ, SERROR, TRAP, ...) and the exception class of the last trap (`esr_ec`, stale
/// unless the code is TRAP): the reason is the class for a trap, else the code with
/// [`ARM64_NOT_A_TRAP`] set.
pub const ISA_ARM64: u32 = 64;
/// Marks an arm64 reason that is an exit code, not an exception class (classes are 6 bits).
pub const ARM64_NOT_A_TRAP: u32 = 1 << 31;

/// The events virtprof understands, plus [`EventKind::Other`] for the rest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EventKind {
    /// `kvm:kvm_exit`: the vCPU left guest mode.
    KvmExit {
        /// Raw exit reason (VMX basic reason with flags, or SVM exit code; on arm64 see
        /// [`ISA_ARM64`]).
        reason: u32,
        /// Instruction set of the reason (1 = VMX, 2 = SVM, [`ISA_ARM64`]; 0 if the kernel
        /// lacks the field).
        isa: u32,
        /// Guest RIP (on arm64, PC) at the exit.
        guest_rip: u64,
        /// vCPU id (0 if the kernel lacks the field).
        vcpu_id: u32,
    },
    /// `kvm:kvm_entry`: the vCPU is about to enter guest mode.
    KvmEntry {
        /// vCPU id.
        vcpu_id: u32,
        /// Guest RIP (0 if the kernel lacks the field).
        rip: u64,
    },
    /// `kvm:kvm_userspace_exit`: KVM_RUN returns to the VMM.
    KvmUserspaceExit {
        /// `KVM_EXIT_*` reason.
        reason: u32,
        /// The ioctl's errno (0 on a normal exit).
        errno: i32,
    },
    /// `kvm:kvm_pio`: a port I/O access (in-kernel or forwarded).
    KvmPio {
        /// 1 = write (OUT), 0 = read (IN).
        write: bool,
        /// Port.
        port: u16,
        /// Access size in bytes.
        size: u8,
        /// Repetitions (string I/O).
        count: u32,
    },
    /// `kvm:kvm_mmio`: an MMIO access.
    KvmMmio {
        /// Kind: 0 unsatisfied read, 1 read, 2 write.
        kind: u8,
        /// Access length.
        len: u8,
        /// Guest-physical address.
        gpa: u64,
    },
    /// `kvm:kvm_emulate_insn`: KVM's instruction emulator ran.
    KvmEmulateInsn {
        /// Guest RIP.
        rip: u64,
        /// True if emulation failed.
        failed: bool,
    },
    /// `kvm:kvm_fpu`: guest FPU state loaded (true) or put (false) around KVM_RUN.
    KvmFpu {
        /// Load (entering KVM_RUN) or unload (leaving).
        load: bool,
    },
    /// `sched:sched_switch`.
    SchedSwitch {
        /// Task leaving the CPU.
        prev_tid: u32,
        /// Its state (0 = runnable/preempted; otherwise sleeping or other). The kernel records a
        /// `long`, but every state bit, the preemption marker included, lies in the low 32.
        prev_state: u32,
        /// Its name.
        prev_comm: StrId,
        /// Task taking the CPU.
        next_tid: u32,
        /// Its name.
        next_comm: StrId,
    },
    /// `sched:sched_wakeup` (and `sched_wakeup_new`).
    SchedWakeup {
        /// Woken task.
        tid: u32,
        /// CPU it will run on.
        target_cpu: u32,
    },
    /// `sched:sched_process_fork`: `parent` made `child`, a process or a thread of its own
    /// (the event does not say which).
    SchedFork {
        /// The task that called fork or clone.
        parent_tid: u32,
        /// The new task.
        child_tid: u32,
    },
    /// `sched:sched_migrate_task`.
    SchedMigrate {
        /// Migrated task.
        tid: u32,
        /// From.
        orig_cpu: u32,
        /// To.
        dest_cpu: u32,
    },
    /// `irq:irq_handler_entry`.
    IrqEntry {
        /// IRQ number.
        irq: u32,
    },
    /// `irq:irq_handler_exit`.
    IrqExit {
        /// IRQ number.
        irq: u32,
    },
    /// `irq:softirq_entry`.
    SoftirqEntry {
        /// Softirq vector.
        vec: u32,
    },
    /// `irq:softirq_exit`.
    SoftirqExit {
        /// Softirq vector.
        vec: u32,
    },
    /// `irq:softirq_raise`.
    SoftirqRaise {
        /// Softirq vector.
        vec: u32,
    },
    /// `irq_vectors:*_entry` (local timer, reschedule, call function, ...).
    IrqVectorEntry {
        /// Vector number.
        vector: u32,
        /// Event id, to name the vector class.
        event: u16,
    },
    /// `irq_vectors:*_exit`.
    IrqVectorExit {
        /// Vector number.
        vector: u32,
        /// Event id.
        event: u16,
    },
    /// `nmi:nmi_handler`, written when an NMI handler returns.
    Nmi {
        /// How long the handler ran (`delta_ns`): the NMI spans `[ts - handler_ns, ts]`.
        handler_ns: u64,
    },
    /// `kvm:kvm_vcpu_wakeup`: a halted vCPU resumes; it spent `ns` halted, polling only
    /// (`waited` false: halt-polling found work) or polling then blocked.
    KvmVcpuWakeup {
        /// Time halted.
        ns: u64,
        /// It blocked after polling.
        waited: bool,
    },
    /// Any other event, by its tracefs id.
    Other {
        /// The event's tracefs id.
        event: u16,
    },
    /// The kernel dropped events on this CPU before this point.
    Lost {
        /// How many, when the kernel said.
        count: Option<u64>,
    },
}

impl EventKind {
    /// The kernel's event name of a typed event (`kvm_exit`, `sched_switch`, ...); None for
    /// [`EventKind::Other`], named by its format, and [`EventKind::Lost`], which is no event.
    pub fn typed_name(&self) -> Option<&'static str> {
        Some(match self {
            EventKind::KvmExit { .. } => "kvm_exit",
            EventKind::KvmEntry { .. } => "kvm_entry",
            EventKind::KvmUserspaceExit { .. } => "kvm_userspace_exit",
            EventKind::KvmPio { .. } => "kvm_pio",
            EventKind::KvmMmio { .. } => "kvm_mmio",
            EventKind::KvmEmulateInsn { .. } => "kvm_emulate_insn",
            EventKind::KvmFpu { .. } => "kvm_fpu",
            EventKind::KvmVcpuWakeup { .. } => "kvm_vcpu_wakeup",
            EventKind::SchedSwitch { .. } => "sched_switch",
            EventKind::SchedWakeup { .. } => "sched_wakeup",
            EventKind::SchedFork { .. } => "sched_process_fork",
            EventKind::SchedMigrate { .. } => "sched_migrate_task",
            EventKind::IrqEntry { .. } => "irq_handler_entry",
            EventKind::IrqExit { .. } => "irq_handler_exit",
            EventKind::SoftirqEntry { .. } => "softirq_entry",
            EventKind::SoftirqExit { .. } => "softirq_exit",
            EventKind::SoftirqRaise { .. } => "softirq_raise",
            EventKind::Nmi { .. } => "nmi_handler",
            EventKind::IrqVectorEntry { .. } | EventKind::IrqVectorExit { .. } | EventKind::Other { .. } => {
                return None
            }
            EventKind::Lost { .. } => return None,
        })
    }
}
