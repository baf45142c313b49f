//! `virtprof balance`: energy accounting per vCPU and core, and seed 002's thermal balancing
//! policy acting on real vCPU threads (live), deciding only (`--dry-run`), or simulated on a
//! recording (`--replay`); `calibrate` fits the energy weights, `bench` runs the seed's
//! experiments on test VMs.

mod bench;
mod calibrate;
mod output;
mod replay;

use std::path::Path;
use std::process::ExitCode;

use virtprof_analysis::balancer::Policy;
use virtprof_kvm::discover::{DiscoveredVm, Discovery};
use virtprof_model::units::{duration_ns, format_duration};

use crate::args::{BalanceAction, BalanceArgs, BalanceBenchArgs, CalibrateArgs, CpuList};
use crate::exit::usage;
use virtprof_engine::energy::{model, powercap, Model};

pub fn run(args: &BalanceArgs) -> anyhow::Result<ExitCode> {
    match &args.action {
        Some(BalanceAction::Weights) => {
            print!("{}", model::DEFAULT_TOML);
            Ok(ExitCode::SUCCESS)
        }
        Some(BalanceAction::Calibrate(c)) => run_calibrate(c),
        Some(BalanceAction::Bench(b)) => run_bench(b),
        None => run_balance(args),
    }
}

fn run_balance(args: &BalanceArgs) -> anyhow::Result<ExitCode> {
    if !(args.k > 1.0 && args.k.is_finite()) {
        return Err(usage(format!("--k {}: the threshold must be a number greater than 1", args.k)));
    }
    let period_ns = duration_ns(args.period);
    if period_ns < 1_000_000 {
        return Err(usage("--period: at least 1ms (the energy of shorter periods is mostly rounding)"));
    }
    let model = Model::load(args.weights.as_deref())?;
    if let Some(file) = &args.replay {
        let replay = replay::run(file, period_ns, args.k, args.cores.map_or(0, usize::from), &model)?;
        return output::replay(&replay, args.json, args.html.as_deref());
    }
    let duration_ns = args.duration.map(duration_ns);
    let forced_hz = args.force_hz.unwrap_or(0.0);
    if !(0.0..=10_000.0).contains(&forced_hz) {
        return Err(usage(format!("--force-hz {forced_hz}: between 0 and 10000")));
    }
    let cpus = cpus(args.cpus.as_ref());
    if cpus.len() < 2 {
        return Err(usage(format!("--cpus: balancing needs at least two CPUs, got {cpus:?}")));
    }
    let vms = find_vms(&args.vm)?;
    let targets = virtprof_engine::balance::Target::of(&vms);
    virtprof_host::stop::install_handler();
    let config = virtprof_engine::balance::RunConfig {
        cpus,
        period_ns,
        duration_ns,
        // Forced swaps are the overhead experiment: the policy stays out of it (at 0 Hz the
        // placement is kept, the experiment's baseline).
        policy: if args.force_hz.is_some() { Policy::Fixed } else { Policy::Thermal { k: args.k } },
        forced_hz,
        actuate: !args.dry_run,
        verify: args.verify.then_some(args.buffer_size_kb),
        model,
        progress: !args.json,
    };
    if !args.json {
        eprintln!(
            "virtprof balance: {} vCPUs of {} VMs over CPUs {:?}, period {}, {}{} (Ctrl-C stops)",
            targets.len(),
            vms.len(),
            config.cpus,
            format_duration(args.period),
            match args.force_hz {
                Some(hz) => format!("swapped by force at {hz} Hz"),
                None => format!("k {}", args.k),
            },
            if args.dry_run { ", dry run" } else { "" }
        );
    }
    let result = virtprof_engine::balance::run(&vms, targets, &config)?;
    output::run(&result, &config, args.json, args.html.as_deref())
}

/// The VMs to balance: those given, or every KVM VM found; each with its vCPU threads. A VM
/// named with `--vm` may also be one QEMU emulates (TCG): its vCPU threads move the same way.
fn find_vms(only: &[u32]) -> anyhow::Result<Vec<DiscoveredVm>> {
    let proc_root = Path::new("/proc");
    let mut emulated = Vec::new();
    for &pid in only {
        if virtprof_kvm::discover::inspect(proc_root, pid).ok().flatten().is_some() {
            continue;
        }
        match virtprof_kvm::discover::inspect_emulated(proc_root, pid) {
            Some(vm) => emulated.push(vm),
            None => {
                return Err(usage(format!(
                    "--vm {pid}: no such process holding a KVM VM or emulating vCPUs (list VMs with `virtprof top --once`; run as root)"
                )))
            }
        }
    }
    let kvm_pids: Vec<u32> = only.iter().copied().filter(|pid| !emulated.iter().any(|vm| vm.pid == *pid)).collect();
    let mut vms: Vec<_> = if only.is_empty() || !kvm_pids.is_empty() {
        Discovery::new("/proc", kvm_pids).scan().into_iter().filter(|vm| !vm.vcpus.is_empty()).collect()
    } else {
        Vec::new()
    };
    vms.extend(emulated);
    if vms.is_empty() {
        return Err(usage(
            "no VM with vCPU threads found (start one, e.g. `virtprof testvm --workload compute --duration 60s &`)",
        ));
    }
    Ok(vms)
}

