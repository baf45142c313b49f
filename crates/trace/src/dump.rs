//! A tracefs dump on disk: `events/` (header_page and formats) plus
//! `per_cpu/cpuN/trace_pipe_raw` (raw pages), as `virtprof import` and the kvm_amd fixtures
//! have them. Also the page walk shared by every raw source: pages → records → events, with
//! lost-event markers where a page says the kernel dropped events.

use std::fs;
use std::path::{Path, PathBuf};

use virtprof_model::{Event, EventKind};

use crate::decode::Decoder;
use crate::error::TraceError;
use crate::page::{Missed, Page};
use crate::tracefs::load_layout;

/// Raw pages of one CPU.
#[derive(Debug, Clone)]
pub struct CpuPages {
    /// CPU number.
    pub cpu: u32,
    /// Concatenated pages.
    pub raw: Vec<u8>,
    /// Where they came from.
    pub path: PathBuf,
}

/// A loaded dump: its decoder and each CPU's pages.
#[derive(Debug)]
pub struct Dump {
    /// Decoder for the dump's formats.
    pub decoder: Decoder,
    /// Per-CPU pages, by CPU number.
    pub cpus: Vec<CpuPages>,
}

impl Dump {
    /// Load a dump directory.
    pub fn open(root: &Path) -> Result<Dump, TraceError> {
        let layout = load_layout(root, &[])?;
        let per_cpu = root.join("per_cpu");
        let mut cpus = Vec::new();
        for entry in fs::read_dir(&per_cpu).map_err(TraceError::file(&per_cpu))?.filter_map(Result::ok) {
            let name = entry.file_name();
            let Some(cpu) = name.to_str().and_then(|n| n.strip_prefix("cpu")).and_then(|n| n.parse().ok()) else {
                continue;
            };
            let path = entry.path().join("trace_pipe_raw");
            let raw = fs::read(&path).map_err(TraceError::file(&path))?;
            cpus.push(CpuPages { cpu, raw, path });
        }
        cpus.sort_by_key(|c| c.cpu);
        Ok(Dump { decoder: Decoder::new(layout), cpus })
    }
}

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

/// Decode every page of one CPU, in order, calling `sink` per event (and per loss marker).
pub fn walk_pages(
    decoder: &mut Decoder,
    cpu: u32,
    raw: &[u8],
    mut sink: impl FnMut(Event),
) -> Result<WalkStats, WalkError> {
    let page_size = decoder.layout().header.page_size;
    let header = decoder.layout().header;
    let mut stats = WalkStats::default();
    for (index, bytes) in raw.chunks(page_size).enumerate() {
        let fail = |offset: usize, message: String| WalkError {
            cpu,
            page: index,
            offset: index * page_size + offset,
            message,
        };
        if bytes.len() < page_size {
            return Err(fail(0, format!("truncated page: {} of {page_size} bytes", bytes.len())));
        }
        let page = Page::parse(bytes, &header).map_err(|e| fail(e.offset, e.message))?;
        stats.pages += 1;
        if let Missed::Lost(count) = page.missed {
            match count {
                Some(n) => stats.lost += n,
                None => stats.lost_unknown += 1,
            }
            sink(Event { ts: page.base_ts(), cpu, tid: 0, kind: EventKind::Lost { count } });
        }
        for record in page.records() {
            let record = record.map_err(|e| fail(e.offset, e.message))?;
            let event = decoder.decode(cpu, &record).map_err(|e| fail(0, e.to_string()))?;
            stats.events += 1;
            sink(event);
        }
    }
    Ok(stats)
}
