//! Merging per-CPU event streams into one timestamp-ordered stream, lazily: each CPU keeps one
//! decoded event pending (or, decoded on its own thread, a few batches in flight and one
//! expanded compressed frame), so memory is bounded by the CPU count whatever the trace length.
//! Ties go to the lower CPU number, so every path (live, replay, shuffled input) agrees.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::BinaryHeap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use virtprof_model::{Event, EventKind, Loss, StrId};

use crate::decode::Decoder;
use crate::format::PageHeader;
use crate::page::{Missed, Page, Records};
use crate::segment::{Segment, SegmentError};

/// Counts from walking pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// Pages read.
    pub pages: u64,
    /// Records decoded.
    pub events: u64,
    /// Where pages said events were lost: per CPU, the stored counts and the time spans of the
    /// gaps (no kernel counters: those come with the recording's footer or the live capture).
    pub page_loss: Loss,
}

impl WalkStats {
    fn add(&mut self, other: &WalkStats) {
        self.pages += other.pages;
        self.events += other.events;
        self.page_loss.merge(&other.page_loss);
    }
}

/// Where a walk failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cpu{cpu}: page {page} (byte offset {offset}): {message}")]
pub struct WalkError {
    /// CPU.
    pub cpu: u32,
    /// Page index.
    pub page: usize,
    /// Byte offset in the CPU's stream.
    pub offset: usize,
    /// What went wrong.
    pub message: String,
}

/// One CPU's pages: whole pages in one or more segments, in order (a recording's chunks,
/// trace-cmd's compressed frames, or one buffer), borrowed so nothing is copied.
#[derive(Debug, Clone)]
pub struct CpuStream<'a> {
    /// CPU number.
    pub cpu: u32,
    /// Segments of whole pages.
    pub segments: Vec<Segment<'a>>,
}

impl<'a> CpuStream<'a> {
    /// A stream of one contiguous buffer.
    pub fn contiguous(cpu: u32, raw: &'a [u8]) -> Self {
        CpuStream { cpu, segments: vec![Segment::Pages(raw)] }
    }

    /// True if a walk must expand compressed frames.
    fn is_compressed(&self) -> bool {
        self.segments.iter().any(Segment::is_compressed)
    }
}

/// The base timestamps of the earliest first page and the latest last page over all CPUs:
/// the span a walk will cover (to within a page), known before decoding anything, which is
/// what progress bars and time-bucketed analyses need up front.
pub fn time_range(header: &PageHeader, cpus: &[CpuStream<'_>]) -> Option<(u64, u64)> {
    let page_size = header.page_size;
    let page_ts = |page: &[u8]| Page::parse(page, header).ok().map(|p| p.base_ts()).filter(|&ts| ts > 0);
    let mut buffer = Vec::new();
    let mut range: Option<(u64, u64)> = None;
    for s in cpus {
        let whole = |seg: &&Segment<'_>| seg.len() >= page_size;
        let first = s.segments.iter().find(whole).and_then(|seg| {
            let pages = seg.pages(&mut buffer).ok()?;
            page_ts(pages.get(..page_size)?)
        });
        let last = s.segments.iter().rev().find(whole).and_then(|seg| {
            let pages = seg.pages(&mut buffer).ok()?;
            let n = pages.len() / page_size;
            page_ts(pages.get(n.checked_sub(1)? * page_size..n * page_size)?)
        });
        if let (Some(a), Some(b)) = (first, last) {
            let (lo, hi) = range.unwrap_or((a, b));
            range = Some((lo.min(a), hi.max(b)));
        }
    }
    range
}

/// How far into its CPU's stream a cursor starts: pages before it and the last timestamp
/// seen (where a gap flagged on its first page begins).
#[derive(Debug, Clone, Copy, Default)]
struct Position {
    pages: usize,
    last_ts: Option<u64>,
}

/// The walk error for a frame of CPU `cpu` that would not expand, `position` into its stream.
fn frame_error(cpu: u32, position: Position, page_size: usize, e: SegmentError) -> WalkError {
    WalkError { cpu, page: position.pages, offset: position.pages * page_size, message: e.to_string() }
}

/// One CPU's position in its pages.
struct Cursor<'a> {
    cpu: u32,
    segments: &'a [&'a [u8]],
    segment: usize,
    next_page: usize,
    /// Pages in the segments before the current one (for error offsets).
    pages_before: usize,
    records: Option<Records<'a>>,
    /// Where the previous page's events ended: a gap flagged on the next page begins there.
    last_ts: Option<u64>,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `segments`, `position` into its CPU's stream (see
    /// [`Cursor::position`]).
    fn new(cpu: u32, segments: &'a [&'a [u8]], position: Position) -> Self {
        Cursor {
            cpu,
            segments,
            segment: 0,
            next_page: 0,
            pages_before: position.pages,
            records: None,
            last_ts: position.last_ts,
        }
    }

    /// Where it is, for a cursor over the pages that follow.
    fn position(&self) -> Position {
        Position { pages: self.pages_before + self.next_page, last_ts: self.last_ts }
    }

    fn error(&self, page: usize, page_size: usize, offset: usize, message: String) -> WalkError {
        WalkError { cpu: self.cpu, page, offset: page * page_size + offset, message }
    }
}

