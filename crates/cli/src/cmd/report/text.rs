//! The report as text: a summary a terminal user reads top to bottom.

use std::io::{self, Write};

use virtprof_model::units::format_duration_ns;

use crate::exit_table::reason_table;
use virtprof_engine::report::{GuestNoiseOut, IntervalsOut, Report};

pub fn print(r: &Report, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "{} ({}, trace clock {}), {} CPUs", r.recording, r.origin, r.trace_clock, r.cpus)?;
    if !r.host.is_empty() {
        let facts: Vec<String> = r.host.iter().map(|(k, v)| format!("{k} {v}")).collect();
        writeln!(out, "host: {}", facts.join(", "))?;
    }
    writeln!(
        out,
        "{}, {} events, lost events: {}{}",
        r.duration_s.map_or_else(|| "duration unknown".to_string(), |s| format!("{s:.3} s")),
        r.events,
        r.lost_events_text,
        r.truncated_at.map(|at| format!(" (file cut short at byte {at})")).unwrap_or_default()
    )?;
    if let Some(clock) = &r.clock {
        writeln!(out, "clock: {clock}")?;
    }
    for vm in &r.vms {
        writeln!(out, "  VM {} {} ({}), {} vCPUs", vm.pid, vm.name, vm.kind, vm.vcpus.len())?;
    }

    let t = &r.exits.totals;
    writeln!(out, "\nexits: {}, source: {}", crate::exit_table::exits_line(t), r.exits.source.path)?;
    if let Some(line) = crate::exit_table::time_line(t) {
        writeln!(out, "  {line}")?;
    }
    if !r.exits.by_reason.is_empty() {
        reason_table(&r.exits.by_reason).write_text(&mut *out)?;
    }
    for missing in &r.exits.source.unavailable {
        writeln!(out, "  not available: {missing}")?;
    }

    if let Some(acc) = &r.accounting {
        writeln!(out, "\nvCPU accounting over the run ({}; exits from {}):", acc.length_text(3), acc.exits_source)?;
        crate::qos::table(acc, true).write_text(&mut *out)?;
        if let Some(roles) = crate::qos::roles_table(acc) {
            writeln!(out, "\nWork for each VM by role (IO/EXEC: the VM's I/O accesses per execution of the role):")?;
            roles.write_text(&mut *out)?;
        }
    }
    if let Some(iv) = &r.intervals {
        print_intervals(iv, out)?;
    }
    for g in &r.guests {
        print_guest(g, out)?;
    }
    if let Some(guest) = &r.guest_trace {
        writeln!(out)?;
        crate::guest_table::write_text(guest, out)?;
    }
    Ok(())
}

