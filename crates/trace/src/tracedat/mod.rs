//! Reading trace-cmd's `trace.dat`, versions 6 (trace-cmd 2.x, `--file-version 6`) and 7
//! (trace-cmd 3.x: sections located through options, optionally zstd- or zlib-compressed).
//! Each buffer's per-CPU pages stay where they are in the file: uncompressed ones read in
//! place, compressed chunks as frames a walk expands when it reaches them ([`Segment`]).
//!
//! Every option trace-cmd writes is read where it carries meaning (trace-cmd.dat.v6(5),
//! trace-cmd.dat.v7(5)): CPUSTAT (loss), CPUCOUNT, TRACECLOCK, TSC2NSEC, OFFSET and DATE (time
//! conversion), TRACEID, TIME_SHIFT and GUEST (host and guest traces of one session), several
//! buffers (`record -B`), BUFFER_TEXT and v6 latency data (text), saved cmdlines. Layout facts
//! checked against files trace-cmd 3.1 and 3.3 wrote: a v7 section header is `id: u16, flags:
//! u16, description: u32, size: u64` (the man page says the size is 4 bytes; the files carry 8),
//! and a v7 BUFFER option carries the buffer's page size before its CPU count (3.1 and later).

mod cursor;
mod options;
mod v6;
mod v7;

use std::borrow::Cow;

use virtprof_model::clock::TimeScale;

use crate::format::{owned_text, text_of};
use crate::segment::{Codec, Segment};
use cursor::Cursor;
pub use options::{GuestVcpus, Tsc2Nsec};

/// A problem in a trace.dat file, with its byte offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trace.dat at byte {offset}: {message}")]
pub struct TraceDatError {
    /// Where.
    pub offset: usize,
    /// What.
    pub message: String,
}

/// One ring buffer's data: the top one (name "") or an instance (`trace-cmd record -B NAME`).
#[derive(Debug, Clone, Default)]
pub struct Buffer<'a> {
    /// Instance name; empty for the top buffer.
    pub name: String,
    /// Its trace clock.
    pub clock: String,
    /// Each CPU's pages, in order, borrowed from the file (compressed chunks stay compressed).
    pub cpus: Vec<(u32, Vec<Segment<'a>>)>,
}

/// One event's `format` file as a trace.dat stores it: borrowed from the file where it is
/// stored plainly, owned where its section was compressed, and not yet read as UTF-8. A file
/// carries thousands of formats and a reader needs a few dozen in full: copying them all
/// took a millisecond of the 18 that `exits` takes on a 600k-event file.
#[derive(Debug, Clone)]
pub struct FormatText<'a> {
    /// The event's system ("ftrace" for the ftrace formats).
    pub system: String,
    /// The format file's bytes.
    pub text: Cow<'a, [u8]>,
}

impl FormatText<'_> {
    /// The text (any byte that is not UTF-8 replaced).
    pub fn text(&self) -> String {
        owned_text(&self.text)
    }

    /// The system and the text, owned (any byte that is not UTF-8 replaced).
    pub fn into_owned(self) -> (String, String) {
        let text = match self.text {
            Cow::Owned(bytes) => text_of(bytes),
            Cow::Borrowed(bytes) => owned_text(bytes),
        };
        (self.system, text)
    }
}

/// A buffer saved as text (a latency tracer's output: BUFFER_TEXT, or a v6 file's latency
/// data).
#[derive(Debug, Clone, Default)]
pub struct BufferText {
    /// Instance name; empty for the top buffer.
    pub name: String,
    /// Its trace clock, where the file says.
    pub clock: String,
    /// The `trace` file's text.
    pub text: String,
}

/// What a trace.dat holds.
#[derive(Debug, Clone, Default)]
pub struct TraceDat<'a> {
    /// File version: 6 or 7.
    pub version: u32,
    /// How its sections and data are compressed (None: not at all).
    pub compression: Option<Codec>,
    /// Target page size.
    pub page_size: usize,
    /// `events/header_page` text.
    pub header_page: String,
    /// Every event's format text, in file order.
    pub formats: Vec<FormatText<'a>>,
    /// `saved_cmdlines` text (`pid comm` lines).
    pub cmdlines: String,
    /// The trace clock of the top buffer (the first buffer's, where there is no top one).
    pub clock: String,
    /// `per_cpu/cpuN/stats` texts (CPUSTAT), in file order.
    pub cpu_stats: Vec<String>,
    /// CPUs of the traced machine (CPUCOUNT).
    pub cpu_count: Option<u32>,
    /// This trace session's identifier (TRACEID): a guest's TIME_SHIFT and a host's GUEST
    /// option name the peer by it.
    pub trace_id: Option<u64>,
    /// TSC to nanoseconds (TSC2NSEC), where the clock is the TSC.
    pub tsc2nsec: Option<Tsc2Nsec>,
    /// Nanoseconds added to every timestamp (OFFSET and DATE options).
    pub offset_ns: i64,
    /// A guest trace's offsets to its host's clock (TIME_SHIFT).
    pub time_shift: Option<virtprof_model::clock_sync::ClockSync>,
    /// A host trace's guests: each vCPU's host thread (GUEST).
    pub guests: Vec<GuestVcpus>,
    /// The traced machine (UNAME).
    pub uname: String,
    /// The trace-cmd that wrote the file (VERSION).
    pub tracer_version: String,
    /// Binary buffers, the top one first.
    pub buffers: Vec<Buffer<'a>>,
    /// Text buffers.
    pub texts: Vec<BufferText>,
}

