//! `virtprof sched FILE`: the `top` table for a recording — the whole run, and with `--window`
//! one table per consecutive slice.

use std::io::Write;
use std::process::ExitCode;

use serde::Serialize;
use virtprof_analysis::qos::{window_report, WindowReport};
use virtprof_analysis::sched::SchedOptions;
use virtprof_model::units::{duration_ns, format_duration_ns};
use virtprof_model::Loss;

use crate::args::SchedArgs;
use crate::exit::usage;
use crate::qos::{log_rows, roles_table, table, LOG_HEADER};
use virtprof_engine::guest_view::{self, GuestView};
use virtprof_engine::pass::{recording_tasks, VcpuAccounting, ACCOUNTING_SYSTEMS};
use virtprof_session::{evidence_event_ids, DecoderNames, GuestTrace, Session};

/// `sched --json`: the same `windows[]` as `top --once --json`.
#[derive(Serialize)]
struct Output<'a> {
    source: Source<'a>,
    lost_events: u64,
    /// Lost events per CPU, with where the gaps were.
    loss: &'a Loss,
    windows: Vec<WindowReport>,
    /// The guest's own trace, where given (`--guest`, or held by the recording).
    #[serde(skip_serializing_if = "Option::is_none")]
    guest_trace: Option<GuestView>,
}

#[derive(Serialize)]
struct Source<'a> {
    recording: String,
    trace_clock: &'a str,
    /// How the timestamps were read as time where they needed a conversion, or why they
    /// cannot be.
    clock: Option<String>,
    mode: &'static str,
}

/// The most windows `--window` may cut a recording into: each holds every vCPU's accounting.
const MAX_WINDOWS: u64 = virtprof_analysis::sched::MAX_KEPT_BUCKETS as u64;

