//! The report's data: one serializable value that `--json` prints, the text summary reads and
//! the HTML page draws (documented in docs/report.md).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use virtprof_analysis::correlate::{self, Method};
use virtprof_analysis::exits::{ReasonRow, Source, Totals};
use virtprof_analysis::intervals::IntervalTable;
use virtprof_analysis::phases;
use virtprof_analysis::qos::{window_report, WindowReport};
use virtprof_analysis::sched::Span;
use virtprof_model::evidence::{Class, Figure};
use virtprof_model::interval::{Entity, SeriesKind};
use virtprof_model::{Pid, Tid, VcpuThread};

use crate::pass::{features, Analysis};
use virtprof_session::Session;

/// Most clusters phase detection tries.
const MAX_PHASES: usize = 8;

/// A phase lasts longer than this; shorter excursions (a VM starved of CPU for an interval
/// or two by other host load) are smoothed away.
const MIN_PHASE_NS: u64 = 20_000_000;

/// How many rows an excursion may span and still be smoothed away: at least one.
fn blip_rows(interval_ns: u64) -> usize {
    usize::try_from(MIN_PHASE_NS.div_ceil(interval_ns.max(1))).unwrap_or(usize::MAX).clamp(1, 100)
}

/// Most points a drawn time series gets (longer ones are averaged down).
const MAX_POINTS: usize = 1500;

#[derive(Serialize)]
pub struct Report {
    pub recording: String,
    pub origin: String,
    pub trace_clock: String,
    pub host: BTreeMap<String, String>,
    pub cpus: usize,
    /// First to last event (or interval row), seconds (None: its timestamps are not time).
    pub duration_s: Option<f64>,
    /// How its timestamps are read as time where they needed a conversion (cycles at a
    /// frequency, and where the frequency came from), or why they cannot be.
    pub clock: Option<String>,
    /// Figures the recording cannot give, each with its reason (the exits' and accounting's
    /// own lists say which of theirs).
    pub unavailable: Vec<String>,
    /// Trace events decoded.
    pub events: u64,
    /// Events lost in all (the kernel's counts, or at least what the pages said).
    pub lost_events: u64,
    /// Per CPU, with where the gaps were; `complete` false when the figure is unknown.
    pub loss: virtprof_model::Loss,
    /// The loss as one line (what `record` printed, with where).
    pub lost_events_text: String,
    /// Byte offset where the file was cut short, if it was.
    pub truncated_at: Option<u64>,
    pub vms: Vec<VmOut>,
    pub exits: ExitsOut,
    /// Run/wait/blocked per VM and vCPU over the whole run (`top`'s table).
    pub accounting: Option<WindowReport>,
    /// The same per vCPU over time.
    pub timeline: Option<Timeline>,
    /// `record --interval` analyses.
    pub intervals: Option<IntervalsOut>,
    /// Guest agents' layers (`record --agent`), on the recording's clock.
    pub guests: Vec<GuestOut>,
    /// A guest's own trace beside the host's (`--guest`, or held by the recording).
    pub guest_trace: Option<crate::guest_view::GuestView>,
}

#[derive(Serialize)]
pub struct GuestOut {
    pub agent: u32,
    pub name: String,
    pub address: String,
    pub kernel: String,
    pub cpus: u32,
    pub clocksource: String,
    pub ptp_kvm: Option<String>,
    pub interval_ns: u64,
    pub rows: usize,
    /// Seconds of the recording (from its start) the guest rows cover: first and last.
    pub span_s: Option<(f64, f64)>,
    pub clock: GuestClockOut,
    pub gaps: Vec<GuestGapOut>,
    /// Shares of the guest's CPU time (all its CPUs), percent: user, nice, system, idle,
    /// iowait, irq, softirq, steal.
    pub cpu_pct: Vec<(String, f64)>,
    /// Every other counter's total and rate, gauges' last level.
    pub metrics: Vec<MetricOut>,
    /// Per row on the recording's time: seconds from its start, and each CPU-time share.
    pub timeline: GuestTimeline,
    pub unavailable: Vec<(String, String)>,
    /// The link's figures (None when the recording has no footer).
    pub link: Option<virtprof_store::recording::AgentFooter>,
    /// The clock checked against the guest's port writes the host traced
    /// (`agent --marker-port`).
    pub markers: Option<MarkersOut>,
    /// The guest's noise loop per CPU (`agent --noise`).
    pub noise: Vec<GuestNoiseOut>,
}

