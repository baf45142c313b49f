//! `virtprof exits --duration D --bpf`: exits counted in the kernel (the eBPF program `top` and
//! `serve` use) for D, then the per-reason table; no event is handed to user space. What the
//! program cannot tell (the per-reason light/heavy split, descheduling, per-vCPU time) is
//! printed as unknown.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;
use virtprof_analysis::exits::ExitReport;
use virtprof_engine::kernel_counts::KernelCounter;
use virtprof_engine::kernel_exits::exit_report;
use virtprof_host::stop::STOP_REQUESTED;
use virtprof_model::units::format_duration;
use virtprof_session::{DecoderNames, EVIDENCE_EVENTS};
use virtprof_sinks::Table;
use virtprof_store::recording::Task;
use virtprof_trace::decode::Decoder;
use virtprof_trace::tracefs::{load_layout, Tracefs};

use crate::args::{ExitsArgs, GroupBy};
use crate::exit::usage;
use crate::exit_table::{count, exits_line, reason_table, time_line};

/// `--json`: the report's shape, with per-thread rows whose time is unknown.
#[derive(Serialize)]
struct Output<'a> {
    source: &'a virtprof_analysis::exits::Source,
    totals: &'a virtprof_analysis::exits::Totals,
    by_reason: &'a [virtprof_analysis::exits::ReasonRow],
    by_vcpu: Vec<ThreadRow>,
    by_vm: Vec<VmRow>,
    /// Events the program could not count: a map full, or skipped by the kernel.
    lost_events: u64,
    seconds: f64,
}

#[derive(Serialize)]
struct ThreadRow {
    tid: u32,
    thread: String,
    /// Its process: the VMM.
    pid: Option<u32>,
    vcpu: Option<u32>,
    exits: u64,
    lightweight: Option<u64>,
    heavyweight: Option<u64>,
    /// Unknown: the program times exits per reason only.
    total_ns: Option<u64>,
}

#[derive(Serialize)]
struct VmRow {
    pid: u32,
    vcpus: usize,
    exits: u64,
    lightweight: Option<u64>,
    heavyweight: Option<u64>,
}

pub fn run(args: &ExitsArgs) -> anyhow::Result<ExitCode> {
    let before = host_tasks();
    for pid in &args.vm {
        if !before.iter().any(|t| t.pid == *pid) {
            return Err(usage(format!("--vm {pid}: no such process on this host")));
        }
    }
    let tracefs = Tracefs::locate_or_mount()?;
    let mut counter = KernelCounter::start(tracefs.root(), &EVIDENCE_EVENTS, true).map_err(|e| {
        usage(format!("--bpf: the in-kernel program is unavailable here ({e}); without --bpf, exits traces instead"))
    })?;
    let decoder = Decoder::new(load_layout(tracefs.root(), &["kvm"])?);
    virtprof_host::stop::install_handler();
    eprintln!("virtprof: counting in the kernel for {} (Ctrl-C to stop early)...", format_duration(args.duration));
    let started = Instant::now();
    // The host's threads, looked at twice a second: the program counts by thread id only, and
    // a VM that comes and goes meanwhile is still named (one living less than that may not be).
    let mut tasks: BTreeMap<u32, Task> = before.into_iter().map(|t| (t.tid, t)).collect();
    let mut looked = Instant::now();
    while started.elapsed() < args.duration && !STOP_REQUESTED.load(Ordering::Relaxed) {
        std::thread::sleep((args.duration - started.elapsed().min(args.duration)).min(Duration::from_millis(100)));
        if looked.elapsed() >= Duration::from_millis(500) {
            host_tasks().into_iter().for_each(|t| _ = tasks.entry(t.tid).or_insert(t));
            looked = Instant::now();
        }
    }
    let counts = counter.counts()?;
    let seconds = started.elapsed().as_secs_f64();
    drop(counter);
    host_tasks().into_iter().for_each(|t| _ = tasks.entry(t.tid).or_insert(t));
    let tasks: Vec<Task> = tasks.into_values().collect();
    let tids: Vec<u32> = tasks
        .iter()
        .filter(|t| args.vm.is_empty() || args.vm.contains(&t.pid))
        .filter(|t| args.vcpu.is_none() || virtprof_kvm::discover::vcpu_index(&t.comm) == args.vcpu)
        .map(|t| t.tid)
        .collect();
    let filtered = !args.vm.is_empty() || args.vcpu.is_some();
    let report = exit_report(&counts, &DecoderNames(&decoder), filtered.then_some(&tids[..]));
    let threads = thread_rows(&report, &tasks);
    let vms = vm_rows(&threads);
    let mut out = crate::output::stdout();
    if args.json {
        let output = Output {
            source: &report.source,
            totals: &report.totals,
            by_reason: &report.by_reason,
            by_vcpu: threads,
            by_vm: vms,
            lost_events: report.totals.lost_events,
            seconds,
        };
        crate::output::write_json_pretty(&mut out, &output)?;
        return Ok(ExitCode::SUCCESS);
    }
    let table = match args.by {
        GroupBy::Reason => reason_table(&report.by_reason),
        GroupBy::Vcpu => thread_table(&threads),
        GroupBy::Vm => vm_table(&vms),
    };
    if args.csv {
        table.write_csv(&mut out)?;
        return Ok(ExitCode::SUCCESS);
    }
    table.write_text(&mut out)?;
    footer(&mut out, &report, seconds)?;
    Ok(ExitCode::SUCCESS)
}

