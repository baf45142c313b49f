//! A source opened for reading: container chunks (store) or an imported capture → decoder and
//! per-CPU pages (trace), with the metadata, interval rows and loss every command reads.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use virtprof_analysis::intervals::IntervalTable;
use virtprof_analysis::Analyzer;
use virtprof_model::clock::{clock_unit, ClockUnit, TimeScale};
use virtprof_model::evidence::{Class, Holdings};
use virtprof_model::Event;
use virtprof_model::{HostKind, Loss};
use virtprof_store::recording::{
    Chunk, Footer, GuestMachine, KvmStatsSnapshot, Metadata, Reader, Task, TasksFound, VmIdentity,
};
use virtprof_trace::decode::{Decoder, Layout};
use virtprof_trace::format::{owned_text, parse_event_format, parse_event_identity, parse_header_page};
use virtprof_trace::merge::{merge_cpus, time_range, CpuStream, WalkStats};
use virtprof_trace::page::Page;
use virtprof_trace::segment::{Codec, Segment};

/// How far past its recorded duration a recording's events may lie from its middle page:
/// `record` times its duration after tracing starts and drains the buffers after it ends.
pub const SPAN_SLACK_NS: u64 = 1_000_000_000;

/// Linux's largest CONFIG_NR_CPUS.
pub const MAX_CPUS: u32 = 8192;

use crate::backing::Backing;
use crate::error::{Result, SessionError};
use crate::import::SourceOptions;
use crate::names::DecoderNames;

/// A recording, memory-mapped (page data is read in place, never copied), or a capture from
/// elsewhere imported in memory.
pub struct Session {
    /// The file or directory it was opened from.
    pub path: std::path::PathBuf,
    /// Its metadata.
    pub metadata: Metadata,
    /// Its footer (None if the file was cut short before it).
    pub footer: Option<Footer>,
    /// Where the file was cut short, if it was.
    pub truncated_at: Option<u64>,
    /// The file's length in bytes (0 for a capture imported in memory).
    pub bytes: u64,
    /// The sampled interval rows (`record --interval`), if any.
    pub intervals: Option<IntervalTable>,
    /// Guest agents' rows, clocks and gaps (`record --agent`).
    pub guests: Vec<crate::guest::GuestStream>,
    /// Threads first seen during the recording (its tasks chunks and footer), sorted; the
    /// metadata's tasks hold them too.
    pub appeared: Vec<u32>,
    pages: Pages,
    /// A trace.dat's event formats where its file holds them plainly: (system, byte range of
    /// the text in the mapped bytes). Left there, and parsed only as far as a decoder needs:
    /// a trace.dat carries thousands. Formats held any other way are in `metadata.formats`.
    formats_in_file: Vec<(String, Range<usize>)>,
    /// [`Session::time_bounds`], found once: every walk and every loss line asks for it.
    bounds: std::sync::OnceLock<Option<(u64, u64)>>,
    /// A guest's trace.dat read alone: its TIME_SHIFT corrections put its raw timestamps on
    /// its host's clock before its time scale, per CPU, as trace-cmd's reader does. Its
    /// decoder then leaves timestamps raw, and the walk places them.
    pub(crate) time_shift: Option<virtprof_model::clock_sync::ClockSync>,
    /// The guest machine a recording holds beside its host (`import host.dat --guest`).
    embedded_guest: Option<EmbeddedGuest>,
}

/// A guest machine's metadata and where its pages are in the recording's bytes.
struct EmbeddedGuest {
    machine: GuestMachine,
    cpus: Vec<(u32, Vec<Span>)>,
}

/// Where the pages live.
enum Pages {
    /// A file's bytes, with each CPU's page chunks as byte ranges into them, in order.
    Mapped { map: Backing, cpus: Vec<(u32, Vec<Span>)> },
    /// A capture imported in memory: each CPU's pages as read.
    Owned(Vec<(u32, Vec<u8>)>),
}

/// Where a chunk of one CPU's pages sits in a mapped file.
#[derive(Debug, Clone)]
struct Span {
    range: Range<usize>,
    /// For a compressed frame (trace-cmd's compressed trace.dat): how, and the bytes of pages
    /// it expands to.
    expands_to: Option<(Codec, usize)>,
}

impl Span {
    fn pages(range: Range<usize>) -> Span {
        Span { range, expands_to: None }
    }

    fn segment<'a>(&self, map: &'a [u8]) -> Segment<'a> {
        let frame = &map[self.range.clone()];
        match self.expands_to {
            None => Segment::Pages(frame),
            Some((codec, size)) => Segment::Frame { codec, frame, size, offset: self.range.start },
        }
    }
}

impl Session {
    /// Map `path` and index its chunks.
    pub fn open(path: &Path) -> Result<Session> {
        Session::index(path, Backing::Map(map_file(path, "recording")?))
    }