/// `--cpus`, or every online CPU.
fn cpus(list: Option<&CpuList>) -> Vec<u32> {
    list.map_or_else(virtprof_trace::capture::online_cpus, |l| l.0.clone())
}

fn run_calibrate(args: &CalibrateArgs) -> anyhow::Result<ExitCode> {
    let base = Model::load(args.weights.as_deref())?;
    let samples = match &args.input {
        Some(path) => calibrate::read_csv(path)?,
        None => live_samples(args)?,
    };
    let fit = calibrate::fit(&samples, &base)?;
    if let Some(out) = &args.output {
        virtprof_host::output::write_file(out, fit.model.to_toml().as_bytes(), virtprof_host::output::Privacy::Shared)?;
    }
    output::calibration(&fit, args.json, args.output.as_deref())
}

/// `calibrate --live`: every VM's vCPU activity per period against RAPL package energy.
fn live_samples(args: &CalibrateArgs) -> anyhow::Result<calibrate::Samples> {
    let Some(mut meter) = powercap::Powercap::open(Path::new(powercap::ROOT)) else {
        return Err(usage(format!(
            "--live: this host has no RAPL package energy ({} has no readable package zone; \
             `virtprof doctor` says what is missing). Log energy with another meter and pass --input CSV",
            powercap::ROOT
        )));
    };
    let period_ns = duration_ns(args.period);
    let vms = find_vms(&[])?;
    let targets = virtprof_engine::balance::Target::of(&vms);
    let weights = Model::default_model();
    let metrics: Vec<String> =
        weights.per_event_j.keys().cloned().chain(std::iter::once(calibrate::SECONDS.to_string())).collect();
    virtprof_host::stop::install_handler();
    let config = virtprof_engine::balance::RunConfig {
        cpus: virtprof_trace::capture::online_cpus(),
        period_ns,
        duration_ns: Some(duration_ns(args.duration)),
        policy: Policy::Fixed,
        forced_hz: 0.0,
        actuate: false,
        verify: None,
        model: weights,
        progress: !args.json,
    };
    meter.joules();
    let mut samples = calibrate::Samples { periods: Vec::new(), measured_j: Vec::new(), metrics };
    let period_s = period_ns as f64 / 1e9;
    virtprof_engine::balance::run_observed(&vms, targets, &config, &mut |activities| {
        let mut total = virtprof_analysis::energy::Activity::default();
        for a in activities {
            total.run_ns += a.run_ns;
            for (m, n) in &a.events {
                *total.events.entry(m.clone()).or_default() += n;
            }
        }
        total.events.insert(calibrate::SECONDS.to_string(), period_s);
        samples.periods.push(total);
        samples.measured_j.push(meter.joules());
    })?;
    Ok(samples)
}

fn run_bench(args: &BalanceBenchArgs) -> anyhow::Result<ExitCode> {
    virtprof_kvm::launcher::check_kvm()?;
    let mut cpus = cpus(args.cpus.as_ref());
    cpus.truncate(2);
    if cpus.len() < 2 {
        return Err(usage(format!("--cpus: the bench needs two CPUs, got {cpus:?}")));
    }
    if !(args.k > 1.0 && args.k.is_finite()) {
        return Err(usage(format!("--k {}: the threshold must be a number greater than 1", args.k)));
    }
    if args.reps == 0 {
        return Err(usage("--reps: at least 1"));
    }
    let config = bench::BenchConfig {
        cpus,
        segment_ns: duration_ns(args.segment),
        reps: args.reps,
        policy_ns: duration_ns(args.policy_time),
        period_ns: duration_ns(args.period),
        k: args.k,
        model: Model::load(args.weights.as_deref())?,
        only: args.only,
    };
    virtprof_host::stop::install_handler();
    let result = bench::run(&config)?;
    output::bench(&result, args.json, args.html.as_deref())
}
