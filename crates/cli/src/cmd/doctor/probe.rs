//! The live probe: micro-VMs at CPL3 and CPL0 under a private tracefs instance, which kvm
//! events fire, which guest operations reach this host's KVM, and what that makes this host
//! differ in from a VMX/SVM one.

use std::collections::BTreeMap;

use serde::Serialize;
use virtprof_kvm::guest::{Privilege, Script};
use virtprof_kvm::launcher::{self, TestvmConfig};
use virtprof_model::testvm::{PhaseReport, TestvmReport};
use virtprof_model::HostKind;
use virtprof_trace::Tracefs;

/// Whether one guest operation reaches this host's KVM, as the live probe measured it.
#[derive(Debug, Clone, Serialize)]
pub(super) struct GuestOperation {
    pub(super) operation: &'static str,
    /// Guest privilege level it ran at.
    pub(super) cpl: u8,
    /// Times the guest ran it (None: not probed).
    pub(super) iterations: Option<u64>,
    /// Exits into KVM meanwhile, by the vCPU's KVM stats fd (`exits`).
    pub(super) kvm_exits: Option<u64>,
    /// `exits` if the operation exits to KVM, `none` if it is handled below KVM, `not probed`.
    pub(super) verdict: &'static str,
    pub(super) detail: String,
}

/// Events the live probe counted, by name.
pub(super) type EventCounts = BTreeMap<String, u64>;

/// What the live probe found: kvm events by name, each guest operation's exits, and the guest
/// loop's cost at each privilege level.
pub(super) struct Probe {
    pub(super) events: EventCounts,
    pub(super) operations: Vec<GuestOperation>,
    /// Nanoseconds per empty guest-loop iteration at (CPL3, CPL0).
    pub(super) loop_ns: (Option<f64>, Option<f64>),
}

/// The guest work of the live probe, one VM per privilege level: a compute phase first (it
/// absorbs the exits of the guest's first page touches), then each kind of exit the test bed
/// can make at that level. CPL0 repeats the CPL3 operations whose handling differs by level on
/// PVM hosts, and adds the privileged ones. A last compute phase times the empty loop (long
/// enough at each level that the marker exits around it are small beside it; CPL0 code is
/// interpreted on PVM hosts, about a thousand times slower).
const PROBE_SCRIPTS: [(Privilege, &str); 2] = [
    (
        Privilege::User,
        "compute:200,cpuid:200,pio-user:200,pio-kernel:200,mmio-user:200,mmio-kernel:200,compute:2000000",
    ),
    (Privilege::Kernel, "compute:50,cpuid:200,pio-user:200,hlt:200,rdmsr:200,compute:2000"),
];
/// The same on arm64, with its own operations (no port I/O; HVC and ID-register reads at EL1).
const PROBE_SCRIPTS_ARM64: [(Privilege, &str); 2] = [
    (Privilege::User, "compute:200,mmio-user:200,mmio-kernel:200,wfi:50,compute:2000000"),
    (Privilege::Kernel, "compute:50,hvc:200,sysreg:200,mmio-user:200,wfi:50,compute:200000"),
];
/// A probed phase: its workload, what it is, the kvm event that shows KVM handled it, and where
/// it is expected to be handled on VMX/SVM.
struct Probed {
    workload: &'static str,
    operation: &'static str,
    evidence: &'static str,
    usual: &'static str,
}