pub(crate) const MAGIC: &[u8] = b"\x17\x08\x44tracing";

/// True if `bytes` start like a trace.dat file.
pub fn is_trace_dat(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// Linux's largest CONFIG_NR_CPUS: no file names more CPUs.
const MAX_CPUS: usize = 8192;

/// The clock trace-cmd names for the TSC: its timestamps are CPU cycles.
pub const TSC_CLOCK: &str = "x86-tsc";

impl<'a> TraceDat<'a> {
    /// Every buffer's CPU streams, by CPU (the top buffer's first for a CPU): what a merge
    /// walks. Buffers of one file share its clock (checked when read), so their events
    /// interleave on one timeline.
    pub fn cpus(&self) -> Vec<(u32, Vec<Segment<'a>>)> {
        let mut all: Vec<(u32, Vec<Segment<'a>>)> =
            self.buffers.iter().flat_map(|b| b.cpus.iter().cloned()).filter(|(_, s)| !s.is_empty()).collect();
        all.sort_by_key(|(cpu, _)| *cpu);
        all
    }

    /// True if its timestamps are TSC cycles with nothing in the file to convert them.
    pub fn in_cycles(&self) -> bool {
        self.clock == TSC_CLOCK && self.tsc2nsec.is_none()
    }

    /// How its timestamps become nanoseconds: the file's TSC2NSEC, else `cycles` (a given
    /// conversion) for a TSC clock, plus the file's offset; and where the conversion came
    /// from. None: they already are nanoseconds, or they are cycles with no conversion (counts
    /// can still be read; durations cannot).
    /// `cycles`, where given, comes with where it came from (`--tsc-khz 2893202`).
    pub fn time_scale(&self, cycles: Option<(TimeScale, String)>) -> (Option<TimeScale>, Option<String>) {
        let (tsc, whence) = if self.clock == TSC_CLOCK {
            match (self.tsc2nsec, cycles) {
                (Some(t), _) => (
                    Some(TimeScale { mult: u64::from(t.mult), shift: t.shift.min(63), offset_ns: 0 }),
                    Some(format!("the file's TSC2NSEC option (mult {}, shift {})", t.mult, t.shift)),
                ),
                (None, Some((scale, from))) => (Some(scale), Some(from)),
                (None, None) => return (None, None),
            }
        } else {
            (None, None)
        };
        let scale = match (tsc, self.offset_ns) {
            (None, 0) => None,
            (None, offset) => Some(TimeScale::offset(offset)),
            (Some(scale), offset) => Some(scale.with_offset(offset)),
        };
        (scale, whence)
    }
}

/// Parse a version 6 or 7 trace.dat held in memory.
pub fn read(data: &[u8]) -> Result<TraceDat<'_>, TraceDatError> {
    let mut c = Cursor::at(data, 0);
    if !is_trace_dat(data) {
        return c.fail("not a trace.dat file (bad magic)");
    }
    c.pos = MAGIC.len();
    let version = c.cstr()?;
    let version = match version.as_str() {
        "6" => 6,
        "7" => 7,
        other => {
            return c.fail(format!(
                "trace.dat version {} is not supported (versions 6 and 7 are: trace-cmd 2.x and 3.x)",
                other.escape_debug()
            ))
        }
    };
    if c.u8()? != 0 {
        return c.fail("big-endian trace.dat files are not supported");
    }
    let _long_size = c.u8()?;
    let page_size = c.size32()?;
    if !(64..=(1 << 24)).contains(&page_size) || !page_size.is_power_of_two() {
        return c.fail(format!("page size {page_size} is not a power of two between 64 and 16 MiB"));
    }
    let mut out = TraceDat { version, page_size, ..Default::default() };
    match version {
        6 => v6::read(&mut c, &mut out)?,
        _ => v7::read(&mut c, &mut out)?,
    }
    finish(&mut out)?;
    check_data(data, &out.buffers)?;
    Ok(out)
}

/// The most a walk may hold expanded at once: it holds one chunk per CPU stream, so the sum
/// over streams of each one's largest chunk. trace-cmd's chunks are 10 pages: 8192 CPUs with
/// 4 KiB pages take 320 MiB, 800 CPUs with 64 KiB pages 500 MiB.
pub const MAX_EXPANDED_AT_ONCE: usize = 512 << 20;

/// What a file's claims must not do to a reader: CPUs whose data overlap (trace-cmd gives
/// each CPU of each buffer bytes of its own; shared, a small file makes every CPU decode or
/// expand the same bytes again), or chunks that would take more than
/// [`MAX_EXPANDED_AT_ONCE`] expanded at once.
fn check_data(data: &[u8], buffers: &[Buffer]) -> Result<(), TraceDatError> {
    let base = data.as_ptr() as usize;
    let mut regions: Vec<(usize, usize, u32)> = Vec::new();
    let mut at_once = 0usize;
    let mut widest = (0usize, 0u32);
    for (cpu, segments) in buffers.iter().flat_map(|b| &b.cpus) {
        let mut largest = 0;
        for segment in segments {
            let bytes = match segment {
                Segment::Pages(pages) => pages,
                Segment::Frame { frame, size, .. } => {
                    largest = largest.max(*size);
                    frame
                }
            };
            if !bytes.is_empty() {
                let start = bytes.as_ptr() as usize - base;
                regions.push((start, start + bytes.len(), *cpu));
            }
        }
        at_once = at_once.saturating_add(largest);
        widest = widest.max((largest, *cpu));
    }
    regions.sort_unstable();
    if let Some(pair) = regions.windows(2).find(|w| w[1].0 < w[0].1) {
        let ((start, end, cpu), (other_start, _, other)) = (pair[0], pair[1]);
        return Err(TraceDatError {
            offset: other_start,
            message: format!(
                "CPU {other}'s data at byte {other_start} lies inside CPU {cpu}'s (bytes {start}..{end}): trace-cmd gives every CPU bytes of its own; the file is damaged, or made to make every CPU read the same bytes"
            ),
        });
    }
    if at_once > MAX_EXPANDED_AT_ONCE {
        let streams = buffers.iter().map(|b| b.cpus.len()).sum::<usize>();
        return Err(TraceDatError {
            offset: 0,
            message: format!(
                "its {streams} CPU streams' compressed chunks claim {} MiB expanded at once (CPU {} alone {} MiB a chunk), over the {} MiB a reader holds at most; trace-cmd writes chunks of 10 pages: the file is damaged, or made to exhaust memory",
                at_once >> 20,
                widest.1,
                widest.0 >> 20,
                MAX_EXPANDED_AT_ONCE >> 20
            ),
        });
    }
    Ok(())
}

/// Claim the bytes `start..end` of a file for one reading (a CPU table): false if any of
/// them were claimed before.
fn claim(claimed: &mut std::collections::BTreeMap<usize, usize>, start: usize, end: usize) -> bool {
    if start >= end {
        return true;
    }
    if claimed.range(..end).next_back().is_some_and(|(_, &e)| e > start) {
        return false;
    }
    claimed.insert(start, end);
    true
}

/// perf.data's tracing data (its HEADER_TRACING_DATA feature: the version-6 metadata after
/// its own initial header, version "0.5" or "0.6", the latter with saved cmdlines): the
/// page layout and event formats of the samples' raw records. No buffers.
pub fn read_tracing_data(data: &[u8]) -> Result<TraceDat<'_>, TraceDatError> {
    let mut c = Cursor::at(data, 0);
    if !is_trace_dat(data) {
        return c.fail("perf.data tracing data: bad magic");
    }
    c.pos = MAGIC.len();
    let version = c.cstr()?;
    if c.u8()? != 0 {
        return c.fail("big-endian tracing data is not supported");
    }
    let _long_size = c.u8()?;
    let page_size = c.size32()?;
    let mut out = TraceDat { version: 6, page_size, ..Default::default() };
    v6::metadata(&mut c, &mut out)?;
    if version == "0.6" && c.remaining() >= 8 {
        let len = c.size64()?;
        out.cmdlines = c.text(len)?;
    }
    if out.header_page.is_empty() {
        return c.fail("perf.data tracing data without a header_page");
    }
    Ok(out)
}