    /// A recording made in memory (a live mode's), named `name` in messages.
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Session> {
        Session::index(Path::new(name), Backing::Memory(bytes.into()))
    }

    /// Index a recording's chunks: page data stays where it is.
    fn index(path: &Path, map: Backing) -> Result<Session> {
        let base = map.as_ptr() as usize;
        let mut reader = Reader::new(&map).map_err(|e| SessionError::in_file(path, e))?;
        let (mut metadata, mut footer) = (None, None);
        let mut cpus: Vec<(u32, Vec<Span>)> = Vec::new();
        let mut intervals: Option<IntervalTable> = None;
        let mut columns: Vec<usize> = Vec::new();
        let mut guests = crate::guest::GuestStreams::default();
        let mut found = Vec::new();
        let mut guest: Option<EmbeddedGuest> = None;
        let span_of = |data: &[u8]| {
            let start = data.as_ptr() as usize - base;
            Span::pages(start..start + data.len())
        };
        while let Some(chunk) = reader.next_chunk().map_err(|e| SessionError::in_file(path, e))? {
            match chunk {
                Chunk::Metadata(m) => metadata = Some(*m),
                Chunk::Pages { cpu, data } => add_span(&mut cpus, cpu, span_of(data)),
                Chunk::GuestMachine(machine) if guest.is_none() => {
                    guest = Some(EmbeddedGuest { machine: *machine, cpus: Vec::new() })
                }
                Chunk::GuestMachine(_) => return Err(SessionError::in_file(path, "holds a second guest machine")),
                Chunk::GuestPages { cpu, data } => match guest.as_mut() {
                    Some(guest) => add_span(&mut guest.cpus, cpu, span_of(data)),
                    None => {
                        return Err(SessionError::in_file(path, "holds guest machine pages before the guest machine"))
                    }
                },
                Chunk::Footer(f) => footer = Some(f),
                Chunk::Agent(record) => guests.record(record),
                Chunk::AgentNoise { agent, payload } => {
                    let start = payload.as_ptr() as usize - base;
                    guests.noise(agent, start..start + payload.len());
                }
                Chunk::Tasks(tasks) => found.push(tasks),
                Chunk::AgentRow { agent, start_ns, end_ns, values } => {
                    if !guests.row(agent, start_ns, end_ns, values) {
                        return Err(SessionError::in_file(
                            path,
                            format!(
                                "a guest row of agent {agent} with {} values does not match its series",
                                values.len() / 8
                            ),
                        ));
                    }
                }
                Chunk::IntervalSchema(schema) => {
                    let table = intervals.get_or_insert_with(|| IntervalTable::new(schema.interval_ns));
                    columns = schema.series.iter().map(|s| table.column_of(s)).collect();
                    for u in schema.unavailable {
                        if !table.unavailable.contains(&u) {
                            table.unavailable.push(u);
                        }
                    }
                }
                Chunk::Intervals(rows) => {
                    let Some(table) = intervals.as_mut().filter(|_| rows.series() == columns.len()) else {
                        return Err(SessionError::in_file(
                            path,
                            format!("interval rows of {} values without a matching schema before them", rows.series()),
                        ));
                    };
                    for row in rows.iter() {
                        let values = columns.iter().enumerate().map(|(i, &c)| (c, row.value(i)));
                        table.push_row(row.index, row.start_ns, row.end_ns, values);
                    }
                }
            }
        }
        let truncated_at = reader.truncated_at;
        if let Some(guest) = guest.as_mut() {
            guest.cpus.sort_by_key(|(c, _)| *c);
        }
        let mut metadata: Metadata = metadata.ok_or_else(|| SessionError::in_file(path, "has no metadata chunk"))?;
        let appeared = add_found(&mut metadata, found, footer.as_ref());
        cpus.sort_by_key(|(c, _)| *c);
        let bytes = map.len() as u64;
        let guests = guests.finish(footer.as_ref().map_or(&[], |f| f.agents.as_slice()), &map);
        Session {
            path: path.to_path_buf(),
            metadata,
            footer,
            truncated_at,
            bytes,
            intervals,
            guests,
            appeared,
            formats_in_file: Vec::new(),
            pages: Pages::Mapped { map, cpus },
            bounds: Default::default(),
            time_shift: None,
            embedded_guest: guest,
        }
        .checked()
    }

