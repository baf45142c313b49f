//! What a figure is computed from. A source says which kinds of events it holds ([`Holdings`]);
//! every figure an analysis reports names the kinds it needs ([`Figure::needs`]); a figure
//! whose kinds the source lacks is unknown, with the reason ([`Unavailable`]), never 0 or
//! 100 %. This is the one list of such cases: analyses ask it, sinks render what it says, and
//! the documentation's table of which figure needs which events is checked against it.

use std::collections::BTreeSet;

/// A kind of evidence a figure can need: trace events (one or several that go together), the
/// KVM stats snapshots a recording keeps, or timestamps that can be read as time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(rename_all = "snake_case"))]
pub enum Class {
    /// `sched:sched_switch`: when threads run, stop, and why.
    SchedSwitch,
    /// `sched:sched_wakeup`: when a sleeping thread became runnable.
    SchedWakeup,
    /// `kvm:kvm_userspace_exit`: exits handed to the VMM.
    UserspaceExit,
    /// `kvm:kvm_exit` and `kvm:kvm_entry`: every exit and its end (VMX, SVM, arm64).
    ExitEntry,
    /// `kvm:kvm_fpu` or `kvm:kvm_entry`: where a return from the VMM ends.
    RoundTripEnd,
    /// `kvm:kvm_vcpu_wakeup`: how a halted vCPU woke (polled or slept).
    VcpuWakeup,
    /// `kvm:kvm_pio` and `kvm:kvm_mmio`: the guest's port and MMIO accesses.
    IoAccess,
    /// `irq:irq_handler_entry` (and, on x86, `irq_vectors:*`): interrupts on a CPU.
    Irq,
    /// `irq:softirq_entry`: softirqs on a CPU.
    Softirq,
    /// `sched:sched_migrate_task`: a thread moved to another CPU.
    Migrate,
    /// `kvmmmu:kvm_mmu_spte_requested`: KVM faulting a guest page in (x86).
    MmuFault,
    /// `kvm:kvm_unmap_hva_range`: the host taking guest memory back (a balloon, reclaim).
    HvaUnmap,
    /// The VMs' KVM binary statistics at the start and end (`record` keeps them).
    KvmStats,
    /// Timestamps in nanoseconds, or cycles of a known frequency.
    Time,
}

impl Class {
    /// Every kind, in order.
    pub const ALL: [Class; 14] = [
        Class::SchedSwitch,
        Class::SchedWakeup,
        Class::UserspaceExit,
        Class::ExitEntry,
        Class::RoundTripEnd,
        Class::VcpuWakeup,
        Class::IoAccess,
        Class::Irq,
        Class::Softirq,
        Class::Migrate,
        Class::MmuFault,
        Class::HvaUnmap,
        Class::KvmStats,
        Class::Time,
    ];

    /// The events that make it (all of them needed; for [`Class::RoundTripEnd`], either).
    pub fn events(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Class::SchedSwitch => &[("sched", "sched_switch")],
            Class::SchedWakeup => &[("sched", "sched_wakeup")],
            Class::UserspaceExit => &[("kvm", "kvm_userspace_exit")],
            Class::ExitEntry => &[("kvm", "kvm_exit"), ("kvm", "kvm_entry")],
            Class::RoundTripEnd => &[("kvm", "kvm_fpu"), ("kvm", "kvm_entry")],
            Class::VcpuWakeup => &[("kvm", "kvm_vcpu_wakeup")],
            Class::IoAccess => &[("kvm", "kvm_pio"), ("kvm", "kvm_mmio")],
            Class::Irq => &[("irq", "irq_handler_entry")],
            Class::Softirq => &[("irq", "softirq_entry")],
            Class::Migrate => &[("sched", "sched_migrate_task")],
            Class::MmuFault => &[("kvmmmu", "kvm_mmu_spte_requested")],
            Class::HvaUnmap => &[("kvm", "kvm_unmap_hva_range")],
            Class::KvmStats | Class::Time => &[],
        }
    }

    /// How it is named in reasons and tables: its events, or what it is.
    pub fn name(self) -> String {
        match self {
            Class::KvmStats => "KVM stats snapshots".into(),
            Class::Time => "timestamps readable as time".into(),
            Class::RoundTripEnd => "kvm_fpu or kvm_entry".into(),
            other => other.events().iter().map(|(_, e)| *e).collect::<Vec<_>>().join(" and "),
        }
    }
}