/// What opening a cursor's next page found.
enum PageStep {
    /// No pages left.
    End,
    /// A page is open; the kernel flagged events lost before it (the event saying so).
    Opened(Option<Event>),
}

impl Cursor<'_> {
    /// Open the next page (moving to the next segment where one ends).
    fn open_page(&mut self, decoder: &Decoder, stats: &mut WalkStats) -> Result<PageStep, WalkError> {
        let page_size = decoder.layout().header.page_size;
        loop {
            let Some(&raw) = self.segments.get(self.segment) else { return Ok(PageStep::End) };
            let start = self.next_page * page_size;
            if start >= raw.len() {
                self.pages_before += self.next_page;
                self.segment += 1;
                self.next_page = 0;
                continue;
            }
            let index = self.pages_before + self.next_page;
            self.next_page += 1;
            let bytes = &raw[start..(start + page_size).min(raw.len())];
            if bytes.len() < page_size {
                return Err(self.error(
                    index,
                    page_size,
                    0,
                    format!("truncated page: {} of {page_size} bytes", bytes.len()),
                ));
            }
            let page = Page::parse(bytes, &decoder.layout().header)
                .map_err(|e| self.error(index, page_size, e.offset, e.message))?;
            stats.pages += 1;
            self.records = Some(page.records());
            if let Missed::Lost(count) = page.missed {
                let since = self.last_ts.map_or(page.base_ts(), |ts| ts.min(page.base_ts()));
                stats.page_loss.cpu(self.cpu).add_gap(count, since, page.base_ts());
                let lost = Event { ts: page.base_ts(), cpu: self.cpu, tid: 0, kind: EventKind::Lost { count } };
                return Ok(PageStep::Opened(Some(lost)));
            }
            return Ok(PageStep::Opened(None));
        }
    }

    /// The index of the page being read.
    fn page_index(&self) -> usize {
        self.pages_before + self.next_page.saturating_sub(1)
    }

    /// Decode the rest of the open page, or else the whole next one, into `out`; false when
    /// no pages are left. A page's events are decoded in one tight loop, which is what a
    /// decoding thread wants; the events before an error are in `out` when it is returned.
    fn fill(&mut self, decoder: &mut Decoder, stats: &mut WalkStats, out: &mut Vec<Event>) -> Result<bool, WalkError> {
        let (cpu, page_size, page) = (self.cpu, decoder.layout().header.page_size, self.page_index());
        let Some(records) = &mut self.records else {
            return match self.open_page(decoder, stats)? {
                PageStep::End => Ok(false),
                PageStep::Opened(lost) => {
                    out.extend(lost);
                    Ok(true)
                }
            };
        };
        let fail = |offset: usize, message: String| WalkError { cpu, page, offset: page * page_size + offset, message };
        while let Some(record) = records.next_record() {
            prefetch_ahead(record.data);
            stats.events += 1;
            out.push(decoder.decode(cpu, &record).map_err(|e| fail(0, e.to_string()))?);
        }
        if let Some(e) = records.take_error() {
            return Err(fail(e.offset, e.message));
        }
        self.last_ts = self.records.take().map(|r| r.ts());
        Ok(true)
    }
}

