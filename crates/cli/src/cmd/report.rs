//! `virtprof report FILE`: what a recording holds — host, VMs, duration, loss — and, for
//! `record --interval` recordings, the interval analyses: per-metric totals and rates, phases,
//! and the most correlated metric pairs.

use std::process::ExitCode;

use serde::Serialize;
use virtprof_analysis::correlate::{self, Method};
use virtprof_analysis::intervals::{IntervalTable, TraceBinner};
use virtprof_analysis::phases;
use virtprof_model::interval::{Entity, SeriesKind};
use virtprof_trace::merge::merge_cpus;

use crate::args::ReportArgs;
use crate::exit::usage;
use crate::recording::{DecoderNames, Recording};

/// Most clusters phase detection tries.
const MAX_PHASES: usize = 8;

/// The interval table of a recording with the trace-derived columns and per-VM sums added.
pub fn interval_table(path: &std::path::Path) -> anyhow::Result<(Recording, IntervalTable, u64)> {
    let mut recording = Recording::open_any(path, None)?;
    let Some(mut table) = recording.intervals.take() else {
        return Err(usage(format!(
            "'{}' has no interval rows; record with `virtprof record --interval 10ms ...`",
            path.display()
        )));
    };
    let host = crate::cmd::sched::recording_tasks(&recording);
    let vcpus = host
        .vms(&[], &[])
        .iter()
        .flat_map(|vm| vm.vcpus.iter().map(move |&(index, tid)| (tid, Entity::Vcpu { pid: vm.pid, index })))
        .collect();
    let mut decoder = recording.decoder(&["kvm", "sched", "irq", "irq_vectors"])?;
    let outside = {
        let mut binner = TraceBinner::new(&mut table, vcpus);
        merge_cpus(&mut decoder, &recording.streams(), |e, d| binner.on_event(e, &DecoderNames(d)))?;
        binner.outside
    };
    table.add_vm_sums();
    Ok((recording, table, outside))
}

/// The features phase detection and correlation look at: host-level delta metrics (app
/// counters and the phase gauge excluded: they are what the analysis should rediscover).
pub fn features(table: &IntervalTable) -> Vec<(String, Vec<f64>)> {
    table.host_metrics().into_iter().filter(|(m, _)| !m.starts_with("app.")).collect()
}

#[derive(Serialize)]
struct Output {
    recording: String,
    origin: String,
    trace_clock: String,
    cpus: usize,
    vms: Vec<VmOut>,
    lost_events: u64,
    intervals: IntervalsOut,
    metrics: Vec<MetricOut>,
    phases: PhasesOut,
    correlations: Vec<PairOut>,
    unavailable: Vec<(String, String)>,
}

#[derive(Serialize)]
struct VmOut {
    pid: u32,
    name: String,
    kind: String,
}

#[derive(Serialize)]
struct IntervalsOut {
    interval_ns: u64,
    rows: usize,
    seconds: f64,
    missed: u64,
    overwritten: u64,
    events_outside_rows: u64,
}

#[derive(Serialize)]
struct MetricOut {
    entity: String,
    metric: String,
    unit: String,
    total: f64,
    per_second: f64,
}

#[derive(Serialize)]
struct PhasesOut {
    k: usize,
    silhouette: f64,
    /// Start time (ns since the first row) of each phase change.
    boundaries_ns: Vec<u64>,
    /// Row of each phase change (the first row of the new phase).
    boundary_rows: Vec<usize>,
    ids: Vec<usize>,
}

#[derive(Serialize)]
struct PairOut {
    a: String,
    b: String,
    r: f64,
}