/// What a source holds, and for what it lacks, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holdings {
    missing: BTreeSet<Class>,
    /// Kinds the host that made the source never emits (PVM's kvm_exit), said as such.
    never_emitted: BTreeSet<Class>,
    /// Why [`Class::Time`] is missing, where it is (the clock the source uses).
    clock: Option<String>,
}

impl Default for Holdings {
    /// Everything held (a live session, whose tracer enables what it needs).
    fn default() -> Holdings {
        Holdings::all()
    }
}

impl Holdings {
    /// Everything held.
    pub fn all() -> Holdings {
        Holdings { missing: BTreeSet::new(), never_emitted: BTreeSet::new(), clock: None }
    }

    /// The kinds held by a source that has events `has(system, name)`, KVM stats snapshots
    /// where `kvm_stats`, and timestamps readable as time unless `clock_not_time` says which
    /// clock they are on.
    pub fn of(has: impl Fn(&str, &str) -> bool, kvm_stats: bool, clock_not_time: Option<String>) -> Holdings {
        let missing = Class::ALL
            .into_iter()
            .filter(|&class| match class {
                Class::KvmStats => !kvm_stats,
                Class::Time => clock_not_time.is_some(),
                Class::RoundTripEnd => !class.events().iter().any(|(s, e)| has(s, e)),
                other => !other.events().iter().all(|(s, e)| has(s, e)),
            })
            .collect();
        Holdings { missing, never_emitted: BTreeSet::new(), clock: clock_not_time }
    }

    /// The host that made the source never emits `class` (it is missing whatever was enabled).
    pub fn never_emitted(mut self, class: Class) -> Holdings {
        self.missing.insert(class);
        self.never_emitted.insert(class);
        self
    }

    /// Whether it holds `class`.
    pub fn has(&self, class: Class) -> bool {
        !self.missing.contains(&class)
    }

    /// Why `class` is missing (None: it is held).
    pub fn why_missing(&self, class: Class) -> Option<String> {
        if self.has(class) {
            return None;
        }
        Some(match class {
            Class::KvmStats => {
                "the source has no KVM stats snapshots (a file made elsewhere, `record --no-kvm-stats`, or VMs whose stats were not readable)"
                    .into()
            }
            Class::Time => format!("its timestamps are {}", self.clock.as_deref().unwrap_or("not nanoseconds")),
            c if self.never_emitted.contains(&c) => format!("this host never emits {}", c.name()),
            c => format!("{} {} not recorded", c.name(), if c.events().len() > 1 { "were" } else { "was" }),
        })
    }

    /// `figure` if this source has what it needs; else why not.
    pub fn check(&self, figure: Figure) -> Result<(), Unavailable> {
        let lacking: Vec<Class> = figure.needs().iter().copied().filter(|&c| !self.has(c)).collect();
        if lacking.is_empty() {
            return Ok(());
        }
        let reasons: Vec<String> = lacking.iter().filter_map(|&c| self.why_missing(c)).collect();
        Err(Unavailable { figure: figure.label().to_string(), missing: lacking, reason: reasons.join("; ") })
    }

    /// Whether this source has what `figure` needs.
    pub fn knows(&self, figure: Figure) -> bool {
        self.check(figure).is_ok()
    }

    /// The figures of `figures` this source cannot give, each with its reason.
    pub fn unavailable(&self, figures: &[Figure]) -> Vec<Unavailable> {
        figures.iter().filter_map(|&f| self.check(f).err()).collect()
    }

    /// The kinds it lacks.
    pub fn missing(&self) -> impl Iterator<Item = Class> + '_ {
        self.missing.iter().copied()
    }
}