#[derive(Serialize)]
pub struct MarkersOut {
    pub port: u16,
    #[serde(flatten)]
    pub check: virtprof_model::guest::MarkerCheck,
}

#[derive(Serialize)]
pub struct GuestNoiseOut {
    pub cpu: u32,
    #[serde(flatten)]
    pub noise: virtprof_model::guest::NoiseSummary,
}

#[derive(Serialize, Default)]
pub struct GuestTimeline {
    pub t_s: Vec<f64>,
    /// Field name → percent of the guest's CPU time in each row.
    pub cpu_pct: BTreeMap<String, Vec<f64>>,
}

#[derive(Serialize)]
pub struct GuestClockOut {
    /// What measured the points: `ptp_kvm` or `exchanges`.
    pub source: &'static str,
    pub points: usize,
    /// Guest minus host at the first point, ns.
    pub offset_ns: Option<i64>,
    pub drift_ppm: f64,
    pub median_bound_ns: u64,
    pub max_bound_ns: u64,
}

#[derive(Serialize)]
pub struct GuestGapOut {
    pub from_s: f64,
    pub to_s: f64,
    pub cause: String,
}

#[derive(Serialize)]
pub struct VmOut {
    pub pid: Pid,
    pub name: String,
    pub kind: String,
    /// (index, thread id) per vCPU.
    pub vcpus: Vec<VcpuThread>,
}

#[derive(Serialize)]
pub struct ExitsOut {
    pub source: Source,
    pub totals: Totals,
    /// The most frequent reasons (`--top-exits`), as `exits --json` lists them.
    pub by_reason: Vec<ReasonRow>,
    /// Duration histograms of the timed reasons among them.
    pub histograms: Vec<HistogramOut>,
}

#[derive(Serialize)]
pub struct HistogramOut {
    pub reason: String,
    /// (lowest duration in the bucket in ns, exits), non-empty buckets, shortest first.
    pub buckets: Vec<(u64, u64)>,
}

#[derive(Serialize)]
pub struct Timeline {
    pub bucket_ns: u64,
    /// Bucket starts, seconds since the report's origin.
    pub t_s: Vec<f64>,
    pub vcpus: Vec<VcpuTimeline>,
}

#[derive(Serialize)]
pub struct VcpuTimeline {
    pub vm: u32,
    pub index: u32,
    pub tid: u32,
    /// Percent of each bucket.
    pub running_pct: Vec<f64>,
    pub waiting_pct: Vec<f64>,
    pub blocked_pct: Vec<f64>,
}

#[derive(Serialize)]
pub struct IntervalsOut {
    pub interval_ns: u64,
    pub rows: usize,
    pub seconds: f64,
    pub missed: u64,
    pub overwritten: u64,
    pub events_outside_rows: u64,
    pub metrics: Vec<MetricOut>,
    pub phases: PhasesOut,
    pub correlations: Vec<PairOut>,
    /// The whole correlation matrix over the host-level metrics (null: undefined).
    pub matrix: MatrixOut,
    /// Host-level metrics over time, per second, averaged down to at most 1500 points.
    pub series: SeriesOut,
    /// Counters this host refused, with the kernel's reason.
    pub unavailable: Vec<(String, String)>,
}

#[derive(Serialize)]
pub struct MetricOut {
    pub entity: String,
    pub metric: String,
    pub unit: String,
    pub total: f64,
    pub per_second: f64,
    /// For a perf counter: the share of the time it was counting, over the rows (1 for one
    /// that never took turns on the PMU; below 1, the rest of its total is scaled up by
    /// time_enabled / time_running). Null for a figure that is no perf counter (tracepoint
    /// counts, KVM stats, /proc), which is never scaled.
    pub measured: Option<f64>,
    /// Whether its total is partly an estimate (a perf counter that took turns).
    pub scaled: bool,
}

