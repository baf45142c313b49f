//! `virtprof report FILE`: what a recording holds — host, VMs, duration, loss, top exits, vCPU
//! accounting — and, for `record --interval` recordings, the interval analyses: per-metric
//! totals and rates, phases, and the most correlated metric pairs. As text, `--json`, or one
//! self-contained HTML page (`--html OUT`).

use std::io::Write;
mod html;
mod text;

use std::process::ExitCode;

use virtprof_analysis::correlate::Method;

use crate::args::ReportArgs;
use virtprof_analysis::Names;
use virtprof_engine::pass::{analyse_with, Want};
use virtprof_model::event::{Event, EventKind};
use virtprof_session::Session;

pub fn run(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    let mut recording = Session::open_warning(&args.file, &Default::default())?;
    let want = Want { exits: true, exit_rows: false, accounting: true, binning: true, state_slices: false };
    // The guests' marker writes as the host traced them, to check their clocks by.
    let ports: Vec<u16> = recording.guests.iter().filter_map(|g| g.guest.marker_port).collect();
    let mut pio = Vec::new();
    let mut markers = |e: &Event, _: &dyn Names| {
        if let EventKind::KvmPio { write: true, port, .. } = e.kind {
            if ports.contains(&port) {
                pio.push((port, e.ts));
            }
        }
    };
    let analysis = analyse_with(&mut recording, want, &mut markers)?;
    pio.sort_unstable_by_key(|p| p.1);
    let method = if args.spearman { Method::Spearman } else { Method::Pearson };
    let limits = virtprof_engine::report::Limits { top_exits: args.top_exits, top_pairs: args.top, method };
    let mut report = virtprof_engine::report::build(&args.file, &recording, analysis, &limits, &pio);
    if let Some(guest) = virtprof_session::GuestTrace::of(&recording, args.guest.as_deref(), &Default::default())? {
        report.guest_trace = Some(virtprof_engine::guest_view::read(&guest)?);
    }
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
        crate::output::write_json_pretty(&mut out, &report)?;
        out.flush()?;
    } else if args.html.is_none() {
        let mut out = crate::output::stdout();
        text::print(&report, &mut out)?;
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}
