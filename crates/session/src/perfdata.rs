//! `perf.data` from `perf record -e 'kvm:*' ...` or `perf kvm stat record`, read through the
//! `linux-perf-data` crate: each tracepoint sample's raw record is the ring-buffer record the
//! kernel wrote (common fields first), decoded with the formats the file itself carries (its
//! tracing-data feature). The samples are laid into per-CPU pages in time order, so every
//! analysis reads them as it reads a recording; COMM records name threads with their real
//! process; lost records (LOST, LOST_SAMPLES) become loss on their CPU, flagged at the gap.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use linux_perf_data::linux_perf_event_reader::{EventRecord, PerfEventType, RecordType};
use linux_perf_data::{Feature, PerfFileReader, PerfFileRecord, UserRecordType};
use virtprof_model::{Cpu, KernelLoss};
use virtprof_store::recording::{Metadata, Task};
use virtprof_trace::decode::Layout;
use virtprof_trace::format::parse_header_page;
use virtprof_trace::text::PageWriter;

use crate::error::{Result, SessionError};
use crate::import::CpuPages;

/// The feature bit of the event descriptions (HEADER_EVENT_DESC).
const EVENT_DESC_FEATURE: usize = 12;

/// A record whose processor-trace data follows it in the file.
const PERF_RECORD_AUXTRACE: u32 = 71;
/// Records holding a zstd stream of other records (`perf record -z`): the whole body, or
/// (COMPRESSED2, Linux 6.16) `data_size: u64` and that many bytes.
const PERF_RECORD_COMPRESSED: u32 = 81;
const PERF_RECORD_COMPRESSED2: u32 = 83;

/// perf's zstd compresses tracepoint samples about 14:1 at any level (measured here, levels 1
/// and 22): a stream expanding to more than this many times its size is a bomb.
const MAX_EXPANSION_RATIO: u64 = 64;
/// Below this, any expansion is taken (a short file's small stream).
const MIN_EXPANSION_LIMIT: u64 = 16 << 20;

/// perf.data's magic (version 2, little-endian).
pub const MAGIC: &[u8] = b"PERFILE2";

/// One CPU's samples before they are laid into pages: their raw records one after another,
/// each as (time, where in `bytes`, length), and gaps (time, count). One buffer, not one per
/// sample: a sample's own allocation would cost more than its record.
#[derive(Default)]
struct CpuSamples {
    bytes: Vec<u8>,
    records: Vec<(u64, usize, usize)>,
    lost: Vec<(u64, u64)>,
}

impl CpuSamples {
    fn push(&mut self, ts: u64, raw: &[u8]) {
        self.records.push((ts, self.bytes.len(), raw.len()));
        self.bytes.extend_from_slice(raw);
    }
}

/// What a perf.data holds besides its tracepoint samples, said once.
#[derive(Default)]
struct Skipped {
    not_tracepoints: u64,
    without_raw: u64,
    without_cpu: u64,
}

/// Read a perf.data (a file, or perf's pipe mode: `perf record -o -`) into recording metadata,
/// per-CPU pages and loss figures.
pub fn read(path: &Path, max_bytes: u64) -> Result<(Metadata, CpuPages, virtprof_store::recording::Footer)> {
    let bad = |e: String| SessionError::in_file(path, e);
    let bytes = virtprof_host::input::read_bytes(path, "perf.data", max_bytes)?;
    let pipe = bytes.starts_with(MAGIC) && bytes.get(8..16) == Some(&PIPE_HEADER_SIZE.to_le_bytes()[..]);
    // The parser allocates what the file declares and indexes what it reads: the layout is
    // checked against the file first, and a panic on damage it still trips over is caught
    // and reported as bad input.
    let parsed = if pipe {
        let split = split_pipe(&bytes).map_err(|e| bad(format!("perf.data (pipe mode): {e}")))?;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let reader = PerfFileReader::parse_pipe(std::io::Cursor::new(&split.stream[..]));
            parse(path, reader, Some(split.tracing))
        }))
    } else {
        check_layout(&bytes).map_err(|e| bad(format!("perf.data: {e}")))?;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            parse(path, PerfFileReader::parse_file(std::io::Cursor::new(&bytes[..])), None)
        }))
    };
    parsed.unwrap_or_else(|_| {
        Err(bad("perf.data: the file is damaged (its records do not parse; the parser stopped)".into()))
    })
}

