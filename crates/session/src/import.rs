//! Captures made elsewhere, read into recording metadata, per-CPU pages and loss figures:
//! a tracefs dump directory (`events/`, `per_cpu/cpuN/trace_pipe_raw`, `saved_cmdlines`...),
//! a perf.data, or ftrace text re-encoded through the traced kernel's formats. A trace-cmd
//! trace.dat is read in place instead ([`trace_dat_parts`], by `Session`).

use std::path::Path;

use virtprof_model::clock::TimeScale;
use virtprof_model::{Cpu, KernelLoss};
use virtprof_store::recording::{Footer, FormatText, Metadata, Task};
use virtprof_trace::capture::stat_value;
use virtprof_trace::dump::read_cpu_pages;
use virtprof_trace::format::parse_header_page;
use virtprof_trace::segment::Segment;
use virtprof_trace::tracedat::TraceDat;
use virtprof_trace::tracefs::{format_texts, parse_saved_tasks, selected_clock};

use crate::error::{Result, SessionError};

/// A capture made elsewhere, in memory: a tracefs dump directory, a perf.data, or ftrace text
/// (which needs the traced kernel's formats).
pub fn read_source(src: &Path, options: &SourceOptions) -> Result<(Metadata, CpuPages, Footer)> {
    let parts = read_capture(src, options)?;
    // Every reader of the result lays pages out by it: refuse a bad one here, by the file's name.
    parse_header_page(&parts.0.header_page).map_err(|e| SessionError::in_file(src, e.to_string()))?;
    Ok(parts)
}

fn read_capture(src: &Path, options: &SourceOptions) -> Result<(Metadata, CpuPages, Footer)> {
    let formats = options.formats.as_deref();
    if !src.exists() {
        return Err(SessionError::in_file(src, "does not exist"));
    }
    // The first bytes say what a file is (empty for anything else).
    let head = if src.is_file() { file_head(src) } else { Vec::new() };
    // `exists`, not `is_file`: a header_page that is a FIFO or a device is refused by name
    // when the dump is read, not taken for "not a dump".
    if src.is_dir() && src.join("events/header_page").exists() {
        read_tracefs_dump(src, options)
    } else if head.starts_with(crate::perfdata::MAGIC) {
        crate::perfdata::read(src, MAX_IMPORT)
    } else if head.starts_with(virtprof_store::recording::MAGIC) {
        Err(SessionError::in_file(
            src,
            "is a virtprof recording already: nothing to import; every command reads it as it is (e.g. `virtprof exits FILE`)",
        ))
    } else if src.is_file() {
        let Some(formats) = formats else {
            return Err(SessionError::in_file(
                src,
                "is not a virtprof recording, a trace-cmd trace.dat, a perf.data or a tracefs dump; if it is ftrace text, give --formats DIR (the tracefs root, with events/, of the kernel that recorded it)",
            ));
        };
        read_ftrace_text(src, formats)
    } else {
        Err(SessionError::in_file(
            src,
            "is neither a tracefs dump (a directory with events/header_page and per_cpu/cpuN/trace_pipe_raw) nor a trace-cmd trace.dat",
        ))
    }
}

/// How to read a capture made elsewhere.
#[derive(Debug, Clone, Default)]
pub struct SourceOptions {
    /// For ftrace text: the tracefs root (or dump) whose formats describe the traced kernel.
    pub formats: Option<std::path::PathBuf>,
    /// For a trace in TSC cycles without its own conversion: the TSC's frequency in kHz.
    pub tsc_khz: Option<u64>,
    /// Else, for such a trace: a conversion from elsewhere (a guest trace takes its host
    /// file's TSC2NSEC).
    pub tsc_scale: Option<TimeScale>,
}

impl SourceOptions {
    /// The conversion for a trace in cycles, and where it came from: the user's frequency,
    /// else one from elsewhere.
    pub fn cycles(&self) -> Option<(TimeScale, String)> {
        match (self.tsc_khz.and_then(|khz| Some((TimeScale::from_khz(khz)?, khz))), self.tsc_scale) {
            (Some((scale, khz)), _) => Some((scale, format!("--tsc-khz {khz}"))),
            (None, Some(scale)) => Some((scale, "its host trace's TSC2NSEC option".to_string())),
            (None, None) => None,
        }
    }
}

