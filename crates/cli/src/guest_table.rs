//! A guest's own trace beside its host's, as `sched` and `report` print it.

use std::io::{self, Write};

use virtprof_engine::guest_view::GuestView;

/// The guest's table: per guest CPU its host thread, busy and idle time, interrupts and
/// longest tasks, each `unknown` where its trace lacks the events.
pub fn write_text(view: &GuestView, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "guest '{}', from its own trace ({} events, lost events: {}); BUSY: a task ran, steal it suffered included",
        view.name, view.events, view.lost_events_text
    )?;
    writeln!(out, "  {}", view.placement)?;
    let unknown = || "unknown".to_string();
    let count = |v: Option<u64>| v.map_or_else(unknown, |n| n.to_string());
    let mut table = virtprof_sinks::table::Table::new([
        "GCPU",
        "HOST_TID",
        "OBSERVED_S",
        "BUSY%",
        "BUSY_S",
        "IDLE_S",
        "SWITCHES",
        "IRQS",
        "SOFTIRQS",
        "TOP TASKS",
    ]);
    for c in &view.cpus {
        let top = c.top_tasks.as_ref().map_or_else(unknown, |tasks| {
            tasks
                .iter()
                .map(|t| format!("{}[{}] {:.1}ms", t.name, t.tid, t.ns as f64 / 1e6))
                .collect::<Vec<_>>()
                .join(", ")
        });
        table.row([
            c.guest_cpu.to_string(),
            c.host_tid.map_or_else(String::new, |t| t.to_string()),
            c.observed_ns.map_or_else(unknown, seconds),
            c.busy_pct.map_or_else(unknown, |p| format!("{p:.1}")),
            c.busy_ns.map_or_else(unknown, seconds),
            c.idle_ns.map_or_else(unknown, seconds),
            count(c.switches),
            count(c.irqs),
            count(c.softirqs),
            top,
        ]);
    }
    table.write_text(&mut *out)?;
    if view.unplaced_events > 0 {
        writeln!(out, "  {} events on guest CPUs its time-sync data do not cover: left out", view.unplaced_events)?;
    }
    if view.tasks_dropped > 0 {
        writeln!(
            out,
            "  {} runs of tasks past the first {} distinct ones counted in busy time under no task",
            view.tasks_dropped,
            virtprof_analysis::guest_cpus::MAX_TASKS
        )?;
    }
    for u in &view.unavailable {
        writeln!(out, "  unavailable: {u}")?;
    }
    Ok(())
}

fn seconds(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e9)
}