/// The header of perf's pipe mode: the magic and its own size, nothing else; attributes and
/// features come as records in the stream.
const PIPE_HEADER_SIZE: u64 = 16;
/// Pipe mode's tracepoint formats: a record whose `size: u32` bytes of tracing data follow it
/// in the stream, padded to 8 bytes (the parser would read them as records).
const PERF_RECORD_HEADER_TRACING_DATA: u32 = 66;

/// A pipe-mode stream with its tracing data taken out, and that data.
struct PipeStream {
    stream: Vec<u8>,
    tracing: Vec<u8>,
}

/// Walk a pipe-mode stream's records (each inside the stream; compressed ones within their
/// expansion bound), taking the tracing data out. A record cut short at the end (perf killed
/// mid-write) ends the stream there, said on standard error.
fn split_pipe(data: &[u8]) -> std::result::Result<PipeStream, String> {
    let u32_at = |at: usize| data.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4")));
    let u64_at = |at: usize| data.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
    let mut stream = data[..16].to_vec();
    let mut tracing = None;
    let mut compressed: Vec<&[u8]> = Vec::new();
    let mut at = 16usize;
    while at + 8 <= data.len() {
        let kind = u32_at(at).expect("inside");
        let size = usize::from(u16::from_le_bytes(data[at + 6..at + 8].try_into().expect("2")));
        if size < 8 {
            return Err(format!("a record at byte {at} claims {size} bytes"));
        }
        let Some(record) = data.get(at..at + size) else { break };
        let mut end = at + size;
        match kind {
            PERF_RECORD_HEADER_TRACING_DATA => {
                let len = u32_at(at + 8).ok_or("a tracing-data record without its size")? as usize;
                let body = data.get(end..end + len).ok_or_else(|| {
                    format!("the tracing data at byte {end} claims {len} bytes; the stream has {}", data.len() - end)
                })?;
                tracing = Some(body.to_vec());
                at = end + len.div_ceil(8) * 8;
                continue;
            }
            PERF_RECORD_AUXTRACE => {
                let aux = u64_at(at + 8).and_then(|a| usize::try_from(a).ok()).unwrap_or(usize::MAX);
                end = end.checked_add(aux).filter(|&e| e <= data.len()).ok_or_else(|| {
                    format!("an AUXTRACE record at byte {at} claims {aux} bytes past the stream's end")
                })?;
            }
            PERF_RECORD_COMPRESSED => compressed.push(&record[8..]),
            PERF_RECORD_COMPRESSED2 => {
                let len = u64_at(at + 8).and_then(|l| usize::try_from(l).ok()).unwrap_or(usize::MAX);
                let body = record.get(16..16usize.saturating_add(len));
                compressed.push(body.ok_or_else(|| format!("a compressed record at byte {at} claims {len} bytes"))?);
            }
            _ => {}
        }
        stream.extend_from_slice(&data[at..end]);
        at = end;
    }
    if at < data.len() {
        eprintln!(
            "virtprof: warning: the perf.data stream ends inside a record at byte {at} ({} bytes cut off): read up to it",
            data.len() - at
        );
    }
    check_expansion(&compressed)?;
    let tracing = tracing.ok_or("no tracepoint formats in the stream (no tracing-data record): record tracepoints, e.g. perf record -o - -e 'kvm:*' -a")?;
    Ok(PipeStream { stream, tracing })
}