const PROBED: [Probed; 10] = [
    Probed { workload: "cpuid", operation: "CPUID", evidence: "kvm_cpuid", usual: "a lightweight exit on VMX/SVM" },
    Probed {
        workload: "pio-user",
        operation: "PIO (OUT), VMM port",
        evidence: "kvm_pio",
        usual: "a heavyweight exit to the VMM",
    },
    Probed {
        workload: "pio-kernel",
        operation: "PIO (OUT), ioeventfd port",
        evidence: "kvm_pio",
        usual: "a lightweight exit handled in KVM",
    },
    Probed {
        workload: "mmio-user",
        operation: "MMIO store, VMM address",
        evidence: "kvm_mmio",
        usual: "a heavyweight exit to the VMM",
    },
    Probed {
        workload: "mmio-kernel",
        operation: "MMIO store, ioeventfd address",
        evidence: "kvm_mmio",
        usual: "a lightweight exit handled in KVM",
    },
    Probed {
        workload: "hlt",
        operation: "HLT (no in-kernel APIC)",
        evidence: "kvm_userspace_exit",
        usual: "a heavyweight exit to the VMM",
    },
    Probed {
        workload: "rdmsr",
        operation: "RDMSR IA32_APIC_BASE",
        evidence: "kvm_msr",
        usual: "a lightweight exit handled in KVM",
    },
    Probed {
        workload: "hvc",
        operation: "HVC (PSCI_VERSION)",
        evidence: "kvm_hvc_arm64",
        usual: "a lightweight exit handled in KVM",
    },
    Probed {
        workload: "sysreg",
        operation: "MRS ID_AA64PFR0_EL1",
        evidence: "kvm_handle_sys_reg",
        usual: "a lightweight exit handled in KVM",
    },
    Probed {
        workload: "wfi",
        operation: "WFI (woken by the VMM)",
        evidence: "kvm_wfx_arm64",
        usual: "an exit in which the vCPU waits (guest idle), plus the wake-up's acknowledgement",
    },
];

/// One line of the probe's trace: which thread, when (CLOCK_MONOTONIC ns), which event.
struct Traced<'a> {
    tid: u32,
    ns: u64,
    name: &'a str,
}

/// Run a micro-VM per privilege level with every kvm event enabled in a private instance and
/// count what fired, and measure per phase which guest operations exit to KVM (its stats fd,
/// not the trace).
pub(super) fn live_probe(tracefs: &Tracefs) -> anyhow::Result<Probe> {
    let mut instance = tracefs.create_instance("doctor")?;
    instance.write("buffer_size_kb", "4096")?;
    // The VMM times its phases on CLOCK_MONOTONIC: events are placed in phases on it too.
    instance.write("trace_clock", "mono")?;
    instance.enable("kvm", None)?;
    instance.write("tracing_on", "1")?;
    let exe = std::env::current_exe()?;
    let mut reports = Vec::new();
    let scripts = if cfg!(target_arch = "aarch64") { PROBE_SCRIPTS_ARM64 } else { PROBE_SCRIPTS };
    for (privilege, script) in scripts {
        let config = TestvmConfig {
            script: Script::parse_phases(script).map_err(anyhow::Error::msg)?.at(privilege),
            vms: 1,
            vcpus: 1,
            pin: Vec::new(),
            io_latency_ns: 0,
            steal_time: false,
            linger_ns: 0,
            name: Some("doctor-probe".into()),
            sample_hz: 0,
            noise_threshold_ns: 0,
            io_thread: None,
            reclaim_hz: 0,
        };
        match launcher::run_testvm(&exe, &config) {
            Ok(report) => reports.push(report),
            Err(e) => {
                instance.write("tracing_on", "0")?;
                return Err(e.into());
            }
        }
    }
    instance.write("tracing_on", "0")?;
    // The instance sees every VM on the host; count only the probe VMs' vCPU threads.
    let tids: Vec<u32> = reports.iter().flat_map(|r| r.vcpus().map(|v| v.tid)).collect();
    let text = instance.read("trace")?;
    let traced = parse_text_events(&text, &tids);
    let mut events = EventCounts::new();
    for event in &traced {
        *events.entry(event.name.to_string()).or_insert(0) += 1;
    }
    let phases = |report: &TestvmReport| report.vcpus().next().map(|v| v.phases.clone()).unwrap_or_default();
    let operations = reports
        .iter()
        .flat_map(|report| {
            let tid = report.vcpus().next().map_or(0, |v| v.tid);
            let mine: Vec<&Traced> = traced.iter().filter(|e| e.tid == tid).collect();
            guest_operations(&phases(report), report.cpl, &mine)
        })
        .collect();
    let loop_ns = |report: Option<&TestvmReport>| loop_ns(&phases(report?));
    Ok(Probe { events, operations, loop_ns: (loop_ns(reports.first()), loop_ns(reports.get(1))) })
}