impl Cursor<'_> {
    /// The next event of this CPU, decoded on the merging thread.
    fn next(&mut self, decoder: &mut Decoder, stats: &mut WalkStats) -> Result<Option<Event>, WalkError> {
        let page_size = decoder.layout().header.page_size;
        loop {
            let page_index = self.page_index();
            if let Some(records) = &mut self.records {
                match records.next() {
                    Some(Ok(rec)) => {
                        prefetch_ahead(rec.data);
                        stats.events += 1;
                        return decoder
                            .decode(self.cpu, &rec)
                            .map(Some)
                            .map_err(|e| self.error(page_index, page_size, 0, e.to_string()));
                    }
                    Some(Err(e)) => return Err(self.error(page_index, page_size, e.offset, e.message)),
                    None => self.last_ts = self.records.take().map(|r| r.ts()),
                }
            }
            match self.open_page(decoder, stats)? {
                PageStep::End => return Ok(None),
                PageStep::Opened(Some(lost)) => return Ok(Some(lost)),
                PageStep::Opened(None) => {}
            }
        }
    }
}

/// Decode the pages of every CPU and deliver all events to `sink` in timestamp order. Big
/// traces of a few CPUs are decoded on a thread per CPU ([`merge_cpus_parallel`]); the order
/// delivered is the same either way.
pub fn merge_cpus<'a>(
    decoder: &mut Decoder,
    cpus: &'a [CpuStream<'a>],
    sink: impl FnMut(&Event, &Decoder),
) -> Result<WalkStats, WalkError> {
    let bytes: usize = cpus.iter().flat_map(|s| &s.segments).map(Segment::len).sum();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    // Compressed chunks are expanded one at a time per CPU on either path; a thread per CPU
    // also expands them in parallel, which is most of a compressed file's cost.
    let compressed = cpus.iter().any(CpuStream::is_compressed);
    let big = threads > 1 && cpus.len() >= 2 && bytes >= PARALLEL_BYTES;
    if (compressed || big) && cpus.len() <= MAX_PARALLEL_CPUS {
        merge_cpus_parallel(decoder, cpus, sink)
    } else {
        merge_cpus_serial(decoder, cpus, sink)
    }
}

/// Below this many bytes of pages, threads cost more than they save.
const PARALLEL_BYTES: usize = 8 << 20;
/// Above this many CPUs, a thread each (and their batches in flight) is too much.
const MAX_PARALLEL_CPUS: usize = 64;

/// [`merge_cpus`] on the calling thread alone: pages in place are decoded where they lie,
/// compressed chunks expanded one at a time per CPU as its walk reaches them (so memory stays
/// at one chunk per CPU, whatever the file's length).
pub fn merge_cpus_serial(
    decoder: &mut Decoder,
    cpus: &[CpuStream<'_>],
    mut sink: impl FnMut(&Event, &Decoder),
) -> Result<WalkStats, WalkError> {
    let in_place: Vec<Vec<&[u8]>> = cpus
        .iter()
        .map(|stream| {
            stream
                .segments
                .iter()
                .filter_map(|segment| match segment {
                    Segment::Pages(pages) => Some(*pages),
                    Segment::Frame { .. } => None,
                })
                .collect()
        })
        .collect();
    let mut sources: Vec<Source<'_>> = cpus
        .iter()
        .zip(&in_place)
        .map(|(stream, pages)| {
            if stream.is_compressed() {
                Source::Expanding(Box::new(Expanding::new(stream)))
            } else {
                Source::InPlace(Cursor::new(stream.cpu, pages, Position::default()))
            }
        })
        .collect();
    merge(&mut sources, decoder, &mut sink)
}

/// One CPU of a serial walk.
enum Source<'a> {
    /// Pages decoded where they lie, an event at a time.
    InPlace(Cursor<'a>),
    /// Compressed chunks expanded as reached, a page's events at a time.
    Expanding(Box<Expanding<'a>>),
}

impl Source<'_> {
    fn cpu(&self) -> u32 {
        match self {
            Source::InPlace(cursor) => cursor.cpu,
            Source::Expanding(feed) => feed.cpu,
        }
    }

    fn next(&mut self, decoder: &mut Decoder, stats: &mut WalkStats) -> Result<Option<Event>, WalkError> {
        match self {
            Source::InPlace(cursor) => cursor.next(decoder, stats),
            Source::Expanding(feed) => feed.next(decoder, stats),
        }
    }
}

/// A CPU whose stream holds compressed chunks, walked on the merging thread: the chunk being
/// read is expanded into a buffer of its own, and each page's events are decoded at once into
/// a short list the merge takes from.
struct Expanding<'a> {
    cpu: u32,
    segments: &'a [Segment<'a>],
    /// The segment being read, and the next page in it.
    segment: usize,
    page: usize,
    /// The chunk being read, expanded (empty until it is reached).
    buffer: Vec<u8>,
    expanded: bool,
    position: Position,
    events: Vec<Event>,
    next: usize,
}

