//! `virtprof explain [FILE]`: why each VM is slow — its vCPU time split, its losses ranked by
//! cause with their evidence and a fix (`engine::explain` gathers, `analysis::explain` weighs).
//! Without a file, this host is recorded into memory for `--duration` first.

use std::io::Write;
use std::process::ExitCode;

use virtprof_analysis::explain::Explanation;
use virtprof_engine::explain::{explain_recording, ExplainReport};
use virtprof_engine::recorder::{record_into, RecordOptions};
use virtprof_model::units::format_duration;
use virtprof_session::Session;

use crate::args::ExplainArgs;

pub fn run(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let mut recording = match &args.file {
        Some(file) => Session::open_warning(file, &args.source.options())?,
        None => {
            eprintln!("virtprof: recording for {} (Ctrl-C to stop early)...", format_duration(args.duration));
            let options = RecordOptions { duration: Some(args.duration), ..RecordOptions::default() };
            let recorded = record_into(&options, Vec::new())?;
            eprintln!("virtprof: recorded {} pages; lost events: {}", recorded.summary.pages, recorded.summary.lost);
            Session::from_bytes(recorded.out, "the live trace")?
        }
    };
    let report = explain_recording(&mut recording, args.vm.as_deref())?;
    let mut out = crate::output::stdout();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print(&report, &mut out)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn ms(ns: Option<u64>) -> String {
    ns.map_or_else(|| "unknown".into(), |ns| format!("{:.1} ms", ns as f64 / 1e6))
}

fn print(report: &ExplainReport, out: &mut impl Write) -> std::io::Result<()> {
    for vm in &report.vms {
        print_vm(vm, out)?;
        writeln!(out)?;
    }
    if let Some(clock) = &report.clock {
        writeln!(out, "clock: {clock}")?;
    }
    writeln!(out, "lost events: {}", report.lost_events_text)
}

fn print_vm(vm: &Explanation, out: &mut impl Write) -> std::io::Result<()> {
    let window = vm.seconds.map_or_else(|| "duration unknown".into(), |s| format!("{s:.3} s"));
    writeln!(out, "VM {} (pid {}), {} vCPUs, {window}: {}", vm.name, vm.pid, vm.vcpus, vm.verdict)?;
    let t = &vm.time;
    writeln!(
        out,
        "  vCPU time: running {}, waiting for a CPU {}, blocked {}; of the running, in exits {}, in host interrupts {}",
        ms(t.running_ns),
        ms(t.waiting_ns),
        ms(t.blocked_ns),
        ms(t.exits_ns),
        ms(t.host_irq_ns)
    )?;
    let lost_pct = vm.lost_pct.map_or_else(|| "unknown".into(), |p| format!("{p:.1} %"));
    writeln!(out, "  lost: {} ({lost_pct} of its vCPU time)", ms(vm.lost_ns))?;
    for (i, c) in vm.causes.iter().enumerate() {
        let share = c.share_pct.map_or_else(|| "share unknown".into(), |p| format!("{p:.0} % of the lost time"));
        writeln!(out, "  {}. {} ({share}): {}", i + 1, c.kind.title(), c.summary)?;
        writeln!(out, "     evidence: {}", c.evidence.join("; "))?;
        if !c.rules_out.is_empty() {
            writeln!(out, "     rules out: {}", c.rules_out.join("; "))?;
        }
        writeln!(out, "     try: {}", c.fix)?;
        writeln!(out, "     see: {}", c.see.join("; "))?;
    }
    for c in &vm.cannot_tell {
        writeln!(out, "  cannot tell {}: {}; to tell: {}", c.what, c.why, c.record)?;
    }
    Ok(())
}