/// Checks every version shares: a page layout, one clock for the buffers merged, some data.
fn finish(out: &mut TraceDat) -> Result<(), TraceDatError> {
    let fail = |message: String| Err(TraceDatError { offset: 0, message });
    if out.header_page.is_empty() {
        return fail("no header_page: the file lacks the page layout".into());
    }
    // trace-cmd names the clock of `record -C tsc2nsec` "tsc2nsec" in BUFFER options: the
    // x86-tsc clock read through the file's TSC2NSEC conversion.
    for buffer in &mut out.buffers {
        if buffer.clock == "tsc2nsec" {
            buffer.clock = TSC_CLOCK.into();
        }
    }
    out.buffers.sort_by_key(|b| !b.name.is_empty());
    if let Some(first) = out.buffers.first() {
        if out.clock.is_empty() || !first.name.is_empty() {
            out.clock.clone_from(&first.clock);
        }
    }
    let with_data: Vec<&Buffer> = out.buffers.iter().filter(|b| b.cpus.iter().any(|(_, s)| !s.is_empty())).collect();
    if let Some(other) = with_data.iter().find(|b| !b.clock.is_empty() && b.clock != out.clock) {
        return fail(format!(
            "buffer '{}' uses clock '{}' and the top buffer '{}': their times cannot be merged",
            other.name, other.clock, out.clock
        ));
    }
    // Every CPU's data empty: a trace of nothing, which reads as that (0 events).
    Ok(())
}