/// The perf.data header's sections (attributes, data, feature table, each feature, each
/// attribute's ids) lie inside the file: what the parser allocates is then bounded by it.
fn check_layout(data: &[u8]) -> std::result::Result<(), String> {
    let u64_at = |at: usize| -> std::result::Result<u64, String> {
        data.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
            .ok_or_else(|| format!("needs byte {} of the header; the file has {}", at + 8, data.len()))
    };
    let section = |at: usize, what: &str| -> std::result::Result<(u64, u64), String> {
        let (offset, size) = (u64_at(at)?, u64_at(at + 8)?);
        match offset.checked_add(size) {
            Some(end) if end <= data.len() as u64 => Ok((offset, size)),
            _ => Err(format!(
                "the {what} section ({size} bytes at byte {offset}) runs past the end of the file ({} bytes)",
                data.len()
            )),
        }
    };
    if !data.starts_with(MAGIC) {
        return Err("not a little-endian perf.data (PERFILE2)".into());
    }
    let header_size = u64_at(8)?;
    let attr_size = u64_at(16)?;
    if header_size != 104 {
        return Err(format!("header of {header_size} bytes, not 104"));
    }
    if !(80..=4096).contains(&attr_size) {
        return Err(format!("attributes of {attr_size} bytes each"));
    }
    let (attrs, attrs_size) = section(24, "attributes")?;
    let (data_at, data_size) = section(40, "data")?;
    if attrs_size % attr_size != 0 {
        return Err(format!("attributes section of {attrs_size} bytes is not whole {attr_size}-byte entries"));
    }
    for i in 0..attrs_size / attr_size {
        // Each entry ends with the file section of its event ids.
        let at = usize::try_from(attrs + (i + 1) * attr_size - 16).map_err(|e| e.to_string())?;
        section(at, "event ids")?;
    }
    // Records: an AUXTRACE record's data follows it, sized by the record: it must end inside
    // the data section (the parser allocates what it says before reading). Compressed ones
    // expand within a bound, checked before the parser expands them (it holds a record's
    // whole expansion at once).
    let end = data_at + data_size;
    let mut at = data_at;
    let mut compressed: Vec<&[u8]> = Vec::new();
    while at + 8 <= end {
        let i = usize::try_from(at).map_err(|e| e.to_string())?;
        let kind = u32::from_le_bytes(data[i..i + 4].try_into().expect("4"));
        let size = u64::from(u16::from_le_bytes(data[i + 6..i + 8].try_into().expect("2")));
        if size < 8 {
            return Err(format!("a record at byte {at} claims {size} bytes"));
        }
        let mut next = at + size;
        let body =
            data.get(i + 8..(i + usize::from(u16::try_from(size).unwrap_or(0))).min(data.len())).unwrap_or_default();
        if kind == PERF_RECORD_COMPRESSED {
            compressed.push(body);
        } else if kind == PERF_RECORD_COMPRESSED2 {
            let len = body.get(..8).map_or(u64::MAX, |b| u64::from_le_bytes(b.try_into().expect("8")));
            let stream = usize::try_from(len).ok().and_then(|len| body.get(8..8 + len));
            compressed.push(stream.ok_or_else(|| format!("a compressed record at byte {at} claims {len} bytes"))?);
        }
        if kind == PERF_RECORD_AUXTRACE {
            let aux = if size >= 16 { u64_at(i + 8)? } else { u64::MAX };
            next = next.checked_add(aux).filter(|&n| n <= end).ok_or_else(|| {
                format!("an AUXTRACE record at byte {at} claims {aux} bytes past the data section's end")
            })?;
        }
        at = next;
    }
    check_expansion(&compressed)?;
    section(56, "event types")?;
    let bits: Vec<u64> = (0..4).map(|w| u64_at(72 + 8 * w)).collect::<std::result::Result<_, _>>()?;
    let table = usize::try_from(data_at + data_size).map_err(|e| e.to_string())?;
    // Feature sections are listed in bit order; the event descriptions are parsed up front.
    let mut index = 0;
    for bit in 0..256usize {
        if bits[bit / 64] >> (bit % 64) & 1 == 0 {
            continue;
        }
        let (offset, size) = section(table + 16 * index, "feature")?;
        index += 1;
        if bit == EVENT_DESC_FEATURE {
            let start = usize::try_from(offset).map_err(|e| e.to_string())?;
            let end = start + usize::try_from(size).map_err(|e| e.to_string())?;
            check_event_desc(&data[start..end])?;
        }
    }
    Ok(())
}

