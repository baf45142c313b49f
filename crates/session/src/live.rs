//! A private tracefs instance decoded as it runs: the live commands (`top`, `balance --verify`,
//! `noise`) start one, drain it now and then into a sink of typed events, and read its loss
//! (the kernel's counts, located by the gaps the pages flagged) whenever they show it. The
//! instance is removed when it is finished or dropped.

use virtprof_analysis::{Analyzer, Names};
use virtprof_model::event::Event;
use virtprof_model::Loss;
use virtprof_trace::capture::{Capture, CaptureConfig};
use virtprof_trace::decode::Decoder;
use virtprof_trace::merge::{merge_cpus, CpuStream};
use virtprof_trace::tracefs::{load_layout, Tracefs};

use crate::error::{Result, SessionError};
use crate::names::DecoderNames;

/// A running, decoding trace.
pub struct LiveTrace {
    // Field order is drop order: the capture (and its tracefs instance) goes first.
    capture: Capture,
    decoder: Decoder,
    /// Gaps the pages drained so far flagged.
    page_loss: Loss,
    /// Requested events this kernel lacks.
    pub missing: Vec<String>,
    /// The kernel's page size, and how many pages each CPU's buffer holds.
    page_size: usize,
    capacity_pages: usize,
}

impl LiveTrace {
    /// Trace `events` (`system` or `system:event`) on trace clock `clock`, decoding the formats
    /// of `systems`.
    pub fn start(events: &[&str], clock: &str, buffer_size_kb: u32, systems: &[&str]) -> Result<LiveTrace> {
        let tracefs = Tracefs::locate_or_mount()?;
        let header_path = tracefs.root().join("events/header_page");
        let header_page = virtprof_trace::tracefs::read_file(&header_path)
            .map_err(SessionError::io(format!("reading '{}'", header_path.display())))?;
        let page_size = virtprof_trace::format::parse_header_page(&header_page)
            .map_err(|e| SessionError::Live(format!("this kernel's header_page: {e}")))?
            .page_size;
        let config = CaptureConfig {
            events: events.iter().map(|e| (*e).to_string()).collect(),
            buffer_size_kb,
            fit_to_rate: false,
            clock: clock.into(),
            exit_hist: false,
        };
        let (capture, missing) = Capture::start(&tracefs, &config, page_size)?;
        let decoder = Decoder::new(load_layout(tracefs.root(), systems)?);
        let page_size = page_size.max(1);
        let capacity_pages = (buffer_size_kb as usize * 1024 / page_size).max(1);
        Ok(LiveTrace { capture, decoder, page_loss: Loss::default(), missing, page_size, capacity_pages })
    }

    /// Decode what the kernel has buffered, per drain in time order across CPUs (call often
    /// enough that the buffers never fill).
    pub fn drain(&mut self, mut sink: impl FnMut(&Event)) -> Result<()> {
        self.drain_into(&mut [&mut |e: &Event, _: &dyn Names| sink(e)]).map(|_| ())
    }

    /// [`LiveTrace::drain`] into analyzers, as [`crate::Session::analyse`] does for a file.
    /// Returns how full the fullest CPU's buffer was (0 to 1): how soon the next drain is due.
    pub fn drain_into(&mut self, analyzers: &mut [&mut dyn Analyzer]) -> Result<f64> {
        let mut batches: Vec<(u32, Vec<u8>)> = Vec::new();
        while self.capture.poll(256, |cpu, pages| batches.push((cpu, pages)))? > 0 {}
        let mut per_cpu: std::collections::BTreeMap<u32, usize> = std::collections::BTreeMap::new();
        for (cpu, raw) in &batches {
            *per_cpu.entry(*cpu).or_default() += raw.len();
        }
        let fullest = per_cpu.values().max().copied().unwrap_or(0);
        let streams: Vec<CpuStream<'_>> = batches.iter().map(|(cpu, raw)| CpuStream::contiguous(*cpu, raw)).collect();
        let stats = merge_cpus(&mut self.decoder, &streams, |e, d| {
            let names = DecoderNames(d);
            for a in analyzers.iter_mut() {
                a.on_event(e, &names);
            }
        })
        .map_err(|e| SessionError::Live(e.to_string()))?;
        self.page_loss.merge(&stats.page_loss);
        Ok((fullest / self.page_size) as f64 / self.capacity_pages as f64)
    }

    /// Events lost so far: the kernel's per-CPU counts and where the pages said.
    pub fn loss(&self) -> Loss {
        self.capture.account(&self.page_loss)
    }

    /// The decoder (task names, symbol tables).
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// The CPUs traced.
    pub fn cpus(&self) -> Vec<u32> {
        self.capture.cpus()
    }

    /// Stop tracing, decode the rest, remove the instance; returns the events lost and the
    /// decoder (for task names and symbol tables).
    pub fn finish(mut self, sink: impl FnMut(&Event)) -> Result<(Loss, Decoder)> {
        self.capture.stop()?;
        self.drain(sink)?;
        let loss = self.loss();
        self.capture.close();
        Ok((loss, self.decoder))
    }
}