    /// The guest machine this recording holds beside its host (`import host.dat --guest
    /// guest.dat`), read as its own source: its pages in place, its loss from the guest's part
    /// of the footer (unknown where the recording was cut short), and the name of the file it
    /// came from.
    pub fn embedded_guest(&self) -> Option<Result<(Session, String)>> {
        let guest = self.embedded_guest.as_ref()?;
        let Pages::Mapped { map, .. } = &self.pages else { return None };
        let file = guest.machine.file.clone();
        let session = Session {
            path: std::path::PathBuf::from(format!("{} (guest '{file}')", self.path.display())),
            metadata: guest.machine.metadata.clone(),
            footer: self.footer.as_ref().and_then(|f| f.guest.as_deref().cloned()),
            truncated_at: self.truncated_at,
            bytes: self.bytes,
            intervals: None,
            guests: Vec::new(),
            appeared: Vec::new(),
            pages: Pages::Mapped { map: map.clone(), cpus: guest.cpus.clone() },
            formats_in_file: Vec::new(),
            bounds: Default::default(),
            time_shift: None,
            embedded_guest: None,
        };
        Some(session.checked().map(|s| (s, file)))
    }

    /// Map a trace-cmd trace.dat: its pages are read in place, compressed frames expanded one
    /// at a time as the walk reaches them.
    fn open_trace_dat(path: &Path, cycles: Option<(TimeScale, String)>) -> Result<Session> {
        Session::index_trace_dat(path, Backing::Map(map_file(path, "trace.dat")?), cycles)
    }

    /// A trace.dat already in memory (`name` names it in messages).
    pub fn trace_dat_from_bytes(bytes: Vec<u8>, name: &str) -> Result<Session> {
        Session::index_trace_dat(Path::new(name), Backing::Memory(bytes.into()), None)
    }

    fn index_trace_dat(path: &Path, map: Backing, cycles: Option<(TimeScale, String)>) -> Result<Session> {
        let base = map.as_ptr() as usize;
        let mut dat = crate::import::parse_trace_dat(path, &map)?;
        let formats = std::mem::take(&mut dat.formats);
        let (mut metadata, footer, cpus) = crate::import::trace_dat_parts(path, dat, cycles)?;
        let at = |bytes: &[u8]| {
            let start = bytes.as_ptr() as usize - base;
            start..start + bytes.len()
        };
        // Left in the file where it holds them plainly; those out of a compressed section
        // are kept as any import keeps them.
        let (in_file, expanded): (Vec<_>, Vec<_>) =
            formats.into_iter().partition(|f| matches!(f.text, Cow::Borrowed(_)));
        metadata.formats.extend(crate::import::kept_formats(expanded));
        let formats_in_file = in_file.into_iter().map(|f| (f.system, at(&f.text))).collect();
        let cpus = cpus
            .into_iter()
            .map(|(cpu, segments)| {
                let spans = segments
                    .iter()
                    .map(|segment| match *segment {
                        Segment::Pages(pages) => Span::pages(at(pages)),
                        Segment::Frame { codec, frame, size, .. } => {
                            Span { range: at(frame), expands_to: Some((codec, size)) }
                        }
                    })
                    .collect();
                (cpu, spans)
            })
            .collect();
        let mut session = Session::imported(path, metadata, footer, Pages::Mapped { map, cpus });
        session.formats_in_file = formats_in_file;
        session.checked()
    }

    /// Refuse what every reading command would get wrong: CPU numbers no kernel has.
    fn checked(self) -> Result<Session> {
        self.cpus_checked()
    }

    /// What its timestamps are where they cannot be read as time, and how to fix that (a
    /// source is read whatever its clock: counting needs none; its durations are unknown):
    /// event counts or jiffies, or CPU cycles with no conversion to nanoseconds. None: they are
    /// nanoseconds (or converted to them).
    pub fn clock_not_time(&self) -> Option<String> {
        let clock = &self.metadata.trace_clock;
        match clock_unit(clock) {
            ClockUnit::NotTime if clock == "counter" => {
                Some(format!("event counts (trace clock '{clock}'), from which no duration can be read"))
            }
            ClockUnit::NotTime => Some(format!("jiffies (trace clock '{clock}'), too coarse for any duration")),
            ClockUnit::Ticks if self.metadata.time_scale.is_none() => {
                Some(format!("CPU cycles (trace clock '{clock}') of an unknown frequency: give --tsc-khz KHZ"))
            }
            _ => None,
        }
    }

    /// The clock line every reading command prints where the timestamps needed a conversion
    /// (the frequency and where it came from) or cannot be read as time (and how to fix it).
    pub fn clock_line(&self) -> Option<String> {
        let hint = " (the traced host's TSC frequency: its dmesg says e.g. 'tsc: Refined TSC clocksource calibration: 2893.202 MHz', that is --tsc-khz 2893202)";
        let line = self.clock_note().or_else(|| {
            let not_time = self.clock_not_time()?;
            Some(format!("timestamps are {not_time}{}", if not_time.contains("--tsc-khz") { hint } else { "" }))
        });
        let shift = self.time_shift.as_ref().map(|sync| {
            format!(
                "a guest's trace, placed on its host's clock by its TIME_SHIFT ({} samples), as trace-cmd reads it",
                sync.samples()
            )
        });
        match (shift, line) {
            (Some(shift), Some(line)) => Some(format!("{shift}; {line}")),
            (shift, line) => shift.or(line),
        }
    }