/// A figure an analysis reports, with the evidence it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Figure {
    /// Exits' durations from kvm_exit to kvm_entry, lightweight ones among them.
    ExitDurations,
    /// Heavyweight exits' durations where they are timed as userspace round trips (a host
    /// without kvm_exit).
    RoundTripDurations,
    /// Which exits went to the VMM (heavyweight) and which KVM handled (lightweight).
    LightHeavySplit,
    /// Lightweight exits on a host without kvm_exit: KVM's count less the userspace exits.
    LightweightWithoutExitEvents,
    /// Time the VMM spent on heavyweight exits.
    VmmTime,
    /// Time an exit's thread was off CPU: preempted (runnable) or blocked.
    Descheduled,
    /// Hypervisor overhead of an exit: its duration less VMM and off-CPU time.
    Overhead,
    /// Halt-polling within halted time.
    HaltPolling,
    /// Interrupts on the exit's CPU while it was handled.
    IrqsDuringExit,
    /// Softirqs on the exit's CPU while it was handled.
    SoftirqsDuringExit,
    /// Threads that ran on the exit's CPU while it was handled.
    ThreadsDuringExit,
    /// A thread's running time, executions, CPU per execution and allocation.
    Running,
    /// A thread's not-running time split into waiting (runnable: host steal) and blocked.
    WaitingBlocked,
    /// A vCPU's port and MMIO accesses.
    IoCount,
    /// A vCPU's exits (and their reasons) per second where the host traces no kvm_exit: its
    /// userspace exits and evidence events.
    ExitRateWithoutExitEvents,
    /// Time the host trace shows a noise-measuring vCPU off its CPU, and who preempted it.
    NoiseHostSteal,
    /// Which guest noise the host explains (IRQs, softirqs, preemption) and which it does not.
    NoiseExplained,
    /// A guest CPU's busy and idle time and its longest tasks, from the guest's own trace.
    GuestBusy,
    /// A guest CPU's interrupts, from the guest's own trace.
    GuestIrqs,
    /// A guest CPU's softirqs, from the guest's own trace.
    GuestSoftirqs,
    /// Who ran on the CPU a vCPU waited for, and how long.
    Preemptors,
    /// Host interrupt and softirq time on a vCPU's CPU while it ran.
    HostIrqTime,
    /// A vCPU thread's moves across CPUs.
    Migrations,
    /// Guest pages KVM faulted in on a vCPU's behalf.
    MemoryFaults,
    /// Times the host took guest memory back, and who did.
    MemoryReclaims,
}

impl Figure {
    /// Every figure, in order (the documentation's table lists them so).
    pub const ALL: [Figure; 25] = [
        Figure::ExitDurations,
        Figure::RoundTripDurations,
        Figure::LightHeavySplit,
        Figure::LightweightWithoutExitEvents,
        Figure::VmmTime,
        Figure::Descheduled,
        Figure::Overhead,
        Figure::HaltPolling,
        Figure::IrqsDuringExit,
        Figure::SoftirqsDuringExit,
        Figure::ThreadsDuringExit,
        Figure::Running,
        Figure::WaitingBlocked,
        Figure::IoCount,
        Figure::ExitRateWithoutExitEvents,
        Figure::NoiseHostSteal,
        Figure::NoiseExplained,
        Figure::GuestBusy,
        Figure::GuestIrqs,
        Figure::GuestSoftirqs,
        Figure::Preemptors,
        Figure::HostIrqTime,
        Figure::Migrations,
        Figure::MemoryFaults,
        Figure::MemoryReclaims,
    ];