#[derive(Serialize)]
pub struct PhasesOut {
    pub k: usize,
    pub silhouette: f64,
    /// Start time (ns since the first row) of each phase change.
    pub boundaries_ns: Vec<u64>,
    /// Row of each phase change (the first row of the new phase).
    pub boundary_rows: Vec<usize>,
    pub ids: Vec<usize>,
}

#[derive(Serialize)]
pub struct PairOut {
    pub a: String,
    pub b: String,
    pub r: f64,
}

#[derive(Serialize)]
pub struct MatrixOut {
    pub method: &'static str,
    pub names: Vec<String>,
    pub r: Vec<Vec<Option<f64>>>,
}

#[derive(Serialize)]
pub struct SeriesOut {
    /// Seconds since the report's origin.
    pub t_s: Vec<f64>,
    pub metrics: Vec<SeriesMetric>,
    /// Phase id per point.
    pub phase: Vec<usize>,
}

#[derive(Serialize)]
pub struct SeriesMetric {
    pub name: String,
    pub per_s: Vec<f64>,
}

/// How much the report shows.
pub struct Limits {
    /// Exit reasons listed.
    pub top_exits: usize,
    /// Correlated metric pairs listed.
    pub top_pairs: usize,
    /// How metrics are correlated.
    pub method: Method,
}

/// Assemble the report from one analysis pass.
/// `pio`: the traced port writes to the guests' marker ports, (port, host time) in time order.
pub fn build(path: &Path, recording: &Session, mut analysis: Analysis, limits: &Limits, pio: &[(u16, u64)]) -> Report {
    let md = &recording.metadata;
    let table = analysis.table.take();
    // One time origin for trace and interval rows (both on the recording's clock).
    let first_row = table.as_ref().and_then(|t| t.start_ns.first().copied());
    let origin_ns = [analysis.span_ns.map(|s| s.0), first_row].into_iter().flatten().min().unwrap_or(0);
    let last_row = table.as_ref().and_then(|t| t.end_ns.last().copied());
    let end_ns = [analysis.span_ns.map(|s| s.1), last_row].into_iter().flatten().max().unwrap_or(origin_ns);

    let exits = analysis.exits.take().expect("report asks for exits");
    let names = analysis.names();
    let mut by_reason = exits.by_reason;
    by_reason.truncate(limits.top_exits);
    let histograms = by_reason
        .iter()
        .filter(|r| r.histogram.count() > 0)
        .map(|r| HistogramOut { reason: r.reason.clone(), buckets: r.histogram.buckets().collect() })
        .collect();
    let vms = analysis.vms.clone();
    let accounting = analysis.total.as_ref().map(|t| window_report(t, "run", &vms, &names, None, &analysis.holdings));
    // A stacked run / wait / blocked chart: only where the recording gives all three.
    let states_known = [Figure::Running, Figure::WaitingBlocked].iter().all(|&f| analysis.holdings.knows(f));
    let timeline = (analysis.total.is_some() && states_known)
        .then(|| timeline(&analysis.buckets, &vms, analysis.bucket_ns, origin_ns));
    let late = recording.footer.iter().flat_map(|f| f.vm_identities.iter());
    let identities: Vec<_> = md.vm_identities.iter().chain(late).collect();
    let vms_out = vms
        .iter()
        .map(|vm| {
            let kind = identities.iter().find(|i| i.pid == vm.pid.0).map_or(vm.kind.clone(), |i| i.kind.clone());
            VmOut { pid: vm.pid, name: vm.name.clone(), kind, vcpus: vm.vcpus.clone() }
        })
        .collect();
    let intervals = table.map(|t| intervals(&t, recording, analysis.outside_rows, origin_ns, limits));
    let traced = analysis.span_ns.unwrap_or((0, 0));
    let guests = recording.guests.iter().map(|g| guest(g, origin_ns, pio, traced)).collect();
    Report {
        guests,
        guest_trace: None,
        recording: path.display().to_string(),
        origin: md.origin.clone(),
        trace_clock: md.trace_clock.clone(),
        host: md.host.clone(),
        cpus: md.cpus.len(),
        duration_s: analysis.holdings.has(Class::Time).then(|| end_ns.saturating_sub(origin_ns) as f64 / 1e9),
        clock: recording.clock_line(),
        unavailable: analysis.holdings.unavailable(&Figure::ALL).iter().map(ToString::to_string).collect(),
        events: analysis.events,
        lost_events: analysis.loss.total(),
        loss: analysis.loss.clone(),
        lost_events_text: analysis.loss.describe(origin_ns),
        truncated_at: recording.truncated_at,
        vms: vms_out,
        exits: ExitsOut { source: exits.source, totals: exits.totals, by_reason, histograms },
        accounting,
        timeline,
        intervals,
    }
}