/// A CPU's flyrecord data: raw pages in place, or compressed chunks (`count: u32`, then
/// `compressed: u32, size: u32, bytes` each). It must lie inside the file and, uncompressed,
/// be whole pages.
fn cpu_segments<'a>(
    data: &'a [u8],
    cpu: u32,
    offset: usize,
    size: usize,
    page_size: usize,
    codec: Option<Codec>,
) -> Result<Vec<Segment<'a>>, TraceDatError> {
    let fail = |at: usize, message: String| Err(TraceDatError { offset: at, message });
    if size == 0 {
        return Ok(Vec::new());
    }
    let past_end = |what: &str| {
        fail(
            offset,
            format!("CPU {cpu}'s data ({what} at byte {offset}) runs past the end of the file ({} bytes)", data.len()),
        )
    };
    let Some(codec) = codec else {
        if offset.checked_add(size).is_none_or(|end| end > data.len()) {
            return past_end(&format!("{size} bytes"));
        }
        if size % page_size != 0 {
            return fail(offset, format!("CPU {cpu}'s data of {size} bytes is not whole {page_size}-byte pages"));
        }
        return Ok(vec![Segment::Pages(&data[offset..offset + size])]);
    };
    // Compressed, the size trace-cmd 3.1 records is not the chunks' length: the chunks are
    // bounded by the file instead.
    if offset >= data.len() {
        return past_end("compressed chunks");
    }
    let region = &data[offset..];
    let mut c = Cursor::within(region, offset);
    let chunks = c.u32()?;
    let mut list = Vec::new();
    for _ in 0..chunks {
        let compressed = c.size32()?;
        let expanded = c.size32()?;
        let at = offset + c.pos;
        let frame = c.bytes(compressed)?;
        if expanded % page_size != 0 {
            return fail(at, format!("CPU {cpu}: a chunk expanding to {expanded} bytes is not whole pages"));
        }
        list.push(
            Segment::frame(codec, frame, expanded, at).map_err(|e| TraceDatError { offset: at, message: e.message })?,
        );
    }
    Ok(list)
}

/// `header_page` (then `header_event`, unused) as both versions store it.
fn read_header_info(c: &mut Cursor, out: &mut TraceDat) -> Result<(), TraceDatError> {
    if c.cstr()? != "header_page" {
        return c.fail("the header info does not start with header_page");
    }
    let len = c.size64()?;
    out.header_page = c.text(len)?;
    Ok(())
}

/// Event formats by system (`count: u32`, then `system\0, count: u32, (size: u64, text)...`),
/// as slices of the cursor's bytes.
fn event_formats<'c>(c: &mut Cursor<'c>) -> Result<Vec<(String, &'c [u8])>, TraceDatError> {
    let systems = c.u32()?;
    let mut formats = Vec::new();
    for _ in 0..systems {
        let system = c.cstr()?;
        let events = c.u32()?;
        for _ in 0..events {
            let len = c.size64()?;
            formats.push((system.clone(), c.bytes(len)?));
        }
    }
    Ok(formats)
}

/// The ftrace formats (`count: u32`, then `(size: u64, text)...`): kept under system "ftrace".
fn ftrace_formats<'c>(c: &mut Cursor<'c>) -> Result<Vec<(String, &'c [u8])>, TraceDatError> {
    let events = c.u32()?;
    let mut formats = Vec::new();
    for _ in 0..events {
        let len = c.size64()?;
        formats.push(("ftrace".to_string(), c.bytes(len)?));
    }
    Ok(formats)
}

/// Formats read from the file itself: kept where they are.
fn borrowed(formats: Vec<(String, &[u8])>) -> impl Iterator<Item = FormatText<'_>> {
    formats.into_iter().map(|(system, text)| FormatText { system, text: Cow::Borrowed(text) })
}

#[cfg(test)]
mod tests;
