//! `virtprof export FILE --format csv|parquet|perfetto`: a recording for other tools; with
//! `--dataset DIR`, its Parquet tables filed into a fleet-wide dataset (`dataset`).

mod dataset;

use std::path::Path;
use std::process::ExitCode;

use crate::args::{ExportArgs, ExportFormat};
use crate::exit::usage;
use crate::output::Output;
use virtprof_analysis::qos::window_report;
use virtprof_analysis::sched::StateSlice;
use virtprof_engine::pass::{analyse, analyse_with, interval_table, Want};
use virtprof_host::output::Privacy;
use virtprof_model::evidence::{Figure, Holdings};
use virtprof_session::Session;
use virtprof_sinks::{csv, parquet, perfetto};

pub fn run(args: &ExportArgs) -> anyhow::Result<ExitCode> {
    if args.dataset.is_some() && args.format != ExportFormat::Parquet {
        return Err(usage("--dataset files Parquet tables: add --format parquet"));
    }
    if args.guest.is_some() && args.format != ExportFormat::Perfetto {
        return Err(usage("--guest draws a guest's own trace beside its host's: add --format perfetto"));
    }
    match args.format {
        ExportFormat::Csv => {
            let rows = interval_table(&args.file)?;
            let mut out = Output::open(args.output.as_deref(), Privacy::Shared)?;
            csv::write(&rows.table, &mut out)?;
            out.finish()?;
            eprintln!("virtprof: lost events: {}", rows.lost_events_text);
        }
        ExportFormat::Parquet if args.dataset.is_some() => dataset::add(args)?,
        ExportFormat::Parquet => {
            let Some(dir) = args.output.as_ref().filter(|d| d.as_os_str() != "-") else {
                return Err(usage(
                    "--format parquet writes a directory of tables: give it with -o DIR (or --dataset DIR)",
                ));
            };
            // The input first: bad input must not leave a folder behind.
            let mut recording = timed(Session::open_warning(&args.file, &Default::default())?)?;
            let made_here = !dir.exists();
            std::fs::create_dir_all(dir).map_err(|e| usage(format!("cannot create '{}': {e}", dir.display())))?;
            if let Err(e) = write_tables(&mut recording, dir) {
                // Half a set of tables reads as a whole one: a folder made for them goes.
                if made_here {
                    let _ = std::fs::remove_dir_all(dir);
                }
                return Err(e);
            }
        }
        ExportFormat::Perfetto => {
            let mut recording = timed(Session::open_warning(&args.file, &Default::default())?)?;
            // The state tracks are the accounting's own slices, so they add up to `sched`.
            let want = Want { exits: true, exit_rows: true, accounting: true, binning: true, state_slices: true };
            let analysis = analyse(&mut recording, want)?;
            let (first, _) = analysis.span_ns.unwrap_or((0, 0));
            let table = analysis.table.as_ref();
            let guests: Vec<_> = recording.guests.iter().flat_map(|g| g.layers()).collect();
            // Noise periods are read from the recording as they are drawn, never all held.
            let guests_of = &recording.guests;
            let guest_noise = |visit: &mut perfetto::NoiseVisitor<'_>| {
                guests_of.iter().flat_map(|g| g.placed_noise()).for_each(visit);
            };
            let mut first_noise: Option<u64> = None;
            guest_noise(&mut |n| {
                if let Some(first) = n.samples.iter().map(|s| s.0).min() {
                    first_noise = Some(first_noise.map_or(first, |seen| seen.min(first)));
                }
            });
            let guest = virtprof_session::GuestTrace::of(&recording, args.guest.as_deref(), &Default::default())?;
            let guest_traces = match guest {
                Some(guest) => vec![guest_machine(&guest)?],
                None => Vec::new(),
            };
            // A guest's own trace can begin before the host's (its tracing started first).
            let first_guest_event = guest_traces
                .iter()
                .flat_map(|g| &g.cpus)
                .flat_map(|c| c.slices.first().map(|s| s.start_ns).into_iter().chain(c.irqs.first().map(|i| i.0)))
                .min();
            // Time 0 is the earliest thing drawn: an agent's first row or noise period, or a
            // guest's own trace, can begin before the trace does, and Perfetto takes no
            // negative times.
            let origin_ns = [
                Some(first),
                table.and_then(|t| t.start_ns.first().copied()),
                guests.iter().filter_map(|l| l.rows.first().map(|r| r.start_ns)).min(),
                first_noise,
                first_guest_event,
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(first);
            let states = known_states(&analysis.slices, &analysis.holdings);
            let tracks = perfetto::Tracks {
                guest_traces: &guest_traces,
                guests: &guests,
                guest_noise: &guest_noise,
                vms: &analysis.vms,
                states: &states,
                exits: analysis.exits.as_ref().map_or(&[][..], |x| &x.rows[..]),
                table,
                origin_ns,
            };
            let mut out = Output::open(args.output.as_deref(), Privacy::Shared)?;
            perfetto::write(&tracks, &mut out)?;
            out.finish()?;
            eprintln!("virtprof: lost events: {}", recording.describe_loss(&analysis.loss, &analysis.decoder));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `recording`, if its timestamps read as time: tables and timelines are laid out on it
/// (counting commands read any clock).
fn timed(recording: Session) -> anyhow::Result<Session> {
    match recording.clock_not_time() {
        Some(clock) => Err(usage(format!(
            "'{}': its timestamps are {clock}; exports lay events out in time: import the capture again with --tsc-khz (or read it with `virtprof exits`, which counts without a clock)",
            recording.path.display()
        ))),
        None => Ok(recording),
    }
}

/// The vCPU state slices as far as the recording tells them: none without sched_switch (no
/// track, rather than one that says "running" throughout), and without sched_wakeup the
/// time off CPU as one state, since waiting and blocked cannot be told apart.
fn known_states(slices: &[StateSlice], holdings: &Holdings) -> Vec<StateSlice> {
    if !holdings.knows(Figure::Running) {
        return Vec::new();
    }
    let split = holdings.knows(Figure::WaitingBlocked);
    slices
        .iter()
        .map(|s| match s.state {
            "waiting" | "blocked" if !split => StateSlice { state: "off cpu (waiting or blocked)", ..*s },
            _ => *s,
        })
        .collect()
}

/// A guest's own trace, its CPUs' tasks and interrupts on the host's clock, saying how it
/// was placed.
fn guest_machine(guest: &virtprof_session::GuestTrace) -> anyhow::Result<perfetto::GuestMachine> {
    use virtprof_analysis::Analyzer;
    let mut tasks = virtprof_analysis::guest_tasks::GuestTasks::default();
    let mut decoder = guest.session.decoder(&["sched", "irq", "irq_vectors"])?;
    let walk = guest.walk(&mut decoder, |e, d| tasks.on_event(e, &virtprof_session::DecoderNames(d)))?;
    eprintln!("virtprof: {}", guest.describe());
    let loss = guest.session.loss(&walk.stats);
    eprintln!("virtprof: guest '{}': lost events: {}", guest.name, guest.session.describe_loss(&loss, &decoder));
    if walk.unplaced > 0 {
        eprintln!(
            "virtprof: warning: {} guest events are on CPUs its time-sync data do not cover: left out",
            walk.unplaced
        );
    }
    if tasks.dropped > 0 {
        eprintln!(
            "virtprof: warning: guest '{}': {} slices past the first {} left out",
            guest.name,
            tasks.dropped,
            virtprof_analysis::guest_tasks::MAX_ITEMS
        );
    }
    Ok(perfetto::GuestMachine {
        name: guest.name.clone(),
        aligned: guest.aligned(),
        vcpu_threads: guest.vcpu_threads.clone(),
        cpus: tasks.finish(),
    })
}

/// Every Parquet table of `recording` into `dir` (one pass), saying what was written.
fn write_tables(recording: &mut Session, dir: &Path) -> anyhow::Result<()> {
    let mut events = parquet::EventTable::create(&dir.join("events.parquet"))?;
    let want = Want { exits: true, exit_rows: true, accounting: true, binning: true, ..Want::default() };
    let analysis = analyse_with(recording, want, &mut events)?;
    let event_rows = events.finish()?;
    let exits = analysis.exits.as_ref();
    let exit_rows = parquet::write_exits(&dir.join("exits.parquet"), exits.map_or(&[][..], |x| &x.rows[..]))?;
    let reasons = exits.map_or(&[][..], |x| &x.by_reason[..]);
    parquet::write_exit_reasons(&dir.join("exit_reasons.parquet"), reasons)?;
    let mut summary = format!("{event_rows} events, {exit_rows} exits ({} reasons)", reasons.len());
    if let Some(total) = &analysis.total {
        let window = window_report(total, "run", &analysis.vms, &analysis.names(), None, &analysis.holdings);
        let rows = parquet::write_sched(&dir.join("sched.parquet"), &window)?;
        summary += &format!(", {rows} vCPUs");
        if window.vms.iter().any(|vm| !vm.roles.is_empty()) {
            let rows = parquet::write_roles(&dir.join("roles.parquet"), &window)?;
            summary += &format!(", {rows} thread roles");
        }
    }
    if let Some(table) = &analysis.table {
        let rows = parquet::write_intervals(&dir.join("intervals.parquet"), table)?;
        summary += &format!(", {rows} interval values");
    }
    let layers: Vec<_> = recording.guests.iter().flat_map(|g| g.layers()).collect();
    if !layers.is_empty() {
        let rows = parquet::write_guests(&dir.join("guests.parquet"), &layers)?;
        summary += &format!(", {rows} guest values");
    }
    eprintln!("virtprof: wrote {summary} into {}", dir.display());
    eprintln!("virtprof: lost events: {}", recording.describe_loss(&analysis.loss, &analysis.decoder));
    Ok(())
}