fn footer(out: &mut impl Write, report: &ExitReport, seconds: f64) -> std::io::Result<()> {
    let t = &report.totals;
    let exits = match t.lightweight {
        Some(_) => exits_line(t),
        None => format!("{} exits to the VMM (those handled in the kernel: unknown, see below)", t.exits),
    };
    writeln!(out, "\n{exits} in {seconds:.1} s | source: {}", report.source.path)?;
    let events: Vec<String> = report.source.events.iter().map(|(e, n)| format!("{e} {n}")).collect();
    writeln!(out, "events counted: {}", events.join(", "))?;
    if let Some(line) = time_line(t) {
        writeln!(out, "{line}")?;
    }
    let lost = match t.lost_events {
        0 => "none".to_string(),
        n => format!("{n} (events the program could not count: a map full, or skipped by the kernel)"),
    };
    writeln!(out, "lost events: {lost}")?;
    for note in &report.source.unavailable {
        writeln!(out, "unavailable: {note}")?;
    }
    Ok(())
}

/// Every thread on the host now.
fn host_tasks() -> Vec<Task> {
    virtprof_host::procfs::all_threads(Path::new("/proc"))
        .into_iter()
        .map(|(tid, pid, comm)| Task { tid, pid, comm })
        .collect()
}

fn thread_rows(report: &ExitReport, tasks: &[Task]) -> Vec<ThreadRow> {
    report
        .by_vcpu
        .iter()
        .map(|v| {
            let task = tasks.iter().find(|t| t.tid == v.tid);
            let thread = task.map(|t| t.comm.clone()).unwrap_or_default();
            ThreadRow {
                tid: v.tid,
                vcpu: virtprof_kvm::discover::vcpu_index(&thread),
                thread,
                pid: task.map(|t| t.pid),
                exits: v.exits,
                lightweight: v.lightweight,
                heavyweight: v.heavyweight,
                total_ns: None,
            }
        })
        .collect()
}

fn vm_rows(threads: &[ThreadRow]) -> Vec<VmRow> {
    let mut vms: BTreeMap<u32, VmRow> = Default::default();
    for t in threads {
        let Some(pid) = t.pid else { continue };
        let vm =
            vms.entry(pid).or_insert(VmRow { pid, vcpus: 0, exits: 0, lightweight: Some(0), heavyweight: Some(0) });
        vm.vcpus += 1;
        vm.exits += t.exits;
        vm.lightweight = vm.lightweight.zip(t.lightweight).map(|(a, b)| a + b);
        vm.heavyweight = vm.heavyweight.zip(t.heavyweight).map(|(a, b)| a + b);
    }
    vms.into_values().collect()
}

fn thread_table(rows: &[ThreadRow]) -> Table {
    let mut t = Table::new(["TID", "THREAD", "VM", "VCPU", "EXITS", "LIGHT", "HEAVY", "TOTAL_US"]);
    for r in rows {
        t.row([
            r.tid.to_string(),
            r.thread.clone(),
            r.pid.map(|p| format!("pid {p}")).unwrap_or_default(),
            r.vcpu.map(|i| i.to_string()).unwrap_or_default(),
            r.exits.to_string(),
            count(r.lightweight),
            count(r.heavyweight),
            "unknown".to_string(),
        ]);
    }
    t
}

fn vm_table(rows: &[VmRow]) -> Table {
    let mut t = Table::new(["VM", "GROUPED_BY", "VCPUS", "EXITS", "LIGHT", "HEAVY", "TOTAL_US"]);
    for v in rows {
        t.row([
            format!("pid {}", v.pid),
            "process".to_string(),
            v.vcpus.to_string(),
            v.exits.to_string(),
            count(v.lightweight),
            count(v.heavyweight),
            "unknown".to_string(),
        ]);
    }
    t
}