    /// How its timestamps are read as time, where they needed a conversion: the clock, the
    /// frequency and where it came from (every report says so).
    pub fn clock_note(&self) -> Option<String> {
        let scale = self.metadata.time_scale?;
        if clock_unit(&self.metadata.trace_clock) != ClockUnit::Ticks {
            return None;
        }
        // mult / 2^shift ns per cycle: the frequency in kHz is 10^6 / that.
        let ns_per_cycle = scale.mult as f64 / (1u128 << scale.shift.min(127)) as f64;
        let khz = if ns_per_cycle > 0.0 { 1e6 / ns_per_cycle } else { f64::NAN };
        let from = self.metadata.host.get(crate::import::TSC_CONVERSION).map_or("the source", String::as_str);
        Some(format!(
            "timestamps are CPU cycles (trace clock '{}') read at {khz:.0} kHz, from {from}",
            self.metadata.trace_clock
        ))
    }

    /// A trace clock no kernel has (a damaged file, or a kernel newer than this version): its
    /// timestamps are read as nanoseconds, which they may not be.
    pub fn clock_doubt(&self) -> Option<String> {
        let clock = self.metadata.trace_clock.as_str();
        // Version 6 trace.dat files may not say their clock at all (empty).
        let named = !matches!(clock, "" | crate::import::TEXT_CLOCK | crate::import::UNKNOWN_CLOCK);
        (named && clock_unit(clock) == ClockUnit::Unknown).then(|| {
            format!(
                "trace clock '{}' is not one Linux has ({}, x86-tsc, counter, uptime): its timestamps are read as nanoseconds, which they may not be",
                clock.escape_debug(),
                virtprof_model::clock::NANOSECOND_CLOCKS
            )
        })
    }

    /// Refuse CPU numbers no kernel has (a damaged CPU id): every per-CPU table is indexed
    /// by them.
    fn cpus_checked(self) -> Result<Session> {
        let cpus: Vec<u32> = match &self.pages {
            Pages::Mapped { cpus, .. } => cpus.iter().map(|(cpu, _)| *cpu).collect(),
            Pages::Owned(cpus) => cpus.iter().map(|(cpu, _)| *cpu).collect(),
        };
        match cpus.into_iter().find(|&cpu| cpu >= MAX_CPUS) {
            Some(cpu) => Err(SessionError::in_file(
                &self.path,
                format!("names CPU {cpu}; no kernel has more than {MAX_CPUS} CPUs (the file is damaged)"),
            )),
            None => Ok(self),
        }
    }

    /// A capture from elsewhere: complete (its loss figures are its footer), no interval rows.
    fn imported(path: &Path, metadata: Metadata, footer: Footer, pages: Pages) -> Session {
        Session {
            path: path.to_path_buf(),
            metadata,
            footer: Some(footer),
            truncated_at: None,
            bytes: 0,
            intervals: None,
            guests: Vec::new(),
            appeared: Vec::new(),
            pages,
            formats_in_file: Vec::new(),
            bounds: Default::default(),
            time_shift: None,
            embedded_guest: None,
        }
    }

    /// A recording, or any capture `import` reads (trace.dat, tracefs dump, ftrace text with
    /// `formats`), imported in memory.
    pub fn open_any(path: &Path, options: &SourceOptions) -> Result<Session> {
        if path.exists() && !path.is_dir() {
            // A FIFO or a device must be refused, not opened and read (or waited on).
            virtprof_host::input::open_regular(path, "input")?;
        }
        let head = if path.is_file() { crate::import::file_head(path) } else { Vec::new() };
        if head.starts_with(virtprof_store::recording::MAGIC) || !path.exists() {
            // An imported guest trace keeps its TIME_SHIFT: read as the file itself is.
            return Session::open(path).map(Session::placed_by_time_shift);
        }
        if virtprof_trace::tracedat::is_trace_dat(&head) {
            return Session::open_trace_dat(path, options.cycles()).map(Session::placed_by_time_shift);
        }
        let (metadata, pages, footer) = crate::import::read_source(path, options)?;
        Session::imported(path, metadata, footer, Pages::Owned(pages)).checked()
    }

    /// A guest's trace.dat (one with TIME_SHIFT corrections covering all its CPUs) read on
    /// its host's clock, as trace-cmd reads it alone.
    fn placed_by_time_shift(mut self) -> Session {
        let covers = |sync: &virtprof_model::clock_sync::ClockSync| {
            sync.samples() > 0
                && self.metadata.cpus.iter().all(|&cpu| sync.cpus.get(cpu as usize).is_some_and(|s| !s.is_empty()))
        };
        self.time_shift = self.metadata.clock_sync.clone().filter(covers);
        self
    }