/// Nanoseconds per iteration of the script's last compute phase.
fn loop_ns(phases: &[PhaseReport]) -> Option<f64> {
    let phase = phases.iter().rev().find(|p| p.workload == "compute" && p.iterations > 0)?;
    Some(phase.end_monotonic_ns.saturating_sub(phase.start_monotonic_ns) as f64 / phase.iterations as f64)
}

/// Each probed operation's verdict, for a VM that ran at `cpl`: from its phase's exits into KVM
/// per iteration (`PhaseReport::reaches_kvm`, the rule `testvm` reports by too), and, where it
/// made none, from its evidence event in the vCPU thread's `traced` events meanwhile (on PVM,
/// KVM's emulator runs CPL0 code and handles CPUID and RDMSR there without counting an exit).
fn guest_operations(phases: &[PhaseReport], cpl: u8, traced: &[&Traced]) -> Vec<GuestOperation> {
    PROBED
        .iter()
        .filter_map(|probed| {
            let phase = phases.iter().find(|p| p.workload == probed.workload)?;
            let during = traced
                .iter()
                .filter(|e| {
                    e.name == probed.evidence && (phase.start_monotonic_ns..phase.end_monotonic_ns).contains(&e.ns)
                })
                .count() as f64;
            let evidence = during / phase.iterations.max(1) as f64;
            let usual = probed.usual;
            let per_op = phase.kvm_exits_per_iteration().zip(phase.reaches_kvm());
            let (verdict, detail) = match per_op {
                None => ("not probed", "the KVM stats fd has no `exits` counter".to_string()),
                Some((r, true)) => ("exits", format!("{r:.2} exits into KVM per operation (usually {usual})")),
                Some((r, false)) if evidence >= 0.9 => (
                    "in KVM, no exit",
                    format!(
                        "{r:.2} exits into KVM per operation, yet {evidence:.2} {} per operation: KVM handles it \
                         without counting an exit, so traces show its event but no exit or duration (usually {usual})",
                        probed.evidence
                    ),
                ),
                Some((r, false)) => (
                    "none",
                    format!(
                        "{r:.2} exits into KVM per operation: handled below this host's KVM, so no trace \
                         shows an exit for it (usually {usual})"
                    ),
                ),
            };
            Some(GuestOperation {
                operation: probed.operation,
                cpl,
                iterations: Some(phase.iterations),
                kvm_exits: phase.kvm_exits,
                verdict,
                detail,
            })
        })
        .collect()
}

/// The events of ftrace text output (`comm-pid [cpu] flags seconds: name: fields`) made by the
/// threads in `tids`.
fn parse_text_events<'a>(text: &'a str, tids: &[u32]) -> Vec<Traced<'a>> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (task, rest) = line.split_once(" [")?;
            let tid = task.rsplit('-').next()?.trim().parse().ok().filter(|t| tids.contains(t))?;
            let mut fields = rest.split(": ");
            let seconds = fields.next()?.rsplit(' ').next()?;
            let (whole, micros) = seconds.split_once('.')?;
            let ns = whole.parse::<u64>().ok()? * 1_000_000_000 + micros.parse::<u64>().ok()? * 1000;
            Some(Traced { tid, ns, name: fields.next()? })
        })
        .collect()
}

/// A privilege level as this architecture names it (arm64: EL0 for CPL3, EL1 for CPL0).
fn level_name(cpl: u8) -> String {
    match (cfg!(target_arch = "aarch64"), cpl) {
        (true, 3) => "EL0".into(),
        (true, _) => "EL1".into(),
        (false, _) => format!("CPL{cpl}"),
    }
}