pub fn run(args: &SchedArgs) -> anyhow::Result<ExitCode> {
    let window_ns = match &args.window {
        Some(w) => match duration_ns(*w) {
            0 => return Err(usage("--window must be longer than 0")),
            ns => Some(ns),
        },
        None => None,
    };
    let recording = Session::open_warning(&args.file, &args.source.options())?;
    let cpus = &recording.metadata.cpus;
    if let Some(cpu) = args.cpu.filter(|c| !cpus.is_empty() && !cpus.contains(c)) {
        let listed: Vec<String> = cpus.iter().map(u32::to_string).collect();
        return Err(usage(format!(
            "--cpu {cpu}: '{}' has no CPU {cpu} (it recorded CPUs {})",
            args.file.display(),
            listed.join(", ")
        )));
    }
    let mut decoder = recording.decoder(ACCOUNTING_SYSTEMS)?;
    if let (Some(window), Some((first, last))) = (window_ns, recording.time_range(&decoder)) {
        let windows = (last - first) / window + 1;
        if windows > MAX_WINDOWS {
            return Err(usage(format!(
                "--window {} cuts the {} of '{}' into {windows} windows, over the {MAX_WINDOWS} a table can hold: use --window {} or longer",
                format_duration_ns(window),
                format_duration_ns(last - first),
                args.file.display(),
                format_duration_ns((last - first).div_ceil(MAX_WINDOWS))
            )));
        }
    }
    let evidence = evidence_event_ids(&decoder);
    let host = recording_tasks(&recording);
    for pid in &args.vm {
        if !host.threads.values().any(|(p, _)| p == pid) {
            return Err(usage(format!("--vm {pid}: no such process in the recording")));
        }
    }
    // One bucket per window; without --window one bucket spans the whole run.
    let bucket_ns = window_ns.unwrap_or(1 << 62);
    let mut acc =
        VcpuAccounting::new(&recording, &host, SchedOptions { bucket_ns, keep_buckets: usize::MAX }, evidence);
    let stats = recording.analyse(&mut decoder, &mut [&mut acc])?;
    let total = acc.finish()?;
    let vms = acc.vms(&host, &total, &args.vm);
    let acc = &acc.inner;
    // A trace of nothing (a valid file whose CPUs hold no events) reads as that: no windows.
    let empty = stats.events == 0;
    if empty && !args.json && !args.csv {
        let mut out = crate::output::stdout();
        writeln!(out, "0 events in '{}': nothing to account", args.file.display())?;
        writeln!(out, "{}", recording.loss_report(&recording.loss(&stats), &decoder, ""))?;
        return Ok(ExitCode::SUCCESS);
    }
    if vms.is_empty() && !empty {
        let why = match acc.kvm_threads().count() {
            0 => "no vCPU threads by name and no thread emitted kvm events (was the kvm system recorded?)".to_string(),
            n => format!(
                "{n} thread{} emitted kvm events, but the recording does not say which processes they are (no task table names them: was it cut short before its first scan?); `virtprof exits` counts their exits per thread",
                if n == 1 { "" } else { "s" }
            ),
        };
        return Err(usage(format!("no VM in '{}': {why}", args.file.display())));
    }
    let names = DecoderNames(&decoder);
    let holdings = recording.holdings(&decoder);
    let mut windows = Vec::new();
    if window_ns.is_some() && !empty {
        for bucket in acc.buckets() {
            let offset = bucket.start_ns.saturating_sub(total.start_ns) as f64 / 1e9;
            windows.push(window_report(bucket, &format!("+{offset:.3}s"), &vms, &names, args.cpu, &holdings));
        }
    }
    if !empty {
        windows.push(window_report(&total, "run", &vms, &names, args.cpu, &holdings));
    }
    let loss = recording.loss(&stats);
    let lost_events = loss.total();
    let guest_trace = match GuestTrace::of(&recording, args.guest.as_deref(), &args.source.options())? {
        Some(guest) => Some(guest_view::read(&guest)?),
        None => None,
    };

    let mut out = crate::output::stdout();
    if args.json {
        let source = Source {
            recording: args.file.display().to_string(),
            trace_clock: &recording.metadata.trace_clock,
            clock: recording.clock_line(),
            mode: "trace",
        };
        crate::output::write_json_pretty(&mut out, &Output { source, lost_events, loss: &loss, windows, guest_trace })?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.csv {
        if let Some(guest) = &guest_trace {
            eprintln!(
                "virtprof: the CSV rows are the host's; guest '{}''s CPUs are in the text and --json",
                guest.name
            );
        }
        writeln!(out, "{LOG_HEADER}")?;
        for w in &windows {
            let end_s = w.end_ns.saturating_sub(total.start_ns) as f64 / 1e9;
            for line in log_rows(w, end_s) {
                writeln!(out, "{line}")?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    for w in &windows {
        let cpu = w.cpu.map(|c| format!(", physical CPU {c} only")).unwrap_or_default();
        writeln!(out, "window {} ({}{cpu}; exits from {})", w.label, w.length_text(3), w.exits_source)?;
        table(w, true).write_text(&mut out)?;
        writeln!(out)?;
        if let Some(roles) = roles_table(w) {
            writeln!(out, "by role (IO/EXEC: the VM's I/O accesses per execution of the role)")?;
            roles.write_text(&mut out)?;
            writeln!(out)?;
        }
    }
    for u in windows.last().map_or(&[][..], |w| &w.unavailable[..]) {
        writeln!(out, "unavailable: {u}")?;
    }
    if let Some(guest) = &guest_trace {
        writeln!(out)?;
        crate::guest_table::write_text(guest, &mut out)?;
        writeln!(out)?;
    }
    if let Some(clock) = recording.clock_line() {
        writeln!(out, "clock: {clock}")?;
    }
    let across =
        "each vCPU's state across a gap is taken from its next event, and execution and I/O counts there are short";
    writeln!(out, "{}", recording.loss_report(&loss, &decoder, across))?;
    Ok(ExitCode::SUCCESS)
}
