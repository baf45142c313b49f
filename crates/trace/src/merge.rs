//! Merging per-CPU event streams into one timestamp-ordered stream, lazily: each CPU keeps one
//! decoded event pending, so memory is bounded by the CPU count whatever the trace length.
//! Ties go to the lower CPU number, so every path (live, replay, shuffled input) agrees.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use virtprof_model::{Event, EventKind};

use crate::decode::Decoder;
use crate::format::PageHeader;
use crate::page::{Missed, Page, Records};

/// Counts from walking pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// Pages read.
    pub pages: u64,
    /// Records decoded.
    pub events: u64,
    /// Events the kernel reported lost (known counts).
    pub lost: u64,
    /// Pages that said events were lost without a count.
    pub lost_unknown: u64,
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

/// One CPU's pages: whole pages in one or more segments, in order (a recording's chunks, or
/// one buffer), borrowed so nothing is copied.
#[derive(Debug, Clone)]
pub struct CpuStream<'a> {
    /// CPU number.
    pub cpu: u32,
    /// Segments of whole pages.
    pub segments: Vec<&'a [u8]>,
}

impl<'a> CpuStream<'a> {
    /// A stream of one contiguous buffer.
    pub fn contiguous(cpu: u32, raw: &'a [u8]) -> Self {
        CpuStream { cpu, segments: vec![raw] }
    }
}

/// The base timestamps of the earliest first page and the latest last page over all CPUs:
/// the span a walk will cover (to within a page), known before decoding anything, which is
/// what progress bars and time-bucketed analyses need up front.
pub fn time_range(header: &PageHeader, cpus: &[CpuStream<'_>]) -> Option<(u64, u64)> {
    let page_ts = |page: &[u8]| Page::parse(page, header).ok().map(|p| p.base_ts()).filter(|&ts| ts > 0);
    let mut range: Option<(u64, u64)> = None;
    for s in cpus {
        let whole = |seg: &&&[u8]| seg.len() >= header.page_size;
        let first = s.segments.iter().find(whole).and_then(|seg| page_ts(&seg[..header.page_size]));
        let last = s.segments.iter().rev().find(whole).and_then(|seg| {
            let pages = seg.len() / header.page_size;
            page_ts(&seg[(pages - 1) * header.page_size..pages * header.page_size])
        });
        if let (Some(a), Some(b)) = (first, last) {
            let (lo, hi) = range.unwrap_or((a, b));
            range = Some((lo.min(a), hi.max(b)));
        }
    }
    range
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
}

impl<'a> Cursor<'a> {
    fn next(&mut self, decoder: &mut Decoder, stats: &mut WalkStats) -> Result<Option<Event>, WalkError> {
        let page_size = decoder.layout().header.page_size;
        loop {
            let page_index = self.pages_before + self.next_page.saturating_sub(1);
            if let Some(records) = &mut self.records {
                match records.next() {
                    Some(Ok(rec)) => {
                        stats.events += 1;
                        return decoder
                            .decode(self.cpu, &rec)
                            .map(Some)
                            .map_err(|e| self.error(page_index, page_size, 0, e.to_string()));
                    }
                    Some(Err(e)) => return Err(self.error(page_index, page_size, e.offset, e.message)),
                    None => self.records = None,
                }
            }
            let Some(&raw) = self.segments.get(self.segment) else { return Ok(None) };
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
                match count {
                    Some(n) => stats.lost += n,
                    None => stats.lost_unknown += 1,
                }
                return Ok(Some(Event { ts: page.base_ts(), cpu: self.cpu, tid: 0, kind: EventKind::Lost { count } }));
            }
        }
    }

    fn error(&self, page: usize, page_size: usize, offset: usize, message: String) -> WalkError {
        WalkError { cpu: self.cpu, page, offset: page * page_size + offset, message }
    }
}

/// Decode the pages of every CPU and deliver all events to `sink` in timestamp order.
pub fn merge_cpus<'a>(
    decoder: &mut Decoder,
    cpus: &'a [CpuStream<'a>],
    mut sink: impl FnMut(&Event, &Decoder),
) -> Result<WalkStats, WalkError> {
    let mut stats = WalkStats::default();
    let mut cursors: Vec<Cursor<'a>> = cpus
        .iter()
        .map(|s| Cursor { cpu: s.cpu, segments: &s.segments, segment: 0, next_page: 0, pages_before: 0, records: None })
        .collect();
    let mut heap = BinaryHeap::with_capacity(cursors.len());
    let mut pending: Vec<Option<Event>> = vec![None; cursors.len()];
    for (i, c) in cursors.iter_mut().enumerate() {
        if let Some(e) = c.next(decoder, &mut stats)? {
            heap.push(Reverse((e.ts, c.cpu, i)));
            pending[i] = Some(e);
        }
    }
    while let Some(Reverse((_, _, i))) = heap.pop() {
        let event = pending[i].take().expect("heap entries have a pending event");
        sink(&event, decoder);
        // Keep taking from this CPU while it stays the earliest: the heap is only touched when
        // the order between CPUs changes (ties still go to the lower CPU).
        let bound = heap.peek().map(|Reverse((ts, cpu, _))| (*ts, *cpu));
        while let Some(e) = cursors[i].next(decoder, &mut stats)? {
            if bound.is_none_or(|b| (e.ts, cursors[i].cpu) < b) {
                sink(&e, decoder);
                continue;
            }
            heap.push(Reverse((e.ts, cursors[i].cpu, i)));
            pending[i] = Some(e);
            break;
        }
    }
    Ok(stats)
}
