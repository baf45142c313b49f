//! One streaming pass over a recording's trace that feeds every analysis `report`, `export`
//! and `compare` need: exit durations, vCPU run/wait/blocked accounting over time, and the
//! trace-derived interval columns. Memory stays bounded whatever the number of events: the
//! exit analyzer keeps fixed-size histograms, the accounting a bounded number of time
//! buckets, and the binner adds to the already loaded interval rows.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use virtprof_analysis::exits::{ExitAnalyzer, ExitOptions, ExitReport};
use virtprof_analysis::intervals::{IntervalTable, TraceBinner};
use virtprof_analysis::qos::VmInfo;
use virtprof_analysis::sched::{SchedOptions, Span, StateSlice};
use virtprof_analysis::{Analyzer, Names};
use virtprof_model::evidence::Holdings;
use virtprof_model::interval::Entity;
use virtprof_model::{Event, Loss, Tid, VcpuThread};
use virtprof_trace::decode::Decoder;

mod accounting;
mod intervals;

pub use accounting::{recording_tasks, VcpuAccounting};
pub use intervals::{features, interval_table};
use virtprof_session::{evidence_event_ids, DecoderNames, Session};

/// The event systems every accounting pass decodes. The interrupts matter to run time: where
/// the trace leaves a switch-in out, the last event on that CPU bounds when the thread started
/// (`sched` decoding fewer than `report` once gave one thread 5.2 ms against 3.6 ms).
pub const ACCOUNTING_SYSTEMS: &[&str] = &["kvm", "sched", "irq", "irq_vectors"];

/// About this many accounting buckets span a recording, whatever its length.
const TIMELINE_BUCKETS: u64 = 600;

/// Events between progress-bar updates.
const PROGRESS_EVERY: u64 = 1 << 16;

/// Which analyses to run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Want {
    /// Exit durations and reasons.
    pub exits: bool,
    /// Keep a row per exit (for slices in exports; memory grows with the exits).
    pub exit_rows: bool,
    /// vCPU run/wait/blocked accounting, whole run and over time.
    pub accounting: bool,
    /// Count trace events into the interval rows.
    pub binning: bool,
    /// Keep each vCPU thread's state slices (with `accounting`; timelines draw them).
    pub state_slices: bool,
}

/// What the pass found.
pub struct Analysis {
    /// Exit analysis (when wanted).
    pub exits: Option<ExitReport>,
    /// The whole run's accounting (when wanted).
    pub total: Option<Span>,
    /// Accounting per time bucket, oldest first.
    pub buckets: Vec<Span>,
    /// Each accounted thread's state slices (when wanted): they add up to `total`.
    pub slices: Vec<StateSlice>,
    /// Width of those buckets.
    pub bucket_ns: u64,
    /// VMs whose vCPU threads were seen (named ones when accounting was not wanted).
    pub vms: Vec<VmInfo>,
    /// The interval rows with trace columns and per-VM sums added (when the recording has rows).
    pub table: Option<IntervalTable>,
    /// Events that fell outside every interval row.
    pub outside_rows: u64,
    /// Events decoded.
    pub events: u64,
    /// Events lost: the kernel's per-CPU counts, located by the gaps on the pages.
    pub loss: Loss,
    /// First and last event timestamps.
    pub span_ns: Option<(u64, u64)>,
    /// The decoder, which names reasons and events.
    pub decoder: Decoder,
    /// What the recording holds: which figures it can give.
    pub holdings: Holdings,
}

impl Analysis {
    /// Names through the recorded kernel's formats.
    pub fn names(&self) -> DecoderNames<'_> {
        DecoderNames(&self.decoder)
    }
}

/// Run the wanted analyses over `recording` in one pass, with a progress bar on a terminal.
pub fn analyse(recording: &mut Session, want: Want) -> anyhow::Result<Analysis> {
    analyse_with(recording, want, &mut |_: &Event, _: &dyn Names| {})
}

