//! `virtprof explain [FILE]`: why each VM is slow — its vCPU time split, its losses ranked by
//! cause with their evidence and a fix (`engine::explain` gathers, `analysis::explain` weighs).
//! Without a file, this host is recorded into memory for `--duration` first.

use std::io::Write;
use std::process::ExitCode;

use virtprof_analysis::explain::{Cause, Explanation, GuestExplanation};
use virtprof_engine::explain::{explain_recording, ExplainReport};
use virtprof_engine::recorder::{record_into, RecordOptions};
use virtprof_host::output::{write_file, Privacy};
use virtprof_model::units::format_duration;
use virtprof_session::Session;

use crate::args::ExplainArgs;

const EXPLAIN_JS: &str = include_str!("../../assets/explain.js");

pub fn run(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let mut recording = match &args.file {
        Some(file) => Session::open_warning(file, &args.source.options())?,
        None => {
            let started =
                format!("virtprof: recording for {} (Ctrl-C to stop early)...", format_duration(args.duration));
            let options = RecordOptions {
                duration: Some(args.duration),
                started_message: Some(started),
                ..RecordOptions::default()
            };
            let recorded = record_into(&options, Vec::new())?;
            eprintln!("virtprof: recorded {} pages; lost events: {}", recorded.summary.pages, recorded.summary.lost);
            Session::from_bytes(recorded.out, "the live trace")?
        }
    };
    let report = explain_recording(&mut recording, args.vm.as_deref())?;
    if let Some(path) = &args.html {
        let page = virtprof_sinks::html::render("explain", &report.source, &report, EXPLAIN_JS)?;
        write_file(path, page.as_bytes(), Privacy::Shared)?;
        eprintln!("virtprof: wrote {}; lost events: {}", path.display(), report.lost_events_text);
    }
    let mut out = crate::output::stdout();
    if args.json {
        crate::output::write_json_pretty(&mut out, &report)?;
    } else if args.html.is_none() {
        print(&report, &mut out)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Each cause in three lines: what and how much; the evidence, what it rules out and where to
/// see more; the fix.
fn print_causes(causes: &[Cause], out: &mut impl Write) -> std::io::Result<()> {
    for (i, c) in causes.iter().enumerate() {
        let share = c.share_pct.map_or_else(|| "share unknown".into(), |p| format!("{p:.0} %"));
        writeln!(out, "  {}. {} [{share}]: {}", i + 1, c.kind.title(), c.summary)?;
        let mut why = format!("     from {}", c.evidence.join("; "));
        if !c.rules_out.is_empty() {
            why += &format!("; rules out {}", c.rules_out.join("; "));
        }
        writeln!(out, "{why}; see `{}`", c.see.join("`, `"))?;
        writeln!(out, "     try: {}", c.fix)?;
    }
    Ok(())
}

fn ms(ns: Option<u64>) -> String {
    ns.map_or_else(|| "unknown".into(), |ns| format!("{:.1} ms", ns as f64 / 1e6))
}

fn print(report: &ExplainReport, out: &mut impl Write) -> std::io::Result<()> {
    for vm in &report.vms {
        print_vm(&vm.explanation, out)?;
    }
    for g in &report.guests {
        print_guest(g, out)?;
    }
    if let Some(clock) = &report.clock {
        writeln!(out, "clock: {clock}")?;
    }
    writeln!(out, "lost events: {}", report.lost_events_text)
}

/// A guest seen from the inside by its agent.
fn print_guest(g: &GuestExplanation, out: &mut impl Write) -> std::io::Result<()> {
    let p = |v: Option<f64>| v.map_or_else(|| "unknown".into(), |p| format!("{p:.1} %"));
    writeln!(
        out,
        "guest {} (agent {}, its own view): {}; steal {}, noise {}",
        g.name,
        g.agent,
        g.verdict,
        p(g.steal_pct),
        p(g.noise_pct)
    )?;
    print_causes(&g.causes, out)?;
    for c in &g.cannot_tell {
        writeln!(out, "  cannot tell {}: {}; to tell: {}", c.what, c.why, c.record)?;
    }
    Ok(())
}

/// One VM: a line when it has nothing to explain, else its time split, each cause in three
/// lines (what and how much; the evidence, what it rules out and where to see more; the fix)
/// and what cannot be told. `--json` has every field.
fn print_vm(vm: &Explanation, out: &mut impl Write) -> std::io::Result<()> {
    let window = vm.seconds.map_or_else(|| "duration unknown".into(), |s| format!("{s:.3} s"));
    let lost_pct = vm.lost_pct.map_or_else(|| "unknown".into(), |p| format!("{p:.1} %"));
    writeln!(
        out,
        "VM {} (pid {}), {} vCPUs, {window}: {}; lost {} ({lost_pct} of its vCPU time)",
        vm.name,
        vm.pid,
        vm.vcpus,
        vm.verdict,
        ms(vm.lost_ns)
    )?;
    if vm.verdict == "nothing to explain" {
        return Ok(());
    }
    let t = &vm.time;
    writeln!(
        out,
        "  vCPU time: running {} (in exits {}, host interrupts {}), waiting for a CPU {}, blocked {}",
        ms(t.running_ns),
        ms(t.exits_ns),
        ms(t.host_irq_ns),
        ms(t.waiting_ns),
        ms(t.blocked_ns)
    )?;
    print_causes(&vm.causes, out)?;
    for c in &vm.cannot_tell {
        writeln!(out, "  cannot tell {}: {}; to tell: {}", c.what, c.why, c.record)?;
    }
    Ok(())
}