/// perf's compressed records are one zstd stream, cut into records: expanded without keeping
/// it (a buffer at a time), it must stay within [`MAX_EXPANSION_RATIO`] times its size (or
/// [`MIN_EXPANSION_LIMIT`]).
fn check_expansion(records: &[&[u8]]) -> std::result::Result<(), String> {
    use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};
    if records.is_empty() {
        return Ok(());
    }
    let compressed: u64 = records.iter().map(|r| r.len() as u64).sum();
    let limit = compressed.saturating_mul(MAX_EXPANSION_RATIO).max(MIN_EXPANSION_LIMIT);
    let mut decoder = Decoder::new().map_err(|e| format!("zstd: {e}"))?;
    let mut scratch = vec![0u8; 1 << 20];
    let mut expanded = 0u64;
    for record in records {
        let mut input = InBuffer::around(record);
        loop {
            let mut output = OutBuffer::around(&mut scratch[..]);
            decoder.run(&mut input, &mut output).map_err(|e| format!("a compressed record does not expand: {e}"))?;
            let produced = output.pos();
            expanded += produced as u64;
            if expanded > limit {
                return Err(format!(
                    "its {} compressed records ({compressed} bytes) expand past {limit} bytes, more than {MAX_EXPANSION_RATIO} times their size (perf's zstd gives about 14): the file is damaged, or made to exhaust memory",
                    records.len()
                ));
            }
            if input.pos() == record.len() && produced < scratch.len() {
                break;
            }
        }
    }
    Ok(())
}

/// The EVENT_DESC feature: `nr: u32, attr_size: u32`, then per event the attribute, `nr_ids:
/// u32`, a string (`len: u32, bytes`) and the ids. Every count must fit the section, which the
/// parser otherwise allocates for before reading.
fn check_event_desc(section: &[u8]) -> std::result::Result<(), String> {
    let fail = || "the event descriptions claim more than their section holds".to_string();
    let u32_at = |at: usize| -> std::result::Result<usize, String> {
        section.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4")) as usize).ok_or_else(fail)
    };
    let (events, attr_size) = (u32_at(0)?, u32_at(4)?);
    let mut at = 8usize;
    for _ in 0..events {
        at = at.checked_add(attr_size).ok_or_else(fail)?;
        let ids = u32_at(at)?;
        let name = u32_at(at + 4)?;
        at = (at + 8).checked_add(name).and_then(|a| a.checked_add(ids.checked_mul(8)?)).ok_or_else(fail)?;
        if at > section.len() {
            return Err(fail());
        }
    }
    Ok(())
}

