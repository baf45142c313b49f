//! `virtprof testvm`: run micro-VMs and print their ground truth.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use virtprof_kvm::guest::{boot, Bound, Privilege, Script, Workload};
use virtprof_kvm::launcher::{self, TestvmConfig};
use virtprof_model::testvm::TestvmReport;
use virtprof_model::units::{duration_ns, format_duration_ns};
use virtprof_sinks::Table;

use crate::args::TestvmArgs;
use crate::exit::usage;

pub fn run(args: &TestvmArgs) -> anyhow::Result<ExitCode> {
    let config = config_from_args(args)?;
    virtprof_host::stop::install_handler();
    let exe = std::env::current_exe().context("locating the virtprof executable to start VMM processes")?;
    let report = match launcher::run_testvm(&exe, &config) {
        Err(virtprof_kvm::VmmError::Stopped { index }) => {
            // Asked to stop: that is how the run ends, not a failure.
            eprintln!("virtprof testvm: stopped before VM {index} had run; nothing to report");
            return Ok(ExitCode::SUCCESS);
        }
        report => report?,
    };
    let mut out = crate::output::stdout();
    if args.json {
        crate::output::write_json_pretty(&mut out, &report)?;
    } else {
        write_human(&report, &config, &mut out)?;
    }
    let incomplete = report.vcpus().any(|v| !v.completed);
    Ok(if incomplete { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Validate the arguments into a launcher config; every problem is a usage error.
pub fn config_from_args(args: &TestvmArgs) -> anyhow::Result<TestvmConfig> {
    let bound = match (args.iterations, &args.duration) {
        (Some(n), _) => Bound::Iterations(n),
        (None, Some(d)) => Bound::Duration { ns: duration_ns(*d) },
        (None, None) => Bound::Duration { ns: 1_000_000_000 },
    };
    let script = match (args.workload.as_str(), &args.phases) {
        ("phases", Some(spec)) => Script::parse_phases(spec).map_err(|e| usage(format!("--phases: {e}")))?,
        ("phases", None) => {
            return Err(usage("--workload phases needs --phases SCRIPT, e.g. --phases compute:200ms,pio-user:10000"))
        }
        (_, Some(_)) if args.workload != "compute" => {
            return Err(usage(format!("--phases goes with --workload phases, not '{}'", args.workload)))
        }
        (_, Some(spec)) => Script::parse_phases(spec).map_err(|e| usage(format!("--phases: {e}")))?,
        ("boot", None) => boot_script(args, bound)?,
        (name, None) => Script::single(name.parse::<Workload>().map_err(usage)?, bound),
    };
    let privilege = Privilege::from_cpl(args.cpl)
        .ok_or_else(|| usage(format!("--cpl {}: the test bed runs at CPL 3 or CPL 0", args.cpl)))?;
    let script = script.at(privilege);
    script.check().map_err(usage)?;
    if args.phases.is_some() && (args.iterations.is_some() || args.duration.is_some()) {
        return Err(usage("--phases gives each phase its own bound; drop --iterations/--duration"));
    }
    if args.vcpus == 0 || args.vcpus > virtprof_kvm::guest::layout::MAX_VCPUS {
        return Err(usage(format!("--vcpus {}: must be 1 to {}", args.vcpus, virtprof_kvm::guest::layout::MAX_VCPUS)));
    }
    if args.vms == 0 || args.vms > 64 {
        return Err(usage(format!("--vms {}: must be 1 to 64", args.vms)));
    }
    let pin = match &args.pin {
        None => Vec::new(),
        Some(list) => {
            let cpus = list.0.clone();
            let allowed = virtprof_host::affinity::allowed_cpus();
            if let Some(bad) = cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(usage(format!(
                    "--pin: CPU {bad} is not available here (allowed: {})",
                    format_cpus(&allowed)
                )));
            }
            cpus
        }
    };
    let io_latency_ns = duration_ns(args.io_latency);
    let linger_ns = args.linger.map_or(0, duration_ns);
    let noise = script.phases.iter().any(|p| p.workload == Workload::Noise);
    let buffered = script.phases.iter().find(|p| p.workload.uses_buffer());
    if let Some(phase) = buffered.filter(|_| args.vcpus > virtprof_kvm::guest::layout::NOISE_VCPUS) {
        return Err(usage(format!(
            "--vcpus {}: the {} workload supports 1 to {}",
            args.vcpus,
            phase.workload,
            virtprof_kvm::guest::layout::NOISE_VCPUS
        )));
    }
    if args.reclaim_hz > 0 && !script.phases.iter().any(|p| p.workload == Workload::Touch) {
        return Err(usage(format!(
            "--reclaim-hz {}: only the touch workload has memory to take back (--workload touch)",
            args.reclaim_hz
        )));
    }
    if noise && matches!(bound, Bound::Iterations(_)) && args.phases.is_none() {
        return Err(usage("--workload noise runs for a --duration, not --iterations"));
    }
    let noise_threshold_ns = duration_ns(args.noise_threshold);
    let io_thread = match args.io_thread.as_deref() {
        None => None,
        Some("any") => Some(None),
        Some(cpu) => match cpu.parse::<u32>() {
            Ok(cpu) if virtprof_trace::capture::online_cpus().contains(&cpu) => Some(Some(cpu)),
            _ => return Err(usage(format!("--io-thread {cpu}: give an online CPU number or 'any'"))),
        },
    };
    Ok(TestvmConfig {
        script,
        vms: args.vms,
        vcpus: args.vcpus,
        pin,
        io_latency_ns,
        steal_time: args.steal_time || noise,
        linger_ns,
        name: args.name.clone(),
        sample_hz: args.inject_hz,
        noise_threshold_ns,
        io_thread,
        reclaim_hz: args.reclaim_hz,
    })
}

/// The `boot` workload: `--shares` of `--duration` (iterations make no sense for it).
fn boot_script(args: &TestvmArgs, bound: Bound) -> anyhow::Result<Script> {
    let Bound::Duration { ns } = bound else {
        return Err(usage("--workload boot runs for a --duration, not --iterations"));
    };
    boot::script_from_specs(&args.shares, args.balloon.as_deref(), ns).map_err(usage)
}

fn format_cpus(cpus: &[u32]) -> String {
    cpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn write_human(report: &TestvmReport, config: &TestvmConfig, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "virtprof testvm: {} at CPL{} on {} VM(s) x {} vCPU(s), {} wall, {} marker IO exits per vCPU",
        report.workload,
        report.cpl,
        report.vms.len(),
        config.vcpus,
        format_duration_ns(report.wall_ns / 1000 * 1000),
        report.marker_io_exits_per_vcpu
    )?;
    let mut table = Table::new([
        "VM",
        "PID",
        "VCPU",
        "TID",
        "CPU",
        "ITERATIONS",
        "NS/ITER",
        "RUN_MS",
        "WAIT_MS",
        "IO",
        "MMIO",
        "OTHER",
        "IOEVENTFD",
        "KVM_EXITS",
        "STEAL_MS",
    ]);
    for vm in &report.vms {
        for v in &vm.vcpus {
            let other: u64 = v.userspace_exits.iter().filter(|(k, _)| *k != "IO" && *k != "MMIO").map(|(_, n)| n).sum();
            let ms = |ns: u64| format!("{:.1}", ns as f64 / 1e6);
            table.row([
                vm.index.to_string(),
                vm.pid.to_string(),
                v.index.to_string(),
                v.tid.to_string(),
                v.pinned_cpu.map(|c| c.to_string()).unwrap_or_default(),
                v.iterations.to_string(),
                format!("{:.1}", v.ns_per_iteration),
                ms(v.run_ns),
                ms(v.wait_ns),
                v.exits("IO").to_string(),
                v.exits("MMIO").to_string(),
                other.to_string(),
                v.ioeventfd_signals.to_string(),
                v.kvm_stats.get("exits").map(u64::to_string).unwrap_or_default(),
                v.steal_ns.map(ms).unwrap_or_default(),
            ]);
        }
    }
    table.write_text(&mut *out)?;
    for vm in &report.vms {
        if let Some(times) = vm.reclaims {
            let faulted: u64 = vm.vcpus.iter().filter_map(|v| v.kvm_stats.get("pf_fixed")).sum();
            writeln!(
                out,
                "VM {}: its touch buffers taken back {times} times (--reclaim-hz); KVM faulted {faulted} pages in (pf_fixed)",
                vm.index
            )?;
        }
    }
    write_phase_exits(report, out)
}

/// Per phase, the exits that reached KVM (its stats fd, read at each marker): which guest
/// operations exit on this host, measured rather than assumed.
fn write_phase_exits(report: &TestvmReport, out: &mut impl Write) -> std::io::Result<()> {
    let mut table = Table::new(["VM", "VCPU", "PHASE", "ITERATIONS", "KVM_EXITS", "EXITS/ITER", "NOTE"]);
    let mut silent = Vec::new();
    for vm in &report.vms {
        for v in &vm.vcpus {
            for p in &v.phases {
                let Some(exits) = p.kvm_exits else { continue };
                let per_iter = p.kvm_exits_per_iteration().map(|r| format!("{r:.2}")).unwrap_or_default();
                // Compute loops (and the boot workload's named functions) make no exits by design.
                let expects_exits = report.workload != "boot" && !matches!(p.workload.as_str(), "compute" | "noise");
                let note = if expects_exits && p.reaches_kvm() == Some(false) {
                    silent.push(p.workload.clone());
                    "no exit counted"
                } else {
                    ""
                };
                table.row([
                    vm.index.to_string(),
                    v.index.to_string(),
                    p.workload.clone(),
                    p.iterations.to_string(),
                    exits.to_string(),
                    per_iter,
                    note.to_string(),
                ]);
            }
        }
    }
    if table.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    table.write_text(&mut *out)?;
    silent.sort();
    silent.dedup();
    if !silent.is_empty() {
        writeln!(
            out,
            "note: {} made no exit that this host's KVM counts (KVM stats fd): the operation is handled below \
             KVM (a CPL3 CPUID on PVM) or emulated inside it without an exit (CPL0 code on PVM); either way no \
             trace shows an exit for it (`virtprof doctor` tells which)",
            silent.join(", ")
        )?;
    }
    Ok(())
}
