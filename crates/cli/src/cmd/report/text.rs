//! The report as text: a summary a terminal user reads top to bottom.

use std::io::{self, Write};

use virtprof_model::units::format_duration_ns;

use super::model::{IntervalsOut, Report};
use crate::exit_table::reason_table;

pub fn print(r: &Report, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "{} ({}, trace clock {}), {} CPUs", r.recording, r.origin, r.trace_clock, r.cpus)?;
    if !r.host.is_empty() {
        let facts: Vec<String> = r.host.iter().map(|(k, v)| format!("{k} {v}")).collect();
        writeln!(out, "host: {}", facts.join(", "))?;
    }
    writeln!(
        out,
        "{:.3} s, {} events, lost events: {}{}",
        r.duration_s,
        r.events,
        r.lost_events_text,
        r.truncated_at.map(|at| format!(" (file cut short at byte {at})")).unwrap_or_default()
    )?;
    for vm in &r.vms {
        writeln!(out, "  VM {} {} ({}), {} vCPUs", vm.pid, vm.name, vm.kind, vm.vcpus.len())?;
    }

    let t = &r.exits.totals;
    writeln!(
        out,
        "\nexits: {} ({} lightweight, {} heavyweight), source: {}",
        t.exits, t.lightweight, t.heavyweight, r.exits.source.path
    )?;
    if !r.exits.by_reason.is_empty() {
        reason_table(&r.exits.by_reason).write_text(&mut *out)?;
    }
    for missing in &r.exits.source.unavailable {
        writeln!(out, "  not available: {missing}")?;
    }

    if let Some(acc) = &r.accounting {
        writeln!(out, "\nvCPU accounting over the run ({:.3} s; exits from {}):", acc.seconds, acc.exits_source)?;
        crate::qos::table(acc, true).write_text(&mut *out)?;
    }
    if let Some(iv) = &r.intervals {
        print_intervals(iv, out)?;
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
    writeln!(out, "{:<22} {:<36} {:>16} {:>14}", "ENTITY", "METRIC", "TOTAL", "PER SECOND")?;
    for m in &iv.metrics {
        writeln!(out, "{:<22} {:<36} {:>16.0} {:>14.1}", m.entity, m.metric, m.total, m.per_second)?;
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