/// What a user of this host must know against a VMX/SVM one, from the host kind and what the
/// probe measured.
pub(super) fn host_differences(kind: Option<HostKind>, probe: &Probe) -> Vec<String> {
    let mut lines = Vec::new();
    let traced = probe.events.get("kvm_exit").copied().unwrap_or(0) > 0;
    let all_exit = probe.operations.iter().all(|o| o.verdict == "exits");
    if traced && all_exit && matches!(kind, Some(HostKind::Vmx | HostKind::Svm)) {
        lines.push(
            "none: this is a VMX/SVM host. Every probed guest operation exits to KVM at both privilege levels, and \
             kvm_exit/kvm_entry time each exit (docs/testbeds.md, \"On a real kvm_amd host\", lists what a PVM host lacks)."
                .to_string(),
        );
    }
    if traced && kind == Some(HostKind::Arm64) {
        lines.push(
            "arm64: kvm_exit/kvm_entry time every exit; an exit is its code (IRQ, ...) or, for a trap, its \
             exception class, named from the kernel's print fmt with the class in hex (DABT_LOW (EC 0x24)). \
             WFx exits (WFI and WFE, one class) are guest idle, reported apart from handling time. KVM traps WFI \
             while no interrupt is pending, and WFE only while the vCPU's CPU has other tasks to run (on an L1 \
             emulated by QEMU TCG, WFE never traps). No port I/O: devices are MMIO."
                .to_string(),
        );
    }
    if !traced {
        lines.push(
            "kvm_exit/kvm_entry never fire here: exits are counted from the KVM stats fd and evidence events \
             (kvm_pio, kvm_mmio, kvm_msr, ...), heavyweight ones timed by their userspace round trip; lightweight \
             exits have no duration. On VMX/SVM every exit is traced with its reason and duration."
                .to_string(),
        );
    }
    // The operations given `verdict`, as "CPUID at CPL0, ...".
    let with_verdict = |verdict: &str| {
        let ops: Vec<String> = probe
            .operations
            .iter()
            .filter(|o| o.verdict == verdict)
            .map(|o| format!("{} at {}", o.operation, level_name(o.cpl)))
            .collect();
        (!ops.is_empty()).then(|| ops.join(", "))
    };
    if let Some(ops) = with_verdict("in KVM, no exit") {
        lines.push(format!(
            "handled inside KVM without an exit (its event fires; no kvm_exit, no duration, not in the stats fd's \
             exits): {ops}. On VMX/SVM each is a counted, timed exit."
        ));
    }
    if let Some(ops) = with_verdict("none") {
        lines.push(format!(
            "handled below this host's KVM, so invisible to any trace here: {ops}. On VMX/SVM each is an exit KVM \
             handles (a lightweight exit)."
        ));
    }
    // PVM runs guest CPL0 code in KVM's emulator. (Elsewhere a slow CPL0 loop means nothing
    // of the kind: under an emulated SVM both levels are slow, and marker exits dominate.)
    if let (Some(user), Some(kernel), Some(HostKind::Pvm)) = (probe.loop_ns.0, probe.loop_ns.1, kind) {
        let slowdown = kernel / user.max(0.001);
        let emulator = match probe.events.get("kvm_emulate_insn") {
            Some(n) => format!(" by KVM's instruction emulator ({n} kvm_emulate_insn in the probe)"),
            None => String::new(),
        };
        lines.push(format!(
            "guest kernel (CPL0) code is interpreted here{emulator}: an empty guest loop iteration took \
             {kernel:.0} ns at CPL0 against {user:.2} ns at CPL3 ({slowdown:.0}x). On VMX/SVM both levels run \
             natively."
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ftrace_text_lines_of_the_probe_threads() {
        let text = "# tracer: nop\n#\n vcpu0-12 [001] ..... 10.000001: kvm_pio: pio_write at 0xe0 size 1 count 1 val 0x0\n vcpu0-12 [001] ..... 10.000002: kvm_userspace_exit: reason KVM_EXIT_IO (2)\n vcpu0-99 [000] ..... 10.000004: kvm_pio: pio_write at 0xe0 size 1 count 1 val 0x0\n";
        let events = parse_text_events(text, &[12]);
        let names: Vec<_> = events.iter().map(|e| (e.ns, e.name)).collect();
        assert_eq!(names, [(10_000_001_000, "kvm_pio"), (10_000_002_000, "kvm_userspace_exit")]);
    }
}