pub fn run(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    let (recording, table, outside) = interval_table(&args.file)?;
    let footer = recording.footer.clone().unwrap_or_default();
    let seconds = table.seconds().max(f64::MIN_POSITIVE);
    let mut metrics: Vec<MetricOut> = table
        .columns
        .iter()
        .filter(|c| c.series.kind == SeriesKind::Delta && matches!(c.series.entity, Entity::Vm(_) | Entity::Cpu(_)))
        .map(|c| MetricOut {
            entity: c.series.entity.to_string(),
            metric: c.series.metric.clone(),
            unit: c.series.unit.clone(),
            total: c.total(),
            per_second: c.total() / seconds,
        })
        .filter(|m| m.total != 0.0)
        .collect();
    metrics.sort_by(|a, b| a.entity.cmp(&b.entity).then_with(|| a.metric.cmp(&b.metric)));
    let features = features(&table);
    let rows: Vec<Vec<f64>> = (0..table.rows()).map(|r| features.iter().map(|(_, v)| v[r]).collect()).collect();
    let found = phases::detect(&rows, MAX_PHASES);
    let t0 = table.start_ns.first().copied().unwrap_or(0);
    let method = if args.spearman { Method::Spearman } else { Method::Pearson };
    let m = correlate::matrix(&features, method);
    let mut pairs = Vec::new();
    for i in 0..m.names.len() {
        for j in i + 1..m.names.len() {
            let r = m.get(i, j);
            if r.is_finite() {
                pairs.push(PairOut { a: m.names[i].clone(), b: m.names[j].clone(), r });
            }
        }
    }
    pairs.sort_by(|x, y| y.r.abs().total_cmp(&x.r.abs()));
    pairs.truncate(args.top);
    let identities = recording.metadata.vm_identities.iter().chain(footer.vm_identities.iter());
    let out = Output {
        recording: args.file.display().to_string(),
        origin: recording.metadata.origin.clone(),
        trace_clock: recording.metadata.trace_clock.clone(),
        cpus: recording.metadata.cpus.len(),
        vms: identities.map(|v| VmOut { pid: v.pid, name: v.name.clone(), kind: v.kind.clone() }).collect(),
        lost_events: footer.cpu_loss.iter().map(|l| l.1 + l.2).sum(),
        intervals: IntervalsOut {
            interval_ns: table.interval_ns,
            rows: table.rows(),
            seconds: table.seconds(),
            missed: footer.intervals.missed,
            overwritten: footer.intervals.overwritten,
            events_outside_rows: outside,
        },
        metrics,
        phases: PhasesOut {
            k: found.k,
            silhouette: found.silhouette,
            boundaries_ns: found.boundaries().iter().map(|&r| table.start_ns[r] - t0).collect(),
            boundary_rows: found.boundaries(),
            ids: found.ids.clone(),
        },
        correlations: pairs,
        unavailable: table.unavailable.clone(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_text(&out);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_text(out: &Output) {
    let iv = &out.intervals;
    println!("{} ({}, trace clock {}), {} CPUs", out.recording, out.origin, out.trace_clock, out.cpus);
    for vm in &out.vms {
        println!("  VM {} {} ({})", vm.pid, vm.name, vm.kind);
    }
    println!(
        "{} intervals of {} over {:.3} s; missed {}, overwritten {}; lost events {}",
        iv.rows,
        virtprof_model::units::format_duration_ns(iv.interval_ns),
        iv.seconds,
        iv.missed,
        iv.overwritten,
        out.lost_events
    );
    println!("\n{:<22} {:<36} {:>16} {:>14}", "ENTITY", "METRIC", "TOTAL", "PER SECOND");
    for m in &out.metrics {
        println!("{:<22} {:<36} {:>16.0} {:>14.1}", m.entity, m.metric, m.total, m.per_second);
    }
    let p = &out.phases;
    let starts: Vec<String> = p.boundaries_ns.iter().map(|&ns| format!("{:.3}s", ns as f64 / 1e9)).collect();
    println!(
        "\nphases: {} (silhouette {:.2}); changes at {}",
        p.k,
        p.silhouette,
        if starts.is_empty() { "-".to_string() } else { starts.join(", ") }
    );
    println!("\nmost correlated metrics (all vCPUs and CPUs summed):");
    for pair in &out.correlations {
        println!("  {:+.2}  {}  ~  {}", pair.r, pair.a, pair.b);
    }
    if !out.unavailable.is_empty() {
        println!("\nnot counted on this host:");
        for (metric, reason) in &out.unavailable {
            println!("  {metric}: {reason}");
        }
    }
}
