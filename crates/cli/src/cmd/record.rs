//! `virtprof record -o FILE [-- CMD]`: the recorder (`virtprof_engine::recorder`) writing a `.vprec`, with
//! its summary on stderr.

use std::process::ExitCode;

use virtprof_model::units::{duration_ns, format_duration_ns};

use virtprof_agent::transport::Address;

use crate::args::RecordArgs;
use crate::exit::usage;
use virtprof_engine::recorder::{record, RecordOptions};
use virtprof_trace::buffer_sizing::FIT_SECONDS;

pub fn run(args: &RecordArgs) -> anyhow::Result<ExitCode> {
    let options = options(args)?;
    let summary = record(&options, &args.output)?;
    eprintln!(
        "virtprof: recorded {} pages ({:.1} MiB) from {} CPUs into {}; lost events: {}",
        summary.pages,
        summary.bytes as f64 / (1 << 20) as f64,
        summary.cpus,
        args.output.display(),
        summary.lost
    );
    let buffer = summary.buffer;
    if let Some(rate) = buffer.busiest_bytes_per_s.filter(|_| buffer.kb > virtprof_engine::recorder::DEFAULT_BUFFER_KB)
    {
        eprintln!(
            "virtprof: trace buffers grown to {} MiB per CPU for {:.1} MiB/s on the busiest CPU at the start{}",
            buffer.kb / 1024,
            rate as f64 / (1 << 20) as f64,
            if buffer.capped {
                format!(" (capped below {FIT_SECONDS} s of it; --buffer-size to choose)")
            } else {
                format!(" ({FIT_SECONDS} s of it)")
            }
        );
    }
    let iv = summary.intervals;
    if iv.interval_ns > 0 {
        eprintln!(
            "virtprof: {} intervals of {}; missed {} (sampler late), overwritten {} (writer late)",
            iv.rows,
            format_duration_ns(iv.interval_ns),
            iv.missed,
            iv.overwritten
        );
    }
    for a in &summary.agents {
        let link = match (&a.refused, a.sessions) {
            (Some(why), _) => format!("refused us: {why}"),
            (None, 0) => match &a.rejected {
                Some((times, why)) => format!("answered {times} time(s) but {why}: nothing taken from this guest"),
                None => "never answered: nothing from this guest (is `virtprof agent` listening there?)".into(),
            },
            (None, n) => {
                format!("{} rows, {} noise periods in {n} session(s), {} gap(s)", a.rows, a.noise_batches, a.gaps)
            }
        };
        eprintln!("virtprof: agent {} ({}): {link}", a.agent, a.address);
    }
    if !summary.missing_events.is_empty() {
        eprintln!("virtprof: not on this kernel, skipped: {}", summary.missing_events.join(", "));
    }
    match &summary.kernel_exit_hists {
        Some(Ok(h)) => eprintln!(
            "virtprof: the kernel's hist triggers timed {} exits in {} reasons ({} entries dropped), kept in the recording: `virtprof exits {}` sets them beside the trace's",
            h.exits(),
            h.reasons.len(),
            h.dropped,
            args.output.display()
        ),
        Some(Err(why)) => eprintln!("virtprof: the kernel's exit histograms could not be read back: {why}"),
        None => {}
    }
    // The command's failure is ours (as with `time CMD`), except when it ended because the
    // recording was stopped and passed the signal on.
    let passed_on = |status: &std::process::ExitStatus| {
        use std::os::unix::process::ExitStatusExt;
        status.signal().is_some() && virtprof_host::stop::requested()
    };
    Ok(match summary.command_status {
        Some(status) if !status.success() && !passed_on(&status) => {
            // A command killed by a signal prints nothing of its own: say which, or the
            // recording's failure has no explanation anywhere.
            if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
                let core =
                    if std::os::unix::process::ExitStatusExt::core_dumped(&status) { " (core dumped)" } else { "" };
                eprintln!("virtprof: the recorded command was killed by signal {signal}{core}; the recording is kept");
            }
            ExitCode::from(status.code().unwrap_or(1).clamp(1, 255) as u8)
        }
        _ => ExitCode::SUCCESS,
    })
}

/// The command line's options, checked.
fn options(args: &RecordArgs) -> anyhow::Result<RecordOptions> {
    let events: Vec<String> = match &args.events {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        None => Vec::new(),
    };
    if args.events.is_some() && events.is_empty() {
        return Err(usage("--events: empty list; e.g. --events kvm,sched:sched_switch"));
    }
    let interval_ns = match args.interval {
        Some(d) => {
            let ns = duration_ns(d);
            if !(1_000_000..=3_600_000_000_000).contains(&ns) {
                return Err(usage(format!("--interval {}: must be between 1ms and 1h", format_duration_ns(ns))));
            }
            Some(ns)
        }
        None => None,
    };
    let token = match &args.agent_token_file {
        Some(path) => Some(virtprof_engine::token::read_token(path)?),
        None => None,
    };
    if let Some(a) = args.agent.iter().find(|a| matches!(a, Address::Tcp(_))).filter(|_| token.is_none()) {
        return Err(usage(format!("--agent {a}: a tcp agent needs its token: --agent-token-file FILE")));
    }
    if !args.agent.is_empty() && args.clock != virtprof_engine::recorder::DEFAULT_CLOCK {
        return Err(usage(format!(
            "--agent with --clock {}: guest rows are aligned to CLOCK_MONOTONIC, so the trace clock must be mono",
            args.clock
        )));
    }
    if args.kernel_hist {
        virtprof_engine::recorder::check_kernel_exit_hist(&events)?;
    }
    let counters = match &args.counters {
        Some(list) => {
            // Tracepoints are looked up where the recording will find tracefs.
            let tracefs = virtprof_trace::tracefs::Tracefs::locate_or_mount().map_err(|e| usage(e.to_string()))?;
            let pmus = std::path::Path::new("/sys/bus/event_source/devices");
            let specs = virtprof_interval::event_names::parse_counters(list, tracefs.root(), pmus);
            Some(specs.map_err(|e| usage(format!("--counters: {e}")))?)
        }
        None => None,
    };
    Ok(RecordOptions {
        counters,
        agents: args.agent.iter().map(|a| (a.clone(), token.clone())).collect(),
        agent_limits: virtprof_agent::limits::GuestLimits { max_bytes: args.agent_max_mib << 20, ..Default::default() },
        agent_wait: args.agent_wait,
        events,
        duration: args.duration,
        buffer_size_kb: args.buffer_size_kb.unwrap_or(virtprof_engine::recorder::DEFAULT_BUFFER_KB),
        fit_buffer_to_rate: args.buffer_size_kb.is_none(),
        clock: args.clock.clone(),
        vm: args.vm.clone(),
        kvm_stats: !args.no_kvm_stats,
        interval_ns,
        hw_counters: args.hw_counters,
        command: args.command.clone(),
        kernel_exit_hist: args.kernel_hist,
        started_message: None,
    })
}