fn print_guest(g: &virtprof_engine::report::GuestOut, out: &mut impl Write) -> io::Result<()> {
    // Everything here came from inside a guest: escaped before it reaches a terminal.
    let p = virtprof_model::units::printable;
    if g.link.as_ref().is_some_and(|l| l.sessions == 0) {
        let link = g.link.as_ref();
        let rejected =
            link.and_then(|l| l.rejected.as_ref()).map(|(n, why)| format!("it answered {n} time(s) but {why}"));
        let why = link.and_then(|l| l.refused.clone()).or(rejected).unwrap_or_else(|| "it never answered".into());
        writeln!(out, "\nguest {} (agent {}): nothing recorded: {}", p(&g.address), g.agent, p(&why))?;
        for gap in &g.gaps {
            writeln!(out, "  gap {:.3}–{:.3} s: {}", gap.from_s, gap.to_s, p(&gap.cause))?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "\nguest {} (agent {} at {}): kernel {}, {} CPUs, clocksource {}{}",
        p(&g.name),
        g.agent,
        g.address,
        p(&g.kernel),
        g.cpus,
        p(&g.clocksource),
        g.ptp_kvm.as_deref().map(|x| format!(", ptp_kvm {}", p(x))).unwrap_or_default()
    )?;
    let span = g.span_s.map(|(a, b)| format!(" from {a:.3} s to {b:.3} s")).unwrap_or_default();
    writeln!(out, "  {} rows of {}{span}", g.rows, format_duration_ns(g.interval_ns))?;
    let c = &g.clock;
    let checked = g
        .link
        .as_ref()
        .map(|l| format!("; {} exchanges checked, {} outside their bound", l.exchanges_checked, l.exchanges_outside))
        .unwrap_or_default();
    match c.offset_ns {
        Some(offset) => writeln!(
            out,
            "  clock: guest − host {:+.3} ms, drift {:+.2} ppm, bound ±{:.3} µs (median) ±{:.3} µs (max) over {} points from {}{checked}",
            offset as f64 / 1e6,
            c.drift_ppm,
            c.median_bound_ns as f64 / 1e3,
            c.max_bound_ns as f64 / 1e3,
            c.points,
            c.source
        )?,
        None => writeln!(out, "  clock: never measured (its rows cannot be placed on the host's timeline)")?,
    }
    if let Some(l) = &g.link {
        if l.garbage_bytes > 0 || l.bad_frames > 0 || l.refused.is_some() {
            writeln!(
                out,
                "  link: {} garbage bytes skipped, {} bad frames{}",
                l.garbage_bytes,
                l.bad_frames,
                l.refused.as_deref().map(|r| format!("; refused: {}", p(r))).unwrap_or_default()
            )?;
        }
        let dropped = l.dropped_rows + l.dropped_noise + l.dropped_points + l.dropped_schemas;
        if dropped > 0 || l.capped {
            writeln!(
                out,
                "  over the host's limits, dropped: {} rows, {} noise periods, {} clock points, {} schemas{}",
                l.dropped_rows,
                l.dropped_noise,
                l.dropped_points,
                l.dropped_schemas,
                if l.capped {
                    format!("; the guest's data reached the cap ({} MiB taken)", l.bytes >> 20)
                } else {
                    String::new()
                }
            )?;
        }
    }
    if let Some(m) = &g.markers {
        let c = &m.check;
        writeln!(
            out,
            "  clock check: {} markers written to port {:#x} while traced, {} found in the trace (kvm_pio), {} outside their bound{}; largest error {:.1} µs against a bound of ±{:.1} µs{}",
            c.written,
            m.port,
            c.matched,
            c.outside,
            if c.outside > 0 { format!(" (worst by {:.1} µs)", c.worst_excess_ns as f64 / 1e3) } else { String::new() },
            c.max_error_ns as f64 / 1e3,
            c.max_bound_ns as f64 / 1e3,
            if c.outside_trace > 0 { format!(" ({} more outside the trace)", c.outside_trace) } else { String::new() }
        )?;
    }
    for GuestNoiseOut { cpu, noise: n } in &g.noise {
        let pct = n.noise_pct();
        writeln!(
            out,
            "  noise on CPU {}: {} samples in {} periods ({:.3} s measured), {pct:.3} % of the time, largest {:.1} µs{}; `virtprof noise --host-recording` explains them",
            cpu,
            n.samples,
            n.periods,
            n.measured_ns as f64 / 1e9,
            n.max_single_ns as f64 / 1e3,
            if n.dropped_samples > 0 { format!(", {} not sent", n.dropped_samples) } else { String::new() }
        )?;
    }
    for gap in &g.gaps {
        writeln!(out, "  gap {:.3}–{:.3} s: {}", gap.from_s, gap.to_s, p(&gap.cause))?;
    }
    if g.cpu_pct.is_empty() {
        writeln!(out, "  CPU time: unknown (no /proc/stat rows from this guest)")?;
    } else {
        let cpu: Vec<String> = g.cpu_pct.iter().map(|(f, v)| format!("{f} {v:.1}%")).collect();
        writeln!(out, "  CPU time: {}", cpu.join(", "))?;
    }
    for m in g.metrics.iter().filter(|m| m.total != 0.0) {
        if m.per_second.is_finite() {
            writeln!(out, "  {:<40} {:>14.0} {:<8} {:>12.1}/s", p(&m.metric), m.total, p(&m.unit), m.per_second)?;
        } else {
            writeln!(out, "  {:<40} {:>14.0} {:<8} (level)", p(&m.metric), m.total, p(&m.unit))?;
        }
    }
    for (what, why) in &g.unavailable {
        writeln!(out, "  not sampled: {}: {}", p(what), p(why))?;
    }
    Ok(())
}

fn print_intervals(iv: &IntervalsOut, out: &mut impl Write) -> io::Result<()> {
    writeln!(
        out,
        "\n{} intervals of {} over {:.3} s; missed {}, overwritten {}; {} events outside the rows",
        iv.rows,
        format_duration_ns(iv.interval_ns),
        iv.seconds,
        iv.missed,
        iv.overwritten,
        iv.events_outside_rows
    )?;
    // MEASURED: the share of the time a counter that took turns on the PMU was counting.
    writeln!(out, "{:<22} {:<36} {:>16} {:>14} {:>9}", "ENTITY", "METRIC", "TOTAL", "PER SECOND", "MEASURED")?;
    for m in &iv.metrics {
        // Not a perf counter: nothing was scaled.
        let measured = m.measured.map_or_else(|| "-".to_string(), |r| format!("{:.0}%", 100.0 * r));
        writeln!(out, "{:<22} {:<36} {:>16.0} {:>14.1} {measured:>9}", m.entity, m.metric, m.total, m.per_second)?;
    }
    let p = &iv.phases;
    let starts: Vec<String> = p.boundaries_ns.iter().map(|&ns| format!("{:.3}s", ns as f64 / 1e9)).collect();
    writeln!(
        out,
        "\nphases: {} (silhouette {:.2}); changes at {}",
        p.k,
        p.silhouette,
        if starts.is_empty() { "-".to_string() } else { starts.join(", ") }
    )?;
    writeln!(out, "\nmost correlated metrics (all vCPUs and CPUs summed, {}):", iv.matrix.method)?;
    for pair in &iv.correlations {
        writeln!(out, "  {:+.2}  {}  ~  {}", pair.r, pair.a, pair.b)?;
    }
    if !iv.unavailable.is_empty() {
        writeln!(out, "\nnot counted on this host:")?;
        for (metric, reason) in &iv.unavailable {
            writeln!(out, "  {metric}: {reason}")?;
        }
    }
    Ok(())
}
