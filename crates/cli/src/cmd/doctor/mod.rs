//! `virtprof doctor`: what this host offers, what each virtprof feature will therefore do, and
//! how to fix what is missing. Probes are read-only except the live probe (`probe`), which runs
//! micro-VMs under a private tracefs instance (removed afterwards) to see which kvm events fire.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use virtprof_engine::kernel_counts::KernelCounter;
use virtprof_kvm::caps::KvmCaps;
use virtprof_model::HostKind;
use virtprof_sinks::Table;
use virtprof_trace::perf::{self, Availability};
use virtprof_trace::{tracefs, Tracefs};

use crate::args::DoctorArgs;

mod probe;

use probe::{live_probe, EventCounts, GuestOperation};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Warn,
    Missing,
}

#[derive(Debug, Clone, Serialize)]
struct Check {
    name: &'static str,
    status: Status,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

#[derive(Debug, Serialize)]
struct Feature {
    feature: &'static str,
    mode: String,
}

#[derive(Debug, Serialize)]
struct Report {
    host_kind: Option<HostKind>,
    checks: Vec<Check>,
    features: Vec<Feature>,
    /// Which guest operations exit to KVM here, measured by the live probe.
    guest_operations: Vec<GuestOperation>,
    /// What differs here from a VMX/SVM host, from the host kind and the live probe.
    host_differences: Vec<String>,
    /// The figures a recording made here with the default events leaves unknown, and why.
    unknown_figures: Vec<String>,
}

/// Whether one guest operation reaches this host's KVM, as the live probe measured it.
fn check(name: &'static str, status: Status, detail: impl Into<String>, fix: Option<&str>) -> Check {
    Check { name, status, detail: detail.into(), fix: fix.map(str::to_string) }
}

pub fn run(args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let mut checks = Vec::new();
    let root = geteuid() == 0;
    checks.push(if root {
        check("privileges", Status::Ok, "running as root", None)
    } else {
        check(
            "privileges",
            Status::Warn,
            "not root: tracefs and other VMMs' fds may be refused",
            Some("run as root (sudo virtprof ...)"),
        )
    });
    checks.push(check("kernel", Status::Ok, kernel_release(), None));

    let tracefs = if root { Tracefs::locate_or_mount().ok() } else { Tracefs::locate() };
    match &tracefs {
        Some(t) => checks.push(check("tracefs", Status::Ok, format!("mounted at {}", t.root().display()), None)),
        None => checks.push(check(
            "tracefs",
            Status::Missing,
            "not mounted",
            Some("mount -t tracefs nodev /sys/kernel/tracing (virtprof does this itself when root)"),
        )),
    }
    if args.cleanup {
        if let Some(t) = &tracefs {
            for (path, result) in tracefs::cleanup_stale(t) {
                let detail = match result {
                    Ok(()) => format!("removed {}", path.display()),
                    Err(e) => format!("could not remove: {e}"),
                };
                checks.push(check("cleanup", Status::Ok, detail, None));
            }
        }
    }
    let stale = tracefs.as_ref().map(Tracefs::stale_instances).unwrap_or_default();
    if !stale.is_empty() {
        checks.push(check(
            "stale instances",
            Status::Warn,
            format!("{} left by dead virtprof processes", stale.len()),
            Some("virtprof doctor --cleanup"),
        ));
    }

    let kvm = KvmCaps::probe();
    match &kvm.api_version {
        Ok(v) => checks.push(check(
            "/dev/kvm",
            Status::Ok,
            format!("KVM API {v}, host kind {}", kvm.kind.map_or("unknown", HostKind::as_str)),
            None,
        )),
        Err(e) => checks.push(check(
            "/dev/kvm",
            Status::Missing,
            e.clone(),
            Some("load kvm_intel/kvm_amd (or kvm_pvm), and run as root or in group 'kvm'"),
        )),
    }
    match &kvm.stats {
        Ok((vm, vcpu)) => {
            checks.push(check("KVM stats fd", Status::Ok, format!("{vm} VM stats, {vcpu} vCPU stats"), None))
        }
        Err(e) => checks.push(check("KVM stats fd", Status::Missing, e.clone(), Some("needs Linux 5.14 or newer"))),
    }
    checks.push(debugfs_kvm_check());
    checks.push(match virtprof_kvm::uevents::probe() {
        Ok(()) => check("KVM VM announcements", Status::Ok, "heard: record --interval finds a VM at its creation", None),
        Err(e) => check(
            "KVM VM announcements",
            Status::Warn,
            format!("{e}; record --interval finds new VMs by scanning /proc, which backs off to 500 ms while pids keep coming"),
            Some("run virtprof in the host's initial network and user namespaces"),
        ),
    });

    if let Some(t) = tracefs.as_ref() {
        checks.push(match virtprof_trace::exit_hist::unavailable(t) {
            None => check("kernel exit histograms", Status::Ok, "hist triggers time exits: exits --kernel-hist", None),
            Some(why) => check(
                "kernel exit histograms",
                Status::Warn,
                format!("{why}: exits --kernel-hist is unavailable; exits are timed from the trace (or --bpf)"),
                None,
            ),
        });
    }
    let kvm_events = tracefs.as_ref().map(|t| t.events("kvm")).unwrap_or_default();
    if tracefs.is_some() {
        let has = |e: &str| kvm_events.iter().any(|k| k == e);
        let status = if has("kvm_exit") && has("kvm_entry") { Status::Ok } else { Status::Warn };
        checks.push(check(
            "kvm tracepoints",
            status,
            format!(
                "{} kvm events{}",
                kvm_events.len(),
                if has("kvm_exit") { ", kvm_exit and kvm_entry defined" } else { ", no kvm_exit" }
            ),
            None,
        ));
    }

    let in_kernel = in_kernel_check(tracefs.as_ref(), !kvm_events.is_empty());
    checks.push(in_kernel.clone());

    let probe = match (&tracefs, &kvm.api_version, args.no_probe) {
        (Some(t), Ok(_), false) => Some(live_probe(t)),
        _ => None,
    };
    match &probe {
        Some(Ok(p)) => checks.extend(probe_checks(&p.events)),
        Some(Err(e)) => checks.push(check("live probe", Status::Warn, format!("failed: {e:#}"), None)),
        None => checks.push(check(
            "live probe",
            Status::Warn,
            if args.no_probe { "skipped (--no-probe)" } else { "needs tracefs and /dev/kvm" },
            None,
        )),
    }

    let software = perf::probe_software();
    let hardware = perf::probe_hardware();
    let paranoid = perf::paranoid_level();
    checks.push(match &software {
        Availability::Available => check("perf software events", Status::Ok, "task-clock counts", None),
        Availability::Unavailable(e) => check(
            "perf software events",
            Status::Missing,
            format!("{e} (perf_event_paranoid={})", paranoid.map_or("?".into(), |p| p.to_string())),
            Some("sysctl kernel.perf_event_paranoid=1, or run as root"),
        ),
    });
    checks.push(match &hardware {
        Availability::Available => check("perf hardware counters", Status::Ok, "cycles counts", None),
        Availability::Unavailable(e) => check(
            "perf hardware counters",
            Status::Missing,
            format!("cycles: {e}"),
            Some("on a VM, enable the vPMU (QEMU -cpu host,pmu=on; Firecracker has none)"),
        ),
    });
    let rapl =
        Path::new("/sys/class/powercap/intel-rapl:0").exists() || Path::new("/sys/class/powercap/intel-rapl").exists();
    checks.push(if rapl {
        check("RAPL / powercap", Status::Ok, "/sys/class/powercap/intel-rapl present", None)
    } else {
        check(
            "RAPL / powercap",
            Status::Missing,
            "no /sys/class/powercap/intel-rapl*",
            Some("bare-metal Intel/AMD with intel_rapl_common loaded"),
        )
    });
    let tracers = tracefs.as_ref().map(Tracefs::available_tracers).unwrap_or_default();
    let osnoise = tracers.iter().any(|t| t == "osnoise");
    checks.push(if osnoise {
        check("osnoise tracer", Status::Ok, "available", None)
    } else {
        check(
            "osnoise tracer",
            Status::Missing,
            format!("available tracers: {}", tracers.join(" ")),
            Some("CONFIG_OSNOISE_TRACER=y (virtprof noise does not need it)"),
        )
    });
    let in_vm = virtprof_host::kind::in_vm();
    checks.push(check(
        "running in a VM",
        Status::Ok,
        if in_vm { "yes (hypervisor CPU flag): noise splits steal/hypervisor" } else { "no (bare metal)" },
        None,
    ));
    for (tool, package) in
        [("qemu-system-x86_64", "qemu-system-x86"), ("trace-cmd", "trace-cmd"), ("perf", "linux-perf")]
    {
        checks.push(if which(tool) {
            check(tool_check_name(tool), Status::Ok, "found in PATH", None)
        } else {
            check(
                tool_check_name(tool),
                Status::Warn,
                "not found (only needed for comparisons and QEMU guests)",
                Some(&format!("apt-get install {package}")),
            )
        });
    }

    let probed = probe.as_ref().and_then(|p| p.as_ref().ok());
    let exits_live = probed.map(|p| p.events.get("kvm_exit").copied().unwrap_or(0) > 0);
    let mut features = features(&kvm, tracefs.is_some(), exits_live, &hardware, rapl);
    let hist_triggers = tracefs.as_ref().is_some_and(|t| t.root().join("events/kvm/kvm_exit/hist").exists());
    features.push(Feature { feature: "in-kernel aggregation", mode: in_kernel_mode(&in_kernel, hist_triggers) });
    let guest_operations = probed.map(|p| p.operations.clone()).unwrap_or_default();
    let host_differences = probed.map(|p| probe::host_differences(kvm.kind, p)).unwrap_or_default();
    let unknown_figures = unknown_figures(tracefs.is_some(), exits_live);
    let report = Report { host_kind: kvm.kind, checks, features, guest_operations, host_differences, unknown_figures };
    let mut out = crate::output::stdout();
    if args.json {
        crate::output::write_json_pretty(&mut out, &report)?;
    } else {
        write_human(&report, &mut out)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn tool_check_name(tool: &str) -> &'static str {
    match tool {
        "qemu-system-x86_64" => "qemu",
        "trace-cmd" => "trace-cmd",
        _ => "perf tool",
    }
}

fn probe_checks(counts: &EventCounts) -> Vec<Check> {
    let n = |e: &str| counts.get(e).copied().unwrap_or(0);
    let mut checks = Vec::new();
    checks.push(if n("kvm_exit") > 0 && n("kvm_entry") > 0 {
        check("kvm_exit/kvm_entry", Status::Ok, format!("emitted ({} exits in the probe VM)", n("kvm_exit")), None)
    } else {
        check(
            "kvm_exit/kvm_entry",
            Status::Missing,
            "not emitted by this host's KVM (e.g. PVM): per-exit durations come from userspace round trips",
            Some("use a VMX/SVM host for per-exit durations of lightweight exits"),
        )
    });
    let evidence: Vec<String> =
        counts.iter().filter(|(k, _)| k.starts_with("kvm_")).map(|(k, v)| format!("{k}={v}")).collect();
    checks.push(check(
        "kvm events in probe",
        if evidence.is_empty() { Status::Missing } else { Status::Ok },
        if evidence.is_empty() { "none fired".to_string() } else { evidence.join(" ") },
        None,
    ));
    checks
}

fn features(
    kvm: &KvmCaps,
    tracefs: bool,
    exits_live: Option<bool>,
    hardware: &Availability,
    rapl: bool,
) -> Vec<Feature> {
    let f = |feature, mode: &str| Feature { feature, mode: mode.to_string() };
    let testvm = if cfg!(not(any(target_arch = "x86_64", target_arch = "aarch64"))) {
        "unavailable on this architecture: guest programs exist for x86-64 and arm64"
    } else if kvm.api_version.is_ok() && cfg!(target_arch = "aarch64") {
        "available (arm64: compute, mmio-user, mmio-kernel, io-bound, fault, noise, hvc, wfi, sysreg at EL1/EL0; steal time from KVM's PV time record)"
    } else if kvm.api_version.is_ok() {
        "available"
    } else {
        "unavailable: no /dev/kvm"
    };
    let exits = match (tracefs, exits_live) {
        (false, _) => "unavailable: needs tracefs",
        (true, Some(true)) => "per-exit durations from kvm_exit/kvm_entry, light/heavy split, vm_noise rows",
        (true, Some(false)) => "heavyweight round trips from kvm_userspace_exit/kvm_fpu; lightweight counts from evidence events and the KVM stats fd; per-exit durations of lightweight exits unavailable",
        (true, None) => "depends on kvm_exit (run doctor without --no-probe to find out)",
    };
    // `record --counters` also reaches the sysfs PMUs this kernel has (msr, power, uncore).
    let pmus: Vec<String> = std::fs::read_dir("/sys/bus/event_source/devices")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let mut pmus: Vec<&str> = pmus
        .iter()
        .map(String::as_str)
        .filter(|p| !["software", "tracepoint", "breakpoint", "kprobe", "uprobe"].contains(p))
        .collect();
    pmus.sort_unstable();
    let counters = format!(
        "{}; `record --counters` by perf's names, sysfs PMUs here: {}",
        match hardware {
            Availability::Available => "software and hardware counters",
            Availability::Unavailable(_) => {
                "software counters and tracepoint counts (no hardware PMU: hardware, cache and raw events are reported unavailable)"
            }
        },
        if pmus.is_empty() { "none".to_string() } else { pmus.join(", ") }
    );
    let energy = if rapl {
        "per-vCPU model; `balance calibrate --live` fits its weights against RAPL package energy"
    } else {
        "per-vCPU model with default weights; `balance calibrate --live` unavailable (no RAPL/powercap): fit with --input CSV from another meter"
    };
    let balance = if kvm.api_version.is_ok() || tracefs {
        "live swaps by CPU affinity, --dry-run, --replay; --verify needs tracefs; bench needs /dev/kvm"
    } else {
        "--replay of recordings; live swaps need VMs (no /dev/kvm here)"
    };
    vec![
        f("testvm", testvm),
        f("exits", exits),
        f(
            "sched/top",
            if tracefs {
                "exact, from sched_switch/sched_wakeup (switch-ins a kernel leaves untraced are inferred from the thread's own events and reported)"
            } else {
                "approximate, from schedstat and KVM stats polling"
            },
        ),
        f("counters", &counters),
        f("boot", &boot_sources(kvm, tracefs, exits_live)),
        f("energy", energy),
        f("balance", balance),
        f("noise", &noise_mode(kvm, tracefs)),
        f("agent", &agent_mode()),
        f("serve", &serve_mode(tracefs, exits_live)),
        f("stats", if kvm.stats.is_ok() { "KVM binary stats of any VMM via pidfd_getfd" } else { "unavailable" }),
        f(
            "import",
            "on any host: trace.dat v6/v7 (zstd, zlib, none; every buffer; x86-tsc without TSC2NSEC: counts, durations unknown until --tsc-khz), perf.data tracepoint samples, tracefs dumps, ftrace text; a host trace.dat and its guest's placed on one clock by TIME_SHIFT (exits/export/sched/report --guest), or imported as one recording (import HOST --guest GUEST)",
        ),
    ]
}

/// Whether the in-kernel aggregation (eBPF) loads here: the kernel's verifier accepts it and
/// it attaches to this kernel's kvm tracepoints (then detaches: this is a probe).
fn in_kernel_check(tracefs: Option<&Tracefs>, kvm_events: bool) -> Check {
    const NAME: &str = "eBPF aggregation";
    let Some(tracefs) = tracefs else {
        return check(NAME, Status::Missing, "needs tracefs (the kvm tracepoints)", None);
    };
    if !kvm_events {
        return check(NAME, Status::Missing, "no kvm tracepoints (is the kvm module loaded?)", None);
    }
    match KernelCounter::start(tracefs.root(), &virtprof_session::EVIDENCE_EVENTS, true) {
        Ok(counter) => check(
            NAME,
            Status::Ok,
            format!(
                "loads (verifier accepted) and attaches to {}; its maps are read {}; {}",
                counter.attached().join(", "),
                if counter.reads_in_batches() {
                    "in batches (BPF_MAP_LOOKUP_BATCH)"
                } else {
                    "one entry at a time (no BPF_MAP_LOOKUP_BATCH before Linux 5.6: a refresh costs more)"
                },
                if counter.raw_events().iter().any(|e| e == "sched:sched_switch") {
                    "the sched events through raw tracepoints (never skipped while the maps are read)"
                } else {
                    "the sched events through tracepoint programs (no kernel BTF, or before Linux 5.18): the kernel skips them while a CPU reads the maps, counted as lost events"
                }
            ),
            None,
        ),
        Err(e) => check(
            NAME,
            Status::Warn,
            format!("unavailable: {e}"),
            Some("run as root on a kernel with CONFIG_BPF_SYSCALL and CONFIG_BPF_EVENTS"),
        ),
    }
}

/// What the eBPF check means for the live views, as things stand, and how close its figures
/// come to the traced path's.
fn in_kernel_mode(check: &Check, hist_triggers: bool) -> String {
    // The program reads the clock when it runs, the ring buffer when it reserves the event: an
    // exit's duration differs between the two paths by the difference of those gaps at its
    // ends, so an exit close to a bucket's edge may be in the neighbouring bucket. Only a
    // kernel histogram in the trace's own instance (hist triggers) reads the same timestamps.
    let precision = format!(
        "exit counts equal the traced path's; durations agree with its up to the gap between a program's clock read and the ring buffer's timestamp (an exit near a bucket's edge may fall in the neighbouring bucket); {}",
        if hist_triggers {
            "this kernel has hist triggers, which would bucket exactly as the trace does (not used yet)"
        } else {
            "no hist triggers here (CONFIG_HIST_TRIGGERS off), the one in-kernel way to bucket on the trace's own timestamps"
        }
    );
    match check.status {
        Status::Ok => format!(
            "`top`, `demo` and `serve` count exits by reason, exit durations and run/wait/blocked per vCPU thread in the kernel (eBPF; --trace decodes every traced event instead); events the kernel skips the program for are counted as lost; {precision}"
        ),
        _ => format!("unavailable ({}): `top`, `demo` and `serve` decode every traced event", check.detail),
    }
}

/// What `virtprof noise` measures and attributes here.
fn noise_mode(kvm: &KvmCaps, tracefs: bool) -> String {
    use virtprof_host::{clock::tsc_usable, kind::in_vm};
    let clock = if tsc_usable() { "TSC loop" } else { "CLOCK_MONOTONIC_RAW loop (no constant, non-stop TSC)" };
    let rest =
        if in_vm() { "unexplained noise is STEAL/HYP (inside a VM)" } else { "unexplained noise is HW (bare metal)" };
    let attribution =
        if tracefs { "NMI/IRQ/softirq/thread from a private trace" } else { "no attribution (needs tracefs)" };
    let testvm = if kvm.api_version.is_ok() && tracefs {
        "--testvm explains guest samples by host events"
    } else {
        "no --testvm (needs /dev/kvm and tracefs)"
    };
    format!("{clock}; {attribution}; {rest}; {testvm}")
}

/// What `virtprof agent` can use on this machine, were it a guest.
fn agent_mode() -> String {
    let have = |path: &str| Path::new(path).exists();
    let vsock = if have("/dev/vsock") { "vsock available" } else { "no /dev/vsock (serial or tcp)" };
    let marker = if have("/dev/port") {
        "--marker-port available (root)"
    } else {
        "no --marker-port (no /dev/port: CONFIG_DEVPORT)"
    };
    let ptp = virtprof_agent::collect::ptp_kvm()
        .map_or_else(|| "no ptp_kvm clock".to_string(), |name| format!("ptp_kvm clock {name}"));
    format!(
        "clock alignment by ptp_kvm where the guest has it, else NTP-style exchanges, each checked against every exchange (kvmclock is reported, not used); {vsock}; {marker}; {ptp}"
    )
}

/// What `virtprof serve` exports here.
fn serve_mode(tracefs: bool, exits_live: Option<bool>) -> String {
    let figures = if tracefs {
        "run/wait/blocked seconds, executions, I/O and exit reasons from the traced kvm and sched events (counted in the kernel by eBPF where it loads; --trace decodes them)"
    } else {
        "run/wait from schedstat polling (blocked as the remainder; no exit reasons or traced I/O: needs tracefs)"
    };
    let durations = match (tracefs, exits_live) {
        (true, Some(true)) => "exit-duration histogram from kvm_exit/kvm_entry",
        (true, _) => "exit-duration histogram of userspace round trips only (no kvm_exit here)",
        (false, _) => "no exit-duration histogram",
    };
    format!("Prometheus/OpenMetrics endpoint (or node_exporter textfile): {figures}; exits from the KVM stats fd; {durations}; energy from the model")
}

/// Which `virtprof boot` sources work here.
fn boot_sources(kvm: &KvmCaps, tracefs: bool, exits_live: Option<bool>) -> String {
    let qemu =
        std::process::Command::new("qemu-system-x86_64").arg("--version").output().is_ok_and(|o| o.status.success());
    let mut parts = vec![
        if kvm.api_version.is_ok() { "--testvm (micro-VMM kicks)" } else { "no --testvm (no /dev/kvm)" },
        // The gdbstub sampler reads x86-64 registers, whatever this host's architecture.
        if qemu {
            "--qemu/--gdb (QEMU gdbstub; x86-64 guests)"
        } else {
            "--gdb only (x86-64 guests; qemu-system-x86_64 not installed)"
        },
    ];
    parts.push(match (tracefs, exits_live) {
        (true, Some(true)) => "--recording (kvm_exit/kvm_entry timeline: the hypervisor realm measured)",
        (_, Some(false)) => "no --recording profiles (this KVM emits no kvm_exit/kvm_entry)",
        _ => "--recording if the recording holds kvm_exit",
    });
    parts.join("; ")
}

/// The figures a `record` here with the default events cannot give (see docs/evidence.md):
/// the events this host never emits, as `Session::holdings` will say of its recordings.
fn unknown_figures(tracefs: bool, exits_live: Option<bool>) -> Vec<String> {
    use virtprof_model::evidence::{Class, Figure, Holdings};
    if !tracefs {
        return vec!["every traced figure: no tracefs to record from (mount it, as root)".into()];
    }
    let mut holdings = Holdings::all();
    if exits_live == Some(false) {
        holdings = holdings.never_emitted(Class::ExitEntry);
    }
    let mut lines: Vec<String> = holdings.unavailable(&Figure::ALL).iter().map(ToString::to_string).collect();
    if exits_live == Some(false) {
        lines.push(format!(
            "{}: only for VMs whose KVM stats `record` snapshots at its start and end (running through the whole recording)",
            Figure::LightweightWithoutExitEvents.label()
        ));
    }
    lines
}

fn write_human(report: &Report, out: &mut impl Write) -> std::io::Result<()> {
    let mut table = Table::new(["CHECK", "STATUS", "DETAIL"]);
    let mut fixes = Vec::new();
    for c in &report.checks {
        let status = match c.status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Missing => "missing",
        };
        table.row([c.name.to_string(), status.to_string(), c.detail.clone()]);
        if let (Some(fix), false) = (&c.fix, c.status == Status::Ok) {
            fixes.push(format!("  {}: {fix}", c.name));
        }
    }
    table.write_text(&mut *out)?;
    if !report.guest_operations.is_empty() {
        writeln!(out, "\nGUEST OPERATIONS (live probe; exits counted by the vCPU's KVM stats fd)")?;
        let mut ops = Table::new(["OPERATION", "CPL", "ITERATIONS", "KVM_EXITS", "EXITS TO KVM", "DETAIL"]);
        for o in &report.guest_operations {
            let num = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_default();
            ops.row([
                o.operation.to_string(),
                o.cpl.to_string(),
                num(o.iterations),
                num(o.kvm_exits),
                o.verdict.to_string(),
                o.detail.clone(),
            ]);
        }
        ops.write_text(&mut *out)?;
    }
    if !report.host_differences.is_empty() {
        writeln!(out, "\nTHIS HOST AGAINST VMX/SVM (measured by the live probe)")?;
        for line in &report.host_differences {
            writeln!(out, "  - {line}")?;
        }
    }
    writeln!(out, "\nFIGURES A RECORDING HERE CANNOT GIVE (default events; docs/evidence.md)")?;
    if report.unknown_figures.is_empty() {
        writeln!(out, "  none: every figure has its events here")?;
    }
    for line in &report.unknown_figures {
        writeln!(out, "  - {line}")?;
    }
    writeln!(out, "\nWHAT VIRTPROF WILL DO HERE")?;
    let mut features = Table::new(["FEATURE", "MODE"]);
    for f in &report.features {
        features.row([f.feature.to_string(), f.mode.clone()]);
    }
    features.write_text(&mut *out)?;
    if !fixes.is_empty() {
        writeln!(out, "\nTO FIX")?;
        for line in fixes {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

/// Whether kvm_stat's source, debugfs's kvm folder, can be read: its files, not only the
/// listing (on some hosts the folder lists but each file gives EPERM).
fn debugfs_kvm_check() -> Check {
    let dir = std::path::Path::new("/sys/kernel/debug/kvm");
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            return check(
                "debugfs kvm stats",
                Status::Warn,
                format!("{e} (not needed: virtprof reads the stats fd)"),
                None,
            )
        }
    };
    let files: Vec<std::path::PathBuf> =
        entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file()).collect();
    let mut refused = None;
    let readable = files
        .iter()
        .filter(|p| match virtprof_host::input::read_bytes(p, "debugfs kvm stat", 1 << 20) {
            Ok(_) => true,
            Err(e) => {
                refused.get_or_insert_with(|| e.to_string());
                false
            }
        })
        .count();
    match (readable, files.len()) {
        (_, 0) => check("debugfs kvm stats", Status::Warn, "/sys/kernel/debug/kvm holds no stats files (not needed: virtprof reads the stats fd)", None),
        (r, n) if r == n => check("debugfs kvm stats", Status::Ok, format!("/sys/kernel/debug/kvm: all {n} files readable (kvm_stat works)"), None),
        (r, n) => check(
            "debugfs kvm stats",
            Status::Warn,
            format!(
                "/sys/kernel/debug/kvm lists {n} files but {} cannot be read ({}); kvm_stat will not work here (not needed: virtprof reads the stats fd)",
                n - r,
                refused.unwrap_or_default()
            ),
            None,
        ),
    }
}

fn kernel_release() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("Linux {} {}", release.trim(), std::env::consts::ARCH)
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
}

fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}