fn timeline(buckets: &[Span], vms: &[virtprof_analysis::qos::VmInfo], bucket_ns: u64, origin_ns: u64) -> Timeline {
    let t_s = buckets.iter().map(|b| b.start_ns.saturating_sub(origin_ns) as f64 / 1e9).collect();
    let mut vcpus = Vec::new();
    for vm in vms {
        for &VcpuThread { index, tid: Tid(tid) } in &vm.vcpus {
            let mut line = VcpuTimeline {
                vm: vm.pid.0,
                index,
                tid,
                running_pct: vec![],
                waiting_pct: vec![],
                blocked_pct: vec![],
            };
            for b in buckets {
                let c = b.thread(tid, None);
                let width = b.end_ns.saturating_sub(b.start_ns).max(1) as f64 / 100.0;
                line.running_pct.push(c.run_ns as f64 / width);
                line.waiting_pct.push(c.wait_ns as f64 / width);
                line.blocked_pct.push(c.blocked_ns as f64 / width);
            }
            vcpus.push(line);
        }
    }
    Timeline { bucket_ns, t_s, vcpus }
}

/// The mean multiplex ratio (`METRIC.mux`) of a counter over the rows, for `entity` or, for a
/// VM, over its vCPUs; None when the counter never took turns.
fn measured_share(table: &IntervalTable, entity: &Entity, metric: &str) -> Option<f64> {
    let mux = format!("{metric}.mux");
    let ours = |e: &Entity| match (entity, e) {
        (Entity::Vm(vm), Entity::Vcpu { pid, .. }) => vm == pid,
        _ => e == entity,
    };
    let ratios: Vec<f64> = table
        .columns
        .iter()
        .filter(|c| c.series.metric == mux && ours(&c.series.entity))
        .flat_map(|c| c.values.iter().copied().filter(|v| !v.is_nan()))
        .collect();
    (!ratios.is_empty()).then(|| ratios.iter().sum::<f64>() / ratios.len() as f64)
}