    /// What it needs.
    pub fn needs(self) -> &'static [Class] {
        match self {
            Figure::ExitDurations => &[Class::ExitEntry, Class::Time],
            Figure::RoundTripDurations => &[Class::UserspaceExit, Class::RoundTripEnd, Class::Time],
            Figure::LightHeavySplit => &[Class::UserspaceExit],
            Figure::LightweightWithoutExitEvents => &[Class::UserspaceExit, Class::KvmStats],
            // Off CPU is never the VMM's time: without sched_switch it cannot be taken out.
            Figure::VmmTime => &[Class::UserspaceExit, Class::RoundTripEnd, Class::SchedSwitch, Class::Time],
            Figure::Descheduled => &[Class::SchedSwitch, Class::Time],
            Figure::Overhead => &[Class::UserspaceExit, Class::SchedSwitch, Class::Time],
            Figure::HaltPolling => &[Class::VcpuWakeup, Class::Time],
            Figure::IrqsDuringExit => &[Class::Irq],
            Figure::SoftirqsDuringExit => &[Class::Softirq],
            Figure::ThreadsDuringExit => &[Class::SchedSwitch],
            Figure::Running => &[Class::SchedSwitch, Class::Time],
            Figure::WaitingBlocked => &[Class::SchedSwitch, Class::SchedWakeup, Class::Time],
            Figure::IoCount => &[Class::IoAccess],
            Figure::ExitRateWithoutExitEvents => &[Class::UserspaceExit, Class::Time],
            Figure::NoiseHostSteal => &[Class::SchedSwitch, Class::Time],
            Figure::NoiseExplained => &[Class::Irq, Class::Softirq, Class::SchedSwitch, Class::Time],
            Figure::GuestBusy => &[Class::SchedSwitch, Class::Time],
            Figure::GuestIrqs => &[Class::Irq],
            Figure::GuestSoftirqs => &[Class::Softirq],
            Figure::Preemptors => &[Class::SchedSwitch, Class::SchedWakeup, Class::Time],
            Figure::HostIrqTime => &[Class::Irq, Class::Softirq, Class::SchedSwitch, Class::Time],
            Figure::Migrations => &[Class::Migrate],
            Figure::MemoryFaults => &[Class::MmuFault],
            Figure::MemoryReclaims => &[Class::HvaUnmap],
        }
    }

    /// Its name in reasons.
    pub fn label(self) -> &'static str {
        match self {
            Figure::ExitDurations => "durations of exits (kvm_exit to kvm_entry)",
            Figure::RoundTripDurations => "durations of heavyweight exits (userspace round trips)",
            Figure::LightHeavySplit => "lightweight/heavyweight split",
            Figure::LightweightWithoutExitEvents => "lightweight exits (KVM's count less the userspace exits)",
            Figure::VmmTime => "VMM time of heavyweight exits",
            Figure::Descheduled => "preempted and blocked time of exits",
            Figure::Overhead => "hypervisor overhead of exits",
            Figure::HaltPolling => "halt-polling time",
            Figure::IrqsDuringExit => "IRQs during an exit",
            Figure::SoftirqsDuringExit => "softirqs during an exit",
            Figure::ThreadsDuringExit => "threads run during an exit",
            Figure::Running => "run time, executions, CPU per execution, allocation",
            Figure::WaitingBlocked => "waiting (host steal) and blocked time",
            Figure::IoCount => "I/O accesses",
            Figure::ExitRateWithoutExitEvents => "exits per second and top reasons of the vCPU table (no kvm_exit)",
            Figure::NoiseHostSteal => "guest noise: the host trace's steal and preemptors",
            Figure::NoiseExplained => "guest noise: the share the host explains (and what it does not)",
            Figure::GuestBusy => "a guest CPU's busy and idle time and top tasks (the guest's own trace)",
            Figure::GuestIrqs => "a guest CPU's interrupts (the guest's own trace)",
            Figure::GuestSoftirqs => "a guest CPU's softirqs (the guest's own trace)",
            Figure::Preemptors => "who ran on the CPU a vCPU waited for",
            Figure::HostIrqTime => "host interrupt and softirq time on a vCPU's CPU while it ran",
            Figure::Migrations => "vCPU migrations across CPUs",
            Figure::MemoryFaults => "guest pages KVM faulted in for a vCPU",
            Figure::MemoryReclaims => "guest memory the host took back, and who took it",
        }
    }
}

