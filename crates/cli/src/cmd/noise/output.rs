//! What `virtprof noise` prints: the rtla osnoise top table with STEAL and HYP columns, the
//! noise time per class, an optional histogram, JSON, and the stop snapshot.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use virtprof_analysis::noise::ByClass;
use virtprof_model::event::{Event, EventKind};
use virtprof_sinks::table::UNKNOWN;

use super::guest::GuestReport;
use super::{CpuReport, NoiseReport};

/// How results are printed.
#[derive(Debug, Clone, Copy)]
pub struct Show {
    pub json: bool,
    /// Add the sample-length histogram to the table.
    pub hist: bool,
}

pub fn print(report: &NoiseReport, show: Show) -> anyhow::Result<ExitCode> {
    if show.json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", table(report));
        if show.hist {
            print!("{}", hist(report));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The virtualization columns: steal, and the hypervisor (split into lightweight and
/// heavyweight when this side can tell).
fn hyp(c: &ByClass) -> u64 {
    c.hyp + c.hyp_lw + c.hyp_hw
}

pub fn table(r: &NoiseReport) -> String {
    let mut s = String::new();
    let where_ = if r.in_vm {
        "inside a VM: unexplained noise is virtualization (STEAL from the steal-time counter, the rest HYP)"
    } else {
        "bare metal: unexplained noise is hardware (HW)"
    };
    let _ = writeln!(s, "OS noise, {} clock, threshold {} us; {where_}; time in us", r.clock, us(r.threshold_ns));
    if !r.traced {
        let _ = writeln!(s, "no trace (--no-trace, or tracefs unavailable): nothing below is attributed");
    } else if !r.missing_events.is_empty() {
        let _ =
            writeln!(s, "events this kernel lacks (their time counts as unexplained): {}", r.missing_events.join(", "));
    }
    let _ = writeln!(
        s,
        "{:>4} {:>12} {:>10} {:>9} {:>10} {:>8} {:>6} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "CPU",
        "Runtime",
        "Noise",
        "% Avail",
        "Max Single",
        "HW",
        "NMI",
        "IRQ",
        "Softirq",
        "Thread",
        "STEAL",
        "HYP",
        "Samples"
    );
    for c in &r.cpus {
        let t = &c.total;
        let _ = writeln!(
            s,
            "{:>4} {:>12.0} {:>10.1} {:>9.4} {:>10.1} {:>8} {:>6} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7}",
            c.cpu,
            us(t.runtime_ns),
            us(t.noise_ns),
            t.available_pct,
            us(t.max_single_ns),
            t.counts.hw,
            t.counts.nmi,
            t.counts.irq,
            t.counts.softirq,
            t.counts.thread,
            t.counts.steal,
            hyp(&t.counts),
            t.samples
        );
    }
    if let Some(probe) = &r.probe {
        let _ = writeln!(s, "probe {probe} between every two reads: each sample is one exit timed from inside");
        for c in &r.cpus {
            let t = &c.total;
            let average =
                if t.samples == 0 { "-".to_string() } else { format!("{:.2}", us(t.noise_ns) / t.samples as f64) };
            let min = t.min_single_ns.map_or_else(|| "-".to_string(), |m| format!("{:.2}", us(m)));
            let _ = writeln!(s, "{:>4}  {} exits, average {average} us, min {min} us", c.cpu, t.samples);
        }
    }
    let _ = writeln!(s, "noise time by cause (us):");
    for c in &r.cpus {
        let n = &c.total.noise_ns_by_class;
        let _ = writeln!(
            s,
            "{:>4}  hw {:.1}  nmi {:.1}  irq {:.1}  softirq {:.1}  thread {:.1}  steal {:.1}  hyp {:.1}",
            c.cpu,
            us(n.hw),
            us(n.nmi),
            us(n.irq),
            us(n.softirq),
            us(n.thread),
            us(n.steal),
            us(hyp(n))
        );
    }
    for c in r.cpus.iter().filter(|c| !c.threads.is_empty()) {
        let who: Vec<String> = c
            .threads
            .iter()
            .map(|t| format!("{}({}) {:.1} us in {}", t.comm, t.tid, us(t.noise_ns), t.samples))
            .collect();
        let _ = writeln!(s, "threads on CPU {}: {}", c.cpu, who.join(", "));
    }
    let loops: Vec<String> = r.cpus.iter().map(|c| format!("CPU {} {:.0} ns", c.cpu, c.loop_ns)).collect();
    let _ = writeln!(s, "loop period: {} (a gap must exceed the threshold to count)", loops.join(", "));
    // With a probe every step is meant to be a sample.
    for c in r.cpus.iter().filter(|c| r.probe.is_none() && c.loop_ns * 2.0 > r.threshold_ns as f64) {
        let _ = writeln!(
            s,
            "warning: CPU {}'s loop period ({:.0} ns) is over half the threshold: the loop's own steps count as noise; raise --threshold",
            c.cpu, c.loop_ns
        );
    }
    let dropped: u64 = r.cpus.iter().map(|c| c.dropped_samples).sum();
    if dropped > 0 {
        let _ = writeln!(s, "warning: {dropped} samples did not fit the buffer and are not attributed");
    }
    if r.lost_events > 0 {
        let _ = writeln!(s, "warning: the kernel lost {} trace events: attribution is incomplete", r.lost_events);
    }
    if let Some(stop) = &r.stopped {
        let _ = writeln!(
            s,
            "stopped: a {:.1} us sample on CPU {} at {} ns; trace snapshot in {}",
            us(stop.len_ns),
            stop.cpu,
            stop.start_ns,
            stop.snapshot
        );
    }
    s
}

fn hist(r: &NoiseReport) -> String {
    let mut s = String::new();
    let _ = write!(s, "{:>8}", "us");
    for c in &r.cpus {
        let _ = write!(s, " {:>9}", format!("CPU-{:03}", c.cpu));
    }
    s.push('\n');
    let entries = r.cpus.first().map_or(0, |c| c.hist.len());
    for b in 0..entries {
        if r.cpus.iter().all(|c| c.hist[b] == 0) {
            continue;
        }
        let _ = write!(s, "{:>8}", b as u64 * r.bucket_ns / 1000);
        for c in &r.cpus {
            let _ = write!(s, " {:>9}", c.hist[b]);
        }
        s.push('\n');
    }
    let row = |s: &mut String, name: &str, f: &dyn Fn(&CpuReport) -> String| {
        let _ = write!(s, "{name:>8}");
        for c in &r.cpus {
            let _ = write!(s, " {:>9}", f(c));
        }
        s.push('\n');
    };
    row(&mut s, "over:", &|c| c.hist_over.to_string());
    row(&mut s, "count:", &|c| c.total.samples.to_string());
    row(&mut s, "max:", &|c| format!("{:.1}", us(c.total.max_single_ns)));
    s
}

/// Write the events within 10 ms of the sample `[start, start + len)` as text; returns the path.
pub fn write_snapshot(
    path: &Path,
    events: &[Event],
    names: &HashMap<u32, String>,
    start: u64,
    len: u64,
) -> anyhow::Result<String> {
    let name = |tid: u32| names.get(&tid).map_or("?", String::as_str);
    const MARGIN_NS: u64 = 10_000_000;
    let (from, to) = (start.saturating_sub(MARGIN_NS), start + len + MARGIN_NS);
    let mut around: Vec<&Event> = events.iter().filter(|e| e.ts >= from && e.ts <= to).collect();
    around.sort_by_key(|e| e.ts);
    let mut s = format!(
        "# virtprof noise stop: sample [{start}, {}) ns, {len} ns long; events from {from} to {to}\n",
        start + len
    );
    for e in around {
        let mark = if e.ts >= start && e.ts < start + len { '*' } else { ' ' };
        let what = match e.kind {
            EventKind::SchedSwitch { prev_tid, next_tid, .. } => {
                format!("sched_switch {}({prev_tid}) -> {}({next_tid})", name(prev_tid), name(next_tid))
            }
            EventKind::IrqEntry { irq } => format!("irq_handler_entry irq={irq}"),
            EventKind::IrqExit { irq } => format!("irq_handler_exit irq={irq}"),
            EventKind::SoftirqEntry { vec } => format!("softirq_entry vec={vec}"),
            EventKind::SoftirqExit { vec } => format!("softirq_exit vec={vec}"),
            EventKind::IrqVectorEntry { vector, .. } => format!("irq_vector_entry vector={vector}"),
            EventKind::IrqVectorExit { vector, .. } => format!("irq_vector_exit vector={vector}"),
            EventKind::Nmi { handler_ns } => format!("nmi_handler {handler_ns} ns"),
            other => other.typed_name().unwrap_or("event").to_string(),
        };
        let _ = writeln!(s, "{mark} {:>16} cpu{} tid {:>7} {what}", e.ts, e.cpu, e.tid);
    }
    virtprof_host::output::write_file(path, s.as_bytes(), virtprof_host::output::Privacy::Private)?;
    Ok(path.display().to_string())
}

/// The `--testvm` report: the seed's guest columns, then the host's explanation.
/// The guest-side report (`--testvm`, `--host-recording`): JSON or the table.
pub fn print_guest(r: &GuestReport, show: Show) -> anyhow::Result<ExitCode> {
    if show.json {
        println!("{}", serde_json::to_string_pretty(r)?);
    } else {
        print!("{}", guest_table(r));
    }
    Ok(ExitCode::SUCCESS)
}

fn guest_table(r: &GuestReport) -> String {
    let mut s = String::new();
    let g = &r.guest;
    let _ = writeln!(
        s,
        "guest noise (testvm vCPU thread {} on CPU {}, threshold {} us, {} samples; time in us)",
        r.vcpu_tid,
        r.cpu,
        us(r.threshold_ns),
        g.samples
    );
    let _ = writeln!(
        s,
        "{:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "NOISE", "STEAL", "VIRT", "HW_NOISE", "HW", "LW_EX", "HW_EX"
    );
    let _ = writeln!(
        s,
        "{:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>8} {:>8} {:>8}",
        us(g.noise_ns),
        us(g.steal_ns),
        us(g.virt_ns),
        us(g.hw_noise_ns),
        g.hw_count,
        g.lw_exits,
        g.hw_exits
    );
    let _ = writeln!(
        s,
        "steal: guest record {:.1} us, vCPU thread schedstat wait {:.1} us, host trace {}",
        us(g.steal_ns),
        us(r.schedstat_wait_ns),
        r.host.host_steal_ns.map_or_else(|| UNKNOWN.to_string(), |ns| format!("{:.1} us", us(ns)))
    );
    if r.injected > 0 || r.inject_hz.is_some_and(|hz| hz > 0) {
        let rate = r.inject_hz.map_or_else(String::new, |hz| format!(" at {hz} Hz"));
        let _ = writeln!(
            s,
            "injected heavyweight exits: {}{rate}; guest samples with a heavyweight exit: {}",
            r.injected, g.hw_exit_samples
        );
    }
    let _ = writeln!(
        s,
        "host explanation (clock map: {:.6} ns/tick, error bound ±{:.1} us):",
        r.clock.ns_per_tick,
        us(r.clock.bound_ns)
    );
    for (cause, t) in &r.host.by_cause {
        let mut name =
            serde_json::to_value(cause).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        // Without every explaining event class, what is left is not attributed, not known to
        // have no host cause.
        if *cause == virtprof_analysis::noise::HostCause::Unexplained && r.host.explained_pct.is_none() {
            name = "unattributed".into();
        }
        let _ = writeln!(
            s,
            "  {name:<13} {:>7} samples {:>12} (besides steal)",
            t.samples,
            t.ns.map_or_else(|| UNKNOWN.to_string(), |ns| format!("{:.1} us", us(ns)))
        );
    }
    for (who, ns) in &r.host.preemptors {
        let _ = writeln!(s, "  preempted by {who}: {:.1} us", us(*ns));
    }
    for (reason, n) in &r.host.exit_reasons {
        let _ = writeln!(s, "  exit {reason}: {n} samples");
    }
    match r.host.explained_pct {
        Some(pct) => {
            let _ = writeln!(s, "explained by host events: {pct:.1} % of guest noise time");
        }
        None => {
            let _ = writeln!(s, "explained by host events: {UNKNOWN}");
        }
    }
    for u in &r.host.unavailable {
        let _ = writeln!(s, "unavailable: {u}");
    }
    if r.lost_events > 0 {
        let _ = writeln!(s, "warning: the kernel lost {} trace events: attribution is incomplete", r.lost_events);
    }
    if r.dropped_samples > 0 {
        let _ = writeln!(s, "warning: {} guest samples did not fit the guest's buffer", r.dropped_samples);
    }
    s
}