/// The samples of a parsed perf.data; `tracing`: pipe mode's tracing data, taken from the
/// stream (a file has it as a feature).
fn parse<R: std::io::Read>(
    path: &Path,
    reader: std::result::Result<PerfFileReader<R>, linux_perf_data::Error>,
    tracing: Option<Vec<u8>>,
) -> Result<(Metadata, CpuPages, virtprof_store::recording::Footer)> {
    let bad = |e: String| SessionError::in_file(path, e);
    let PerfFileReader { mut perf_file, mut record_iter } = reader.map_err(|e| bad(format!("perf.data: {e}")))?;
    let tracing = tracing.or_else(|| perf_file.feature_section_data(Feature::TRACING_DATA).map(<[u8]>::to_vec)).ok_or_else(|| {
        bad("perf.data has no tracepoint formats (no tracing-data feature): record it with tracepoints, e.g. perf record -e 'kvm:*' -e 'sched:*' -a".into())
    })?;
    let dat = virtprof_trace::tracedat::read_tracing_data(&tracing).map_err(|e| bad(format!("perf.data: {e}")))?;
    let header = parse_header_page(&dat.header_page).map_err(|e| bad(format!("perf.data header_page: {e}")))?;
    let layout = Layout::new(header, Vec::new());
    // Tracepoint ids by attribute, to keep only those samples.
    let tracepoint: Vec<bool> =
        perf_file.event_attributes().iter().map(|a| matches!(a.attr.type_, PerfEventType::Tracepoint(_))).collect();
    let mut cpus: BTreeMap<u32, CpuSamples> = BTreeMap::new();
    let mut tasks: BTreeMap<u32, Task> = BTreeMap::new();
    let mut lost_without_cpu = 0u64;
    let mut lost_counters = LostCounters::default();
    let mut skipped = Skipped::default();
    while let Some(record) = record_iter.next_record(&mut perf_file).map_err(|e| bad(format!("perf.data: {e}")))? {
        let (attr_index, record) = match record {
            PerfFileRecord::EventRecord { attr_index, record } => (attr_index, record),
            PerfFileRecord::UserRecord(user) if user.record_type == UserRecordType::PERF_ID_INDEX => {
                lost_counters.index_ids(&user.data.as_slice());
                continue;
            }
            PerfFileRecord::UserRecord(_) => continue,
        };
        let common = record.common_data().ok();
        let cpu = common.as_ref().and_then(|c| c.cpu);
        let ts = common.as_ref().and_then(|c| c.timestamp);
        if record.record_type == RecordType::LOST_SAMPLES {
            // `u64 lost`, then the sample id. perf writes these at the end of a recording
            // (time 0) from each event's lost counter: totals that include the LOST records'
            // losses, so only what they add is taken, below. Others are gaps like LOST.
            let count = record.data.as_slice().get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8")));
            match ts {
                Some(0) | None => lost_counters.totals.push((common.as_ref().and_then(|c| c.id), count)),
                Some(_) => note_lost(&mut cpus, &mut lost_without_cpu, cpu, ts, count),
            }
            continue;
        }
        let parsed = record.parse().map_err(|e| bad(format!("perf.data: a {:?} record: {e}", record.record_type)))?;
        match parsed {
            EventRecord::Sample(sample) => {
                if !tracepoint.get(attr_index).copied().unwrap_or(false) {
                    skipped.not_tracepoints += 1;
                    continue;
                }
                let Some(raw) = sample.raw else {
                    skipped.without_raw += 1;
                    continue;
                };
                let Some(ts) = sample.timestamp else {
                    return Err(bad(
                        "perf.data samples carry no time (recorded without -T/--timestamp?): nothing can be ordered"
                            .into(),
                    ));
                };
                let cpu = sample.cpu.unwrap_or_else(|| {
                    skipped.without_cpu += 1;
                    0
                });
                if cpu >= crate::session::MAX_CPUS {
                    return Err(bad(format!("perf.data: a sample on CPU {cpu}; no kernel has that many")));
                }
                cpus.entry(cpu).or_default().push(ts, &raw.as_slice());
            }
            EventRecord::Comm(comm) => {
                let (Ok(pid), Ok(tid)) = (u32::try_from(comm.pid), u32::try_from(comm.tid)) else { continue };
                let name = String::from_utf8_lossy(&comm.name.as_slice()).into_owned();
                tasks.insert(tid, Task { tid, pid, comm: name });
            }
            EventRecord::Lost(lost) => note_lost(&mut cpus, &mut lost_without_cpu, cpu, ts, lost.count),
            _ => {}
        }
    }
    if skipped.not_tracepoints + skipped.without_raw > 0 {
        eprintln!(
            "virtprof: warning: '{}': {} samples of other events and {} tracepoint samples without raw data were skipped",
            path.display(),
            skipped.not_tracepoints,
            skipped.without_raw
        );
    }
    if skipped.without_cpu > 0 {
        eprintln!(
            "virtprof: warning: '{}': {} samples carry no CPU (recorded per thread, without -a): they are all put on CPU 0, so per-CPU figures mean nothing",
            path.display(),
            skipped.without_cpu
        );
    }
    let mut cpu_loss: Vec<KernelLoss> = Vec::new();
    let mut pages: CpuPages = Vec::new();
    for (cpu, mut samples) in cpus {
        // Each CPU's ring buffer is written in time order; perf's rounds interleave CPUs, and
        // a sort keeps any record a round put late in place.
        samples.records.sort_by_key(|&(ts, _, _)| ts);
        samples.lost.sort_unstable();
        let mut writer = PageWriter::new(&layout);
        let mut gaps = samples.lost.iter().peekable();
        let mut dropped = 0u64;
        for &(ts, at, len) in &samples.records {
            while let Some(&&(at, count)) = gaps.peek().filter(|g| g.0 <= ts) {
                writer.lost(at, count);
                dropped = dropped.saturating_add(count);
                gaps.next();
            }
            let raw = &samples.bytes[at..at + len];
            writer.push(ts, raw).map_err(|e| bad(format!("perf.data: a sample on CPU {cpu}: {e}")))?;
        }
        for &(at, count) in gaps {
            writer.lost(at, count);
            dropped = dropped.saturating_add(count);
        }
        writer.flush();
        if dropped > 0 {
            cpu_loss.push(KernelLoss { cpu: Cpu(cpu), overrun: 0, dropped });
        }
        pages.push((cpu, writer.pages));
    }
    // The events' own lost counters beyond what the LOST records said: samples lost where no
    // LOST record followed (at the end of the run), on their event's CPU where the file says.
    let (on_cpus, unplaced) = lost_counters.beyond_records(&cpu_loss, lost_without_cpu);
    for (cpu, extra) in on_cpus {
        add_dropped(&mut cpu_loss, cpu, extra);
    }
    lost_without_cpu = lost_without_cpu.saturating_add(unplaced);
    if lost_without_cpu > 0 {
        // No CPU to place them on: the figure is still the file's loss, on CPU 0.
        add_dropped(&mut cpu_loss, 0, lost_without_cpu);
    }
    cpu_loss.sort_by_key(|l| l.cpu);
    if pages.iter().all(|(_, p)| p.is_empty()) {
        return Err(bad("perf.data holds no tracepoint sample with raw data".into()));
    }
    let mut host = BTreeMap::new();
    let facts = [
        ("hostname", perf_file.hostname()),
        ("kernel_release", perf_file.os_release()),
        ("perf_version", perf_file.perf_version()),
    ];
    for (key, value) in facts {
        if let Ok(Some(value)) = value {
            host.insert(key.to_string(), value.to_string());
        }
    }
    if let Ok(Some(n)) = perf_file.nr_cpus() {
        host.insert("cpu_count".to_string(), n.nr_cpus_online.to_string());
    }
    // Threads perf never saw a COMM for keep the names the tracing data saved.
    for (tid, pid, comm) in virtprof_trace::tracefs::parse_saved_tasks(&dat.cmdlines, "") {
        tasks.entry(tid).or_insert(Task { tid, pid, comm });
    }
    let metadata = Metadata {
        origin: format!("import perf.data {}", path.display()),
        // perf_clock: the kernel's local clock, in nanoseconds.
        trace_clock: "perf".to_string(),
        header_page: dat.header_page,
        formats: crate::import::kept_formats(dat.formats),
        cpus: pages.iter().map(|(c, _)| *c).collect(),
        host,
        tasks: tasks.into_values().collect(),
        ..Default::default()
    };
    Ok((metadata, pages, virtprof_store::recording::Footer { cpu_loss, ..Default::default() }))
}

