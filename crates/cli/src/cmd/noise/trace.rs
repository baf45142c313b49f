//! The trace that explains the samples: a private tracefs instance on the loop's clock with
//! the events that interrupt a thread (NMI, IRQ, IRQ vectors, softirq) and the scheduler's
//! switches, decoded as it runs and kept for attribution.

use virtprof_model::event::Event;
use virtprof_trace::capture::{Capture, CaptureConfig};
use virtprof_trace::decode::Decoder;
use virtprof_trace::merge::{merge_cpus, CpuStream};
use virtprof_trace::tracefs::{load_layout, Tracefs};

/// The events that explain noise on the measured CPUs.
pub const EVENTS: [&str; 8] = [
    "irq:irq_handler_entry",
    "irq:irq_handler_exit",
    "irq:softirq_entry",
    "irq:softirq_exit",
    "irq_vectors",
    "sched:sched_switch",
    "nmi:nmi_handler",
    "sched:sched_wakeup",
];

/// A running trace of the measured CPUs.
pub struct NoiseTrace {
    // Field order is drop order: the capture (and its tracefs instance) goes first.
    capture: Capture,
    decoder: Decoder,
    cpus: Vec<u32>,
    /// Events of the measured CPUs, in time order per drain.
    pub events: Vec<Event>,
    /// Events this kernel lacks.
    pub missing: Vec<String>,
}

impl NoiseTrace {
    /// Start tracing `events` on trace clock `clock` (`mono_raw`, `mono`).
    pub fn start(cpus: &[u32], clock: &str, events: &[&str]) -> anyhow::Result<NoiseTrace> {
        let tracefs = Tracefs::locate_or_mount()?;
        let header_page = virtprof_trace::tracefs::read_file(&tracefs.root().join("events/header_page"))?;
        let page_size = virtprof_trace::format::parse_header_page(&header_page)?.page_size;
        let config = CaptureConfig {
            events: events.iter().map(|e| (*e).to_string()).collect(),
            buffer_size_kb: 8192,
            clock: clock.into(),
        };
        let (capture, missing) = Capture::start(&tracefs, &config, page_size)?;
        let decoder = Decoder::new(load_layout(tracefs.root(), &["irq", "irq_vectors", "sched", "nmi", "kvm"])?);
        Ok(NoiseTrace { capture, decoder, cpus: cpus.to_vec(), events: Vec::new(), missing })
    }

    /// Take in what the kernel has buffered (call every period so the buffers never fill).
    pub fn drain(&mut self) -> anyhow::Result<()> {
        let mut batches: Vec<(u32, Vec<u8>)> = Vec::new();
        while self.capture.poll(256, |cpu, pages| batches.push((cpu, pages)))? > 0 {}
        let streams: Vec<CpuStream<'_>> = batches
            .iter()
            .filter(|(cpu, _)| self.cpus.contains(cpu))
            .map(|(cpu, raw)| CpuStream::contiguous(*cpu, raw))
            .collect();
        let events = &mut self.events;
        merge_cpus(&mut self.decoder, &streams, |e, _| events.push(*e))?;
        Ok(())
    }

    /// Stop, read the rest; returns the events lost on the measured CPUs and the decoder (for
    /// task names).
    pub fn finish(mut self) -> anyhow::Result<(Vec<Event>, u64, Decoder)> {
        self.capture.stop()?;
        self.drain()?;
        let cpus = self.cpus.clone();
        let lost = self.capture.loss().iter().filter(|l| cpus.contains(&l.cpu)).map(|l| l.overrun + l.dropped).sum();
        self.capture.close();
        let mut events = self.events;
        events.sort_by_key(|e| (e.cpu, e.ts));
        Ok((events, lost, self.decoder))
    }
}