    /// A raw timestamp of `cpu` on the clock every command reads: through the TIME_SHIFT of a
    /// guest read alone, then the time scale (which its decoder leaves out).
    fn placed(&self, cpu: u32, raw: u64) -> u64 {
        let Some(sync) = &self.time_shift else { return raw };
        let host = sync.to_host(cpu, raw).unwrap_or(raw);
        self.metadata.time_scale.map_or(host, |s| s.apply(host))
    }

    /// [`Session::open_any`], warning on stderr when the file was cut short.
    pub fn open_warning(path: &Path, options: &SourceOptions) -> Result<Session> {
        let recording = Session::open_any(path, options)?;
        if let Some(at) = recording.truncated_at {
            eprintln!(
                "virtprof: warning: '{}' was cut short at byte {at}; using what precedes it (lost events past byte {at} are unknown)",
                path.display()
            );
        } else if recording.footer.is_none() {
            eprintln!(
                "virtprof: warning: '{}' ends without its footer (was `record` killed?): lost events past byte {} are unknown",
                path.display(),
                recording.bytes
            );
        } else if let Some(warning) = recording.footer_mismatch() {
            eprintln!("virtprof: warning: '{}': {warning}", path.display());
        }
        if let Some(doubt) = recording.clock_doubt() {
            eprintln!("virtprof: warning: '{}': {doubt}", path.display());
        }
        if let Some(doubt) = recording.footer_loss_doubt() {
            eprintln!("virtprof: warning: '{}': {doubt}; its lost events are unknown", path.display());
        }
        Ok(recording)
    }

    /// Loss figures no kernel can have written (a damaged or forged footer whose checksum
    /// holds): a count on a CPU the recording does not have, or more events than the CPU
    /// could emit in the recording's time at one per nanosecond. Such figures are not taken:
    /// the loss is then unknown.
    pub fn footer_loss_doubt(&self) -> Option<String> {
        let footer = self.footer.as_ref()?;
        // `record` reads every CPU it counts loss on; imports count loss on CPUs that left no
        // events (a perf.data whose samples on a CPU were all lost, a trace.dat's idle CPUs),
        // read from the capture or from a recording `import` made of it. A count of 0 claims
        // nothing.
        let recorded = &self.metadata.cpus;
        let imported = self.metadata.origin.starts_with("import ");
        let own = self.bytes > 0 && !recorded.is_empty() && !imported;
        if let Some(l) = footer.cpu_loss.iter().find(|l| own && l.events() > 0 && !recorded.contains(&l.cpu.0)) {
            return Some(format!(
                "its footer counts {} lost events on CPU {}, which the recording does not have",
                l.events(),
                l.cpu.0
            ));
        }
        // Imports carry no duration: a ceiling no real capture reaches (13 days at one event
        // per nanosecond) still catches a count that wrapped.
        let (most, span) = match footer.duration_ns {
            0 => (1 << 50, "13 days".to_string()),
            ns => (ns.max(1_000_000_000), virtprof_model::units::format_duration_ns(ns.max(1_000_000_000))),
        };
        // An import's figures are the file's own (perf's lost records, trace-cmd's CPU stats).
        let whose = if self.bytes > 0 { "its footer counts" } else { "it counts" };
        footer.cpu_loss.iter().find(|l| l.events() > most).map(|l| {
            format!(
                "{whose} {} lost events on CPU {}, more than a CPU can emit in {span} (one per nanosecond)",
                l.events(),
                l.cpu.0
            )
        })
    }

    /// Damage the checksums cannot see: a recording's footer that disagrees with the pages
    /// the file holds (the footer's loss figures then describe another file).
    pub fn footer_mismatch(&self) -> Option<String> {
        let footer = self.footer.as_ref()?;
        // Imports (bytes 0) build their footer from what they read: nothing to compare.
        if self.bytes == 0 {
            return None;
        }
        let page_size = parse_header_page(&self.metadata.header_page).ok()?.page_size.max(1) as u64;
        let Pages::Mapped { cpus, .. } = &self.pages else { return None };
        let stored: u64 = cpus.iter().flat_map(|(_, spans)| spans).map(|s| s.range.len() as u64 / page_size).sum();
        (footer.pages != stored).then(|| {
            format!(
                "its footer counts {} pages but the file holds {stored}: the file was altered, and the loss figures of its footer may be wrong",
                footer.pages
            )
        })
    }

    /// The kind of KVM host it was recorded on, as `record` probed it (None: not known, e.g.
    /// an import).
    pub fn host_kind(&self) -> Option<HostKind> {
        self.metadata.host.get("host_kind").and_then(|name| HostKind::from_name(name))
    }

    /// What this source holds, and so which figures it can give: the events it traced (its
    /// list where it keeps one, else every event it has a format for: trace-cmd and perf save
    /// only those), KVM stats snapshots, and timestamps that read as time. A host that never
    /// emits kvm_exit (PVM) is said to.
    pub fn holdings(&self, decoder: &Decoder) -> Holdings {
        self.holdings_on(decoder, self.clock_not_time())
    }