/// The host fact naming where a conversion of TSC cycles to nanoseconds came from.
pub const TSC_CONVERSION: &str = "tsc_to_ns";

/// The trace clock of ftrace text: whichever it was, its times were printed in microseconds.
pub const TEXT_CLOCK: &str = "text (microseconds)";
/// The trace clock of a tracefs dump without its `trace_clock` file.
pub const UNKNOWN_CLOCK: &str = "unknown";

/// The most a file imported into memory (a trace.dat being converted, ftrace text) can be.
const MAX_IMPORT: u64 = 16 << 30;

/// The first 16 bytes of a file (fewer if it is shorter or unreadable): enough for any magic.
pub fn file_head(path: &Path) -> Vec<u8> {
    let mut head = Vec::with_capacity(16);
    if let Ok(file) = virtprof_host::input::open_regular(path, "input") {
        let _ = std::io::Read::read_to_end(&mut std::io::Read::take(file, 16), &mut head);
    }
    head
}

/// Parse a trace.dat held in `bytes`, the error naming `path`.
pub fn parse_trace_dat<'a>(path: &Path, bytes: &'a [u8]) -> Result<TraceDat<'a>> {
    virtprof_trace::tracedat::read(bytes).map_err(|e| SessionError::in_file(path, e))
}

/// A trace.dat's (or perf.data's) event formats as a recording keeps them: owned text.
pub(crate) fn kept_formats(formats: Vec<virtprof_trace::tracedat::FormatText<'_>>) -> Vec<FormatText> {
    formats
        .into_iter()
        .map(|f| {
            let (system, text) = f.into_owned();
            FormatText { system, text }
        })
        .collect()
}

/// Each CPU's page segments, borrowed from the source (compressed ones still compressed).
pub type CpuSegments<'a> = Vec<(u32, Vec<Segment<'a>>)>;

/// A trace.dat as recording metadata, loss figures, and its pages (still where they were).
/// Timestamps that are not nanoseconds get the scale that makes them so (`cycles` where the
/// file holds TSC cycles and no conversion of its own); without one that is bad input.
pub fn trace_dat_parts<'a>(
    path: &Path,
    dat: TraceDat<'a>,
    cycles: Option<(TimeScale, String)>,
) -> Result<(Metadata, Footer, CpuSegments<'a>)> {
    let (time_scale, tsc_from) = dat.time_scale(cycles);
    let cpus = dat.cpus();
    if cpus.is_empty() && dat.texts.iter().any(|t| !t.text.trim().is_empty()) {
        // Only BUFFER_TEXT / v6 latency data: a latency tracer's text, no events to analyse.
        return Err(SessionError::in_file(
            path,
            "holds only latency-tracer text (trace-cmd's BUFFER_TEXT or latency data), no ring-buffer events; `trace-cmd report` prints it",
        ));
    }
    let tasks = saved_tasks(&dat.cmdlines, "");
    let mut cpu_loss: Vec<KernelLoss> = Vec::new();
    for stats in &dat.cpu_stats {
        let Some(cpu) = stats.lines().next().and_then(|l| l.strip_prefix("CPU:")).and_then(|c| c.trim().parse().ok())
        else {
            continue;
        };
        let (overrun, dropped) = (stat_value(stats, "overrun"), stat_value(stats, "dropped events"));
        // Each buffer reports its own CPUs: a CPU's loss is the sum over buffers.
        match cpu_loss.iter_mut().find(|l| l.cpu == Cpu(cpu)) {
            Some(l) => {
                l.overrun = l.overrun.saturating_add(overrun);
                l.dropped = l.dropped.saturating_add(dropped);
            }
            None => cpu_loss.push(KernelLoss { cpu: Cpu(cpu), overrun, dropped }),
        }
    }
    let mut host = std::collections::BTreeMap::new();
    host.insert("trace_dat_version".to_string(), dat.version.to_string());
    let compression = dat.compression.map_or("none", |c| c.name());
    host.insert("trace_dat_compression".to_string(), compression.to_string());
    let facts = [("uname", &dat.uname), ("trace_cmd_version", &dat.tracer_version)];
    for (key, value) in facts.into_iter().filter(|(_, v)| !v.trim().is_empty()) {
        host.insert(key.to_string(), value.trim().to_string());
    }
    if let Some(n) = dat.cpu_count {
        host.insert("cpu_count".to_string(), n.to_string());
    }
    if let Some(from) = tsc_from {
        host.insert(TSC_CONVERSION.to_string(), from);
    }
    if let Some(id) = dat.trace_id {
        host.insert("trace_id".to_string(), format!("{id:#x}"));
    }
    let names: Vec<&str> =
        dat.buffers.iter().map(|b| if b.name.is_empty() { "(top)" } else { b.name.as_str() }).collect();
    host.insert("buffers".to_string(), names.join(","));
    let guests = dat
        .guests
        .iter()
        .map(|g| virtprof_store::recording::GuestVcpuThreads {
            name: g.name.clone(),
            trace_id: Some(g.trace_id),
            vcpus: g.vcpus.clone(),
        })
        .collect();
    let metadata = Metadata {
        origin: format!("import trace.dat {}", path.display()),
        trace_clock: dat.clock.clone(),
        header_page: dat.header_page,
        formats: crate::import::kept_formats(dat.formats),
        cpus: cpus.iter().map(|(c, _)| *c).collect(),
        host,
        tasks,
        time_scale,
        guests,
        clock_sync: dat.time_shift.clone(),
        ..Default::default()
    };
    Ok((metadata, Footer { cpu_loss, ..Default::default() }, cpus))
}