fn intervals(
    table: &IntervalTable,
    recording: &Session,
    outside_rows: u64,
    origin_ns: u64,
    limits: &Limits,
) -> IntervalsOut {
    let loss = recording.footer.as_ref().map(|f| f.intervals).unwrap_or_default();
    let seconds = table.seconds().max(f64::MIN_POSITIVE);
    let mut metrics: Vec<MetricOut> = table
        .columns
        .iter()
        .filter(|c| c.series.kind == SeriesKind::Delta && matches!(c.series.entity, Entity::Vm(_) | Entity::Cpu(_)))
        .map(|c| {
            let share = measured_share(table, &c.series.entity, &c.series.metric);
            let counter = c.series.metric.starts_with("perf.");
            MetricOut {
                entity: c.series.entity.to_string(),
                metric: c.series.metric.clone(),
                unit: c.series.unit.clone(),
                total: c.total(),
                per_second: c.total() / seconds,
                measured: share.or(counter.then_some(1.0)),
                scaled: share.is_some_and(|r| r < 1.0),
            }
        })
        .filter(|m| m.total != 0.0)
        .collect();
    metrics.sort_by(|a, b| a.entity.cmp(&b.entity).then_with(|| a.metric.cmp(&b.metric)));

    let features = features(table);
    let rows: Vec<Vec<f64>> = (0..table.rows()).map(|r| features.iter().map(|(_, v)| v[r]).collect()).collect();
    let found = phases::detect(&rows, MAX_PHASES, blip_rows(table.interval_ns));
    let t0 = table.start_ns.first().copied().unwrap_or(0);
    let m = correlate::matrix(&features, limits.method);
    let n = m.names.len();
    let mut pairs = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            let r = m.get(i, j);
            if r.is_finite() {
                pairs.push(PairOut { a: m.names[i].clone(), b: m.names[j].clone(), r });
            }
        }
    }
    pairs.sort_by(|x, y| y.r.abs().total_cmp(&x.r.abs()));
    pairs.truncate(limits.top_pairs);
    let matrix = MatrixOut {
        method: match limits.method {
            Method::Spearman => "spearman",
            Method::Pearson => "pearson",
        },
        names: m.names.clone(),
        r: (0..n).map(|i| (0..n).map(|j| Some(m.get(i, j)).filter(|r| r.is_finite())).collect()).collect(),
    };
    IntervalsOut {
        interval_ns: table.interval_ns,
        rows: table.rows(),
        seconds: table.seconds(),
        missed: loss.missed,
        overwritten: loss.overwritten,
        events_outside_rows: outside_rows,
        metrics,
        phases: PhasesOut {
            k: found.k,
            silhouette: found.silhouette,
            boundaries_ns: found.boundaries().iter().map(|&r| table.start_ns[r] - t0).collect(),
            boundary_rows: found.boundaries(),
            ids: found.ids.clone(),
        },
        correlations: pairs,
        matrix,
        series: series(table, &found.ids, origin_ns),
        unavailable: table.unavailable.clone(),
    }
}

/// Host-level metrics per second, in groups of rows averaged so at most [`MAX_POINTS`] remain.
fn series(table: &IntervalTable, phase_ids: &[usize], origin_ns: u64) -> SeriesOut {
    let rows = table.rows();
    let group = rows.div_ceil(MAX_POINTS).max(1);
    let groups: Vec<std::ops::Range<usize>> = (0..rows).step_by(group).map(|s| s..(s + group).min(rows)).collect();
    let t_s = groups.iter().map(|g| table.start_ns[g.start].saturating_sub(origin_ns) as f64 / 1e9).collect();
    let seconds_of = |g: &std::ops::Range<usize>| {
        (table.end_ns[g.end - 1].saturating_sub(table.start_ns[g.start])).max(1) as f64 / 1e9
    };
    let metrics = table
        .host_metrics()
        .into_iter()
        .filter(|(_, v)| v.iter().any(|x| *x != 0.0 && x.is_finite()))
        .map(|(name, v)| SeriesMetric {
            name,
            per_s: groups
                .iter()
                .map(|g| v[g.clone()].iter().filter(|x| x.is_finite()).sum::<f64>() / seconds_of(g))
                .collect(),
        })
        .collect();
    let phase = groups.iter().map(|g| phase_ids.get(g.start).copied().unwrap_or(0)).collect();
    SeriesOut { t_s, metrics, phase }
}