impl<'a> Expanding<'a> {
    fn new(stream: &'a CpuStream<'a>) -> Expanding<'a> {
        Expanding {
            cpu: stream.cpu,
            segments: &stream.segments,
            segment: 0,
            page: 0,
            buffer: Vec::new(),
            expanded: false,
            position: Position::default(),
            events: Vec::new(),
            next: 0,
        }
    }

    fn next(&mut self, decoder: &mut Decoder, stats: &mut WalkStats) -> Result<Option<Event>, WalkError> {
        while self.next >= self.events.len() {
            self.events.clear();
            self.next = 0;
            if !self.read_page(decoder, stats)? {
                return Ok(None);
            }
        }
        self.next += 1;
        Ok(Some(self.events[self.next - 1]))
    }

    /// Decode the next page (expanding its chunk first if it starts one) into `events`;
    /// false when no pages are left.
    fn read_page(&mut self, decoder: &mut Decoder, stats: &mut WalkStats) -> Result<bool, WalkError> {
        let page_size = decoder.layout().header.page_size;
        loop {
            let Some(segment) = self.segments.get(self.segment) else { return Ok(false) };
            let pages: &[u8] = match segment {
                Segment::Pages(pages) => pages,
                Segment::Frame { .. } => {
                    if !self.expanded {
                        segment
                            .pages(&mut self.buffer)
                            .map_err(|e| frame_error(self.cpu, self.position, page_size, e))?;
                        self.expanded = true;
                    }
                    &self.buffer
                }
            };
            let start = self.page * page_size;
            if start >= pages.len() {
                self.segment += 1;
                self.page = 0;
                self.expanded = false;
                continue;
            }
            let rest = [&pages[start..]];
            let mut cursor = Cursor::new(self.cpu, &rest, self.position);
            // The first fill opens the page (and says if events were lost before it), the
            // second decodes its records.
            cursor.fill(decoder, stats, &mut self.events)?;
            cursor.fill(decoder, stats, &mut self.events)?;
            self.position = cursor.position();
            self.page += 1;
            return Ok(true);
        }
    }
}