/// The documentation's table of which figure needs which events, made from [`Figure::ALL`]
/// (docs/evidence.md holds it; a test checks they agree).
pub fn needs_table() -> String {
    let mut out = String::from("| figure | needs (all of them) |\n|---|---|\n");
    for figure in Figure::ALL {
        let needs: Vec<String> = figure
            .needs()
            .iter()
            .map(|&class| match class.events() {
                [] => class.name(),
                events if class == Class::RoundTripEnd => {
                    events.iter().map(|(s, e)| format!("`{s}:{e}`")).collect::<Vec<_>>().join(" or ")
                }
                events => events.iter().map(|(s, e)| format!("`{s}:{e}`")).collect::<Vec<_>>().join(" and "),
            })
            .collect();
        out.push_str(&format!("| {} | {} |\n", figure.label(), needs.join(", ")));
    }
    out
}

/// A figure that is unknown, and why: rendered as "unknown" in text, `null` in JSON (with this
/// in the output's `unavailable` list), an empty cell in CSV and Parquet, no track in Perfetto,
/// no series in Prometheus (a `virtprof_unavailable` info series instead), a greyed cell in
/// HTML.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Unavailable {
    /// The figure.
    pub figure: String,
    /// The kinds of evidence it lacks.
    pub missing: Vec<Class>,
    /// Why, in words.
    pub reason: String,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.figure, self.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_is_known_only_with_every_kind_it_needs_and_says_what_it_lacks() {
        let recorded = ["sched:sched_switch", "kvm:kvm_exit", "kvm:kvm_entry", "kvm:kvm_pio"];
        let has = |s: &str, e: &str| recorded.contains(&format!("{s}:{e}").as_str());
        let h = Holdings::of(has, false, None);
        assert!(h.knows(Figure::Running) && h.knows(Figure::ExitDurations) && h.knows(Figure::Descheduled));
        let split = h.check(Figure::LightHeavySplit).unwrap_err();
        assert_eq!(split.missing, vec![Class::UserspaceExit]);
        assert_eq!(split.to_string(), "lightweight/heavyweight split: kvm_userspace_exit was not recorded");
        // kvm_pio without kvm_mmio: I/O counts would miss the MMIO accesses.
        assert!(!h.knows(Figure::IoCount));
        // kvm_entry alone ends round trips.
        assert!(h.has(Class::RoundTripEnd));
        let waits = h.check(Figure::WaitingBlocked).unwrap_err();
        assert_eq!(waits.reason, "sched_wakeup was not recorded");
        // A cycle clock: every duration unknown, counts not.
        let cycles =
            Holdings::of(|_, _| true, true, Some("CPU cycles of an unknown frequency: give --tsc-khz KHZ".into()));
        assert!(!cycles.knows(Figure::ExitDurations) && cycles.knows(Figure::LightHeavySplit));
        assert_eq!(cycles.check(Figure::ExitDurations).unwrap_err().missing, vec![Class::Time]);
        assert!(cycles.check(Figure::Running).unwrap_err().reason.contains("give --tsc-khz"));
        let pvm = Holdings::of(|_, _| true, true, None).never_emitted(Class::ExitEntry);
        assert_eq!(pvm.why_missing(Class::ExitEntry).unwrap(), "this host never emits kvm_exit and kvm_entry");
        assert!(Holdings::all().unavailable(&Figure::ALL).is_empty());
    }

    /// docs/evidence.md's table is this code's: regenerate it with
    /// `cargo test -p virtprof-model -- --ignored print_the_needs_table --nocapture`.
    #[test]
    fn the_documented_table_is_the_codes() {
        let doc = include_str!("../../../docs/evidence.md");
        assert!(doc.contains(&needs_table()), "docs/evidence.md's table differs from:\n{}", needs_table());
    }

    #[test]
    #[ignore = "prints the table for docs/evidence.md"]
    fn print_the_needs_table() {
        print!("{}", needs_table());
    }
}