    /// [`Session::holdings`] where whether its timestamps read as time is known otherwise (a
    /// guest paired with its host, whose time scale the pairing applies).
    pub(crate) fn holdings_on(&self, decoder: &Decoder, clock_not_time: Option<String>) -> Holdings {
        let listed: Option<std::collections::HashSet<&str>> =
            self.metadata.events.as_ref().map(|events| events.iter().map(String::as_str).collect());
        let has = |system: &str, name: &str| match &listed {
            Some(events) => events.contains(format!("{system}:{name}").as_str()),
            None => decoder.layout().format_by_name(system, name).is_some(),
        };
        let kvm_stats =
            !self.metadata.kvm_stats.is_empty() || self.footer.as_ref().is_some_and(|f| !f.kvm_stats.is_empty());
        let holdings = Holdings::of(has, kvm_stats, clock_not_time);
        match self.host_kind() {
            Some(HostKind::Pvm) => holdings.never_emitted(Class::ExitEntry),
            _ => holdings,
        }
    }

    /// Exits KVM counted for the recording's VMs over it: its stats fds at the end less at the
    /// start (a VM that began during the recording from 0). None where a VM lacks a snapshot
    /// at either end (one whose stats could not be held, a file made elsewhere).
    pub fn kvm_exits(&self) -> Option<u64> {
        let exits = |s: &KvmStatsSnapshot| -> u64 { s.vcpus.iter().filter_map(|(_, m)| m.get("exits")).sum() };
        let pids: std::collections::BTreeSet<u32> = self.kvm_snapshots().map(|s| s.pid).collect();
        if pids.is_empty() {
            return None;
        }
        let spans = self.kvm_stats_spans();
        let mut total = 0u64;
        for pid in pids {
            let (start, end) = spans.iter().find(|(_, end)| end.pid == pid)?;
            total = total.saturating_add(exits(end).saturating_sub(start.map_or(0, exits)));
        }
        Some(total)
    }

    /// Each VM's KVM stats over the recording: its snapshot at the start (None for a VM that
    /// began during the recording, whose counters started from zero) and at the end. A VM
    /// without an end snapshot, or without a start one though it ran before the recording
    /// began, is left out: its counts over the recording are unknown.
    pub fn kvm_stats_spans(&self) -> Vec<(Option<&KvmStatsSnapshot>, &KvmStatsSnapshot)> {
        let Some(footer) = &self.footer else { return Vec::new() };
        footer
            .kvm_stats
            .iter()
            .filter_map(|end| match self.metadata.kvm_stats.iter().find(|s| s.pid == end.pid) {
                Some(start) => Some((Some(start), end)),
                None if self.appeared.contains(&end.pid) => Some((None, end)),
                None => None,
            })
            .collect()
    }

    fn kvm_snapshots(&self) -> impl Iterator<Item = &KvmStatsSnapshot> {
        self.metadata.kvm_stats.iter().chain(self.footer.iter().flat_map(|f| &f.kvm_stats))
    }