/// Deliver the events of `sources` to `sink` in timestamp order.
fn merge(
    sources: &mut [Source<'_>],
    decoder: &mut Decoder,
    sink: &mut impl FnMut(&Event, &Decoder),
) -> Result<WalkStats, WalkError> {
    let mut stats = WalkStats::default();
    let mut pending: Vec<Option<Event>> = vec![None; sources.len()];
    let mut heap = BinaryHeap::with_capacity(sources.len());
    for (i, source) in sources.iter_mut().enumerate() {
        if let Some(e) = source.next(decoder, &mut stats)? {
            heap.push(Reverse((e.ts, source.cpu(), i)));
            pending[i] = Some(e);
        }
    }
    // Earliest on top (ties: the lower CPU). Each delivered event replaces its CPU's entry in
    // place: one sift instead of a pop and a push.
    while let Some(mut top) = heap.peek_mut() {
        let Reverse((_, cpu, i)) = *top;
        let event = pending[i].take().expect("heap entries have a pending event");
        sink(&event, decoder);
        match sources[i].next(decoder, &mut stats)? {
            Some(e) => {
                *top = Reverse((e.ts, cpu, i));
                pending[i] = Some(e);
            }
            None => {
                PeekMut::pop(top);
            }
        }
    }
    Ok(stats)
}

/// Events a decoding thread hands over at a time (at least; a batch ends with a page).
const BATCH: usize = 4096;
/// Batches a decoding thread may have ahead of the merge: enough that on a host with fewer
/// cores than threads, a decoding thread runs a long stretch and then sleeps, rather than
/// waking for every batch (each wake-up costs more than the batch on a virtualized host).
/// Memory stays bounded: this many batches of [`BATCH`] events per CPU.
const BATCHES_IN_FLIGHT: usize = 8;
/// The most events one page can hold (of 64 KiB, the largest page size, at 8 bytes each), so
/// a batch never grows past its first allocation.
const MAX_PAGE_EVENTS: usize = 8192;

/// What a decoding thread sends: events in order, the task names it interned since its last
/// batch, and, last, how its walk ended.
struct Batch {
    events: Vec<Event>,
    /// Which of `events` carry name ids (their thread's, to be translated).
    named_events: Vec<u32>,
    names: Vec<String>,
    end: Option<Result<WalkStats, WalkError>>,
}

/// One CPU's decoding thread, as the merge sees it: the batch being delivered.
struct Feed {
    cpu: u32,
    rx: Receiver<Batch>,
    /// Delivered batches go back to the thread to be filled again: no allocation, and no
    /// fresh pages to fault in, per batch.
    spent: SyncSender<Vec<Event>>,
    batch: Vec<Event>,
    /// The next event of `batch` to deliver.
    next: usize,
    /// The thread's name ids → `decoder`'s.
    names: Vec<StrId>,
    /// The thread has sent its last batch.
    done: bool,
    /// Where its walk failed, reported once the events before it are delivered (as the serial
    /// walk would).
    error: Option<WalkError>,
}

impl Feed {
    /// The timestamp of this CPU's next event, waiting for its thread if need be; None at its
    /// end. A batch's names are translated to the merging decoder's ids when it arrives.
    fn head(&mut self, decoder: &mut Decoder, stats: &mut WalkStats) -> Result<Option<u64>, WalkError> {
        loop {
            if let Some(e) = self.batch.get(self.next) {
                return Ok(Some(e.ts));
            }
            if let Some(e) = self.error.take() {
                return Err(e);
            }
            if self.done {
                return Ok(None);
            }
            let Ok(batch) = self.rx.recv() else {
                return Err(WalkError {
                    cpu: self.cpu,
                    page: 0,
                    offset: 0,
                    message: "the decoding thread stopped".into(),
                });
            };
            self.names.extend(batch.names.iter().map(|n| decoder.strings.intern(n.as_bytes())));
            let mut spent = std::mem::replace(&mut self.batch, batch.events);
            spent.clear();
            // The thread may have finished, or have enough spares: then the vector is dropped.
            let _ = self.spent.try_send(spent);
            self.next = 0;
            for &i in &batch.named_events {
                if let Some(EventKind::SchedSwitch { prev_comm, next_comm, .. }) =
                    self.batch.get_mut(i as usize).map(|e| &mut e.kind)
                {
                    *prev_comm = self.names[prev_comm.0 as usize];
                    *next_comm = self.names[next_comm.0 as usize];
                }
            }
            match batch.end {
                Some(Ok(s)) => stats.add(&s),
                Some(Err(e)) => self.error = Some(e),
                None => continue,
            }
            self.done = true;
        }
    }
}

/// How far ahead of the event being delivered the merge prefetches its batch. The batch was
/// written on another core, so each cache line is a cross-core miss; fetching them early cut
/// the merge's share of a 22 ms `exits` run by about a tenth (any distance from 8 to 64 did).
const PREFETCH_EVENTS: usize = 16;

/// Ask the CPU to start loading `event`, which a decoding thread wrote on another core.
#[inline(always)]
fn prefetch(event: &Event) {
    prefetch_address(std::ptr::from_ref(event).cast());
}

/// How far past the record being decoded a cursor asks for its pages' bytes.
const PREFETCH_BYTES: usize = 1024;

/// Ask the CPU to start loading the bytes [`PREFETCH_BYTES`] past `record`, which a cursor
/// decodes a few dozen records later (a CPU's pages lie one after another, so near a page's
/// end this is the next page; past the last one the hint goes nowhere, harmlessly). The
/// hardware prefetcher stops at page boundaries, so each page's first records waited on memory
/// (on this shadow-paged host, on a walk of the page tables too): those header loads were a
/// third of a decoding thread's time. One hint per record cut `exits` on an 804k-event v6
/// trace.dat from 37-39 to 32-34 ms of CPU (512 to 2048 bytes ahead did about as well; the
/// whole next page at once, at page open, stalled on the load buffers and gained a third as
/// much).
#[inline(always)]
fn prefetch_ahead(record: &[u8]) {
    prefetch_address(record.as_ptr().wrapping_add(PREFETCH_BYTES));
}

/// The prefetch hint for the cache line at `address` (a no-op where the hint is not stable
/// Rust). Any address will do: a prefetch never faults and reads nothing into the program.
#[inline(always)]
fn prefetch_address(address: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never faults and reads nothing into the program.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Where a CPU's stream is in the merge order: its next event's timestamp, then the CPU.
type Key = (u64, u32);

/// Deliver the events of `feeds` to `sink` in timestamp order (ties: the lower CPU), straight
/// from their batches. The CPU whose next event is earliest delivers a run: every event
/// before the runner-up's next one goes out at once. Finding the two is a scan of the CPUs'
/// next timestamps, which for the few CPUs a parallel walk has (at most
/// [`MAX_PARALLEL_CPUS`]) costs less than keeping a heap.
fn merge_feeds(
    feeds: &mut [Feed],
    decoder: &mut Decoder,
    sink: &mut impl FnMut(&Event, &Decoder),
) -> Result<WalkStats, WalkError> {
    let mut stats = WalkStats::default();
    // Each CPU's next (timestamp, CPU), None once it has delivered everything.
    let mut heads: Vec<Option<Key>> = Vec::with_capacity(feeds.len());
    for feed in feeds.iter_mut() {
        heads.push(feed.head(decoder, &mut stats)?.map(|ts| (ts, feed.cpu)));
    }
    loop {
        // The earliest head and which feed has it; the next earliest.
        let (mut first, mut runner_up): (Option<(Key, usize)>, Option<Key>) = (None, None);
        for (i, head) in heads.iter().enumerate() {
            let Some(key) = *head else { continue };
            match first {
                Some((best, _)) if key > best => {
                    runner_up = Some(runner_up.map_or(key, |r| r.min(key)));
                }
                _ => {
                    runner_up = first.map(|(best, _)| best);
                    first = Some((key, i));
                }
            }
        }
        let Some(((_, cpu), i)) = first else { break };
        let feed = &mut feeds[i];
        loop {
            if let Some(ahead) = feed.batch.get(feed.next + PREFETCH_EVENTS) {
                prefetch(ahead);
            }
            sink(&feed.batch[feed.next], decoder);
            feed.next += 1;
            match (feed.batch.get(feed.next), runner_up) {
                (Some(e), Some(limit)) if (e.ts, cpu) < limit => {}
                (Some(_), None) => {}
                _ => break,
            }
        }
        heads[i] = feed.head(decoder, &mut stats)?.map(|ts| (ts, cpu));
    }
    Ok(stats)
}

/// [`merge_cpus`] with each CPU decoded on a thread of its own (a forked [`Decoder`]) and
/// handed over in batches; the merge and `sink` run on the calling thread, in the same order
/// as [`merge_cpus_serial`].
pub fn merge_cpus_parallel<'a>(
    decoder: &mut Decoder,
    cpus: &'a [CpuStream<'a>],
    mut sink: impl FnMut(&Event, &Decoder),
) -> Result<WalkStats, WalkError> {
    std::thread::scope(|scope| {
        let mut feeds: Vec<Feed> = cpus
            .iter()
            .map(|stream| {
                let (tx, rx) = sync_channel(BATCHES_IN_FLIGHT);
                let (spent, spares) = sync_channel(BATCHES_IN_FLIGHT);
                let mut worker = decoder.fork();
                scope.spawn(move || decode_into(&mut worker, stream, &tx, &spares));
                Feed {
                    cpu: stream.cpu,
                    rx,
                    spent,
                    batch: Vec::new(),
                    next: 0,
                    names: Vec::new(),
                    done: false,
                    error: None,
                }
            })
            .collect();
        merge_feeds(&mut feeds, decoder, &mut sink)
    })
}