/// The events' lost-sample counters perf writes at the end of a recording (LOST_SAMPLES at
/// time 0, one per event and CPU, by sample id). A CPU's LOST records count what all its
/// events lost in its one buffer, so the two are compared per CPU.
#[derive(Default)]
struct LostCounters {
    /// (sample id, count) of each counter.
    totals: Vec<(Option<u64>, u64)>,
    /// Each id's CPU, from the ID_INDEX record perf writes.
    cpus: HashMap<u64, u32>,
}

impl LostCounters {
    /// An ID_INDEX record: `nr: u64`, then `(id, idx, cpu, tid): u64` each.
    fn index_ids(&mut self, data: &[u8]) {
        let word = |i: usize| data.get(i * 8..i * 8 + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
        let entries = word(0).and_then(|n| usize::try_from(n).ok()).unwrap_or(0).min(data.len() / 32);
        for entry in 0..entries {
            if let (Some(id), Some(cpu)) = (word(1 + entry * 4), word(3 + entry * 4)) {
                // Per-thread events have CPU -1; a CPU no kernel has is left unplaced.
                if let Some(cpu) = u32::try_from(cpu).ok().filter(|&c| c < crate::session::MAX_CPUS) {
                    self.cpus.insert(id, cpu);
                }
            }
        }
    }

    /// What the counters add to the LOST records (`placed` per CPU, `unplaced_records`
    /// without one): samples lost where no LOST record followed (at the end of the run), per
    /// CPU where the file says which CPU each counter's event was on; and the rest of what
    /// all counters add to all records, whose CPU the file does not give.
    fn beyond_records(&self, placed: &[KernelLoss], unplaced_records: u64) -> (BTreeMap<u32, u64>, u64) {
        let mut per_cpu: BTreeMap<u32, u64> = BTreeMap::new();
        for &(id, total) in &self.totals {
            if let Some(&cpu) = id.and_then(|id| self.cpus.get(&id)) {
                let sum = per_cpu.entry(cpu).or_insert(0);
                *sum = sum.saturating_add(total);
            }
        }
        let on_cpus: BTreeMap<u32, u64> = per_cpu
            .into_iter()
            .map(|(cpu, total)| {
                (cpu, total.saturating_sub(placed.iter().find(|l| l.cpu == Cpu(cpu)).map_or(0, |l| l.dropped)))
            })
            .filter(|&(_, extra)| extra > 0)
            .collect();
        // Saturating: a forged counter near 2^64 must not wrap to a small loss.
        let counted = self.totals.iter().fold(0u64, |sum, (_, n)| sum.saturating_add(*n));
        let recorded = placed.iter().fold(unplaced_records, |sum, l| sum.saturating_add(l.dropped));
        let placed_extra = on_cpus.values().fold(0u64, |sum, n| sum.saturating_add(*n));
        let unplaced = counted.saturating_sub(recorded).saturating_sub(placed_extra);
        (on_cpus, unplaced)
    }
}

/// `count` more events dropped on `cpu`.
fn add_dropped(cpu_loss: &mut Vec<KernelLoss>, cpu: u32, count: u64) {
    match cpu_loss.iter_mut().find(|l| l.cpu == Cpu(cpu)) {
        Some(l) => l.dropped = l.dropped.saturating_add(count),
        None => cpu_loss.push(KernelLoss { cpu: Cpu(cpu), overrun: 0, dropped: count }),
    }
}

/// A loss record: on its CPU at its time where the record says, else counted apart.
fn note_lost(
    cpus: &mut BTreeMap<u32, CpuSamples>,
    without_cpu: &mut u64,
    cpu: Option<u32>,
    ts: Option<u64>,
    count: u64,
) {
    match (cpu.filter(|&c| c < crate::session::MAX_CPUS), ts) {
        (Some(cpu), Some(ts)) => cpus.entry(cpu).or_default().lost.push((ts, count)),
        _ => *without_cpu = without_cpu.saturating_add(count),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id_index(entries: &[(u64, u64)]) -> Vec<u8> {
        let mut data = (entries.len() as u64).to_le_bytes().to_vec();
        for &(id, cpu) in entries {
            for word in [id, 0, cpu, u64::MAX] {
                data.extend_from_slice(&word.to_le_bytes());
            }
        }
        data
    }

    #[test]
    fn end_of_run_counters_add_what_a_cpus_lost_records_missed_on_that_cpu() {
        let mut counters = LostCounters::default();
        // Two events on each of two CPUs; a fifth id perf's index does not place.
        counters.index_ids(&id_index(&[(10, 0), (11, 1), (20, 0), (21, 1)]));
        counters.totals = vec![(Some(10), 60), (Some(20), 40), (Some(11), 70), (Some(21), 94), (Some(99), 5)];
        let placed = [
            KernelLoss { cpu: Cpu(0), overrun: 0, dropped: 100 },
            KernelLoss { cpu: Cpu(1), overrun: 0, dropped: 150 },
        ];
        let (on_cpus, unplaced) = counters.beyond_records(&placed, 0);
        assert_eq!((on_cpus, unplaced), (BTreeMap::from([(1, 14)]), 5));
        // Counters without ids (or none perf's index places) are compared as a sum: what they
        // repeat of the records is not counted twice.
        counters.totals = vec![(None, 260)];
        assert_eq!(counters.beyond_records(&placed, 0), (BTreeMap::new(), 10));
        assert_eq!(counters.beyond_records(&placed, 20), (BTreeMap::new(), 0));
        // Counts no kernel could write do not wrap around to small ones.
        counters.totals = vec![(Some(11), u64::MAX), (Some(21), u64::MAX)];
        assert_eq!(counters.beyond_records(&placed, 0).0, BTreeMap::from([(1, u64::MAX - 150)]));
    }

    #[test]
    fn a_truncated_id_index_places_only_its_whole_entries() {
        let mut counters = LostCounters::default();
        let mut data = id_index(&[(10, 3), (11, 4)]);
        data[..8].copy_from_slice(&1000u64.to_le_bytes());
        data.truncate(8 + 32 + 10);
        counters.index_ids(&data);
        assert_eq!(counters.cpus, HashMap::from([(10, 3)]));
        // Per-thread events (CPU -1) and CPUs no kernel has stay unplaced.
        counters.index_ids(&id_index(&[(12, u64::MAX), (13, 1 << 40), (14, 9000)]));
        assert_eq!(counters.cpus, HashMap::from([(10, 3)]));
    }
}