/// Re-encode ftrace text into pages through the traced kernel's format files.
fn read_ftrace_text(path: &Path, formats_root: &Path) -> Result<(Metadata, CpuPages, Footer)> {
    use virtprof_trace::text::{parse_line, PageWriter, TextEncoder};
    fn formats_error(e: impl std::fmt::Display) -> SessionError {
        SessionError::BadInput(format!("--formats: {e}"))
    }
    let layout = virtprof_trace::tracefs::load_layout(formats_root, &[]).map_err(formats_error)?;
    let header_page =
        virtprof_trace::tracefs::read_file(&formats_root.join("events/header_page")).map_err(formats_error)?;
    let formats = virtprof_trace::tracefs::format_texts(formats_root, &[]).map_err(formats_error)?;
    let text = virtprof_host::input::read_text(path, "ftrace text", MAX_IMPORT)?;
    let encoder = TextEncoder::new(&layout);
    let mut writers: std::collections::BTreeMap<u32, PageWriter> = Default::default();
    // What the text holds: the events it shows (the formats folder has every one).
    let mut seen: std::collections::BTreeSet<String> = Default::default();
    let mut tasks: std::collections::BTreeMap<u32, Task> = Default::default();
    let (mut events, mut skipped) = (0u64, 0u64);
    for (number, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() || line.starts_with("cpus=") {
            continue;
        }
        let Some(parsed) = parse_line(line) else {
            return Err(SessionError::in_file(
                path,
                format!("line {}: not an ftrace text line: '{}'", number + 1, line.escape_debug()),
            ));
        };
        // Each CPU gets pages of its own: lines naming CPUs no kernel has would make a page
        // out of every short line.
        if parsed.cpu >= crate::session::MAX_CPUS {
            return Err(SessionError::in_file(
                path,
                format!(
                    "line {}: CPU {}; no kernel has more than {} CPUs",
                    number + 1,
                    parsed.cpu,
                    crate::session::MAX_CPUS
                ),
            ));
        }
        match encoder.encode(&parsed) {
            Ok(record) => {
                if let Some(format) = layout.format_by_name("", parsed.name) {
                    seen.insert(format!("{}:{}", format.system, format.name));
                }
                writers
                    .entry(parsed.cpu)
                    .or_insert_with(|| PageWriter::new(&layout))
                    .push(parsed.ts, &record)
                    .map_err(|e| SessionError::in_file(path, format!("line {}: {e}", number + 1)))?;
                tasks.entry(parsed.pid).or_insert_with(|| Task {
                    tid: parsed.pid,
                    pid: parsed.pid,
                    comm: parsed.comm.to_string(),
                });
                events += 1;
            }
            Err(_) => skipped += 1,
        }
    }
    if events == 0 {
        return Err(SessionError::in_file(
            path,
            format!("no event matched the formats in '{}'", formats_root.display()),
        ));
    }
    if skipped > 0 {
        eprintln!("virtprof: warning: {skipped} lines name events missing from --formats; they were skipped");
    }
    let cpus: CpuPages = writers
        .into_iter()
        .map(|(cpu, mut w)| {
            w.flush();
            (cpu, w.pages)
        })
        .collect();
    let metadata = Metadata {
        origin: format!("import ftrace-text {}", path.display()),
        trace_clock: TEXT_CLOCK.into(),
        header_page,
        formats: formats.into_iter().map(|(system, text)| FormatText { system, text }).collect(),
        events: Some(seen.into_iter().collect()),
        cpus: cpus.iter().map(|(c, _)| *c).collect(),
        host: Default::default(),
        tasks: tasks.into_values().collect(),
        ..Default::default()
    };
    Ok((metadata, cpus, Footer::default()))
}