/// [`analyse`], also handing every event to `also` (exports write their rows from there).
pub fn analyse_with(recording: &mut Session, want: Want, also: &mut dyn Analyzer) -> anyhow::Result<Analysis> {
    let mut decoder = recording.decoder(ACCOUNTING_SYSTEMS)?;
    let mut table = if want.binning { recording.intervals.take() } else { None };
    let recording = &*recording;
    let range = recording.time_range(&decoder);
    let host = recording_tasks(recording);
    let evidence = evidence_event_ids(&decoder);

    let mut exits = want.exits.then(|| {
        let options = ExitOptions {
            rows: want.exit_rows,
            evidence_events: evidence.clone(),
            host: recording.host_kind(),
            holdings: recording.holdings(&decoder),
            kvm_exits: recording.kvm_exits(),
            ..Default::default()
        };
        ExitAnalyzer::new(options)
    });
    let bucket_ns = bucket_width(range);
    let mut accounting = want.accounting.then(|| {
        let options = SchedOptions { bucket_ns, keep_buckets: usize::MAX };
        let mut accounting = VcpuAccounting::new(recording, &host, options, evidence);
        if want.state_slices {
            accounting.inner.record_slices();
        }
        accounting
    });
    let named_vms = host.vms(&[], &[]);
    let mut binner = table.as_mut().map(|t| {
        let vcpus = named_vms
            .iter()
            .flat_map(|vm| {
                vm.vcpus
                    .iter()
                    .map(move |&VcpuThread { index, tid: Tid(tid) }| (tid, Entity::Vcpu { pid: vm.pid.0, index }))
            })
            .collect();
        TraceBinner::new(t, vcpus)
    });
    let mut progress = Progress::new(range);

    let mut analyzers: Vec<&mut dyn Analyzer> = vec![&mut progress, also];
    if let Some(x) = exits.as_mut() {
        analyzers.push(x);
    }
    if let Some(a) = accounting.as_mut() {
        analyzers.push(a);
    }
    if let Some(b) = binner.as_mut() {
        analyzers.push(b);
    }
    let stats = recording.analyse(&mut decoder, &mut analyzers)?;
    drop(analyzers);
    progress.done();
    let outside_rows = binner.map_or(0, |b| b.outside);
    if let Some(t) = table.as_mut() {
        t.add_vm_sums();
        // Guests seen from inside, in the same intervals as the host (VrtProf's layers).
        for layer in recording.guests.iter().flat_map(|g| g.layers()) {
            t.add_guest_layer(&layer);
        }
    }
    let names = DecoderNames(&decoder);
    let mut exits = exits.map(|x| x.finish(&names));
    let loss = recording.loss(&stats);
    if let Some(x) = exits.as_mut() {
        x.totals.lost_events = loss.total();
    }
    let (total, buckets, slices, vms) = match accounting.as_mut() {
        Some(a) => {
            let total = a.finish()?;
            let vms = a.vms(&host, &total, &[]);
            (Some(total), a.inner.buckets().cloned().collect(), a.inner.take_slices(), vms)
        }
        None => (None, Vec::new(), Vec::new(), named_vms),
    };
    Ok(Analysis {
        exits,
        total,
        buckets,
        slices,
        bucket_ns,
        vms,
        table,
        outside_rows,
        events: stats.events,
        loss,
        span_ns: progress.span_ns(),
        holdings: recording.holdings(&decoder),
        decoder,
    })
}

/// A round bucket width (1, 2 or 5 × a power of ten, at least 1 ms) that cuts `range` into
/// about [`TIMELINE_BUCKETS`].
fn bucket_width(range: Option<(u64, u64)>) -> u64 {
    let span = range.map_or(0, |(a, b)| b.saturating_sub(a));
    let target = (span / TIMELINE_BUCKETS).max(1_000_000);
    let mut decade = 1_000_000u64;
    loop {
        for step in [1, 2, 5] {
            if decade * step >= target {
                return decade * step;
            }
        }
        decade *= 10;
    }
}

/// A progress bar over trace time, drawn only on a terminal; it also notes the first and last
/// event times (the span the report covers).
struct Progress {
    bar: Option<ProgressBar>,
    start: u64,
    seen: u64,
    first_ts: Option<u64>,
    last_ts: u64,
}

impl Progress {
    fn new(range: Option<(u64, u64)>) -> Self {
        let mut progress = Progress { bar: None, start: 0, seen: 0, first_ts: None, last_ts: 0 };
        let Some((start, end)) = range.filter(|_| std::io::stderr().is_terminal()) else {
            return progress;
        };
        let bar = ProgressBar::new(end.saturating_sub(start).max(1));
        let style = ProgressStyle::with_template("{spinner} reading trace [{bar:40}] {percent:>3}% {msg} ({eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        progress.bar = Some(bar);
        progress.start = start;
        progress
    }

    fn span_ns(&self) -> Option<(u64, u64)> {
        self.first_ts.map(|first| (first, self.last_ts))
    }

    fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Analyzer for Progress {
    fn on_event(&mut self, e: &Event, _: &dyn Names) {
        self.first_ts.get_or_insert(e.ts);
        self.last_ts = e.ts;
        self.seen += 1;
        if self.seen % PROGRESS_EVERY == 0 {
            if let Some(bar) = &self.bar {
                bar.set_position(e.ts.saturating_sub(self.start));
                bar.set_message(format!("{:.1} M events", self.seen as f64 / 1e6));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_round_and_about_the_target_count() {
        assert_eq!(bucket_width(None), 1_000_000);
        assert_eq!(bucket_width(Some((0, 10_000_000))), 1_000_000);
        // 60 s / 600 = 100 ms exactly.
        assert_eq!(bucket_width(Some((5, 60_000_000_005))), 100_000_000);
        // 7 s / 600 = 11.7 ms → 20 ms.
        assert_eq!(bucket_width(Some((0, 7_000_000_000))), 20_000_000);
    }
}