/// A decoding thread: walk one CPU's pages segment by segment, expanding a compressed frame
/// only when it is reached (into one reused buffer), and send batches until the end or an
/// error (or until the merge stops listening).
fn decode_into(decoder: &mut Decoder, stream: &CpuStream<'_>, tx: &SyncSender<Batch>, spares: &Receiver<Vec<Event>>) {
    let page_size = decoder.layout().header.page_size;
    let mut sender = BatchSender {
        tx,
        spares,
        named: 0,
        events: Vec::with_capacity(BATCH + MAX_PAGE_EVENTS),
        noted: 0,
        named_events: Vec::new(),
    };
    let mut stats = WalkStats::default();
    let mut position = Position::default();
    let mut buffer = Vec::new();
    for segment in &stream.segments {
        let pages = match segment.pages(&mut buffer) {
            Ok(pages) => [pages],
            Err(e) => return sender.finish(decoder, Err(frame_error(stream.cpu, position, page_size, e))),
        };
        let mut cursor = Cursor::new(stream.cpu, &pages, position);
        loop {
            match cursor.fill(decoder, &mut stats, &mut sender.events) {
                Ok(true) => {
                    if !sender.filled(decoder) {
                        return;
                    }
                }
                Ok(false) => break,
                Err(e) => return sender.finish(decoder, Err(e)),
            }
        }
        position = cursor.position();
    }
    sender.finish(decoder, Ok(stats));
}

