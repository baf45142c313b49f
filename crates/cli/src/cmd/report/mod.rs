//! `virtprof report FILE`: what a recording holds — host, VMs, duration, loss, top exits, vCPU
//! accounting — and, for `record --interval` recordings, the interval analyses: per-metric
//! totals and rates, phases, and the most correlated metric pairs. As text, `--json`, or one
//! self-contained HTML page (`--html OUT`).

use std::io::Write;
mod html;
mod model;
mod text;

use std::process::ExitCode;

use virtprof_analysis::correlate::Method;

use crate::args::ReportArgs;
use crate::pass::{analyse, Want};
use virtprof_session::Session;

pub fn run(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    let mut recording = Session::open_warning(&args.file, None)?;
    let want = Want { exits: true, exit_rows: false, accounting: true, binning: true, state_slices: false };
    let analysis = analyse(&mut recording, want)?;
    let method = if args.spearman { Method::Spearman } else { Method::Pearson };
    let limits = model::Limits { top_exits: args.top_exits, top_pairs: args.top, method };
    let report = model::build(&args.file, &recording, analysis, &limits);
    if let Some(path) = &args.html {
        let page = html::render(&report)?;
        virtprof_host::output::write_file(path, page.as_bytes(), virtprof_host::output::Privacy::Shared)?;
        eprintln!(
            "virtprof: wrote {} ({} KiB); lost events: {}",
            path.display(),
            std::fs::metadata(path).map_or(0, |m| m.len() / 1024),
            report.lost_events_text
        );
    }
    if args.json {
        let mut out = crate::output::stdout();
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
        out.flush()?;
    } else if args.html.is_none() {
        let mut out = crate::output::stdout();
        text::print(&report, &mut out)?;
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}