    /// A decoder for the recorded kernel's formats. Events of `systems` get full layouts;
    /// the others only their name and id (a trace.dat can carry thousands of formats).
    pub fn decoder(&self, systems: &[&str]) -> Result<Decoder> {
        let mut header = parse_header_page(&self.metadata.header_page)
            .map_err(|e| SessionError::in_file(&self.path, e.to_string()))?;
        // A guest read alone is scaled after its TIME_SHIFT, in the walk.
        header.scale = if self.time_shift.is_some() { None } else { self.metadata.time_scale };
        let kept = self.metadata.formats.iter().map(|f| (f.system.as_str(), f.text.as_bytes()));
        let in_file =
            self.formats_in_file.iter().map(|(system, range)| (system.as_str(), &self.file_bytes()[range.clone()]));
        let formats = kept
            .chain(in_file)
            .map(|(system, text)| {
                if systems.contains(&system) {
                    parse_event_format(system, &owned_text(text))
                } else {
                    parse_event_identity(system, text)
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| SessionError::in_file(&self.path, format!("its event formats: {e}")))?;
        Ok(Decoder::new(Layout::new(header, formats)))
    }

    /// Its metadata as a recording of it would keep: with the event formats a trace.dat holds
    /// plainly (read in place otherwise) copied in.
    pub fn recording_metadata(&self) -> Metadata {
        let mut metadata = self.metadata.clone();
        metadata.formats.extend(self.formats_in_file.iter().map(|(system, range)| {
            virtprof_store::recording::FormatText {
                system: system.clone(),
                text: owned_text(&self.file_bytes()[range.clone()]),
            }
        }));
        metadata
    }

    /// The bytes its pages are read from in place (none for a capture imported in memory).
    fn file_bytes(&self) -> &[u8] {
        match &self.pages {
            Pages::Mapped { map, .. } => map,
            Pages::Owned(_) => &[],
        }
    }

    /// Per-CPU page streams, borrowed (never copied), for [`virtprof_trace::merge::merge_cpus`].
    pub fn streams(&self) -> Vec<CpuStream<'_>> {
        match &self.pages {
            Pages::Mapped { map, cpus } => cpus
                .iter()
                .map(|(cpu, spans)| CpuStream { cpu: *cpu, segments: spans.iter().map(|s| s.segment(map)).collect() })
                .collect(),
            Pages::Owned(cpus) => cpus.iter().map(|(cpu, raw)| CpuStream::contiguous(*cpu, raw)).collect(),
        }
    }

    /// Decode every CPU's pages through `decoder` and deliver the events to `sink` in
    /// timestamp order. A page that does not decode is bad input, named by file, CPU and
    /// byte.
    /// Events whose timestamps lie outside [`Session::time_bounds`] (a damaged page) are
    /// counted in the walk's loss and skipped, so no analysis stretches its windows to them.
    pub fn walk(&self, decoder: &mut Decoder, mut sink: impl FnMut(&Event, &Decoder)) -> Result<WalkStats> {
        let bounds = self.time_bounds(decoder);
        let mut outside = 0u64;
        let shifted = self.time_shift.is_some();
        let mut stats = merge_cpus(decoder, &self.streams(), |e, d| match bounds {
            Some((lo, hi)) if e.ts < lo || e.ts > hi => outside += 1,
            _ if shifted => sink(&Event { ts: self.placed(e.cpu, e.ts), ..*e }, d),
            _ => sink(e, d),
        })
        .map_err(|e| SessionError::in_file(&self.path, e))?;
        stats.page_loss.outside_span = outside;
        Ok(stats)
    }

    /// Where every event of this recording must lie: its duration (from the footer) either
    /// side of the median page time, with [`SPAN_SLACK_NS`] more. The median page lies inside
    /// the recording, so every true event is within one duration of it, whatever a damaged
    /// page claims. None without a duration (an import, a recording cut short): there the
    /// window and bucket caps bound memory instead.
    pub fn time_bounds(&self, decoder: &Decoder) -> Option<(u64, u64)> {
        *self.bounds.get_or_init(|| self.find_time_bounds(decoder))
    }

    fn find_time_bounds(&self, decoder: &Decoder) -> Option<(u64, u64)> {
        let duration = self.footer.as_ref().map_or(0, |f| f.duration_ns);
        if duration == 0 {
            return None;
        }
        let header = &decoder.layout().header;
        let mut times = Vec::new();
        for stream in self.streams() {
            for segment in &stream.segments {
                let Segment::Pages(pages) = segment else { continue };
                for page in pages.chunks_exact(header.page_size.max(1)) {
                    times.extend(Page::parse(page, header).ok().map(|p| p.base_ts()).filter(|&ts| ts > 0));
                }
            }
        }
        if times.is_empty() {
            return None;
        }
        let middle = times.len() / 2;
        let median = *times.select_nth_unstable(middle).1;
        let reach = duration.saturating_add(SPAN_SLACK_NS);
        Some((median.saturating_sub(reach), median.saturating_add(reach)))
    }

    /// The first and last page times (see [`virtprof_trace::merge::time_range`]) within
    /// [`Session::time_bounds`].
    pub fn time_range(&self, decoder: &Decoder) -> Option<(u64, u64)> {
        let (first, last) = time_range(&decoder.layout().header, &self.streams())?;
        let cpu = self.metadata.cpus.first().copied().unwrap_or(0);
        let (first, last) = (self.placed(cpu, first), self.placed(cpu, last));
        Some(match self.time_bounds(decoder) {
            Some((lo, hi)) => (first.clamp(lo, hi), last.clamp(lo, hi)),
            None => (first, last),
        })
    }

    /// The one pass over a source: walk it once and hand every event, in timestamp order, to
    /// each of `analyzers`, naming through this recording's kernel formats.
    pub fn analyse(&self, decoder: &mut Decoder, analyzers: &mut [&mut dyn Analyzer]) -> Result<WalkStats> {
        self.walk(decoder, |e, d| {
            let names = DecoderNames(d);
            for a in analyzers.iter_mut() {
                a.on_event(e, &names);
            }
        })
    }

    /// The events this recording lost, counted once for every command: the kernel's per-CPU
    /// counters from the footer (what `record` printed), located by the gaps `walk` found on
    /// the pages. Without a footer the figure is unknown past the last complete chunk.
    pub fn loss(&self, walk: &WalkStats) -> Loss {
        let mut loss = walk.page_loss.clone();
        if let Some(doubt) = self.footer_loss_doubt() {
            loss.complete = false;
            loss.unknown_because = Some(doubt);
            return loss;
        }
        match &self.footer {
            Some(footer) => {
                loss.complete = true;
                for counters in &footer.cpu_loss {
                    loss.report_counters(counters);
                }
            }
            None => {
                loss.complete = false;
                loss.known_until_byte = Some(self.truncated_at.unwrap_or(self.bytes));
            }
        }
        loss
    }

    /// The earliest page timestamp: the origin of the times [`Loss::describe`] prints.
    pub fn origin_ns(&self, decoder: &Decoder) -> u64 {
        self.time_range(decoder).map_or(0, |(start, _)| start)
    }

    /// The loss as reading commands print it: the `lost events:` line, and where the kernel
    /// dropped events a note saying what `across_a_gap` means for the command's figures.
    pub fn loss_report(&self, loss: &Loss, decoder: &Decoder, across_a_gap: &str) -> String {
        let mut text = format!("lost events: {}", self.describe_loss(loss, decoder));
        if loss.gaps() > 0 {
            let gaps = loss.gaps();
            let plural = if gaps == 1 { "" } else { "s" };
            text += &format!("\nnote: {gaps} gap{plural} where the kernel dropped events: {across_a_gap}");
        }
        text
    }

    /// The loss line every reading command prints.
    pub fn describe_loss(&self, loss: &Loss, decoder: &Decoder) -> String {
        loss.describe(self.origin_ns(decoder))
    }
}

/// Append a chunk's span to its CPU's, in file order.
fn add_span(cpus: &mut Vec<(u32, Vec<Span>)>, cpu: u32, span: Span) {
    match cpus.iter_mut().find(|(c, _)| *c == cpu) {
        Some((_, spans)) => spans.push(span),
        None => cpus.push((cpu, vec![span])),
    }
}

/// Threads and VMs found during the recording (its tasks chunks, then its footer) joined to
/// those at its start: one entry per tid and per VM, the latest found. Returns the threads
/// that were not there at the start.
fn add_found(metadata: &mut Metadata, found: Vec<TasksFound>, footer: Option<&Footer>) -> Vec<u32> {
    if found.is_empty() && footer.is_none_or(|f| f.tasks.is_empty()) {
        return Vec::new();
    }
    let mut tasks: BTreeMap<u32, Task> = metadata.tasks.drain(..).map(|t| (t.tid, t)).collect();
    let at_start: std::collections::HashSet<u32> = tasks.keys().copied().collect();
    let mut vms: BTreeMap<u32, VmIdentity> = metadata.vm_identities.drain(..).map(|v| (v.pid, v)).collect();
    for f in found {
        tasks.extend(f.tasks.into_iter().map(|t| (t.tid, t)));
        vms.extend(f.vm_identities.into_iter().map(|v| (v.pid, v)));
    }
    if let Some(f) = footer {
        tasks.extend(f.tasks.iter().map(|t| (t.tid, t.clone())));
    }
    let appeared = tasks.keys().copied().filter(|tid| !at_start.contains(tid)).collect();
    metadata.tasks = tasks.into_values().collect();
    metadata.vm_identities = vms.into_values().collect();
    appeared
}

/// Map `path` (a `what`, for errors) read-only. Where some of it is not in memory, its pages
/// are read in on a thread of their own while the caller reads the headers and builds its
/// decoder: 3 ms of a 22 ms run on a 28 MB file read from disk here (where the kernel cannot,
/// before Linux 5.14, the walk's threads fault the pages in as they reach them). A file
/// already in memory is left to the walk's threads: faulting it in up front cost 0.7-1 ms of
/// a 16 ms run there (the pass holds the mapping's lock that the caller's allocations wait on).
fn map_file(path: &Path, what: &str) -> Result<std::sync::Arc<memmap2::Mmap>> {
    let file = virtprof_host::input::open_regular(path, what)?;
    // SAFETY: the mapping is read-only and private to this process; a file being modified
    // while we read it would at worst give garbage pages, which the decoders turn into errors,
    // never undefined behaviour in safe code that indexes a byte slice.
    let map = unsafe { memmap2::MmapOptions::new().map(&file) }
        .map_err(SessionError::io(format!("mapping '{}'", path.display())))?;
    let map = std::sync::Arc::new(map);
    let populating = std::sync::Arc::clone(&map);
    // The thread holds the mapping until it is done: nothing waits for it, nothing outlives it.
    let _ = std::thread::Builder::new().name("populate".into()).spawn(move || {
        if !resident(&populating) {
            let _ = populating.advise(memmap2::Advice::PopulateRead);
        }
    });
    Ok(map)
}

/// True if every page of `map` is in the page cache (mincore(2)); false where that cannot be
/// told.
fn resident(map: &memmap2::Mmap) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    let mut pages = vec![0u8; map.len().div_ceil(page)];
    // SAFETY: the range is the live mapping `map` holds; `pages` has a byte per page of it.
    let told = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), pages.as_mut_ptr()) } == 0;
    told && pages.iter().all(|p| p & 1 == 1)
}
