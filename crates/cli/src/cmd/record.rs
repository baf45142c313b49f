//! `virtprof record -o FILE [-- CMD]`: the recorder (`crate::recorder`) writing a `.vprec`, with
//! its summary on stderr.

use std::process::ExitCode;

use crate::args::RecordArgs;
use crate::recorder::{record, RecordOptions};

pub fn run(args: &RecordArgs) -> anyhow::Result<ExitCode> {
    let options = RecordOptions::from_args(args)?;
    let summary = record(&options, &args.output)?;
    eprintln!(
        "virtprof: recorded {} pages ({:.1} MiB) from {} CPUs into {}; lost events: {}",
        summary.pages,
        summary.bytes as f64 / (1 << 20) as f64,
        summary.cpus,
        args.output.display(),
        summary.lost
    );
    let iv = summary.intervals;
    if iv.interval_ns > 0 {
        eprintln!(
            "virtprof: {} intervals of {}; missed {} (sampler late), overwritten {} (writer late)",
            iv.rows,
            virtprof_model::units::format_duration_ns(iv.interval_ns),
            iv.missed,
            iv.overwritten
        );
    }
    if !summary.missing_events.is_empty() {
        eprintln!("virtprof: not on this kernel, skipped: {}", summary.missing_events.join(", "));
    }
    Ok(match summary.command_status {
        Some(status) if !status.success() => ExitCode::from(status.code().unwrap_or(1).clamp(1, 255) as u8),
        _ => ExitCode::SUCCESS,
    })
}