/// One guest's layer: its clock, gaps, CPU split and counters, on the recording's time.
fn guest(g: &virtprof_session::guest::GuestStream, origin_ns: u64, pio: &[(u16, u64)], traced: (u64, u64)) -> GuestOut {
    let seconds = |ns: u64| ns.saturating_sub(origin_ns) as f64 / 1e9;
    // Placed once: the span and the timeline both come from these.
    let layers = g.layers();
    let first = layers.first().and_then(|l| l.rows.first());
    let last = layers.last().and_then(|l| l.rows.last());
    let span_s = first.zip(last).map(|(a, b)| (seconds(a.start_ns), seconds(b.end_ns)));
    let covered_s = span_s.map_or(0.0, |(a, b)| b - a).max(1e-9);
    let totals = g.totals();
    let mut cpu: Vec<(String, f64)> =
        virtprof_interval::procstat::FIELDS.iter().map(|f| (f.to_string(), 0.0)).collect();
    let mut metrics = Vec::new();
    for (s, total) in &totals {
        match virtprof_agent::collect::cpu_field(&s.name) {
            Some(f) => cpu.iter_mut().filter(|(name, _)| name == f).for_each(|(_, v)| *v += total),
            // Marker times are guest clock readings, checked below, not a metric.
            None if s.name.starts_with("marker.") => {}
            None => metrics.push(MetricOut {
                entity: g.name(),
                metric: s.name.clone(),
                unit: s.unit.clone(),
                total: *total,
                per_second: if s.kind == virtprof_model::guest::SeriesKind::Counter {
                    total / covered_s
                } else {
                    f64::NAN
                },
                measured: None,
                scaled: false,
            }),
        }
    }
    let timeline = guest_timeline(&layers, origin_ns);
    let all: f64 = cpu.iter().map(|(_, v)| v).sum();
    // No /proc/stat rows: the split is unknown, not all zeros.
    if all > 0.0 {
        cpu.iter_mut().for_each(|(_, v)| *v = 100.0 * *v / all);
    } else {
        cpu.clear();
    }
    GuestOut {
        agent: g.agent,
        name: g.name(),
        address: g.address.clone(),
        kernel: g.guest.kernel.clone(),
        cpus: g.guest.cpus,
        clocksource: g.guest.clocksource.clone(),
        ptp_kvm: g.guest.ptp_kvm.clone(),
        interval_ns: g.guest.interval_ns,
        rows: g.rows(),
        span_s,
        clock: GuestClockOut {
            source: g.alignment.source(),
            points: g.alignment.points().len(),
            offset_ns: g.alignment.points().first().map(|p| p.offset_ns),
            drift_ppm: g.alignment.drift_ppm(),
            median_bound_ns: g.alignment.median_bound_ns(),
            max_bound_ns: g.alignment.max_bound_ns(),
        },
        gaps: g
            .gaps
            .iter()
            .map(|x| GuestGapOut { from_s: seconds(x.from_ns), to_s: seconds(x.to_ns), cause: x.cause.clone() })
            .collect(),
        cpu_pct: cpu,
        metrics,
        timeline,
        unavailable: g.guest.unavailable.clone(),
        link: g.footer.clone(),
        markers: g.guest.marker_port.map(|port| {
            let host: Vec<u64> = pio.iter().filter(|(p, _)| *p == port).map(|(_, t)| *t).collect();
            let window_ns = g.guest.interval_ns / 2;
            MarkersOut { port, check: g.alignment.check_markers(&g.markers(), &host, traced, window_ns) }
        }),
        noise: guest_noise(g),
    }
}

/// The guest's noise periods summed per CPU.
fn guest_noise(g: &virtprof_session::guest::GuestStream) -> Vec<GuestNoiseOut> {
    let mut by_cpu: BTreeMap<u32, virtprof_model::guest::NoiseSummary> = BTreeMap::new();
    for b in g.noise.iter() {
        by_cpu.entry(b.cpu).or_default().add(&virtprof_model::guest::NoiseSummary::of(&b));
    }
    by_cpu.into_iter().map(|(cpu, noise)| GuestNoiseOut { cpu, noise }).collect()
}

/// Each row's CPU-time shares, on the recording's time.
fn guest_timeline(layers: &[virtprof_model::guest::GuestLayer], origin_ns: u64) -> GuestTimeline {
    let mut t = GuestTimeline::default();
    for layer in layers {
        let fields: Vec<Option<&str>> =
            layer.series.iter().map(|s| virtprof_agent::collect::cpu_field(&s.name)).collect();
        for row in &layer.rows {
            let mut by_field: BTreeMap<&str, f64> = BTreeMap::new();
            for (f, v) in fields.iter().zip(&row.values) {
                if let Some(f) = f {
                    *by_field.entry(f).or_default() += v;
                }
            }
            let all: f64 = by_field.values().sum();
            if all <= 0.0 {
                continue;
            }
            t.t_s.push(row.start_ns.saturating_sub(origin_ns) as f64 / 1e9);
            for f in virtprof_interval::procstat::FIELDS {
                t.cpu_pct.entry(f.to_string()).or_default().push(100.0 * by_field.get(f).copied().unwrap_or(0.0) / all);
            }
        }
    }
    t
}