/// A decoding thread's side of its channel: events gathered into batches, with the names
/// its decoder interned since the last one.
struct BatchSender<'a> {
    tx: &'a SyncSender<Batch>,
    /// Batches the merge has delivered, to fill again.
    spares: &'a Receiver<Vec<Event>>,
    named: usize,
    events: Vec<Event>,
    /// Events of `events` already looked at for names.
    noted: usize,
    named_events: Vec<u32>,
}

impl BatchSender<'_> {
    /// Events were added to `events`: note which carry names, and send a full batch; false
    /// once the merge stopped listening.
    fn filled(&mut self, decoder: &Decoder) -> bool {
        self.note_names();
        self.events.len() < BATCH || self.send(decoder, None)
    }

    /// Note the events added since the last call that carry name ids.
    fn note_names(&mut self) {
        for (i, e) in self.events.iter().enumerate().skip(self.noted) {
            if matches!(e.kind, EventKind::SchedSwitch { .. }) {
                // Batches hold a few thousand events.
                #[allow(clippy::cast_possible_truncation)]
                self.named_events.push(i as u32);
            }
        }
        self.noted = self.events.len();
    }

    /// Send what is gathered and how the walk ended.
    fn finish(mut self, decoder: &Decoder, end: Result<WalkStats, WalkError>) {
        self.send(decoder, Some(end));
    }

    fn send(&mut self, decoder: &Decoder, end: Option<Result<WalkStats, WalkError>>) -> bool {
        self.note_names();
        self.noted = 0;
        let names = decoder.strings.names_from(self.named).to_vec();
        self.named += names.len();
        let next = self.spares.try_recv().unwrap_or_else(|_| Vec::with_capacity(BATCH + MAX_PAGE_EVENTS));
        let events = std::mem::replace(&mut self.events, next);
        let named_events = std::mem::take(&mut self.named_events);
        self.tx.send(Batch { events, named_events, names, end }).is_ok()
    }
}