/// Raw pages per CPU.
pub type CpuPages = Vec<(u32, Vec<u8>)>;

/// Read a tracefs dump into recording metadata, per-CPU pages and loss figures.
fn read_tracefs_dump(root: &Path, options: &SourceOptions) -> Result<(Metadata, CpuPages, Footer)> {
    let read = |rel: &str| virtprof_trace::tracefs::read_file(&root.join(rel));
    let bad = |e: virtprof_trace::TraceError| SessionError::in_file(root, e);
    let header_page =
        read("events/header_page").map_err(|e| SessionError::in_file(root, format!("events/header_page: {e}")))?;
    let formats =
        format_texts(root, &[]).map_err(bad)?.into_iter().map(|(system, text)| FormatText { system, text }).collect();
    let trace_clock = read("trace_clock").map_or_else(|_| UNKNOWN_CLOCK.into(), |t| selected_clock(&t));
    let tasks = saved_tasks(&read("saved_cmdlines").unwrap_or_default(), &read("saved_tgids").unwrap_or_default());
    let pages = read_cpu_pages(root).map_err(bad)?;
    let cpu_loss = pages
        .iter()
        .map(|c| KernelLoss {
            cpu: Cpu(c.cpu),
            overrun: stat_value(&c.stats, "overrun"),
            dropped: stat_value(&c.stats, "dropped events"),
        })
        .collect();
    let cpus: CpuPages = pages.into_iter().map(|c| (c.cpu, c.raw)).collect();
    // The events that were enabled, where the dump says (`set_event`): its events/ folder
    // holds every format of the kernel, traced or not.
    let events = read("set_event").ok().map(|text| {
        let mut events: Vec<String> =
            text.lines().map(str::trim).filter(|l| l.contains(':')).map(String::from).collect();
        events.sort();
        events
    });
    // A dump on the TSC clock has no conversion of its own: --tsc-khz gives it.
    let mut host = std::collections::BTreeMap::new();
    let cycles = (trace_clock == virtprof_trace::tracedat::TSC_CLOCK).then(|| options.cycles()).flatten();
    if let Some((_, from)) = &cycles {
        host.insert(TSC_CONVERSION.to_string(), from.clone());
    }
    let metadata = Metadata {
        origin: format!("import tracefs-dump {}", root.display()),
        trace_clock,
        header_page,
        formats,
        events,
        cpus: cpus.iter().map(|(c, _)| *c).collect(),
        tasks,
        host,
        time_scale: cycles.map(|(scale, _)| scale),
        ..Default::default()
    };
    Ok((metadata, cpus, Footer { cpu_loss, ..Default::default() }))
}

/// Tasks for the metadata from a capture's saved_cmdlines/saved_tgids texts.
fn saved_tasks(cmdlines: &str, tgids: &str) -> Vec<Task> {
    parse_saved_tasks(cmdlines, tgids).into_iter().map(|(tid, pid, comm)| Task { tid, pid, comm }).collect()
}
